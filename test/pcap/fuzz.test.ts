import t from 'tap';
import fc from 'fast-check';
import { CaptureError } from '../../src/pcap/format.js';
import { CaptureReader, readCapture } from '../../src/pcap/reader.js';
import { parseFrame } from '../../src/wire/frame.js';
import { classicPcap, epb, idb, shb } from './build.js';
import { readFixture, xorshift32 } from './fixtures.js';

/** Reads everything; returns the record count or the CaptureError code. Anything else is rethrown. */
function consume(input: Uint8Array): number | string {
  try {
    let n = 0;
    for (const r of readCapture(input)) {
      // Touch every record, and its frame, as a real consumer would.
      parseFrame(r.linkType, r.data);
      n++;
    }
    return n;
  } catch (e) {
    if (e instanceof CaptureError) return e.code;
    throw e;
  }
}

const PCAP_HEAD = classicPcap(true, false, 1, []);
const PCAPNG_HEAD = Uint8Array.from([...shb(true), ...idb(true, 1, 0)]);

t.test('fuzz: random bytes, and random bytes after valid headers, only raise CaptureError', async (t) => {
  const started = Date.now();
  const prefix = fc.constantFrom(new Uint8Array(0), PCAP_HEAD, PCAPNG_HEAD, PCAPNG_HEAD.subarray(0, 28));
  fc.assert(
    fc.property(prefix, fc.uint8Array({ maxLength: 400 }), (head, tail) => {
      const input = Uint8Array.from([...head, ...tail]);
      consume(input);
      return true;
    }),
    { seed: 1234, numRuns: 5000 },
  );
  // Structured fuzz: plausible pcapng blocks with random fields.
  fc.assert(
    fc.property(fc.array(fc.tuple(fc.integer({ min: 0, max: 8 }), fc.integer({ min: 0, max: 3 }), fc.uint8Array({ maxLength: 40 })), { maxLength: 6 }), (blocks) => {
      const body = blocks.flatMap(([type, ifId, data]) => (type === 1 ? idb(true, ifId, data.length) : type === 6 ? epb(true, ifId, BigInt(data.length), [...data]) : [type, 0, 0, 0, 12, 0, 0, 0, 12, 0, 0, 0]));
      consume(Uint8Array.from([...PCAPNG_HEAD, ...body]));
      return true;
    }),
    { seed: 4321, numRuns: 2000 },
  );
  t.ok(Date.now() - started < 20000, `bounded in time (${Date.now() - started} ms)`);
});

t.test('fuzz: every truncation of a real capture is TRUNCATED or ends on a record boundary', async (t) => {
  const input = readFixture('imm_ud.pcap');
  const full = consume(input);
  t.equal(full, 21);
  const boundaries = new Set<number>([24]);
  let at = 24;
  for (const r of readCapture(input)) {
    at += 16 + r.data.length;
    boundaries.add(at);
  }
  let ok = 0;
  for (let n = 0; n < input.length; n++) {
    const got = consume(input.subarray(0, n));
    const want = boundaries.has(n) ? 'count' : 'ERR_CAPTURE_TRUNCATED';
    if ((want === 'count' && typeof got === 'number') || got === want) ok++;
    else t.fail(`cut at ${n}: ${got}`);
  }
  t.equal(ok, input.length, `${input.length} truncations`);
});

t.test('fuzz: mutated real captures, whole and streamed, only raise CaptureError', async (t) => {
  const started = Date.now();
  const rnd = xorshift32(77);
  const sources = [readFixture('imm_ud.pcap'), readFixture('v6_ud_pingpong.pcap')];
  let errors = 0;
  let runs = 0;
  for (let round = 0; round < 300; round++) {
    const src = sources[round % sources.length] ?? new Uint8Array(0);
    const input = Uint8Array.from(src.subarray(0, rnd() % (src.length + 1)));
    for (let i = 0, n = 1 + (rnd() % 8); i < n; i++) input[rnd() % Math.max(1, input.length)] = rnd() & 0xff;
    const whole = consume(input);
    // The streamed result must be the same outcome as the whole-buffer one.
    let streamed: number | string = 0;
    try {
      const r = new CaptureReader();
      for (let p = 0; p < input.length; ) {
        const step = 1 + (rnd() % 300);
        streamed = (streamed as number) + r.push(input.subarray(p, p + step)).length;
        p += step;
      }
      streamed = (streamed as number) + r.end().length;
    } catch (e) {
      if (!(e instanceof CaptureError)) throw e;
      streamed = e.code;
    }
    if (streamed !== whole) t.fail(`round ${round}: whole ${whole}, streamed ${streamed}`);
    if (typeof whole === 'string') errors++;
    runs++;
  }
  t.ok(errors > 0 && errors < runs, `${errors} of ${runs} mutated captures rejected`);
  t.ok(Date.now() - started < 20000, `bounded in time (${Date.now() - started} ms)`);
});

import t from 'tap';
import type { CaptureRecord } from '../../src/pcap/format.js';
import { CaptureReader, readCapture } from '../../src/pcap/reader.js';
import { PcapngWriter } from '../../src/pcap/writer.js';
import { plain, readFixture, xorshift32 } from './fixtures.js';

/** Reads `input` pushed as the given chunks (cut at `cuts`, ascending). */
function readSplit(input: Uint8Array, cuts: readonly number[]): ReturnType<typeof plain>[] {
  const r = new CaptureReader();
  const out: CaptureRecord[] = [];
  let at = 0;
  for (const c of [...cuts, input.length]) {
    out.push(...r.push(input.subarray(at, c)));
    at = c;
  }
  out.push(...r.end());
  return out.map(plain);
}

function smallPcapng(): Uint8Array {
  const chunks: Uint8Array[] = [];
  const w = new PcapngWriter((c) => chunks.push(c), { name: 'eth0' });
  const raw = w.addInterface({ linkType: 101, precision: 'us' });
  w.writeFrame(1_000_000_123n, Uint8Array.of(1, 2, 3, 4, 5), { direction: 'in', comment: 'first' });
  w.writeFrame(2_000_000_000n, [Uint8Array.of(0x45), new Uint8Array(30)], { interfaceId: raw });
  w.writeFrame(3_000_000_000n, new Uint8Array(0));
  return Uint8Array.from(Buffer.concat(chunks));
}

t.test('every two-way split of a small capture gives identical records', async (t) => {
  for (const [name, input] of [
    ['imm_ud.pcap', readFixture('imm_ud.pcap')],
    ['pcapng', smallPcapng()],
  ] as const) {
    const want = [...readCapture(input)].map(plain);
    t.ok(want.length >= 3, `${name}: ${want.length} records`);
    let same = 0;
    for (let cut = 0; cut <= input.length; cut++) {
      const got = readSplit(input, [cut]);
      if (JSON.stringify(got) === JSON.stringify(want)) same++;
      else t.fail(`${name}: split at ${cut} differs`);
    }
    t.equal(same, input.length + 1, `${name}: all ${input.length + 1} split points`);
    t.same(readSplit(input, Array.from({ length: input.length }, (_, i) => i)), want, `${name}: one byte per chunk`);
  }
});

t.test('random splits of a big capture give identical records, in linear time', async (t) => {
  const input = readFixture('read_bw.pcap');
  const want = [...readCapture(input)].map(plain);
  t.equal(want.length, 1343);
  const rnd = xorshift32(0xc0ffee);
  for (let round = 0; round < 6; round++) {
    const cuts: number[] = [];
    // Mix tiny and large chunks so headers and blocks straddle boundaries in every way.
    for (let at = 0; ; ) {
      const r = rnd();
      at += r % 4 === 0 ? 1 + (r % 7) : 1 + (r % 20000);
      if (at >= input.length) break;
      cuts.push(at);
    }
    t.same(readSplit(input, cuts), want, `round ${round}: ${cuts.length + 1} chunks`);
  }
  const started = Date.now();
  const oneByte = readFixture('rc_pingpong.pcap');
  const wantOne = [...readCapture(oneByte)].map(plain);
  t.same(readSplit(oneByte, Array.from({ length: oneByte.length - 1 }, (_, i) => i + 1)), wantOne, `${oneByte.length} one-byte chunks`);
  t.ok(Date.now() - started < 15000, `one-byte chunks of 180 KB in ${Date.now() - started} ms`);
});

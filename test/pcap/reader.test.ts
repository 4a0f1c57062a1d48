import t from 'tap';
import { CaptureError, type CaptureRecord } from '../../src/pcap/format.js';
import { CaptureReader, readCapture, readCaptureChunks } from '../../src/pcap/reader.js';
import { parseFrame, formatIpAddress } from '../../src/wire/frame.js';
import { classicPcap, block, endOfOpt, epb, idb, opb, option, shb, spb } from './build.js';
import { RXE_FIXTURES, readFixture } from './fixtures.js';

/** Runs `f` and returns the CaptureError code it throws ('none' if it returns, 'OTHER' for anything else). */
function codeOf(f: () => unknown): string {
  try {
    f();
    return 'none';
  } catch (e) {
    return e instanceof CaptureError ? e.code : `OTHER ${String(e)}`;
  }
}
const all = (b: Uint8Array): CaptureRecord[] => [...readCapture(b)];
const bytes = (...parts: number[][]): Uint8Array => Uint8Array.from(parts.flat());

t.test('rxe captures: frame counts, numbering, link type, RoCEv2 addresses', async (t) => {
  for (const [file, want] of Object.entries(RXE_FIXTURES)) {
    const input = readFixture(file);
    const recs = all(input);
    t.equal(recs.length, want.frames, `${file}: frames`);
    let roce = 0;
    let numbered = true;
    const hosts = new Set<string>();
    recs.forEach((r, i) => {
      if (r.frame !== i + 1 || r.linkType !== 1 || r.interfaceId !== 0) numbered = false;
      if (r.data.buffer !== input.buffer) numbered = false;
      const p = parseFrame(r.linkType, r.data);
      if (p.ok && p.frame.udp.dstPort === 4791) {
        roce++;
        hosts.add(formatIpAddress(p.frame.ip.src)).add(formatIpAddress(p.frame.ip.dst));
      }
    });
    t.ok(numbered, `${file}: frames 1..N, Ethernet, views into the file`);
    t.equal(roce, want.roce, `${file}: UDP dst 4791 frames that parse`);
    t.same([...hosts].sort(), want.hosts, `${file}: addresses`);
  }
});

t.test('rxe capture timestamps and lengths match tshark', async (t) => {
  // tshark -r rc_pingpong.pcap -T fields -e frame.number -e frame.time_epoch -e frame.len -c 3
  const recs = all(readFixture('rc_pingpong.pcap')).slice(0, 3);
  t.same(
    recs.map((r) => [r.frame, r.timestampNs, r.originalLength, r.data.length]),
    [
      [1, 1795962705240819000n, 54, 54],
      [2, 1795962711946884000n, 42, 42],
      [3, 1795962711954902000n, 42, 42],
    ],
  );
});

t.test('classic pcap: both byte orders, µs and ns', async (t) => {
  const recs = [
    { sec: 1, frac: 2, data: [0xaa, 0xbb] },
    { sec: 0xfffffffe, frac: 999999, data: [], orig: 1500 },
  ];
  for (const le of [true, false]) {
    for (const ns of [false, true]) {
      const got = all(classicPcap(le, ns, 101, recs));
      const scale = ns ? 1n : 1000n;
      t.same(
        got.map((r) => ({ frame: r.frame, ts: r.timestampNs, lt: r.linkType, data: [...r.data], len: r.originalLength })),
        [
          { frame: 1, ts: 1_000_000_000n + 2n * scale, lt: 101, data: [0xaa, 0xbb], len: 2 },
          { frame: 2, ts: 0xfffffffen * 1_000_000_000n + 999999n * scale, lt: 101, data: [], len: 1500 },
        ],
        `${le ? 'LE' : 'BE'} ${ns ? 'ns' : 'µs'}`,
      );
    }
  }
  t.same(all(classicPcap(true, false, 1, [])), [], 'a header alone is an empty capture');
  const fcs = classicPcap(true, false, 1, [{ sec: 0, frac: 0, data: [1] }]);
  fcs[23] = 0x10; // FCS length bits above the link type
  t.equal(all(fcs)[0]?.linkType, 1, 'link type is the low 16 bits of "network"');
});

t.test('pcapng: sections, byte orders, interfaces, tsresol, EPB/SPB/OPB, skipped blocks', async (t) => {
  const frame = [1, 2, 3, 4, 5];
  const input = bytes(
    shb(true, 1, [...option(true, 4, [...Buffer.from('test')]), ...endOfOpt(true)]),
    idb(true, 1, 0), // default resolution: µs
    idb(true, 101, 3, { tsresol: 9, name: 'raw0' }), // ns, snaplen 3
    idb(true, 228, 0, { tsresol: 0x80 | 10, tsoffset: 100n }), // 2^-10 s, offset 100 s
    block(true, 4, [0, 0, 0, 0]), // name resolution block: skipped
    epb(true, 0, 1_500_000n, frame), // 1.5 s in µs
    epb(true, 1, 2_000_000_001n, frame.slice(0, 3), 5, [...option(true, 1, [...Buffer.from('hi')]), ...endOfOpt(true)]),
    block(true, 5, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]), // interface statistics: skipped
    epb(true, 2, 1536n, [9]), // 1.5 s in 2^-10 units, +100 s
    block(true, 0x40000bad, [1, 2, 3]), // custom block: skipped
    spb(true, frame, 5), // interface 0 (snaplen 0 = unlimited)
    opb(true, 1, 7n, [8, 8]),
    // A second section, big-endian, with its own interfaces.
    shb(false),
    idb(false, 276, 0, { tsresol: 3 }),
    epb(false, 0, 42n, [7, 7, 7]),
    spb(false, [1, 2, 3, 4, 5, 6, 7, 8], 8),
  );
  const got = all(input).map((r) => ({ f: r.frame, ts: r.timestampNs, lt: r.linkType, if: r.interfaceId, d: [...r.data], len: r.originalLength }));
  t.same(got, [
    { f: 1, ts: 1_500_000_000n, lt: 1, if: 0, d: frame, len: 5 },
    { f: 2, ts: 2_000_000_001n, lt: 101, if: 1, d: [1, 2, 3], len: 5 },
    { f: 3, ts: 101_500_000_000n, lt: 228, if: 2, d: [9], len: 1 },
    { f: 4, ts: 0n, lt: 1, if: 0, d: frame, len: 5 },
    { f: 5, ts: 7n, lt: 101, if: 1, d: [8, 8], len: 2 },
    { f: 6, ts: 42_000_000n, lt: 276, if: 0, d: [7, 7, 7], len: 3 },
    { f: 7, ts: 0n, lt: 276, if: 0, d: [1, 2, 3, 4, 5, 6, 7, 8], len: 8 },
  ]);
  // SPB captured length is capped by the interface snaplen.
  const capped = all(bytes(shb(true), idb(true, 1, 4), spb(true, [1, 2, 3, 4], 9)));
  t.same(capped.map((r) => [[...r.data], r.originalLength]), [[[1, 2, 3, 4], 9]]);
});

t.test('malformed and truncated input: typed errors', async (t) => {
  const pcap = classicPcap(true, false, 1, [{ sec: 1, frac: 1, data: [1, 2, 3] }]);
  t.equal(codeOf(() => all(new Uint8Array(0))), 'ERR_CAPTURE_TRUNCATED', 'empty');
  t.equal(codeOf(() => all(pcap.subarray(0, 3))), 'ERR_CAPTURE_TRUNCATED', 'three bytes');
  t.equal(codeOf(() => all(pcap.subarray(0, 23))), 'ERR_CAPTURE_TRUNCATED', 'half a global header');
  t.equal(codeOf(() => all(pcap.subarray(0, 30))), 'ERR_CAPTURE_TRUNCATED', 'half a record header');
  t.equal(codeOf(() => all(pcap.subarray(0, pcap.length - 1))), 'ERR_CAPTURE_TRUNCATED', 'record cut short');
  t.equal(codeOf(() => all(Uint8Array.from(Buffer.from('GIF89a, not a capture at all')))), 'ERR_CAPTURE_FORMAT', 'bad magic');
  t.equal(codeOf(() => all(Uint8Array.of(0x7f, 0x45, 0x4c, 0x46))), 'ERR_CAPTURE_FORMAT', 'bad magic, 4 bytes: known before the header is complete');
  const v3 = Uint8Array.from(pcap);
  v3[4] = 3;
  t.equal(codeOf(() => all(v3)), 'ERR_CAPTURE_UNSUPPORTED', 'pcap version 3');
  const kuz = Uint8Array.from(pcap);
  kuz.set([0x34, 0xcd, 0xb2, 0xa1], 0);
  t.equal(codeOf(() => all(kuz)), 'ERR_CAPTURE_UNSUPPORTED', 'modified pcap');
  const huge = Uint8Array.from(pcap);
  huge.set([0xff, 0xff, 0xff, 0xff], 24 + 8);
  t.equal(codeOf(() => all(huge)), 'ERR_CAPTURE_FORMAT', 'caplen 4 GiB');

  const good = bytes(shb(true), idb(true, 1, 0), epb(true, 0, 0n, [1]));
  t.equal(codeOf(() => all(good)), 'none');
  t.equal(codeOf(() => all(good.subarray(0, good.length - 1))), 'ERR_CAPTURE_TRUNCATED', 'pcapng cut short');
  const zeroLen = bytes(shb(true), [1, 0, 0, 0, 0, 0, 0, 0]);
  t.equal(codeOf(() => all(zeroLen)), 'ERR_CAPTURE_FORMAT', 'block length 0');
  const odd = bytes(shb(true), [1, 0, 0, 0, 13, 0, 0, 0]);
  t.equal(codeOf(() => all(odd)), 'ERR_CAPTURE_FORMAT', 'block length not a multiple of 4');
  const big = bytes(shb(true), [1, 0, 0, 0, 0xfc, 0xff, 0xff, 0xff]);
  t.equal(codeOf(() => all(big)), 'ERR_CAPTURE_FORMAT', 'block length 4 GiB');
  const trail = Uint8Array.from(good);
  trail[trail.length - 4] = (trail[trail.length - 4] ?? 0) ^ 4;
  t.equal(codeOf(() => all(trail)), 'ERR_CAPTURE_FORMAT', 'trailing length differs');
  t.equal(codeOf(() => all(bytes(shb(true), idb(true, 1, 0), epb(true, 1, 0n, [1])))), 'ERR_CAPTURE_FORMAT', 'unknown interface');
  t.equal(codeOf(() => all(bytes(shb(true), spb(true, [1])))), 'ERR_CAPTURE_FORMAT', 'SPB before any IDB');
  t.equal(codeOf(() => all(bytes(shb(true, 2)))), 'ERR_CAPTURE_UNSUPPORTED', 'pcapng 2.0');
  const bom = bytes(shb(true));
  bom[8] = 0;
  t.equal(codeOf(() => all(bom)), 'ERR_CAPTURE_FORMAT', 'SHB without byte-order magic');
  const capOver = bytes(shb(true), idb(true, 1, 0), epb(true, 0, 0n, [1, 2, 3, 4]));
  capOver.set([200, 0, 0, 0], 28 + 20 + 20); // EPB captured length 200 > block
  t.equal(codeOf(() => all(capOver)), 'ERR_CAPTURE_FORMAT', 'EPB data overruns its block');
  const badOpt = bytes(shb(true), block(true, 1, [1, 0, 0, 0, 0, 0, 0, 0, 9, 0, 100, 0]));
  t.equal(codeOf(() => all(badOpt)), 'ERR_CAPTURE_FORMAT', 'IDB option overruns its block');

  const err = (() => {
    try {
      all(zeroLen);
    } catch (e) {
      return e;
    }
    return undefined;
  })();
  t.ok(err instanceof CaptureError && err instanceof Error);
  t.match(err, { name: 'CaptureError', code: 'ERR_CAPTURE_FORMAT', offset: 28 }, 'offset points at the bad block');
});

t.test('CaptureReader: records as they complete, errors early, state after end/failure', async (t) => {
  const pcap = classicPcap(false, true, 1, [
    { sec: 1, frac: 5, data: [1, 2, 3] },
    { sec: 2, frac: 6, data: [4] },
  ]);
  const r = new CaptureReader();
  t.same(r.push(pcap.subarray(0, 24 + 16 + 2)), [], 'nothing complete yet');
  const first = r.push(pcap.subarray(42, 43 + 16));
  t.same(first.map((x) => x.frame), [1]);
  t.same(r.push(pcap.subarray(59)).map((x) => [...x.data]), [[4]]);
  t.same(r.end(), []);
  t.equal(r.frames, 2);
  t.equal(codeOf(() => r.push(Uint8Array.of(1))), 'ERR_CAPTURE_STATE', 'push after end');

  // A corrupt length fails at once instead of waiting for 4 GiB.
  const hdr = Uint8Array.from(pcap.subarray(0, 24 + 16));
  hdr.set([0xff, 0xff, 0xff, 0xff], 24 + 8);
  const r2 = new CaptureReader();
  t.equal(codeOf(() => r2.push(hdr)), 'ERR_CAPTURE_FORMAT');
  t.equal(codeOf(() => r2.push(Uint8Array.of(0))), 'ERR_CAPTURE_FORMAT', 'the failure sticks');
  t.equal(codeOf(() => r2.end()), 'ERR_CAPTURE_FORMAT');

  // feed() takes the chunk at once; unread records wait for the next call.
  const r3 = new CaptureReader();
  void r3.feed(pcap);
  t.same(r3.end().map((x) => x.frame), [1, 2]);

  t.same([...readCaptureChunks([pcap.subarray(0, 10), pcap.subarray(10)])].length, 2);
  t.equal(codeOf(() => [...readCaptureChunks([pcap.subarray(0, 50)])]), 'ERR_CAPTURE_TRUNCATED');
});

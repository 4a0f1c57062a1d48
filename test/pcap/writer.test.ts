import t from 'tap';
import { readCapture } from '../../src/pcap/reader.js';
import { PcapWriter, PcapngWriter } from '../../src/pcap/writer.js';
import { parseFrame, parseIpAddress } from '../../src/wire/frame.js';
import { hex, plain, toHex, xorshift32 } from './fixtures.js';

function memory(): { sink: (c: Uint8Array) => void; bytes: () => Uint8Array; chunks: Uint8Array[] } {
  const chunks: Uint8Array[] = [];
  return { sink: (c) => chunks.push(c), bytes: () => Uint8Array.from(Buffer.concat(chunks)), chunks };
}
const ip = (s: string): Uint8Array => parseIpAddress(s) ?? new Uint8Array(0);

t.test('golden: classic pcap header and records (µs and ns)', async (t) => {
  const m = memory();
  const w = new PcapWriter(m.sink);
  t.equal(toHex(m.bytes()), toHex(hex('d4c3b2a1 0200 0400 00000000 00000000 00000400 01000000')), 'global header: LE µs, 2.4, snaplen 262144, Ethernet');
  w.writeFrame(1_700_000_000_123_456_789n, [Uint8Array.of(0xaa), Uint8Array.of(0xbb, 0xcc)]);
  t.equal(
    toHex(m.chunks[1] ?? new Uint8Array(0)),
    toHex(hex('00f15365 40e20100 03000000 03000000 aabbcc')),
    'record: 1700000000 s, 123456 µs (truncated, not rounded), lengths 3/3, data',
  );
  const n = memory();
  const wn = new PcapWriter(n.sink, { precision: 'ns', linkType: 101, snapLength: 2 });
  wn.writeFrame(5_000_000_007n, Uint8Array.of(1, 2, 3));
  t.equal(toHex(n.bytes()), toHex(hex('4d3cb2a1 0200 0400 00000000 00000000 02000000 65000000' + '05000000 07000000 02000000 03000000 0102')), 'ns magic, snaplen cut, original length kept');
  t.equal(wn.framesWritten, 1);
  t.throws(() => wn.writeFrame(-1n, new Uint8Array(1)), RangeError);
  t.throws(() => wn.writeFrame(1n << 64n, new Uint8Array(1)), RangeError);
  t.throws(() => new PcapWriter(n.sink, { snapLength: 0 }), RangeError);
});

t.test('golden: pcapng SHB, IDB, EPB with options', async (t) => {
  const m = memory();
  const w = new PcapngWriter(m.sink, { application: 'x', name: 'e' });
  w.writeFrame(0x1_0000_0002n, Uint8Array.of(0xde, 0xad, 0xbe), { direction: 'out', comment: 'c' });
  t.same(m.chunks.map((c) => c.length), [40, 40, 56]);
  t.equal(
    toHex(m.bytes()),
    toHex(
      hex(`
      0a0d0d0a 28000000 4d3c2b1a 0100 0000 ffffffffffffffff   // SHB, LE, 1.0, section length -1
      0400 0100 78000000 0000 0000 28000000                   // shb_userappl "x", end of options
      01000000 28000000 0100 0000 00000400                    // IDB: Ethernet, snaplen 262144
      0200 0100 65000000 0900 0100 09000000 0000 0000 28000000 // if_name "e", if_tsresol 9 (ns)
      06000000 38000000 00000000 01000000 02000000 03000000 03000000 deadbe00 // EPB: if 0, ts hi/lo, lengths, padded data
      0100 0100 63000000 0200 0400 02000000 0000 0000 38000000 // comment "c", epb_flags outbound
    `),
    ),
  );
});

t.test('round trips: pcap µs/ns and pcapng with several interfaces', async (t) => {
  const rnd = xorshift32(2024);
  const frames = Array.from({ length: 200 }, (_, i) => ({
    ts: BigInt(1_700_000_000 + i) * 1_000_000_000n + BigInt(rnd() % 1_000_000_000),
    data: Uint8Array.from({ length: rnd() % 1600 }, () => rnd() & 0xff),
  }));
  for (const precision of ['us', 'ns'] as const) {
    const m = memory();
    const w = new PcapWriter(m.sink, { precision });
    for (const f of frames) w.writeFrame(f.ts, [f.data.subarray(0, 7), f.data.subarray(7)]);
    const got = [...readCapture(m.bytes())];
    t.same(
      got.map(plain),
      frames.map((f, i) => plain({ frame: i + 1, timestampNs: precision === 'ns' ? f.ts : (f.ts / 1000n) * 1000n, linkType: 1, data: f.data, originalLength: f.data.length, interfaceId: 0 })),
      `pcap ${precision}`,
    );
  }
  const m = memory();
  const w = new PcapngWriter(m.sink);
  const ifs = [0, w.addInterface({ linkType: 101, precision: 'us' }), w.addInterface({ linkType: 276, snapLength: 100 })];
  frames.forEach((f, i) => w.writeFrame(f.ts, f.data, { interfaceId: ifs[i % 3] ?? 0 }));
  const got = [...readCapture(m.bytes())];
  t.same(
    got.map(plain),
    frames.map((f, i) => {
      const ifId = i % 3;
      const data = ifId === 2 ? f.data.subarray(0, 100) : f.data;
      const ts = ifId === 1 ? (f.ts / 1000n) * 1000n : f.ts;
      return plain({ frame: i + 1, timestampNs: ts, linkType: [1, 101, 276][ifId] ?? 0, data, originalLength: f.data.length, interfaceId: ifId });
    }),
    'pcapng',
  );
  t.throws(() => w.writeFrame(0n, new Uint8Array(1), { interfaceId: 3 }), RangeError);
});

t.test('writeRoce wraps a RoCEv2 payload that parses back, on every emit link type', async (t) => {
  const bth = hex('0400ffff00000011 00000001'); // RC SEND_ONLY to QP 0x11, PSN 1
  const icrc = hex('01020304');
  for (const linkType of [1, 101, 228, 229]) {
    const v6 = linkType === 229;
    const frame = { src: ip(v6 ? 'fd77::2' : '10.77.0.2'), dst: ip(v6 ? 'fd77::3' : '10.77.0.3'), ipId: 7 };
    for (const kind of ['pcap', 'pcapng'] as const) {
      const m = memory();
      const w = kind === 'pcap' ? new PcapWriter(m.sink, { linkType }) : new PcapngWriter(m.sink, { linkType });
      w.writeRoce(9n, frame, [bth, icrc]);
      w.writeRoce(10n, { ...frame, srcPort: 50000, dstPort: 4792 }, bth);
      const recs = [...readCapture(m.bytes())];
      t.equal(recs.length, 2);
      const p = parseFrame(linkType, recs[0]?.data ?? new Uint8Array(0));
      if (!p.ok) {
        t.fail(`${kind} ${linkType}: ${p.error}`);
        continue;
      }
      t.match(p.frame.udp, { srcPort: 0xc000, dstPort: 4791, length: 8 + 16 }, `${kind} ${linkType}: default ports`);
      t.equal(toHex(recs[0]?.data.subarray(p.frame.payloadOffset) ?? new Uint8Array(0)), toHex(bth) + toHex(icrc));
      const p2 = parseFrame(linkType, recs[1]?.data ?? new Uint8Array(0));
      t.match(p2.ok && p2.frame.udp, { srcPort: 50000, dstPort: 4792 });
    }
  }
  t.throws(() => new PcapWriter(() => undefined, { linkType: 113 }).writeRoce(0n, { src: ip('1.2.3.4'), dst: ip('1.2.3.5') }, bth), RangeError);
  const small = memory();
  new PcapngWriter(small.sink, { snapLength: 20 }).writeRoce(1n, { src: ip('1.2.3.4'), dst: ip('1.2.3.5') }, bth);
  const [rec] = [...readCapture(small.bytes())];
  t.match(rec, { originalLength: 14 + 20 + 8 + 12 }, 'snapped RoCE frame keeps its original length');
  t.equal(rec?.data.length, 20);
});

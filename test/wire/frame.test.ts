import t from 'tap';
import fc from 'fast-check';
import { readCapture } from '../../src/pcap/reader.js';
import {
  type FrameParseResult,
  type ParsedFrame,
  type UdpFrameOptions,
  LinkType,
  emitEthIpv4Udp,
  emitEthIpv6Udp,
  emitUdpFrame,
  emitUdpHeaders,
  formatIpAddress,
  gidFromIp,
  ipFromGid,
  ipv4Checksum,
  isIpv4MappedGid,
  parseFrame,
  parseIpAddress,
  udpFrameLength,
  udpHeadersLength,
} from '../../src/wire/frame.js';
import { RXE_FIXTURES, hex, readFixture, toHex, xorshift32 } from '../pcap/fixtures.js';

// --- oracles, written the slow and obvious way -----------------------------------------------

/** RFC 1071 one's-complement sum of 16-bit big-endian words (odd tail padded with zero). */
function onesSum(bytes: readonly number[]): number {
  let s = 0;
  for (let i = 0; i < bytes.length; i += 2) {
    s += ((bytes[i] ?? 0) << 8) + (bytes[i + 1] ?? 0);
    while (s > 0xffff) s = (s & 0xffff) + 1;
  }
  return s;
}

/** A correct IPv4 header sums, checksum included, to 0xffff. */
function ipv4HeaderSumsToFfff(frame: Uint8Array, ipOffset: number, ihl: number): boolean {
  return onesSum([...frame.subarray(ipOffset, ipOffset + ihl)]) === 0xffff;
}

/** The UDP checksum recomputed from a built pseudo-header; 0xffff when the stored one is right. */
function udpSumWithPseudo(src: Uint8Array, dst: Uint8Array, udpSegment: Uint8Array): number {
  const len = udpSegment.length;
  const pseudo =
    src.length === 4
      ? [...src, ...dst, 0, 17, len >> 8, len & 0xff]
      : [...src, ...dst, 0, 0, len >> 8, len & 0xff, 0, 0, 0, 17];
  return onesSum([...pseudo, ...udpSegment]);
}

function ok(r: FrameParseResult): ParsedFrame {
  if (!r.ok) throw new Error(`parse failed: ${r.error} ${r.detail ?? ''}`);
  return r.frame;
}

const ip = (s: string): Uint8Array => {
  const a = parseIpAddress(s);
  if (a === undefined) throw new Error(`bad test address ${s}`);
  return a;
};

const concat = (parts: readonly Uint8Array[]): Uint8Array => Uint8Array.from(parts.flatMap((p) => [...p]));

// --- golden emits ------------------------------------------------------------------------------

t.test('golden: Ethernet + IPv4 + UDP into a 0xa5 buffer at offset 10', async (t) => {
  const out = new Uint8Array(10 + 46 + 7).fill(0xa5);
  const opts: UdpFrameOptions = {
    src: ip('10.77.0.3'),
    dst: ip('10.77.0.2'),
    srcPort: 0xc1a2,
    dstPort: 4791,
    srcMac: hex('525400abcdef'),
    dstMac: hex('525400123456'),
    ipId: 0x485b,
    tos: 0x02,
    ttl: 64,
  };
  const frame = emitUdpFrame(opts, [Uint8Array.of(0x0a, 0x0b, 0x0c), Uint8Array.of(0x0d)], out, 10);
  const expected = hex(`
    525400123456 525400abcdef 0800          // dst MAC, src MAC, IPv4
    45 02 0020 485b 4000 40 11 ddd1         // v4 IHL 5, TOS 2, len 32, id, DF, TTL 64, UDP, checksum
    0a4d0003 0a4d0002                       // 10.77.0.3 -> 10.77.0.2
    c1a2 12b7 000c 0000                     // ports, UDP length 12, checksum 0 (rxe sends none)
    0a0b0c0d                                // payload parts, in order
  `);
  t.equal(frame.length, 46);
  t.equal(frame.byteOffset - out.byteOffset, 10, 'returned view starts at the offset');
  t.equal(toHex(out.subarray(10, 56)), toHex(expected), 'every byte');
  t.same([...out.subarray(0, 10)], new Array(10).fill(0xa5), 'nothing before the offset is touched');
  t.same([...out.subarray(56)], new Array(7).fill(0xa5), 'nothing after the frame is touched');
  t.ok(ipv4HeaderSumsToFfff(frame, 14, 20), 'one\'s-complement sum of the header is 0xffff');
  t.equal(ipv4Checksum(frame, 14, 20), 0, 'ipv4Checksum over a correct header is 0');
  t.equal(udpFrameLength(opts, 4), 46);
  t.equal(udpHeadersLength(opts), 42);
});

t.test('golden: Ethernet + IPv6 + UDP with computed checksum over odd-length parts', async (t) => {
  const out = new Uint8Array(10 + 67).fill(0xa5);
  const opts: UdpFrameOptions = { src: ip('fd77::3'), dst: ip('fd77::2'), srcPort: 0xc000, dstPort: 4791, tos: 0x0a, flowLabel: 0x12345 };
  const parts = [Uint8Array.of(0x11, 0x22, 0x33), Uint8Array.of(0x44, 0x55)];
  const frame = emitUdpFrame(opts, parts, out, 10);
  const expected = hex(`
    020000000002 020000000003 86dd          // default MACs 02:00 + low 4 bytes of the IP
    60a12345 000d 11 40                     // v6, TC 0x0a, flow 0x12345, payload 13, UDP, hop limit 64
    fd770000000000000000000000000003        // src
    fd770000000000000000000000000002        // dst
    c000 12b7 000d 98c1                     // ports, length 13, checksum (computed by hand)
    1122334455
  `);
  t.equal(toHex(out.subarray(10, 10 + 67)), toHex(expected), 'every byte');
  t.equal(frame.length, 67);
  t.equal(udpSumWithPseudo(opts.src, opts.dst, frame.subarray(54)), 0xffff, 'checksum verifies against the pseudo-header');
  const zero = emitUdpFrame({ ...opts, udpChecksum: 'zero' }, parts);
  t.equal(toHex(zero.subarray(60, 62)), '0000', "udpChecksum: 'zero' leaves it 0, as rxe sends");
});

t.test('golden: 802.1Q tag, raw IP link types, IPv4 without DF', async (t) => {
  const base = { src: ip('10.0.0.1'), dst: ip('10.0.0.2'), srcPort: 1, dstPort: 4791 };
  const tagged = emitUdpFrame({ ...base, vlanTci: 0x6005, dontFragment: false, ttl: 1 }, new Uint8Array(0));
  t.equal(toHex(tagged.subarray(0, 18)), '02000a000002' + '02000a000001' + '81006005' + '0800', 'MACs 02:00:<IPv4>');
  t.equal(toHex(tagged.subarray(18 + 6, 18 + 10)), '0000' + '0111', 'flags 0, TTL 1, UDP');
  t.ok(ipv4HeaderSumsToFfff(tagged, 18, 20));
  const raw = emitUdpFrame({ ...base, linkType: LinkType.RAW }, Uint8Array.of(9));
  t.equal(raw.length, 29);
  t.equal(raw[0], 0x45, 'raw IP starts with the IP header');
  t.throws(() => emitUdpFrame({ ...base, linkType: LinkType.IPV6 }, new Uint8Array(0)), RangeError);
  t.throws(() => emitUdpFrame({ ...base, family: 6 }, new Uint8Array(0)), RangeError, 'family must match the addresses');
  t.throws(() => emitUdpFrame({ ...base, dst: ip('::1') }, new Uint8Array(0)), RangeError, 'mixed families');
  t.throws(() => emitUdpFrame(base, new Uint8Array(10), new Uint8Array(40)), RangeError, 'buffer too small');
  t.throws(() => emitUdpFrame({ ...base, srcPort: 70000 }, new Uint8Array(0)), RangeError);
  t.throws(() => emitUdpFrame({ ...base, linkType: 113 as 1 }, new Uint8Array(0)), RangeError, 'SLL cannot be emitted');
  t.equal(toHex(emitEthIpv4Udp(base, Uint8Array.of(7))), toHex(emitUdpFrame(base, Uint8Array.of(7))));
  t.throws(() => emitEthIpv6Udp(base, Uint8Array.of(7)), RangeError);
});

t.test('emitUdpHeaders writes only headers and returns the payload offset', async (t) => {
  const opts: UdpFrameOptions = { src: ip('fd77::2'), dst: ip('fd77::3'), srcPort: 5, dstPort: 4791 };
  const payload = [Uint8Array.of(1, 2), Uint8Array.of(3)];
  const out = new Uint8Array(100).fill(0xa5);
  const end = emitUdpHeaders(opts, payload, out, 3);
  t.equal(end, 3 + 14 + 40 + 8);
  t.equal(out[end], 0xa5, 'payload area untouched');
  out.set(concat(payload), end);
  t.equal(toHex(out.subarray(3, end + 3)), toHex(emitUdpFrame(opts, payload)));
});

t.test('ipv4Checksum matches the RFC 1071 example and the oracle', async (t) => {
  // RFC 1071 §3: bytes 00 01 f2 03 f4 f5 f6 f7 sum to 0xddf2, so the checksum is ~0xddf2.
  t.equal(ipv4Checksum(hex('0001f203f4f5f6f7'), 0, 8), ~0xddf2 & 0xffff);
  t.equal(ipv4Checksum(hex('ff0001f203f4f5f6f7'), 1, 8), ~0xddf2 & 0xffff, 'honours the offset');
  const rnd = xorshift32(7);
  for (let i = 0; i < 200; i++) {
    const n = 1 + (rnd() % 80);
    const b = Uint8Array.from({ length: n }, () => rnd() & 0xff);
    t.equal(ipv4Checksum(b, 0, n), ~onesSum([...b]) & 0xffff, `random ${n} bytes`);
  }
});

// --- parsing real captures ---------------------------------------------------------------------

t.test('every RoCEv2 frame of the rxe captures parses, and re-emitting it gives the same bytes', async (t) => {
  for (const [file, want] of Object.entries(RXE_FIXTURES)) {
    let roce = 0;
    let reemitted = 0;
    const hosts = new Set<string>();
    for (const rec of readCapture(readFixture(file))) {
      const r = parseFrame(rec.linkType, rec.data);
      if (!r.ok) {
        // ARP and the like; never a UDP/IP problem in these captures.
        if (r.error !== 'NOT_IP' && r.error !== 'NOT_UDP') t.fail(`${file} #${rec.frame}: ${r.error} ${r.detail ?? ''}`);
        continue;
      }
      const f = r.frame;
      if (f.udp.dstPort !== 4791) continue;
      roce++;
      hosts.add(formatIpAddress(f.ip.src)).add(formatIpAddress(f.ip.dst));
      if (f.ip.family === 4) {
        if (!ipv4HeaderSumsToFfff(rec.data, f.ipOffset, f.ip.headerLength)) t.fail(`${file} #${rec.frame}: IPv4 checksum`);
        if (!(f.ip.dontFragment && f.ip.ttl === 64 && f.ip.tos === 0)) t.fail(`${file} #${rec.frame}: DF/TTL/TOS`);
      }
      // Rebuild the frame from what was parsed: it must match the capture byte for byte.
      const opts: UdpFrameOptions = {
        src: f.ip.src,
        dst: f.ip.dst,
        srcPort: f.udp.srcPort,
        dstPort: f.udp.dstPort,
        dstMac: rec.data.subarray(0, 6),
        srcMac: rec.data.subarray(6, 12),
        udpChecksum: f.udp.checksum === 0 ? 'zero' : 'compute',
        ...(f.ip.family === 4
          ? { ipId: f.ip.id, ttl: f.ip.ttl, tos: f.ip.tos, dontFragment: f.ip.dontFragment }
          : { ttl: f.ip.hopLimit, tos: f.ip.trafficClass, flowLabel: f.ip.flowLabel }),
      };
      const again = emitUdpFrame(opts, rec.data.subarray(f.payloadOffset, f.payloadOffset + f.payloadLength));
      if (toHex(again) === toHex(rec.data.subarray(0, f.payloadOffset + f.payloadLength))) reemitted++;
      else t.fail(`${file} #${rec.frame}: re-emitted frame differs`);
    }
    t.equal(roce, want.roce, `${file}: RoCEv2 frames`);
    t.equal(reemitted, want.roce, `${file}: all re-emitted identically`);
    t.same([...hosts].sort(), want.hosts, `${file}: addresses`);
  }
});

t.test('a known frame: rc_pingpong.pcap #18', async (t) => {
  const rec = [...readCapture(readFixture('rc_pingpong.pcap'))][17];
  if (rec === undefined) throw new Error('frame 18 missing');
  const f = ok(parseFrame(rec.linkType, rec.data));
  // Values from `tshark -r rc_pingpong.pcap -Y frame.number==18 -V`.
  t.match(f, { linkType: 1, ipOffset: 14, udpOffset: 34, payloadOffset: 42, payloadLength: 1040 });
  t.match(f.ip, { family: 4, headerLength: 20, id: 0x485b, checksum: 0xd9c7, protocol: 17, flagsFrag: 0x4000, totalLength: 1068 });
  t.same(f.udp, { srcPort: 49458, dstPort: 4791, length: 1048, checksum: 0 });
  t.equal(f.ip.src.buffer, rec.data.buffer, 'addresses are views, not copies');
});

// --- parsing edge cases ------------------------------------------------------------------------

const V4 = { src: ip('192.0.2.1'), dst: ip('192.0.2.2'), srcPort: 1000, dstPort: 4791 } as const;
const V6 = { src: ip('2001:db8::1'), dst: ip('2001:db8::2'), srcPort: 1000, dstPort: 4791 } as const;
const PAY = Uint8Array.of(1, 2, 3, 4, 5, 6);

/** Replace `frame[at .. at+del)` with `ins`. */
function splice(frame: Uint8Array, at: number, del: number, ins: readonly number[]): Uint8Array {
  return Uint8Array.from([...frame.subarray(0, at), ...ins, ...frame.subarray(at + del)]);
}

function errorOf(r: FrameParseResult): string {
  return r.ok ? 'ok' : r.error;
}

t.test('link layers: VLAN tags, SLL, SLL2, raw IP', async (t) => {
  const eth = emitUdpFrame(V4, PAY);
  const one = splice(eth, 12, 0, [0x81, 0x00, 0x00, 0x05]);
  t.equal(ok(parseFrame(1, one)).ipOffset, 18, 'one 802.1Q tag');
  const two = splice(eth, 12, 0, [0x88, 0xa8, 0x00, 0x64, 0x81, 0x00, 0x00, 0x05]);
  t.equal(ok(parseFrame(1, two)).payloadOffset, 22 + 28, 'Q-in-Q');
  const three = splice(two, 12, 0, [0x81, 0x00, 0x00, 0x01]);
  t.equal(errorOf(parseFrame(1, three)), 'NOT_IP', 'three tags are refused');

  const ipPacket = eth.subarray(14);
  const sll = Uint8Array.from([0, 0, 0, 1, 0, 6, 1, 2, 3, 4, 5, 6, 0, 0, 0x08, 0x00, ...ipPacket]);
  t.match(ok(parseFrame(LinkType.LINUX_SLL, sll)), { linkType: 113, ipOffset: 16, payloadLength: 6 });
  const sll2 = Uint8Array.from([0x08, 0x00, 0, 0, 0, 0, 0, 3, 0, 1, 4, 6, 1, 2, 3, 4, 5, 6, 0, 0, ...ipPacket]);
  t.match(ok(parseFrame(LinkType.LINUX_SLL2, sll2)), { linkType: 276, ipOffset: 20 });
  const sllVlan = Uint8Array.from([0, 0, 0, 1, 0, 6, 1, 2, 3, 4, 5, 6, 0, 0, 0x81, 0x00, 0, 7, 0x08, 0x00, ...ipPacket]);
  t.equal(ok(parseFrame(LinkType.LINUX_SLL, sllVlan)).ipOffset, 20, 'SLL with an unstripped tag');

  const raw6 = emitUdpFrame({ ...V6, linkType: LinkType.RAW }, PAY);
  t.match(ok(parseFrame(LinkType.RAW, raw6)), { ipOffset: 0, udpOffset: 40, payloadOffset: 48 });
  t.match(ok(parseFrame(LinkType.RAW, ipPacket)).ip, { family: 4 });
  t.equal(errorOf(parseFrame(LinkType.IPV4, raw6)), 'BAD_IP_VERSION');
  t.equal(errorOf(parseFrame(LinkType.IPV6, ipPacket)), 'BAD_IP_VERSION');
  t.ok(parseFrame(LinkType.IPV6, raw6).ok);
  t.equal(errorOf(parseFrame(LinkType.RAW, Uint8Array.of(0x55, 0))), 'BAD_IP_VERSION');
  t.equal(errorOf(parseFrame(147, eth)), 'UNSUPPORTED_LINKTYPE');
  t.equal(errorOf(parseFrame(1, splice(eth, 12, 2, [0x08, 0x06]))), 'NOT_IP', 'ARP');
  t.equal(errorOf(parseFrame(1, splice(eth, 14, 1, [0x65]))), 'BAD_IP_VERSION', 'ethertype IPv4, version 6');
});

t.test('IPv4: options, padding, fragments, protocols, lengths', async (t) => {
  const eth = emitUdpFrame(V4, PAY);
  // IHL 6 with a 4-byte NOP option block; fix total length and checksum.
  const withOpt = splice(eth, 34, 0, [1, 1, 1, 0]);
  withOpt[14] = 0x46;
  withOpt[17] = (withOpt[17] ?? 0) + 4;
  const f = ok(parseFrame(1, withOpt));
  t.match(f, { udpOffset: 38, payloadOffset: 46, payloadLength: 6 });
  t.match(f.ip, { headerLength: 24 });
  t.same([...withOpt.subarray(f.payloadOffset, f.payloadOffset + 6)], [...PAY]);

  const padded = Uint8Array.from([...eth, 0, 0, 0, 0, 0, 0, 0, 0]);
  t.equal(ok(parseFrame(1, padded)).payloadLength, 6, 'Ethernet padding is not payload');

  const frag = (flagsFrag: number): string => errorOf(parseFrame(1, splice(eth, 20, 2, [flagsFrag >> 8, flagsFrag & 0xff])));
  t.equal(frag(0x2000), 'IP_FRAGMENT', 'MF set: first fragment');
  t.equal(frag(0x0010), 'IP_FRAGMENT', 'non-first fragment');
  t.equal(frag(0x4000), 'ok', 'DF alone is fine');
  t.equal(frag(0x8000), 'ok', 'the reserved bit does not make a fragment');

  t.equal(errorOf(parseFrame(1, splice(eth, 23, 1, [6]))), 'NOT_UDP', 'TCP');
  t.equal(errorOf(parseFrame(1, splice(eth, 14, 1, [0x44]))), 'BAD_IP_HEADER', 'IHL 4');
  t.equal(errorOf(parseFrame(1, splice(eth, 16, 2, [0, 19]))), 'BAD_IP_HEADER', 'total length < header');
  t.equal(errorOf(parseFrame(1, splice(eth, 16, 2, [0, 200]))), 'TRUNCATED', 'total length past the frame');
  t.equal(errorOf(parseFrame(1, splice(eth, 38, 2, [0, 7]))), 'BAD_UDP_LENGTH', 'UDP length 7');
  t.equal(errorOf(parseFrame(1, splice(eth, 38, 2, [0, 15]))), 'BAD_UDP_LENGTH', 'UDP length past the IP payload');
  const shortUdp = ok(parseFrame(1, splice(eth, 38, 2, [0, 10])));
  t.equal(shortUdp.payloadLength, 2, 'UDP shorter than the IP payload is taken at its word');
  t.equal(errorOf(parseFrame(1, splice(eth, 16, 2, [0, 27]))), 'TRUNCATED', 'IP payload too short for a UDP header');
});

t.test('IPv6: extension headers, fragments, jumbograms', async (t) => {
  const eth = emitUdpFrame(V6, PAY);
  /** Insert extension headers (each given as [type, bytes]) between the fixed header and UDP. */
  const withExt = (exts: [number, number[]][]): Uint8Array => {
    const types = exts.map(([ty]) => ty);
    let body: number[] = [];
    exts.forEach(([, bytes], i) => {
      body = body.concat([types[i + 1] ?? 17, ...bytes.slice(1)]);
    });
    const out = splice(eth, 54, 0, body);
    out[20] = types[0] ?? 17;
    const plen = 14 + body.length;
    out[18] = plen >> 8;
    out[19] = plen & 0xff;
    return out;
  };
  const hbh = [0, 0, 1, 4, 0, 0, 0, 0]; // next, len 0 (8 bytes), PadN
  const dst16 = [0, 1, 1, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]; // len 1 (16 bytes)
  const rt = [0, 0, 0, 0, 0, 0, 0, 0];
  const f = ok(parseFrame(1, withExt([[0, hbh], [43, rt], [60, dst16]])));
  t.match(f, { udpOffset: 54 + 32, payloadOffset: 54 + 40, payloadLength: 6 });
  t.equal(f.ip.family === 6 ? f.ip.nextHeader : -1, 0, 'nextHeader is the fixed header\'s');
  t.equal(errorOf(parseFrame(1, withExt([[0, hbh], [44, [0, 0, 0, 1, 0, 0, 0, 1]]]))), 'IP_FRAGMENT');
  t.equal(errorOf(parseFrame(1, withExt([[60, [0, 9, 0, 0, 0, 0, 0, 0]]]))), 'BAD_IP_HEADER', 'extension overruns the payload');
  t.equal(errorOf(parseFrame(1, splice(eth, 20, 1, [58]))), 'NOT_UDP', 'ICMPv6');
  t.equal(errorOf(parseFrame(1, splice(eth, 18, 2, [0, 0]))), 'BAD_IP_HEADER', 'jumbogram');
  t.equal(errorOf(parseFrame(1, splice(eth, 18, 2, [0, 99]))), 'TRUNCATED');
  t.equal(errorOf(parseFrame(1, splice(eth, 58, 2, [0, 99]))), 'BAD_UDP_LENGTH');
  const v = ok(parseFrame(1, eth));
  t.match(v.ip, { family: 6, trafficClass: 0, flowLabel: 0, payloadLength: 14, hopLimit: 64 });
});

t.test('every truncation of a frame is TRUNCATED, never a throw', async (t) => {
  for (const opts of [V4, V6, { ...V4, vlanTci: 3 }]) {
    const eth = emitUdpFrame(opts, PAY);
    for (let n = 0; n < eth.length; n++) {
      const r = parseFrame(1, eth.subarray(0, n));
      if (errorOf(r) !== 'TRUNCATED') t.fail(`prefix ${n}: ${errorOf(r)}`);
    }
    t.ok(parseFrame(1, eth).ok);
  }
});

// --- properties and fuzz -----------------------------------------------------------------------

const arbAddrPair = fc.oneof(
  fc.tuple(fc.uint8Array({ minLength: 4, maxLength: 4 }), fc.uint8Array({ minLength: 4, maxLength: 4 })),
  fc.tuple(fc.uint8Array({ minLength: 16, maxLength: 16 }), fc.uint8Array({ minLength: 16, maxLength: 16 })),
);
const arbOpts = fc.record({
  addrs: arbAddrPair,
  srcPort: fc.integer({ min: 0, max: 0xffff }),
  dstPort: fc.integer({ min: 0, max: 0xffff }),
  tos: fc.integer({ min: 0, max: 0xff }),
  ttl: fc.integer({ min: 0, max: 0xff }),
  ipId: fc.integer({ min: 0, max: 0xffff }),
  dontFragment: fc.boolean(),
  flowLabel: fc.integer({ min: 0, max: 0xfffff }),
  vlan: fc.option(fc.integer({ min: 0, max: 0xffff }), { nil: undefined }),
  raw: fc.boolean(),
  csum: fc.constantFrom('zero' as const, 'compute' as const),
});

t.test('property: parse(emit(x)) gives back x, checksums verify', async (t) => {
  fc.assert(
    fc.property(arbOpts, fc.array(fc.uint8Array({ maxLength: 70 }), { maxLength: 5 }), (o, parts) => {
      const opts: UdpFrameOptions = {
        src: o.addrs[0],
        dst: o.addrs[1],
        srcPort: o.srcPort,
        dstPort: o.dstPort,
        tos: o.tos,
        ttl: o.ttl,
        ipId: o.ipId,
        dontFragment: o.dontFragment,
        flowLabel: o.flowLabel,
        udpChecksum: o.csum,
        ...(o.raw ? { linkType: LinkType.RAW } : o.vlan !== undefined ? { vlanTci: o.vlan } : {}),
      };
      const out = new Uint8Array(udpFrameLength(opts, concat(parts).length) + 3).fill(0xa5);
      const frame = emitUdpFrame(opts, parts, out, 3);
      if (frame.length !== out.length - 3) return false;
      const f = ok(parseFrame(o.raw ? LinkType.RAW : LinkType.ETHERNET, frame));
      const payload = frame.subarray(f.payloadOffset, f.payloadOffset + f.payloadLength);
      if (toHex(payload) !== toHex(concat(parts))) return false;
      if (f.udp.srcPort !== o.srcPort || f.udp.dstPort !== o.dstPort) return false;
      if (toHex(f.ip.src) !== toHex(o.addrs[0]) || toHex(f.ip.dst) !== toHex(o.addrs[1])) return false;
      if (f.ip.family === 4) {
        if (f.ip.tos !== o.tos || f.ip.ttl !== o.ttl || f.ip.id !== o.ipId || f.ip.dontFragment !== o.dontFragment) return false;
        if (!ipv4HeaderSumsToFfff(frame, f.ipOffset, 20)) return false;
      } else if (f.ip.trafficClass !== o.tos || f.ip.hopLimit !== o.ttl || f.ip.flowLabel !== o.flowLabel) {
        return false;
      }
      const seg = frame.subarray(f.udpOffset, f.udpOffset + f.udp.length);
      if (o.csum === 'zero') return f.udp.checksum === 0;
      return f.udp.checksum !== 0 && udpSumWithPseudo(o.addrs[0], o.addrs[1], seg) === 0xffff;
    }),
    { seed: 0x5eed, numRuns: 1500 },
  );
  t.pass('1500 runs');
});

t.test('fuzz: parseFrame never throws and keeps its offsets in bounds', async (t) => {
  const started = Date.now();
  const linkTypes = [1, 101, 113, 228, 229, 276, 0, 9999];
  const inBounds = (data: Uint8Array, r: FrameParseResult): boolean =>
    !r.ok || (r.frame.payloadOffset + r.frame.payloadLength <= data.length && r.frame.ipOffset < r.frame.udpOffset);
  fc.assert(
    fc.property(fc.constantFrom(...linkTypes), fc.uint8Array({ maxLength: 200 }), (lt, data) => inBounds(data, parseFrame(lt, data))),
    { seed: 42, numRuns: 20000 },
  );
  // Mutations of real frames reach deep into the IP and UDP checks.
  const rnd = xorshift32(99);
  const frames = [...readCapture(readFixture('v6_ud_pingpong.pcap')), ...readCapture(readFixture('imm_rc.pcap'))].map((r) => r.data);
  let n = 0;
  for (let round = 0; round < 30; round++) {
    for (const orig of frames) {
      const d = Uint8Array.from(orig);
      const flips = 1 + (rnd() % 4);
      for (let i = 0; i < flips; i++) d[rnd() % Math.min(d.length, 80)] = rnd() & 0xff;
      const cut = d.subarray(0, rnd() % (d.length + 1));
      for (const lt of linkTypes) {
        if (!inBounds(cut, parseFrame(lt, cut))) t.fail('offset out of bounds');
        n++;
      }
    }
  }
  t.ok(n > 10000, `${n} mutated frames`);
  t.ok(Date.now() - started < 20000, 'bounded in time');
});

// --- addresses ---------------------------------------------------------------------------------

t.test('parseIpAddress / formatIpAddress', async (t) => {
  const cases: [string, string, string?][] = [
    ['10.77.0.2', '0a4d0002'],
    ['0.0.0.0', '00000000'],
    ['255.255.255.255', 'ffffffff'],
    ['fd77::2', 'fd770000000000000000000000000002'],
    ['::', '00000000000000000000000000000000'],
    ['::1', '00000000000000000000000000000001'],
    ['fe80::', 'fe800000000000000000000000000000'],
    ['2001:db8:0:0:1:0:0:1', '20010db8000000000001000000000001', '2001:db8::1:0:0:1'],
    ['2001:DB8::A', '20010db800000000000000000000000a', '2001:db8::a'],
    ['1:2:3:4:5:6:7:8', '00010002000300040005000600070008'],
    ['1:0:3:4:5:6:7:8', '00010000000300040005000600070008', '1:0:3:4:5:6:7:8'],
    ['::ffff:10.77.0.2', '00000000000000000000ffff0a4d0002'],
    ['::ffff:0a4d:0002', '00000000000000000000ffff0a4d0002', '::ffff:10.77.0.2'],
    ['1:2:3:4:5:6:1.2.3.4', '00010002000300040005000601020304', '1:2:3:4:5:6:102:304'],
    ['1:0:0:2:0:0:0:3', '00010000000000020000000000000003', '1:0:0:2::3'],
    ['1:0:0:2:0:0:3:4', '00010000000000020000000000030004', '1::2:0:0:3:4'],
  ];
  for (const [text, bytes, formatted] of cases) {
    const b = parseIpAddress(text);
    t.equal(b === undefined ? 'undefined' : toHex(b), bytes, `parse ${text}`);
    if (b !== undefined) t.equal(formatIpAddress(b), formatted ?? text, `format ${text}`);
  }
  const bad = [
    '', '1.2.3', '1.2.3.4.5', '256.1.1.1', '01.2.3.4', '1.2.3.-4', '1..2.3', ' 1.2.3.4', 'a.b.c.d',
    ':', ':::', '1:::2', '1::2::3', '12345::', 'g::', '1:2:3:4:5:6:7', '1:2:3:4:5:6:7:8:9', '1:2:3:4:5:6:7::8',
    '::1.2.3', '1.2.3.4::', 'fe80::1%eth0', '[::1]', '::ffff:1.2.3.4:5', ':1::', '1::2:',
  ];
  for (const text of bad) t.equal(parseIpAddress(text), undefined, `reject ${JSON.stringify(text)}`);
  t.throws(() => formatIpAddress(new Uint8Array(5)), RangeError);
});

t.test('gidFromIp / ipFromGid', async (t) => {
  const v4 = ip('10.77.0.3');
  const gid = gidFromIp(v4);
  t.equal(toHex(gid), '00000000000000000000ffff0a4d0003');
  t.ok(isIpv4MappedGid(gid));
  t.equal(formatIpAddress(gid), '::ffff:10.77.0.3');
  const back = ipFromGid(gid);
  t.equal(toHex(back), '0a4d0003');
  t.equal(back.buffer, gid.buffer, 'a view into the GID');
  const v6 = ip('fd77::3');
  const gid6 = gidFromIp(v6);
  t.not(gid6, v6, 'always a new array');
  t.equal(toHex(gid6), toHex(v6));
  t.notOk(isIpv4MappedGid(gid6));
  t.equal(ipFromGid(gid6).length, 16);
  t.throws(() => gidFromIp(new Uint8Array(6)), RangeError);
  t.throws(() => ipFromGid(new Uint8Array(4)), RangeError);
});

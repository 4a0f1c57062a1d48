import t from 'tap';
import { crc32Bitwise } from '../../src/wire/crc32.js';
import {
  checkIcrc,
  checkIcrcOfIpDatagram,
  ICRC_SEED,
  icrcOfIpDatagram,
  icrcOfParts,
  icrcOfUdpPayload,
  readIcrc,
  recoverIpv4Id,
  writeIcrc,
  type UdpDatagramInfo,
} from '../../src/wire/icrc.js';
import { fixtureFiles, hex, randomBytes, rocePackets, socketView, xorshift32, type RocePacket } from './capture-helper.js';

const be16 = (b: Uint8Array, o: number): number => (b[o]! << 8) | b[o + 1]!;

/**
 * The naive oracle: copy the covered bytes, mask them one by one as Annex A17 lists them, prepend
 * 8 × 0xff and run the bitwise CRC over the lot. Shares no code with src/wire/icrc.ts.
 */
function naiveIcrc(ip: Uint8Array): number {
  const v6 = ip[0]! >>> 4 === 6;
  const hl = v6 ? 40 : (ip[0]! & 15) * 4;
  const udpLen = be16(ip, hl + 4);
  const m = new Uint8Array(8 + hl + udpLen - 4);
  m.fill(0xff, 0, 8);
  m.set(ip.subarray(0, hl + udpLen - 4), 8);
  const h = m.subarray(8);
  if (v6) {
    h[0] = (h[0]! & 0xf0) | 0x0f; // traffic class high nibble
    h[1] = 0xff; // traffic class low nibble + flow label
    h[2] = 0xff;
    h[3] = 0xff;
    h[7] = 0xff; // hop limit
  } else {
    h[1] = 0xff; // TOS
    h[8] = 0xff; // TTL
    h[10] = 0xff; // header checksum
    h[11] = 0xff;
  }
  h[hl + 6] = 0xff; // UDP checksum
  h[hl + 7] = 0xff;
  h[hl + 8 + 4] = 0xff; // BTH byte 4: FECN, BECN, reserved
  return crc32Bitwise(m);
}

// ibv_rc_pingpong, rc_pingpong.pcap frame 22: an RC ACK from 10.77.0.2 to 10.77.0.3.
const ACK_V4 = hex(`
  45 00 00 30   // IPv4, IHL 5, TOS 0, total length 48
  91 19 40 00   // ID 0x9119, DF
  40 11 95 05   // TTL 64, UDP, header checksum
  0a 4d 00 02   // 10.77.0.2
  0a 4d 00 03   // 10.77.0.3
  c1 32 12 b7   // UDP 49458 -> 4791
  00 1c 00 00   // UDP length 28, checksum 0
  11 00 ff ff   // BTH: opcode 0x11 RC ACKNOWLEDGE, flags 0, P_Key 0xffff
  00 00 00 12   // BTH: byte 4 = 0, dest QP 0x000012
  00 5d 29 0a   // BTH: AckReq 0, PSN 0x5d290a
  1f 00 00 01   // AETH: syndrome 0x1f (ACK, no credit limit), MSN 1
  3f 6f 6d 99   // ICRC 0x996d6f3f, little-endian
`);
// ibv_rc_pingpong -g 2, v6_rc_pingpong.pcap frame 32: the same ACK over IPv6 (fd77::2 -> fd77::3).
const ACK_V6 = hex(`
  60 00 00 00   // IPv6, traffic class 0, flow label 0
  00 1c 11 40   // payload length 28, next header UDP, hop limit 64
  fd 77 00 00 00 00 00 00 00 00 00 00 00 00 00 02   // fd77::2
  fd 77 00 00 00 00 00 00 00 00 00 00 00 00 00 03   // fd77::3
  c1 21 12 b7   // UDP 49441 -> 4791
  00 1c 00 00   // UDP length 28, checksum 0
  11 00 ff ff   // BTH: RC ACKNOWLEDGE, P_Key 0xffff
  00 00 00 11   // BTH: dest QP 0x000011
  00 df f7 70   // BTH: PSN 0xdff770
  1f 00 00 01   // AETH: ACK, MSN 1
  a1 12 66 18   // ICRC 0x186612a1, little-endian
`);

t.test('known answers from the captures', async (t) => {
  t.equal(ICRC_SEED, 0x2144df1c, 'CRC-32 of 8 × 0xff');
  t.equal(ACK_V4.length, 48);
  t.equal(readIcrc(ACK_V4.subarray(28)), 0x996d6f3f, 'the wire bytes 3f 6f 6d 99 read little-endian');
  t.equal(naiveIcrc(ACK_V4), 0x996d6f3f, 'the naive oracle reproduces the capture');
  t.equal(icrcOfIpDatagram(ACK_V4), 0x996d6f3f);
  t.same(checkIcrcOfIpDatagram(ACK_V4), { status: 'ok', value: 0x996d6f3f, expected: 0x996d6f3f, ipId: 0x9119, dontFragment: true });
  const info4: UdpDatagramInfo = { family: 4, srcAddr: hex('0a4d0002'), dstAddr: hex('0a4d0003'), srcPort: 49458, dstPort: 4791 };
  const payload4 = ACK_V4.subarray(28);
  t.equal(icrcOfUdpPayload({ ...info4, ipId: 0x9119, ipFlagsFrag: 0x4000 }, payload4), 0x996d6f3f, 'rebuilt header, real ID');
  t.equal(icrcOfUdpPayload({ ...info4, ipId: 0x9119 }, payload4), 0x996d6f3f, 'flags default to DF');
  t.same(
    checkIcrc(info4, payload4, 'strict'),
    { status: 'bad', value: 0x996d6f3f, expected: icrcOfUdpPayload(info4, payload4) },
    'strict assumes ID 0, and rxe used 0x9119; the ICRC for ID 0 is reported',
  );
  t.same(checkIcrc(info4, payload4, 'recover'), { status: 'ok-recovered', value: 0x996d6f3f, expected: 0x996d6f3f, ipId: 0x9119, dontFragment: true });
  t.same(recoverIpv4Id(info4, payload4), { ipId: 0x9119, dontFragment: true });
  t.same(checkIcrc(info4, payload4, 'off'), { status: 'unchecked', value: 0x996d6f3f });

  t.equal(readIcrc(ACK_V6.subarray(48)), 0x186612a1);
  t.equal(naiveIcrc(ACK_V6), 0x186612a1);
  t.equal(icrcOfIpDatagram(ACK_V6), 0x186612a1);
  t.same(checkIcrcOfIpDatagram(ACK_V6), { status: 'ok', value: 0x186612a1, expected: 0x186612a1 });
  const info6: UdpDatagramInfo = { family: 6, srcAddr: ACK_V6.subarray(8, 24), dstAddr: ACK_V6.subarray(24, 40), srcPort: 49441, dstPort: 4791 };
  for (const mode of ['strict', 'recover'] as const) {
    t.same(checkIcrc(info6, ACK_V6.subarray(48), mode), { status: 'ok', value: 0x186612a1, expected: 0x186612a1 }, `IPv6 ${mode} is exact`);
  }
  t.equal(recoverIpv4Id(info6, ACK_V6.subarray(48)), undefined, 'no IP ID in IPv6');

  const frame = new Uint8Array(14 + 48 + 6).fill(0xa5);
  frame.set(ACK_V4, 14);
  t.equal(icrcOfIpDatagram(frame, 14), 0x996d6f3f, 'at an offset, Ethernet padding after the datagram ignored');
  t.equal(checkIcrcOfIpDatagram(frame, 14).status, 'ok');
});

const files = fixtureFiles();
const captures = new Map<string, RocePacket[]>(files.map((f) => [f, rocePackets(f)]));

t.test('every RoCEv2 packet of every capture', async (t) => {
  t.ok(files.length >= 19, `${files.length} fixture captures`);
  let total = 0;
  for (const [file, pkts] of captures) {
    const v6 = file.startsWith('v6_');
    t.ok(pkts.length > 0, `${file}: has RoCEv2 packets`);
    const problems: string[] = [];
    for (const p of pkts) {
      total++;
      const where = `${file}#${p.frame}`;
      if (p.info.family !== (v6 ? 6 : 4)) problems.push(`${where}: family`);
      const full = checkIcrcOfIpDatagram(p.ip);
      if (full.status !== 'ok') problems.push(`${where}: datagram ${full.status}`);
      if (icrcOfUdpPayload(p.info, p.payload) !== readIcrc(p.payload)) problems.push(`${where}: icrcOfUdpPayload`);
      const hidden = socketView(p.info);
      const rec = checkIcrc(hidden, p.payload, 'recover');
      if (v6) {
        if (rec.status !== 'ok') problems.push(`${where}: v6 recover ${rec.status}`);
        if (checkIcrc(hidden, p.payload, 'strict').status !== 'ok') problems.push(`${where}: v6 strict`);
      } else {
        const trueId = p.info.ipId!;
        const want = trueId === 0 ? 'ok' : 'ok-recovered';
        if (rec.status !== want || rec.ipId !== trueId || rec.dontFragment !== true) {
          problems.push(`${where}: recover ${rec.status} id ${rec.ipId} vs ${trueId}`);
        }
        if (checkIcrc(p.info, p.payload, 'strict').status !== 'ok') problems.push(`${where}: strict with the real ID`);
        if (trueId !== 0 && checkIcrc(hidden, p.payload, 'strict').status !== 'bad') problems.push(`${where}: strict with ID 0`);
      }
    }
    t.same(problems, [], `${file}: ${pkts.length} packets`);
  }
  t.ok(total > 4000, `${total} packets in all`);
});

t.test('the naive oracle agrees on a sample of every capture', async (t) => {
  let bad = 0;
  let n = 0;
  for (const pkts of captures.values()) {
    for (let i = 0; i < pkts.length; i += 17) {
      n++;
      if (naiveIcrc(pkts[i]!.ip) !== icrcOfIpDatagram(pkts[i]!.ip)) bad++;
    }
  }
  t.equal(bad, 0, `${n} packets`);
});

/** Bit positions (byte index in the IP datagram) that Annex A17 masks. */
function maskedBytes(p: RocePacket): Set<number> {
  const hl = p.info.family === 6 ? 40 : (p.ip[0]! & 15) * 4;
  const s = new Set<number>([hl + 6, hl + 7, hl + 8 + 4]);
  for (const b of p.info.family === 6 ? [1, 2, 3, 7] : [1, 8, 10, 11]) s.add(b);
  return s;
}

/** A few packets per capture for the exhaustive flip tests: the first, the largest, one from the middle. */
function flipSample(pkts: RocePacket[]): RocePacket[] {
  const largest = pkts.reduce((a, b) => (b.ip.length > a.ip.length ? b : a));
  return [...new Set([pkts[0]!, largest, pkts[pkts.length >> 1]!])];
}

t.test('every single-bit flip of the covered bytes is bad; masked fields are not covered', async (t) => {
  for (const [file, pkts] of captures) {
    const problems: string[] = [];
    let flips = 0;
    for (const p of flipSample(pkts)) {
      const ip = p.ip.slice();
      const masked = maskedBytes(p);
      const hl = p.info.family === 6 ? 40 : 20;
      const payloadAt = hl + 8;
      const info = p.info; // views the unmodified original
      const payload = ip.subarray(payloadAt);
      for (let bit = 0; bit < ip.length * 8; bit++) {
        const byte = bit >>> 3;
        // IPv6 byte 0: the low nibble is traffic class (masked), the high nibble the version (covered).
        const isMasked = masked.has(byte) || (p.info.family === 6 && byte === 0 && (bit & 7) < 4);
        ip[byte]! ^= 1 << (bit & 7);
        flips++;
        const full = checkIcrcOfIpDatagram(ip).status;
        if (full !== (isMasked ? 'ok' : 'bad')) problems.push(`#${p.frame} bit ${bit}: datagram ${full}`);
        if (byte >= payloadAt) {
          // The socket path, with everything known (strict): the same verdict.
          const s = checkIcrc(info, payload, 'strict').status;
          if (s !== (isMasked ? 'ok' : 'bad')) problems.push(`#${p.frame} bit ${bit}: payload ${s}`);
        }
        ip[byte]! ^= 1 << (bit & 7);
      }
    }
    t.same(problems.slice(0, 10), [], `${file}: ${flips} flips`);
  }
});

t.test('recover mode: payload flips are never ok and rarely alias to another IP ID', async (t) => {
  let flips = 0;
  // Whether a single-bit flip aliases depends only on its distance from the ID field (L(e) is x^k mod P
  // times a fixed factor), so it is a property of the bit's position in the UDP payload.
  const aliasAt = new Map<number, boolean>();
  const problems: string[] = [];
  for (const [file, pkts] of captures) {
    if (file.startsWith('v6_')) continue;
    for (const p of flipSample(pkts)) {
      const payload = p.payload.slice();
      const hidden = socketView(p.info);
      const trueId = p.info.ipId!;
      for (let bit = 0; bit < payload.length * 8; bit++) {
        if (bit >>> 3 === 4) continue; // BTH byte 4 is masked
        payload[bit >>> 3]! ^= 1 << (bit & 7);
        flips++;
        const r = checkIcrc(hidden, payload, 'recover');
        const aliased = r.status === 'ok-recovered';
        if (aliased && r.ipId === trueId) problems.push(`${file}#${p.frame} bit ${bit}: claims the true ID`);
        if (!aliased && r.status !== 'bad') problems.push(`${file}#${p.frame} bit ${bit}: ${r.status}`);
        const before = aliasAt.get(bit);
        if (before !== undefined && before !== aliased) problems.push(`${file}#${p.frame} bit ${bit}: aliasing differs between packets`);
        aliasAt.set(bit, aliased);
        payload[bit >>> 3]! ^= 1 << (bit & 7);
      }
    }
  }
  t.same(problems, []);
  const positions = aliasAt.size;
  const aliased = [...aliasAt].filter(([, a]) => a).map(([bit]) => bit);
  // 15 check bits remain: about one position in 2^15 aliases. Allow a generous margin.
  t.ok(aliased.length <= (positions / 2 ** 15) * 4 + 2, `${flips} flips over ${positions} bit positions; aliasing positions ${aliased.join(', ')} (expected about ${(positions / 2 ** 15).toFixed(1)})`);
});

t.test('recover mode: the IP ID and DF are recovered, other flags are not', async (t) => {
  const pkts = [...captures.entries()].filter(([f]) => !f.startsWith('v6_')).flatMap(([, p]) => p.slice(0, 5));
  const problems: string[] = [];
  for (const p of pkts) {
    const trueId = p.info.ipId!;
    for (let b = 0; b < 16; b++) {
      const wrong = { ...p.info, ipId: trueId ^ (1 << b) };
      if (checkIcrc(wrong, p.payload, 'strict').status !== 'bad') problems.push(`#${p.frame}: strict accepted ID bit ${b}`);
      const r = checkIcrc(wrong, p.payload, 'recover');
      if (r.status !== 'ok-recovered' || r.ipId !== trueId || r.dontFragment !== true) problems.push(`#${p.frame}: ID bit ${b} not recovered`);
    }
    const noDf = { ...p.info, ipFlagsFrag: 0 };
    if (checkIcrc(noDf, p.payload, 'strict').status !== 'bad') problems.push(`#${p.frame}: strict accepted DF=0`);
    const r = checkIcrc(noDf, p.payload, 'recover');
    if (r.status !== 'ok-recovered' || r.ipId !== trueId || r.dontFragment !== true) problems.push(`#${p.frame}: DF not recovered`);
  }
  t.same(problems, [], `${pkts.length} packets × 17 bits`);

  // Synthetic packets of many lengths (more than the recovery cache holds), random IDs, DF either way.
  const rnd = xorshift32(4791);
  let wrong = 0;
  let n = 0;
  for (let k = 0; k < 300; k++) {
    const len = 16 + (rnd() % 200) + (k % 3 === 0 ? 4000 : 0);
    const payload = randomBytes(rnd, len);
    const info: UdpDatagramInfo = { family: 4, srcAddr: randomBytes(rnd, 4), dstAddr: randomBytes(rnd, 4), srcPort: rnd() & 0xffff, dstPort: 4791 };
    const ipId = rnd() & 0xffff;
    const df = (rnd() & 1) === 1;
    writeIcrc(payload, icrcOfUdpPayload({ ...info, ipId, ipFlagsFrag: df ? 0x4000 : 0 }, payload));
    const r = checkIcrc(info, payload, 'recover');
    const expectStatus = ipId === 0 && df ? 'ok' : 'ok-recovered';
    n++;
    if (r.status !== expectStatus || r.ipId !== ipId || r.dontFragment !== df) wrong++;
    // A sender with More Fragments or a fragment offset: no ID with flags 0/DF explains it.
    const frag = [0x2000, 0x6000, 0x0001, 0x4000 | 0x1fff, 0x8000][k % 5]!;
    writeIcrc(payload, icrcOfUdpPayload({ ...info, ipId, ipFlagsFrag: frag }, payload));
    n++;
    if (checkIcrc(info, payload, 'recover').status !== 'bad') wrong++;
    if (recoverIpv4Id(info, payload) !== undefined) wrong++;
  }
  t.equal(wrong, 0, `${n} synthetic checks`);
});

t.test('masked fields can change freely', async (t) => {
  const rnd = xorshift32(77);
  const problems: string[] = [];
  let n = 0;
  for (const [file, pkts] of captures) {
    for (const p of pkts.slice(0, 20)) {
      const ip = p.ip.slice();
      const hl = p.info.family === 6 ? 40 : (ip[0]! & 15) * 4;
      if (p.info.family === 6) {
        ip[0] = 0x60 | (rnd() & 0x0f); // traffic class, flow label
        ip[1] = rnd();
        ip[2] = rnd();
        ip[3] = rnd();
        ip[7] = rnd(); // hop limit
      } else {
        ip[1] = rnd(); // TOS, including ECN marks (CE) set by switches
        ip[8] = rnd(); // TTL
        ip[10] = rnd(); // checksum
        ip[11] = rnd();
      }
      ip[hl + 6] = rnd(); // UDP checksum (rxe sends 0, offloading senders a partial sum)
      ip[hl + 7] = rnd();
      ip[hl + 8 + 4] = rnd(); // BTH FECN/BECN/reserved
      n++;
      if (checkIcrcOfIpDatagram(ip).status !== 'ok') problems.push(`${file}#${p.frame}`);
    }
  }
  t.same(problems, [], `${n} packets with random masked fields`);
});

t.test('icrcOfParts over random splits equals icrcOfUdpPayload', async (t) => {
  const rnd = xorshift32(0x1ce);
  let bad = 0;
  let n = 0;
  for (const pkts of captures.values()) {
    for (let i = 0; i < pkts.length; i += 29) {
      const p = pkts[i]!;
      const body = p.payload.subarray(0, p.payload.length - 4);
      const want = icrcOfUdpPayload(p.info, p.payload);
      for (let k = 0; k < 4; k++) {
        const parts: Uint8Array[] = [];
        let at = 0;
        while (at < body.length) {
          // Small pieces first so that the BTH is often split; empty pieces too.
          const size = Math.min(body.length - at, rnd() % (parts.length < 3 ? 14 : 1500));
          parts.push(body.subarray(at, at + size));
          at += size;
        }
        n++;
        if (icrcOfParts(p.info, parts, p.payload.length) !== want) bad++;
      }
      n++;
      if (icrcOfParts(p.info, [body], p.payload.length) !== want) bad++;
    }
  }
  t.equal(bad, 0, `${n} splits`);
  const p = captures.get('write_bw.pcap')![0]!;
  t.throws(() => icrcOfParts(p.info, [p.payload], p.payload.length), RangeError, 'parts must leave out the ICRC');
});

t.test('IPv4 options are covered', async (t) => {
  // The ACK with 4 bytes of options (NOP NOP NOP EOL): IHL 6, total length 52.
  const ip = new Uint8Array(52);
  ip.set(ACK_V4.subarray(0, 20));
  ip.set([0x01, 0x01, 0x01, 0x00], 20);
  ip.set(ACK_V4.subarray(20), 24);
  ip[0] = 0x46;
  ip[3] = 52;
  const want = naiveIcrc(ip);
  t.equal(icrcOfIpDatagram(ip), want);
  writeIcrc(ip.subarray(32), want);
  t.equal(checkIcrcOfIpDatagram(ip).status, 'ok');
  ip[22]! ^= 0x10;
  t.equal(checkIcrcOfIpDatagram(ip).status, 'bad', 'an option byte is covered');
});

t.test('ICRC byte order and accessors', async (t) => {
  const b = new Uint8Array(20).fill(0xa5);
  writeIcrc(b, 0x11223344);
  t.same([...b.subarray(16)], [0x44, 0x33, 0x22, 0x11], 'little-endian');
  t.same([...b.subarray(0, 16)], new Array(16).fill(0xa5), 'nothing else written');
  t.equal(readIcrc(b), 0x11223344);
  writeIcrc(b, 0xfedcba98);
  t.equal(readIcrc(b), 0xfedcba98, 'unsigned');
  t.throws(() => readIcrc(new Uint8Array(3)), RangeError);
  t.throws(() => writeIcrc(new Uint8Array(3), 1), RangeError);
});

t.test('malformed input never throws from the checks', async (t) => {
  const info4: UdpDatagramInfo = { family: 4, srcAddr: hex('0a4d0002'), dstAddr: hex('0a4d0003'), srcPort: 1, dstPort: 4791 };
  const info6: UdpDatagramInfo = { family: 6, srcAddr: new Uint8Array(16), dstAddr: new Uint8Array(16), srcPort: 1, dstPort: 4791 };
  const problems: string[] = [];
  for (let n = 0; n < 16; n++) {
    const payload = ACK_V4.subarray(28, 28 + n);
    for (const info of [info4, info6]) {
      for (const mode of ['strict', 'recover'] as const) {
        if (checkIcrc(info, payload, mode).status !== 'bad') problems.push(`${n} bytes ${mode}`);
      }
      if (checkIcrc(info, payload, 'off').status !== 'unchecked') problems.push(`${n} bytes off`);
    }
    if (recoverIpv4Id(info4, payload) !== undefined) problems.push(`${n} bytes recovered`);
  }
  const garbage = [
    { ...info4, srcAddr: new Uint8Array(3) },
    { ...info4, dstAddr: new Uint8Array(16) },
    { ...info6, srcAddr: new Uint8Array(4) },
    { ...info4, family: 5 } as unknown as UdpDatagramInfo,
  ];
  for (const info of garbage) {
    if (checkIcrc(info, ACK_V4.subarray(28), 'recover').status !== 'bad') problems.push('garbage info');
  }
  t.throws(() => icrcOfUdpPayload(garbage[0]!, ACK_V4.subarray(28)), RangeError, 'the compute functions reject bad info');
  t.throws(() => icrcOfUdpPayload(info4, ACK_V4.subarray(28, 40)), RangeError, '…and short payloads');
  t.throws(() => icrcOfIpDatagram(ACK_V4.subarray(0, 47)), RangeError, '…and truncated datagrams');

  for (const full of [ACK_V4, ACK_V6, captures.get('ud_pingpong.pcap')![0]!.ip]) {
    for (let n = 0; n < full.length; n++) {
      if (checkIcrcOfIpDatagram(full.subarray(0, n)).status !== 'bad') problems.push(`truncated to ${n}`);
    }
  }
  for (const off of [-1, 0.5, 48, 49, 1000, NaN]) {
    if (checkIcrcOfIpDatagram(ACK_V4, off).status !== 'bad') problems.push(`offset ${off}`);
  }
  const rnd = xorshift32(99);
  let threw = 0;
  let ok = 0;
  for (let k = 0; k < 20000; k++) {
    const b = randomBytes(rnd, rnd() % 120);
    // Make about half look like IPv4/IPv6 UDP so the checks get past the first tests.
    if (b.length > 0 && k % 2 === 0) b[0] = k % 4 === 0 ? 0x45 : 0x60;
    if (b.length > 9 && k % 4 === 0) b[9] = 17;
    if (b.length > 6 && k % 4 === 2) b[6] = 17;
    try {
      if (checkIcrcOfIpDatagram(b, rnd() % 4).status === 'ok') ok++;
      const r = checkIcrc(k % 2 === 0 ? info4 : info6, b, 'recover');
      if (r.status === 'ok') ok++;
    } catch {
      threw++;
    }
  }
  t.same(problems, []);
  t.equal(threw, 0, '20000 random buffers: no throw');
  t.equal(ok, 0, 'and none verifies');
});

t.test('send/receive path: consecutive packets that differ in one header input each get their own ICRC', async (t) => {
  // The IP + UDP part of the pseudo header is cached between calls; every input it depends on is
  // changed in turn, and each result is checked against the ICRC of the same packet behind a real
  // IPv4 header (icrcOfIpDatagram, which rebuilds nothing from `info`).
  const rnd = xorshift32(0x1c4c);
  const payload = (n: number): Uint8Array => {
    const p = new Uint8Array(n);
    for (let i = 0; i < n; i++) p[i] = rnd() & 0xff;
    return p;
  };
  const ipDatagram = (info: UdpDatagramInfo, udp: Uint8Array): Uint8Array => {
    const ip = new Uint8Array(28 + udp.length);
    ip[0] = 0x45;
    const total = ip.length;
    ip[2] = total >>> 8;
    ip[3] = total & 0xff;
    ip[4] = (info.ipId ?? 0) >>> 8;
    ip[5] = (info.ipId ?? 0) & 0xff;
    ip[6] = (info.ipFlagsFrag ?? 0x4000) >>> 8;
    ip[7] = (info.ipFlagsFrag ?? 0x4000) & 0xff;
    ip[8] = 64;
    ip[9] = 17;
    ip.set(info.srcAddr, 12);
    ip.set(info.dstAddr, 16);
    ip[20] = info.srcPort >>> 8;
    ip[21] = info.srcPort & 0xff;
    ip[22] = info.dstPort >>> 8;
    ip[23] = info.dstPort & 0xff;
    ip[24] = (8 + udp.length) >>> 8;
    ip[25] = (8 + udp.length) & 0xff;
    ip.set(udp, 28);
    return ip;
  };
  const base: UdpDatagramInfo = {
    family: 4, srcAddr: new Uint8Array([10, 0, 0, 1]), dstAddr: new Uint8Array([10, 0, 0, 2]), srcPort: 0xc001, dstPort: 4791, ipId: 0, ipFlagsFrag: 0x4000,
  };
  const variants: [string, (i: UdpDatagramInfo) => UdpDatagramInfo][] = [
    ['same', (i) => i],
    ['srcAddr', (i) => ({ ...i, srcAddr: new Uint8Array([10, 0, 0, 3]) })],
    ['dstAddr in place', (i) => { i.dstAddr[3] = 9; return i; }],
    ['srcPort', (i) => ({ ...i, srcPort: 0xc002 })],
    ['dstPort', (i) => ({ ...i, dstPort: 4792 })],
    ['ipId', (i) => ({ ...i, ipId: 0x1234 })],
    ['flags', (i) => ({ ...i, ipFlagsFrag: 0 })],
  ];
  let checked = 0;
  for (const len of [64, 1060, 4124]) {
    for (const [name, change] of variants) {
      const before: UdpDatagramInfo = { ...base, srcAddr: base.srcAddr.slice(), dstAddr: base.dstAddr.slice() };
      const p1 = payload(len);
      const p2 = payload(len);
      t.equal(icrcOfUdpPayload(before, p1), icrcOfIpDatagram(ipDatagram(before, p1)), `${name} ${len}: first`);
      const after = change(before);
      t.equal(icrcOfUdpPayload(after, p2), icrcOfIpDatagram(ipDatagram(after, p2)), `${name} ${len}: after the change`);
      // And back-to-back without the reference in between (it resets the cache).
      const a = icrcOfUdpPayload(after, p1);
      const b = icrcOfParts(after, [p1.subarray(0, 20), p1.subarray(20, len - 4)], len);
      t.equal(a, b, `${name} ${len}: icrcOfParts agrees`);
      t.equal(a, icrcOfIpDatagram(ipDatagram(after, p1)), `${name} ${len}: back to back`);
      checked++;
    }
  }
  t.equal(checked, 21);

  // Flows interleaved as an initiator's are (WRITEs to the peer, the peer's ACKs back, now and then a
  // third flow that evicts one entry), each packet with its own IPv4 ID: the ID is folded into the
  // cached prefix, not part of its key.
  const flows: [UdpDatagramInfo, number][] = [
    [{ ...base, srcAddr: base.srcAddr.slice(), dstAddr: base.dstAddr.slice() }, 4124],
    [{ ...base, srcAddr: base.dstAddr.slice(), dstAddr: base.srcAddr.slice(), srcPort: 0xc00f }, 16],
    [{ ...base, srcAddr: new Uint8Array([10, 0, 0, 8]), dstAddr: base.dstAddr.slice(), srcPort: 0xd001, ipFlagsFrag: 0 }, 1060],
  ];
  let wrong = 0;
  let n = 0;
  for (let i = 0; i < 3000; i++) {
    const [f, len] = flows[i % 7 === 6 ? 2 : i & 1]!;
    const info = { ...f, ipId: i < 4 ? [0, 0xffff, 0xff00, 0x00ff][i]! : rnd() & 0xffff };
    const p = payload(len);
    const want = icrcOfIpDatagram(ipDatagram(info, p));
    if (icrcOfParts(info, [p.subarray(0, 12), p.subarray(12, len - 4)], len) !== want) wrong++;
    if (icrcOfUdpPayload(info, p) !== want) wrong++;
    n++;
  }
  t.equal(wrong, 0, `${n} packets of three interleaved flows with random IDs`);
});

t.test('send/receive path, IPv6: an address rewritten in place is seen, in every byte', async (t) => {
  // The prefix cache compares address contents, not array identity: a caller may reuse one array.
  const rnd = xorshift32(0x6a6a);
  const udp = randomBytes(rnd, 1060);
  const info: UdpDatagramInfo = { family: 6, srcAddr: randomBytes(rnd, 16), dstAddr: randomBytes(rnd, 16), srcPort: 0xc003, dstPort: 4791 };
  const ipDatagram = (): Uint8Array => {
    const ip = new Uint8Array(48 + udp.length);
    ip[0] = 0x60;
    ip[4] = (8 + udp.length) >>> 8;
    ip[5] = (8 + udp.length) & 0xff;
    ip[6] = 17;
    ip[7] = 64;
    ip.set(info.srcAddr, 8);
    ip.set(info.dstAddr, 24);
    ip.set([info.srcPort >>> 8, info.srcPort & 0xff, info.dstPort >>> 8, info.dstPort & 0xff, ip[4]!, ip[5]!], 40);
    ip.set(udp, 48);
    return ip;
  };
  let bad = 0;
  for (let i = 0; i < 32; i++) {
    const a = i < 16 ? info.srcAddr : info.dstAddr;
    icrcOfUdpPayload(info, udp); // the flow as it was, now cached
    a[i & 15] = a[i & 15]! ^ (1 << (i & 7));
    const want = icrcOfIpDatagram(ipDatagram());
    if (icrcOfUdpPayload(info, udp) !== want) bad++;
    writeIcrc(udp, want);
    if (checkIcrc(info, udp, 'strict').status !== 'ok') bad++;
    // And a corrupted payload is bad, reported with the ICRC it should have had.
    udp[20] = udp[20]! ^ 1;
    const c = checkIcrc(info, udp, 'recover');
    if (c.status !== 'bad' || c.expected !== icrcOfUdpPayload(info, udp) || c.value !== want) bad++;
    udp[20] = udp[20]! ^ 1;
  }
  t.equal(bad, 0, 'one bit of each of the 32 address bytes flipped in place');
});

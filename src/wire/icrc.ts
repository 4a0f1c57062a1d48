/**
 * The RoCEv2 Invariant CRC (ICRC).
 *
 * Read first: IBTA Vol. 1 §7.8.1 (ICRC) and Annex A17 §A17.3.3 (RoCEv2 ICRC: which IP/UDP fields are
 * "variant" and replaced by ones), and Linux `drivers/infiniband/sw/rxe/rxe_icrc.c` (`rxe_icrc_hdr`).
 * `docs/rxe-lab.md` records the facts below as measured on every frame of the rxe captures.
 *
 * The ICRC is the ordinary CRC-32 (zlib/Ethernet) over
 *   1. 8 bytes of 0xff, standing in for the InfiniBand LRH that RoCEv2 does not carry;
 *   2. the IP header with its variant fields set to ones:
 *      IPv4: TOS (byte 1), TTL (byte 8) and header checksum (bytes 10–11);
 *      IPv6: traffic class, flow label (bytes 0–3 become `6f ff ff ff`) and hop limit (byte 7);
 *   3. the UDP header with its checksum set to 0xffff;
 *   4. the BTH with byte 4 (FECN, BECN, reserved) set to 0xff;
 *   5. the rest of the UDP payload, up to the ICRC itself,
 * and is stored in the last 4 bytes of the UDP payload, least significant byte first (the CRC
 * register's natural order; Wireshark prints those bytes as a big-endian number).
 *
 * Everything else is covered, in particular the IPv4 Identification, flags, total length and the IPv6
 * payload length. That is the catch for a stack on a UDP socket: the IPv4 ID is chosen by a kernel
 * after the sender computed the ICRC, and it is invisible to the receiver. Hence the three modes of
 * `checkIcrc` and the IP-ID recovery at the end of this file.
 *
 * Where the stack's addon is built (`src/native/icrc.c`, loaded by `addon.ts`), each entry point below
 * is one native call that does all of this in C; the JavaScript here is then the reference it is held
 * to (at load, and by test/wire/icrc-addon.test.ts), and the implementation where it is not built.
 *
 * Hot path (from a UDP socket): no allocation and a single CRC call over the UDP payload as it is. The
 * masked IP + UDP headers are rebuilt in a module-level scratch buffer and their CRC is cached per flow
 * (see `prefixFor`); the BTH mask is folded into the seed (`crc32XorByte4`) rather than written into
 * a copy, and the ICRC field the call also covers is taken back off (`crc32DropTail4`), because a
 * `subarray` view that stops short of it costs ~30 ns, a third of a native call's fixed cost.
 */
import { icrcAddon, type IcrcAddon } from './addon.js';
import { CRC32_RESIDUE, crc32, crc32DropTail4, crc32Table, crc32XorByte4 } from './crc32.js';

/** Bytes of ICRC at the end of every RoCEv2 packet. */
export const ICRC_LEN = 4;
/** Bytes of Base Transport Header at the start of every RoCEv2 UDP payload. */
export const BTH_LEN = 12;
/** The shortest UDP payload that can carry an ICRC: a BTH and the ICRC. */
export const MIN_ICRC_PAYLOAD = BTH_LEN + ICRC_LEN;
const UDP_HDR_LEN = 8;
const IPV4_HDR_LEN = 20;
const IPV6_HDR_LEN = 40;
const IPPROTO_UDP = 17;
/** BTH byte 4: FECN, BECN and 6 reserved bits; switches may set FECN/BECN in flight, so it is masked. */
const BTH_MASKED_BYTE = 4;
/** IPv4 flags/fragment-offset word with only Don't Fragment set: what rxe (and `IP_PMTUDISC_DO`) sends. */
export const IPV4_DF = 0x4000;

/** CRC-32 of the 8 × 0xff LRH stand-in (rxe's raw seed 0xdebb20e3, complemented): every ICRC starts here. */
export const ICRC_SEED = crc32(new Uint8Array(8).fill(0xff));

export type IcrcMode = 'strict' | 'recover' | 'off';
export type IcrcStatus = 'ok' | 'ok-recovered' | 'bad' | 'unchecked';

/** What a UDP socket knows about a datagram, plus IPv4 fields when known. */
export interface UdpDatagramInfo {
  family: 4 | 6;
  /** 4 bytes for IPv4, 16 for IPv6, network order. */
  srcAddr: Uint8Array;
  dstAddr: Uint8Array;
  srcPort: number;
  dstPort: number;
  /** IPv4 only: the Identification field; default 0 (what a sender with `IP_PMTUDISC_DO` emits). */
  ipId?: number;
  /** IPv4 only: the flags + fragment offset word; default 0x4000 (DF). */
  ipFlagsFrag?: number;
}

export interface IcrcCheck {
  status: IcrcStatus;
  /** The ICRC as on the wire, decoded little-endian; 0 when the packet is too short to hold one. */
  value: number;
  /** The ICRC computed for the assumed (strict) or recovered header; absent when none was computed. */
  expected?: number;
  /** IPv4: the Identification the ICRC was computed with (assumed, read from the header, or recovered). */
  ipId?: number;
  /** IPv4: whether the ICRC was computed with the DF flag set. */
  dontFragment?: boolean;
}

// Scratch pseudo header: up to 60 bytes of IPv4 header (with options) or 40 of IPv6, then UDP and
// BTH. Only ever used synchronously inside one call, so one per module is enough.
const PSEUDO = new Uint8Array(60 + UDP_HDR_LEN + BTH_LEN);
// Prebuilt views for the two common lengths, so that the hot path allocates no view for them.
const PSEUDO_V4 = PSEUDO.subarray(0, IPV4_HDR_LEN + UDP_HDR_LEN + BTH_LEN);
const PSEUDO_V6 = PSEUDO.subarray(0, IPV6_HDR_LEN + UDP_HDR_LEN + BTH_LEN);
// The IP + UDP part alone, for the send/receive path's prefix cache below.
const PREFIX_V4 = PSEUDO.subarray(0, IPV4_HDR_LEN + UDP_HDR_LEN);
const PREFIX_V6 = PSEUDO.subarray(0, IPV6_HDR_LEN + UDP_HDR_LEN);

/**
 * The CRC of the masked IP + UDP part of the pseudo header (28 or 48 bytes, chained onto the 8 × 0xff
 * prefix) depends only on the family, addresses, ports, length, IPv4 ID and flags: the same for every
 * packet of a flow at one size, i.e. nearly every packet of a stream. It is cached with its inputs; a
 * hit skips rebuilding that part and its CRC (~40–60 ns, a fifth of an ICRC at 4 KiB), and the UDP
 * payload is CRC'd onto it (CRC chaining: crc(A‖B) = crc(B, seed crc(A))). Only that CRC is kept, not
 * PSEUDO's bytes, so `icrcLocated` may overwrite PSEUDO without dropping it.
 *
 * Two entries, because a link both sends and checks: an initiator sends WRITEs of one length to its
 * peer and checks the peer's ACKs of another, and with one entry every message of a many-QP flow
 * missed twice. The IPv4 ID is not part of the key: CRC-32 is affine, so the prefix for ID k is the
 * cached one for ID 0 XOR a linear term of k (`ID_HI`/`ID_LO`), which keeps the segments of a GSO
 * train (IDs 0, 1, 2, …) and a peer's changing IDs on the cached entry.
 */
// The addresses are compared by content, not by identity: the callers in src/link reuse cached
// address arrays, so identity would nearly always hit, but nothing stops a caller from rewriting an
// array in place between packets, and a stale prefix would make the ICRCs of the new flow wrong.
// Stored as 32-bit words (src in 0–3, dst in 4–7) and compared without a branch per byte: a few
// loads more than an identity check, where the byte loop cost ~10 ns.
// The other inputs are packed into two words, compared together with the addresses in one test:
// ports; the length (the headers hold it mod 2^16 only, so that is all the key needs) with the family,
// whose low bits are never 0, so that 0 marks an entry empty; and the IPv4 flags (0 for IPv6).
class PrefixEntry {
  readonly addr = new Int32Array(8);
  ports = 0;
  lenFam = 0;
  flags = 0;
  /** The prefix CRC for IPv4 ID 0. */
  crc = 0;
}
const entryA = new PrefixEntry();
const entryB = new PrefixEntry();
/** The entry a miss replaces: the one not hit last. */
let victim = entryB;

/**
 * The linear part of the prefix CRC in the IPv4 ID (header bytes 4 and 5, followed by 22 more bytes of
 * IPv4 + UDP header): crc(prefix with ID k) = crc(prefix with ID 0) ^ ID_HI[k >>> 8] ^ ID_LO[k & 255].
 * Each term is crc(E) ^ crc(0…0) over 24 bytes, E holding the byte at its place: the constant parts cancel.
 */
const ID_HI = new Int32Array(256);
const ID_LO = new Int32Array(256);
{
  const e = new Uint8Array(IPV4_HDR_LEN + UDP_HDR_LEN - 4);
  const zero = crc32Table(e);
  for (let b = 0; b < 256; b++) {
    e[0] = b;
    ID_HI[b] = crc32Table(e) ^ zero;
    e[0] = 0;
    e[1] = b;
    ID_LO[b] = crc32Table(e) ^ zero;
    e[1] = 0;
  }
}

/** Bytes `o` … `o + 3` of `a` as one little-endian 32-bit word (as an Int32Array would hold them). */
function word(a: Uint8Array, o: number): number {
  return a[o]! | (a[o + 1]! << 8) | (a[o + 2]! << 16) | (a[o + 3]! << 24);
}

/** Zero if and only if `info`'s addresses are `e`'s: the XORs of all their words, ORed. */
function addrDiff(e: PrefixEntry, info: UdpDatagramInfo): number {
  const s = info.srcAddr;
  const d = info.dstAddr;
  const a = e.addr;
  if (info.family === 4) return (word(s, 0) ^ a[0]!) | (word(d, 0) ^ a[4]!);
  return (
    (word(s, 0) ^ a[0]!) | (word(s, 4) ^ a[1]!) | (word(s, 8) ^ a[2]!) | (word(s, 12) ^ a[3]!) |
    (word(d, 0) ^ a[4]!) | (word(d, 4) ^ a[5]!) | (word(d, 8) ^ a[6]!) | (word(d, 12) ^ a[7]!)
  );
}

/** CRC of the 8 × 0xff prefix and the masked IP + UDP headers for these inputs (cached, see above). */
function prefixFor(info: UdpDatagramInfo, udpPayloadLen: number, ipId: number, flagsFrag: number): number {
  const fam = info.family;
  const ports = ((info.srcPort & 0xffff) << 16) | (info.dstPort & 0xffff);
  const lenFam = ((udpPayloadLen & 0xffff) << 3) | fam;
  const flags = fam === 4 ? flagsFrag : 0;
  // One branch per entry for the common hit rather than one per field; the miss is kept out of
  // line, so that this stays small enough for V8 to inline into the ICRC functions.
  let e = entryA;
  if (((ports ^ e.ports) | (lenFam ^ e.lenFam) | (flags ^ e.flags) | addrDiff(e, info)) !== 0) {
    e = entryB;
    if (((ports ^ e.ports) | (lenFam ^ e.lenFam) | (flags ^ e.flags) | addrDiff(e, info)) !== 0) e = newPrefix(info, udpPayloadLen, flagsFrag, ports, lenFam, flags);
  }
  victim = e === entryA ? entryB : entryA;
  const c = e.crc;
  return fam === 4 && ipId !== 0 ? (c ^ ID_HI[(ipId >>> 8) & 0xff]! ^ ID_LO[ipId & 0xff]!) >>> 0 : c;
}

/** `prefixFor` on a miss: builds the headers for ID 0, CRCs them and caches the result with its key. */
function newPrefix(info: UdpDatagramInfo, udpPayloadLen: number, flagsFrag: number, ports: number, lenFam: number, flags: number): PrefixEntry {
  const fam = info.family;
  const e = victim;
  const bth = writePseudoHeaders(info, udpPayloadLen, 0, flagsFrag);
  e.crc = crc32(bth === IPV4_HDR_LEN + UDP_HDR_LEN ? PREFIX_V4 : PREFIX_V6, ICRC_SEED);
  e.ports = ports;
  e.lenFam = lenFam;
  e.flags = flags;
  const words = fam === 4 ? 1 : 4;
  for (let k = 0; k < words; k++) {
    e.addr[k] = word(info.srcAddr, 4 * k);
    e.addr[4 + k] = word(info.dstAddr, 4 * k);
  }
  return e;
}

/**
 * The seed that continues `prefix` over the UDP payload as it is, yet yields the CRC with BTH byte 4
 * masked to 0xff (`raw4` is that byte as it is): no copy of the BTH, and the BTH shares the payload's call.
 */
function maskedBthSeed(prefix: number, raw4: number): number {
  return crc32XorByte4(prefix, raw4 ^ 0xff);
}

function be16(b: Uint8Array, o: number): number {
  return (b[o]! << 8) | b[o + 1]!;
}

function put16(b: Uint8Array, o: number, v: number): void {
  b[o] = v >>> 8;
  b[o + 1] = v;
}

function copyBytes(dst: Uint8Array, d: number, src: Uint8Array, s: number, n: number): void {
  // Header-sized copies: a loop beats `set(subarray(...))`, which allocates a view.
  for (let i = 0; i < n; i++) dst[d + i] = src[s + i]!;
}

/** Reads the ICRC from the last 4 bytes of a UDP payload (little-endian). */
export function readIcrc(udpPayload: Uint8Array): number {
  const n = udpPayload.length;
  if (n < ICRC_LEN) throw new RangeError(`UDP payload of ${n} bytes holds no ICRC`);
  return (udpPayload[n - 4]! | (udpPayload[n - 3]! << 8) | (udpPayload[n - 2]! << 16) | (udpPayload[n - 1]! << 24)) >>> 0;
}

/** Writes `icrc` into the last 4 bytes of a UDP payload (little-endian). */
export function writeIcrc(udpPayload: Uint8Array, icrc: number): void {
  const n = udpPayload.length;
  if (n < ICRC_LEN) throw new RangeError(`UDP payload of ${n} bytes holds no ICRC`);
  udpPayload[n - 4] = icrc;
  udpPayload[n - 3] = icrc >>> 8;
  udpPayload[n - 2] = icrc >>> 16;
  udpPayload[n - 1] = icrc >>> 24;
}

// ---------------------------------------------------------------------------------------------
// From a whole IP datagram (pcap, raw sockets, tests): the real header is at hand.

// Where `locate` found things. Module-level so that locating allocates nothing.
let locHdrLen = 0;
let locUdp = 0;
let locEnd = 0;

/**
 * Finds the UDP header and the end of the UDP payload of an IPv4/IPv6 datagram at `off`, checking
 * every length against the buffer. Returns false for anything the ICRC cannot be computed over:
 * truncated, not UDP, an IPv4 fragment, IPv6 extension headers or jumbograms, or a UDP payload too
 * short for BTH + ICRC. Trailing bytes (Ethernet padding) after the IP total length are ignored.
 */
function locate(ip: Uint8Array, off: number): boolean {
  if (!Number.isInteger(off) || off < 0 || ip.length - off < IPV4_HDR_LEN) return false;
  const version = ip[off]! >>> 4;
  let ipEnd: number;
  if (version === 4) {
    locHdrLen = (ip[off]! & 0x0f) * 4;
    if (locHdrLen < IPV4_HDR_LEN) return false;
    const total = be16(ip, off + 2);
    ipEnd = off + total;
    if (total < locHdrLen + UDP_HDR_LEN || ipEnd > ip.length) return false;
    if (ip[off + 9] !== IPPROTO_UDP) return false;
    // More Fragments or a fragment offset: the ICRC spans the reassembled datagram, not this piece.
    if ((be16(ip, off + 6) & 0x3fff) !== 0) return false;
  } else if (version === 6) {
    locHdrLen = IPV6_HDR_LEN;
    if (ip.length - off < IPV6_HDR_LEN) return false;
    ipEnd = off + IPV6_HDR_LEN + be16(ip, off + 4);
    if (ipEnd > ip.length) return false;
    // RoCEv2 packets carry no extension headers (and rxe would not parse them either).
    if (ip[off + 6] !== IPPROTO_UDP) return false;
  } else {
    return false;
  }
  locUdp = off + locHdrLen;
  if (ipEnd - locUdp < UDP_HDR_LEN) return false;
  const udpLen = be16(ip, locUdp + 4);
  locEnd = locUdp + udpLen;
  return udpLen >= UDP_HDR_LEN + MIN_ICRC_PAYLOAD && locEnd <= ipEnd;
}

/** The ICRC of the datagram `locate` just found, from its real header. */
function icrcLocated(ip: Uint8Array, off: number): number {
  const h = locHdrLen;

  copyBytes(PSEUDO, 0, ip, off, h + UDP_HDR_LEN + BTH_LEN);
  if (h === IPV6_HDR_LEN && ip[off]! >>> 4 === 6) {
    PSEUDO[0] = 0x6f; // version 6, traffic class high nibble all ones
    PSEUDO[1] = 0xff; // traffic class low nibble, flow label
    PSEUDO[2] = 0xff;
    PSEUDO[3] = 0xff;
    PSEUDO[7] = 0xff; // hop limit
  } else {
    PSEUDO[1] = 0xff; // TOS
    PSEUDO[8] = 0xff; // TTL
    PSEUDO[10] = 0xff; // header checksum
    PSEUDO[11] = 0xff;
    // IPv4 options, if any, are covered as they are: they are not in the Annex's list of variant
    // fields. (rxe never sends options, and its receive path assumes a 20-byte header.)
  }
  PSEUDO[h + 6] = 0xff; // UDP checksum
  PSEUDO[h + 7] = 0xff;
  PSEUDO[h + UDP_HDR_LEN + BTH_MASKED_BYTE] = 0xff;
  const n = h + UDP_HDR_LEN + BTH_LEN;
  const pseudo = n === PSEUDO_V4.length ? PSEUDO_V4 : n === PSEUDO_V6.length ? PSEUDO_V6 : PSEUDO.subarray(0, n);
  const c = crc32(pseudo, ICRC_SEED);
  return crc32(ip.subarray(locUdp + UDP_HDR_LEN + BTH_LEN, locEnd - ICRC_LEN), c);
}

/**
 * The ICRC of a whole IPv4 or IPv6 datagram (IP header, UDP header, RoCEv2 payload ending in the ICRC
 * field, whose content is ignored) that starts at `ipOffset`. IPv4 options are honoured (IHL).
 * Throws a RangeError for anything that is not such a datagram; `checkIcrcOfIpDatagram` does not throw.
 */
export function icrcOfIpDatagram(ip: Uint8Array, ipOffset = 0): number {
  if (!locate(ip, ipOffset)) throw new RangeError('not a complete IPv4/IPv6 UDP datagram with a BTH and an ICRC');
  return icrcLocated(ip, ipOffset);
}

/** Checks the ICRC of a whole datagram against its real header: exact, for both families. Never throws. */
export function checkIcrcOfIpDatagram(ip: Uint8Array, ipOffset = 0): IcrcCheck {
  if (!locate(ip, ipOffset)) return { status: 'bad', value: 0 };
  const value = readIcrc(ip.subarray(locEnd - ICRC_LEN, locEnd));
  const expected = icrcLocated(ip, ipOffset);
  const status: IcrcStatus = value === expected ? 'ok' : 'bad';
  if (locHdrLen === IPV6_HDR_LEN && ip[ipOffset]! >>> 4 === 6) return { status, value, expected };
  const flags = be16(ip, ipOffset + 6);
  return { status, value, expected, ipId: be16(ip, ipOffset + 4), dontFragment: (flags & IPV4_DF) !== 0 };
}

// ---------------------------------------------------------------------------------------------
// From what a UDP socket delivers: the IP and UDP headers are rebuilt from `UdpDatagramInfo`.

function infoIsValid(info: UdpDatagramInfo): boolean {
  const alen = info.family === 4 ? 4 : info.family === 6 ? 16 : -1;
  return info.srcAddr instanceof Uint8Array && info.dstAddr instanceof Uint8Array && info.srcAddr.length === alen && info.dstAddr.length === alen;
}

/**
 * Writes the masked IP + UDP headers for a UDP payload of `udpPayloadLen` bytes (ICRC included) into
 * PSEUDO, and returns the offset of the BTH in it. IPv4 is rebuilt without options, as senders of
 * RoCEv2 emit it.
 */
function writePseudoHeaders(info: UdpDatagramInfo, udpPayloadLen: number, ipId: number, flagsFrag: number): number {
  let h: number;
  if (info.family === 4) {
    PSEUDO[0] = 0x45; // version 4, IHL 5
    PSEUDO[1] = 0xff; // TOS (masked)
    put16(PSEUDO, 2, IPV4_HDR_LEN + UDP_HDR_LEN + udpPayloadLen);
    put16(PSEUDO, 4, ipId);
    put16(PSEUDO, 6, flagsFrag);
    PSEUDO[8] = 0xff; // TTL (masked)
    PSEUDO[9] = IPPROTO_UDP;
    PSEUDO[10] = 0xff; // header checksum (masked)
    PSEUDO[11] = 0xff;
    copyBytes(PSEUDO, 12, info.srcAddr, 0, 4);
    copyBytes(PSEUDO, 16, info.dstAddr, 0, 4);
    h = IPV4_HDR_LEN;
  } else {
    PSEUDO[0] = 0x6f; // version 6; traffic class and flow label masked
    PSEUDO[1] = 0xff;
    PSEUDO[2] = 0xff;
    PSEUDO[3] = 0xff;
    put16(PSEUDO, 4, UDP_HDR_LEN + udpPayloadLen); // payload length
    PSEUDO[6] = IPPROTO_UDP; // next header
    PSEUDO[7] = 0xff; // hop limit (masked)
    copyBytes(PSEUDO, 8, info.srcAddr, 0, 16);
    copyBytes(PSEUDO, 24, info.dstAddr, 0, 16);
    h = IPV6_HDR_LEN;
  }
  put16(PSEUDO, h, info.srcPort & 0xffff);
  put16(PSEUDO, h + 2, info.dstPort & 0xffff);
  put16(PSEUDO, h + 4, UDP_HDR_LEN + udpPayloadLen);
  PSEUDO[h + 6] = 0xff; // UDP checksum (masked)
  PSEUDO[h + 7] = 0xff;
  return h + UDP_HDR_LEN;
}

/**
 * The CRC of the covered bytes followed by the ICRC field as it is: the whole UDP payload in one call,
 * no view. `CRC32_RESIDUE` exactly when the field holds the right ICRC; `icrcWith` takes the field off.
 */
function crcThroughField(info: UdpDatagramInfo, udpPayload: Uint8Array, ipId: number, flagsFrag: number): number {
  return crc32(udpPayload, maskedBthSeed(prefixFor(info, udpPayload.length, ipId, flagsFrag), udpPayload[BTH_MASKED_BYTE]!));
}

/** The ICRC of `udpPayload`, whose last 4 bytes read `field` (little-endian; they are not covered). */
function icrcWith(info: UdpDatagramInfo, udpPayload: Uint8Array, field: number, ipId: number, flagsFrag: number): number {
  return crc32DropTail4(crcThroughField(info, udpPayload, ipId, flagsFrag), field);
}

function checkArgs(info: UdpDatagramInfo, udpPayloadLen: number): void {
  if (!infoIsValid(info)) throw new RangeError('UdpDatagramInfo: family must be 4 or 6 with 4- or 16-byte addresses');
  if (udpPayloadLen < MIN_ICRC_PAYLOAD) throw new RangeError(`UDP payload of ${udpPayloadLen} bytes is shorter than BTH + ICRC`);
}

/**
 * The ICRC of a RoCEv2 UDP payload (BTH … ICRC field; the field's content is ignored), with the IP and
 * UDP headers rebuilt from `info`. IPv4 uses `info.ipId` (default 0) and `info.ipFlagsFrag` (default DF).
 */
export function icrcOfUdpPayload(info: UdpDatagramInfo, udpPayload: Uint8Array): number {
  const a = ADDON;
  if (a === undefined) return jsIcrcOfUdpPayload(info, udpPayload);
  checkArgs(info, udpPayload.length);
  writeInfoKey(info);
  return a.icrc(udpPayload) >>> 0;
}

function jsIcrcOfUdpPayload(info: UdpDatagramInfo, udpPayload: Uint8Array): number {
  checkArgs(info, udpPayload.length);
  return icrcWith(info, udpPayload, readIcrc(udpPayload), (info.ipId ?? 0) & 0xffff, (info.ipFlagsFrag ?? IPV4_DF) & 0xffff);
}

/**
 * The ICRC of a packet still in pieces, for the send path: `parts` (e.g. headers, payload, pad) are
 * the UDP payload without the 4 ICRC bytes, and `udpPayloadLen` is the UDP payload length on the wire,
 * ICRC included (so `udpPayloadLen === sum of parts + 4`; it is in the IP and UDP length fields). The
 * BTH may straddle parts. Equal to `icrcOfUdpPayload` of the concatenation.
 */
export function icrcOfParts(info: UdpDatagramInfo, parts: readonly Uint8Array[], udpPayloadLen: number): number {
  const a = ADDON;
  // Headers and payload, the scatter path's split, in one call; other splits chain the JS way.
  if (a === undefined || parts.length !== 2) return jsIcrcOfParts(info, parts, udpPayloadLen);
  checkArgs(info, udpPayloadLen);
  const head = parts[0]!;
  const tail = parts[1]!;
  if (head.length + tail.length + ICRC_LEN !== udpPayloadLen) throw new RangeError(`parts hold ${head.length + tail.length} bytes, expected ${udpPayloadLen - ICRC_LEN}`);
  writeInfoKey(info);
  return a.icrc2(head, tail) >>> 0;
}

function jsIcrcOfParts(info: UdpDatagramInfo, parts: readonly Uint8Array[], udpPayloadLen: number): number {
  checkArgs(info, udpPayloadLen);
  let sum = 0;
  for (const p of parts) sum += p.length;
  if (sum + ICRC_LEN !== udpPayloadLen) throw new RangeError(`parts hold ${sum} bytes, expected ${udpPayloadLen - ICRC_LEN}`);
  // BTH byte 4, in whichever part it lies (normally parts[0], the headers).
  let j = 0;
  let at = BTH_MASKED_BYTE;
  while (parts[j]!.length <= at) at -= parts[j++]!.length;
  let c = maskedBthSeed(prefixFor(info, udpPayloadLen, (info.ipId ?? 0) & 0xffff, (info.ipFlagsFrag ?? IPV4_DF) & 0xffff), parts[j]![at]!);
  for (const p of parts) c = crc32(p, c);
  return c;
}

// ---------------------------------------------------------------------------------------------
// IPv4 IP-ID recovery.
//
// For messages of one fixed length, CRC-32 is affine over GF(2): crc(m ⊕ e) = crc(m) ⊕ L(e), with L
// linear and depending only on e's bits and their distance from the end. Take the 32-bit word
// w = ID << 16 | flagsFrag (IPv4 header bytes 4–7). Any nonzero e confined to 32 adjacent bits is a
// burst CRC-32 always detects, so L restricted to w is injective: a 32 × 32 invertible matrix M over
// GF(2). Thus for the ICRC on the wire W and the ICRC C computed with an assumed word w0, there is
// exactly one word w with W = C ⊕ M·(w ⊕ w0), namely w = w0 ⊕ M⁻¹·(W ⊕ C). We solve for all 32
// bits and accept the answer only if its flags/fragment part is 0x4000 or 0 (DF or not, never MF, no
// fragment offset): 16 ID bits + DF are the 17 unknowns, and the other 15 bits of the solution are
// the consistency equations.
//
// Residual protection: a corrupted packet passes if M⁻¹·(W ⊕ C) happens to have those 15 bits zero,
// i.e. with probability 2^-15 for a random corruption (it then "recovers" a wrong ID). That is the
// price of not seeing the IP header: strict checking (the header is known) keeps the full 2^-32 and
// detects every burst of up to 32 bits. Peers known to always set DF (rxe does) could require it and
// get back to 16 bits. For single-bit errors, whether one aliases depends only on its distance from the
// ID field, not on the packet: about one bit position in 2^15 is blind. Within the first 4 KiB of the
// UDP payload these are byte 173 mask 0x08 and byte 1834 mask 0x40, in every IPv4 packet (the test
// over the captures finds exactly these). The Ethernet FCS still covers each hop; this is end to end.
//
// M⁻¹ depends only on the distance from w to the end of the covered bytes, i.e. on the UDP payload
// length; it is built once per length (32 CRCs over zeros, a 32 × 32 inversion) and stored as four
// 256-entry byte tables, so applying it is four lookups and three XORs.

/** Byte tables of M⁻¹ for one UDP payload length: M⁻¹·d = T[d & 255] ^ T[256 + (d >>> 8 & 255)] ^ … */
type RecoveryTable = Int32Array;

// Payload lengths on a link are few (MTU-sized, a handful of header sizes and tails), so a small map
// with first-in-first-out eviction is enough; the last length is checked first without a map lookup.
const RECOVERY_CACHE_MAX = 64;
const recoveryCache = new Map<number, RecoveryTable | null>();
let lastLen = -1;
let lastTable: RecoveryTable | null = null;
let zeros = new Uint8Array(4096);

/** The linear part of the CRC register moved through `n` zero bytes, applied to a register difference. */
function shiftThroughZeros(delta: number, n: number): number {
  const z = zeros.subarray(0, n);
  return (crc32(z, delta >>> 0) ^ crc32(z, 0)) >>> 0;
}

function buildRecoveryTable(udpPayloadLen: number): RecoveryTable | null {
  // Bytes covered after header bytes 4–7: the rest of the IPv4 header, UDP, payload minus ICRC.
  const trailing = IPV4_HDR_LEN - 8 + UDP_HDR_LEN + udpPayloadLen - ICRC_LEN;
  if (zeros.length < trailing) zeros = new Uint8Array(Math.max(trailing, zeros.length * 2));
  const four = new Uint8Array(4);
  const crcZero4 = crc32(four);
  const vec = new Int32Array(32); // L(bit j of w)
  const comb = new Int32Array(32); // which bits of w were combined into vec[j]
  for (let j = 0; j < 32; j++) {
    four[3 - (j >>> 3)] = 1 << (j & 7); // bit j of w as it sits on the wire (big-endian word)
    const delta = crc32(four) ^ crcZero4; // register difference right after the 4 bytes
    four.fill(0);
    vec[j] = shiftThroughZeros(delta, trailing);
    comb[j] = 1 << j;
  }
  // Gauss–Jordan on the columns: afterwards vec[r] = e_r and comb[r] = M⁻¹·e_r.
  for (let r = 0; r < 32; r++) {
    let p = r;
    while (p < 32 && ((vec[p]! >>> r) & 1) === 0) p++;
    if (p === 32) return null; // singular: cannot happen for CRC-32 (burst ≤ 32 bits), kept for safety
    const v = vec[p]!;
    const c = comb[p]!;
    vec[p] = vec[r]!;
    comb[p] = comb[r]!;
    vec[r] = v;
    comb[r] = c;
    for (let i = 0; i < 32; i++) {
      if (i !== r && ((vec[i]! >>> r) & 1) !== 0) {
        vec[i] = vec[i]! ^ v;
        comb[i] = comb[i]! ^ c;
      }
    }
  }
  const t = new Int32Array(4 * 256);
  for (let k = 0; k < 4; k++) {
    for (let b = 1; b < 256; b++) {
      const low = 31 - Math.clz32(b & -b); // lowest set bit of b
      t[k * 256 + b] = t[k * 256 + (b & (b - 1))]! ^ comb[k * 8 + low]!;
    }
  }
  return t;
}

function recoveryTable(udpPayloadLen: number): RecoveryTable | null {
  if (udpPayloadLen === lastLen) return lastTable;
  let t = recoveryCache.get(udpPayloadLen);
  if (t === undefined) {
    t = buildRecoveryTable(udpPayloadLen);
    if (recoveryCache.size >= RECOVERY_CACHE_MAX) recoveryCache.delete(recoveryCache.keys().next().value!);
    recoveryCache.set(udpPayloadLen, t);
  }
  lastLen = udpPayloadLen;
  lastTable = t;
  return t;
}

/**
 * Solves for the IPv4 ID and DF that make the ICRC on the wire right, given `d`, the wire's ICRC XOR
 * the one computed for the assumed `ipId0`/`flags0`. Returns ID << 1 | DF, or -1 if no ID with flags
 * 0x4000 or 0 fits.
 */
function solveIpv4(udpPayloadLen: number, d: number, ipId0: number, flags0: number): number {
  const t = recoveryTable(udpPayloadLen);
  if (t === null) return -1;
  const diff = t[d & 0xff]! ^ t[256 + ((d >>> 8) & 0xff)]! ^ t[512 + ((d >>> 16) & 0xff)]! ^ t[768 + (d >>> 24)]!;
  const word = (((ipId0 << 16) | flags0) ^ diff) >>> 0;
  const flagsFrag = word & 0xffff;
  if ((flagsFrag & ~IPV4_DF) !== 0) return -1;
  return ((word >>> 16) << 1) | (flagsFrag >>> 14);
}

/**
 * The IPv4 ID and DF flag for which the payload's ICRC is right (with `info`'s addresses and ports),
 * or undefined if there is none, i.e. the packet is corrupt (or not IPv4). See the residual-protection
 * note above: a corrupt packet yields a wrong ID with probability 2^-15.
 */
export function recoverIpv4Id(info: UdpDatagramInfo, udpPayload: Uint8Array): { ipId: number; dontFragment: boolean } | undefined {
  if (info.family !== 4 || !infoIsValid(info) || udpPayload.length < MIN_ICRC_PAYLOAD) return undefined;
  // The answer is an ID with flags DF or 0; assumed flags other than those are the JavaScript's case.
  if (ADDON !== undefined && (((info.ipFlagsFrag ?? IPV4_DF) & 0xffff) & ~IPV4_DF) === 0) {
    // The ID assumed matches or another one is found: either way the one the ICRC is right for.
    const v = verifyIcrc(info, udpPayload, 'recover');
    return v === ICRC_BAD ? undefined : { ipId: verified.ipId, dontFragment: verified.dontFragment };
  }
  return jsRecoverIpv4Id(info, udpPayload);
}

function jsRecoverIpv4Id(info: UdpDatagramInfo, udpPayload: Uint8Array): { ipId: number; dontFragment: boolean } | undefined {
  if (info.family !== 4 || !infoIsValid(info) || udpPayload.length < MIN_ICRC_PAYLOAD) return undefined;
  const ipId0 = (info.ipId ?? 0) & 0xffff;
  const flags0 = (info.ipFlagsFrag ?? IPV4_DF) & 0xffff;
  const wire = readIcrc(udpPayload);
  const r = solveIpv4(udpPayload.length, wire ^ icrcWith(info, udpPayload, wire, ipId0, flags0), ipId0, flags0);
  return r < 0 ? undefined : { ipId: r >>> 1, dontFragment: (r & 1) !== 0 };
}

/** `verifyIcrc`'s answers. */
export const ICRC_BAD = 0;
export const ICRC_OK = 1;
export const ICRC_RECOVERED = 2;
export const ICRC_UNCHECKED = 3;

/**
 * What the last `verifyIcrc` found besides its status, IPv4 only: the ID it was right for, and whether
 * DF was set. Module state rather than a result object, so that the receive path allocates nothing.
 */
export const verified = { ipId: 0, dontFragment: true };

/**
 * `checkIcrc` for the receive path: the same verdicts (`ICRC_OK` for `ok`, `ICRC_RECOVERED` for
 * `ok-recovered`, `ICRC_UNCHECKED`, `ICRC_BAD`) without a result object; `verified` holds the ID and
 * DF that matched (IPv4). Never throws.
 */
export function verifyIcrc(info: UdpDatagramInfo, udpPayload: Uint8Array, mode: IcrcMode): number {
  const a = ADDON;
  if (a === undefined) return jsVerifyIcrc(info, udpPayload, mode);
  if (mode === 'off') return ICRC_UNCHECKED;
  if (udpPayload.length < MIN_ICRC_PAYLOAD || !infoIsValid(info)) return ICRC_BAD;
  if (info.family === 6) {
    writeKey(info, 0, 0);
    KEY[K_MODE] = MODE_STRICT;
    return a.verify(udpPayload);
  }
  writeInfoKey(info);
  KEY[K_MODE] = mode === 'recover' ? MODE_RECOVER : MODE_STRICT;
  const v = a.verify(udpPayload);
  if (v !== ICRC_BAD) {
    const out = KEY[K_OUT]!;
    verified.ipId = out >>> 1;
    verified.dontFragment = (out & 1) !== 0;
  }
  return v;
}

/**
 * The verdicts on every datagram of some messages of a `recvmmsg` batch in one native call (`UdpLink`'s
 * batched receive path; `src/link/mmsg.ts`, `RxRing`, which hands it a chunk at a time), where `verifyIcrc` or `verifyIcrc6` is one call per datagram and
 * the call was a third of a check at path MTU 1024. `mem` holds the batch; `desc` 4 words per message:
 * the offset of its bytes in `mem`, its length, the length it is cut at (a GRO train's segment size, 0
 * or its length otherwise), and the offset of its source's `sockaddr_in` or `sockaddr_in6`. The flow's
 * other end is `localAddr` and `localPort`; segment k of a train is tried with IPv4 ID k first, as the
 * sender's GSO numbered it, with DF; IPv6 is always exact. `out[j]` receives the j-th datagram's word
 * (`receivedVerdict`, `receivedIpId`). Returns how many datagrams were judged, in order:
 * 0 where the addon is not built or the mode is `off` (check each one then), fewer than the batch holds
 * when `out` is shorter. A RangeError for a message or sockaddr outside `mem`, before anything is judged.
 */
export function verifyReceived(family: 4 | 6, localAddr: Uint8Array, localPort: number, mode: IcrcMode, mem: Uint8Array, desc: Int32Array, messages: number, out: Int32Array): number {
  const a = ADDON;
  if (a === undefined || mode === 'off') return 0;
  if (localAddr.length !== (family === 4 ? 4 : 16)) throw new RangeError(`a ${localAddr.length}-byte local address for IPv${family}`);
  writeReceivedKey(family, localAddr, localPort, mode);
  return a.received(mem, desc, messages, out);
}

/** The key block for the addon's `received`: the local end of the flows, the flags assumed, the mode. */
function writeReceivedKey(family: 4 | 6, localAddr: Uint8Array, localPort: number, mode: IcrcMode): void {
  const k = KEY;
  k[K_PORTS] = localPort & 0xffff;
  k[K_ID] = 0;
  // The source words are each message's: the addon writes them from its sockaddr.
  if (family === 4) {
    k[K_FAMILY] = 4;
    k[K_DST] = word(localAddr, 0);
    k[K_FLAGS] = IPV4_DF;
  } else {
    writeAddresses6(k, localAddr, localAddr);
    k[K_FLAGS] = 0;
  }
  k[K_MODE] = family === 4 && mode === 'recover' ? MODE_RECOVER : MODE_STRICT;
}

/** A `verifyReceived` word's verdict: ICRC_OK, ICRC_RECOVERED or ICRC_BAD. */
export function receivedVerdict(w: number): number {
  return w & 3;
}

/** A `verifyReceived` word's IPv4 ID (of the match; 0 for IPv6). */
export function receivedIpId(w: number): number {
  return w >>> 3;
}

/**
 * A flow's key words for the addon (family, ports and addresses), built once for a path that computes
 * many ICRCs for one flow: `UdpLink`'s send path, one per datagram to the same peer. `icrcOfUdpPayload`
 * checks `info` and reads its addresses out of their arrays at every call; `icrc` copies words.
 * `set` takes the flow as `icrcOfUdpPayload` does (a RangeError for an invalid one); the IPv4 ID and
 * flags are given per call.
 */
export class IcrcFlowKey {
  /** Family, ports, then the source and destination address words, as `writeKey` lays them out. */
  readonly words = new Int32Array(10);
  /** The flow as given, for the JavaScript ICRC where the addon is not built. */
  private readonly info: UdpDatagramInfo;

  constructor(info: UdpDatagramInfo) {
    this.info = { family: 4, srcAddr: new Uint8Array(4), dstAddr: new Uint8Array(4), srcPort: 0, dstPort: 0, ipId: 0, ipFlagsFrag: IPV4_DF };
    this.set(info);
  }

  set(info: UdpDatagramInfo): void {
    if (!infoIsValid(info)) throw new RangeError('UdpDatagramInfo: family must be 4 or 6 with 4- or 16-byte addresses');
    const w = this.words;
    const n = info.family === 4 ? 1 : 4;
    w[0] = info.family;
    w[1] = ((info.srcPort & 0xffff) << 16) | (info.dstPort & 0xffff);
    w.fill(0, 2);
    for (let i = 0; i < n; i++) {
      w[2 + i] = word(info.srcAddr, 4 * i);
      w[6 + i] = word(info.dstAddr, 4 * i);
    }
    const f = this.info;
    f.family = info.family;
    f.srcAddr = info.srcAddr.slice();
    f.dstAddr = info.dstAddr.slice();
    f.srcPort = info.srcPort & 0xffff;
    f.dstPort = info.dstPort & 0xffff;
  }

  /** `icrcOfUdpPayload` of the flow, with IPv4 ID `ipId` and DF (what the stack's sockets send). */
  icrc(ipId: number, udpPayload: Uint8Array): number {
    const a = ADDON;
    if (a === undefined) {
      this.info.ipId = ipId & 0xffff;
      return jsIcrcOfUdpPayload(this.info, udpPayload);
    }
    if (udpPayload.length < MIN_ICRC_PAYLOAD) throw new RangeError(`UDP payload of ${udpPayload.length} bytes is shorter than BTH + ICRC`);
    this.writeKey();
    KEY[K_ID] = ipId & 0xffff;
    return a.icrc(udpPayload) >>> 0;
  }

  /**
   * Writes the ICRC of every datagram of messages `from … to - 1` of a send queue into the datagram's
   * last four bytes, all of this flow, with DF: one native call for them all (`icrc` is one per
   * datagram, and at path MTU 1024 the call was a third of the ICRC's cost). `desc` holds three runs of
   * `desc.length / 3` words: each message's offset in `ring`, its length and its segment length; a
   * message is a GSO train whose segment k leaves with IPv4 ID k (the last segment may be shorter), a
   * lone datagram is segment 0 (`src/link/mmsg.ts`, `TxQueue`). A RangeError, before anything is
   * written, for a message outside `ring` or a segment shorter than BTH + ICRC.
   */
  trains(ring: Uint8Array, desc: Int32Array, from: number, to: number): void {
    const a = ADDON;
    if (a !== undefined) {
      this.writeKey();
      a.trains(ring, desc, from, to);
      return;
    }
    const b = (desc.length / 3) | 0;
    if (!(from >= 0 && to >= from && to <= b)) throw new RangeError(`messages ${from} … ${to} of a queue of ${b}`);
    for (let i = from; i < to; i++) {
      const at = desc[i]!;
      const bytes = desc[b + i]!;
      const seg = desc[2 * b + i]!;
      const last = bytes - Math.floor((bytes - 1) / seg) * seg;
      if (at < 0 || bytes < MIN_ICRC_PAYLOAD || seg < MIN_ICRC_PAYLOAD || at + bytes > ring.length || last < MIN_ICRC_PAYLOAD || (bytes - 1) / seg >= 65536) {
        throw new RangeError(`message ${i} (${bytes} B at ${at}, segments of ${seg} B) outside a ring of ${ring.length} B or shorter than BTH + ICRC`);
      }
    }
    const info = this.info;
    for (let i = from; i < to; i++) {
      const at = desc[i]!;
      const bytes = desc[b + i]!;
      const seg = desc[2 * b + i]!;
      for (let o = 0, id = 0; o < bytes; o += seg, id++) {
        const d = ring.subarray(at + o, at + Math.min(o + seg, bytes));
        info.ipId = id;
        writeIcrc(d, jsIcrcOfUdpPayload(info, d));
      }
    }
  }

  /** The flow's words into the addon's key block, with DF; the ID is the caller's. */
  private writeKey(): void {
    const k = KEY;
    const w = this.words;
    k[K_FAMILY] = w[0]!;
    k[K_PORTS] = w[1]!;
    k[K_FLAGS] = IPV4_DF;
    k[K_SRC] = w[2]!;
    k[K_DST] = w[6]!;
    if (w[0] === 6) {
      k[K_SRC + 1] = w[3]!;
      k[K_SRC + 2] = w[4]!;
      k[K_SRC + 3] = w[5]!;
      k[K_DST + 1] = w[7]!;
      k[K_DST + 2] = w[8]!;
      k[K_DST + 3] = w[9]!;
    }
  }
}

/**
 * An IPv6 flow's two addresses as the ICRC's key words: what `verifyIcrc` reads out of the address
 * arrays at every packet (32 byte loads), read once. `UdpLink` keeps one for the peer of its last
 * datagram. Both addresses must be 16 bytes (a RangeError otherwise).
 */
export class Ipv6IcrcKey {
  /** The source words, then the destination's, as `writeKey` lays them out. */
  readonly words = new Int32Array(8);

  constructor(src: Uint8Array, dst: Uint8Array) {
    this.set(src, dst);
  }

  set(src: Uint8Array, dst: Uint8Array): void {
    if (src.length !== 16 || dst.length !== 16) throw new RangeError('Ipv6IcrcKey: 16-byte addresses');
    for (let i = 0; i < 4; i++) {
      this.words[i] = word(src, 4 * i);
      this.words[4 + i] = word(dst, 4 * i);
    }
  }
}

/**
 * The key words of an IPv4 flow's two addresses, as `Ipv6IcrcKey` holds an IPv6 flow's: a receiver
 * keeps one per peer (`UdpLink`) rather than reading two address arrays at every datagram.
 */
export class Ipv4IcrcKey {
  /** The source address as `writeKey` lays it out, then the destination's. */
  src = 0;
  dst = 0;

  constructor(src: Uint8Array, dst: Uint8Array) {
    this.set(src, dst);
  }

  set(src: Uint8Array, dst: Uint8Array): void {
    if (src.length !== 4 || dst.length !== 4) throw new RangeError('Ipv4IcrcKey: 4-byte addresses');
    this.src = word(src, 0);
    this.dst = word(dst, 0);
  }
}

/**
 * `verifyIcrc` of an IPv4 datagram whose addresses `key` holds (the flow's ports, the ID to try and
 * the flags in `info`, whose addresses must be the same; the JavaScript ICRC reads them there), with
 * `verified` set as `verifyIcrc` sets it. Without the checks and reads of the addresses a check cost
 * 0.02–0.09 less of a raw CRC-32 call at path MTU 1024, 0.05–0.07 at 4096 (bench/HISTORY.md, "Since
 * the full run at 20:17"). Never throws.
 */
export function verifyIcrc4(info: UdpDatagramInfo, key: Ipv4IcrcKey, udpPayload: Uint8Array, mode: IcrcMode): number {
  const a = ADDON;
  if (a === undefined) return jsVerifyIcrc(info, udpPayload, mode);
  if (mode === 'off') return ICRC_UNCHECKED;
  if (udpPayload.length < MIN_ICRC_PAYLOAD) return ICRC_BAD;
  const k = KEY;
  k[K_FAMILY] = 4;
  k[K_PORTS] = ((info.srcPort & 0xffff) << 16) | (info.dstPort & 0xffff);
  k[K_ID] = (info.ipId ?? 0) & 0xffff;
  k[K_FLAGS] = (info.ipFlagsFrag ?? IPV4_DF) & 0xffff;
  k[K_SRC] = key.src;
  k[K_DST] = key.dst;
  k[K_MODE] = mode === 'recover' ? MODE_RECOVER : MODE_STRICT;
  const v = a.verify(udpPayload);
  if (v !== ICRC_BAD) {
    const out = k[K_OUT]!;
    verified.ipId = out >>> 1;
    verified.dontFragment = (out & 1) !== 0;
  }
  return v;
}

/**
 * `verifyIcrc` of an IPv6 datagram whose addresses `key` holds (the flow's ports in `info`, whose
 * addresses must be the same; the JavaScript ICRC reads them there). Never throws.
 */
export function verifyIcrc6(info: UdpDatagramInfo, key: Ipv6IcrcKey, udpPayload: Uint8Array, mode: IcrcMode): number {
  const a = ADDON;
  if (a === undefined) return jsVerifyIcrc(info, udpPayload, mode);
  if (mode === 'off') return ICRC_UNCHECKED;
  if (udpPayload.length < MIN_ICRC_PAYLOAD) return ICRC_BAD;
  const k = KEY;
  const w = key.words;
  k[K_FAMILY] = 6;
  k[K_PORTS] = ((info.srcPort & 0xffff) << 16) | (info.dstPort & 0xffff);
  k[K_ID] = 0;
  k[K_FLAGS] = 0;
  k[K_SRC] = w[0]!;
  k[K_SRC + 1] = w[1]!;
  k[K_SRC + 2] = w[2]!;
  k[K_SRC + 3] = w[3]!;
  k[K_DST] = w[4]!;
  k[K_DST + 1] = w[5]!;
  k[K_DST + 2] = w[6]!;
  k[K_DST + 3] = w[7]!;
  k[K_MODE] = MODE_STRICT;
  return a.verify(udpPayload);
}

function jsVerifyIcrc(info: UdpDatagramInfo, udpPayload: Uint8Array, mode: IcrcMode): number {
  const n = udpPayload.length;
  if (mode === 'off') return ICRC_UNCHECKED;
  if (n < MIN_ICRC_PAYLOAD || !infoIsValid(info)) return ICRC_BAD;
  if (info.family === 6) return crcThroughField(info, udpPayload, 0, 0) === CRC32_RESIDUE ? ICRC_OK : ICRC_BAD;
  const ipId0 = (info.ipId ?? 0) & 0xffff;
  const flags0 = (info.ipFlagsFrag ?? IPV4_DF) & 0xffff;
  // A match shows as the residue; only a mismatch needs the ICRC itself (the field taken off), and
  // recovery solves for the ID from it without another pass over the payload.
  const through = crcThroughField(info, udpPayload, ipId0, flags0);
  if (through === CRC32_RESIDUE) {
    verified.ipId = ipId0;
    verified.dontFragment = (flags0 & IPV4_DF) !== 0;
    return ICRC_OK;
  }
  if (mode !== 'recover') return ICRC_BAD;
  // The difference between the wire's ICRC t and the computed one needs no read of t: the computed
  // one is crc32DropTail4(through, t) = ~(X ^ t), with X a function of `through` alone, so
  // t ^ ~(X ^ t) = ~X = crc32DropTail4(through, 0).
  const r = solveIpv4(n, crc32DropTail4(through, 0), ipId0, flags0);
  if (r < 0) return ICRC_BAD;
  verified.ipId = r >>> 1;
  verified.dontFragment = (r & 1) !== 0;
  return ICRC_RECOVERED;
}

/**
 * Checks the ICRC of a RoCEv2 UDP payload as a UDP socket delivers it. Never throws; malformed input
 * (too short, bad `info`) is `bad`.
 * - `strict`: IPv4 assumes `info.ipId` (default 0) and `info.ipFlagsFrag` (default DF); IPv6 is exact.
 * - `recover`: IPv4 also accepts any ID (and DF either way) that makes the ICRC right, reported as
 *   `ok-recovered` with that `ipId`; 15 bits of protection remain (see above). IPv6: as strict.
 * - `off`: `unchecked`.
 */
export function checkIcrc(info: UdpDatagramInfo, udpPayload: Uint8Array, mode: IcrcMode): IcrcCheck {
  const n = udpPayload.length;
  const value = n >= ICRC_LEN ? readIcrc(udpPayload) : 0;
  if (mode === 'off') return { status: 'unchecked', value };
  if (n < MIN_ICRC_PAYLOAD || !infoIsValid(info)) return { status: 'bad', value };
  // The verdict is `verifyIcrc`'s; this adds the record, and for a mismatch the ICRC it should have had.
  const v = verifyIcrc(info, udpPayload, mode);
  const six = info.family === 6;
  if (v === ICRC_BAD) {
    const id = six ? 0 : (info.ipId ?? 0) & 0xffff;
    const flags = six ? 0 : (info.ipFlagsFrag ?? IPV4_DF) & 0xffff;
    let expected: number;
    if (ADDON !== undefined) {
      writeKey(info, id, flags);
      expected = ADDON.icrc(udpPayload) >>> 0;
    } else {
      expected = icrcWith(info, udpPayload, value, id, flags);
    }
    return { status: 'bad', value, expected };
  }
  if (six) return { status: 'ok', value, expected: value };
  // A recovered header reproduces the wire value by construction: it is reported as the expectation.
  return { status: v === ICRC_OK ? 'ok' : 'ok-recovered', value, expected: value, ipId: verified.ipId, dontFragment: verified.dontFragment };
}

// ---------------------------------------------------------------------------------------------
// The addon (`src/native/icrc.c`): the same arithmetic in one native call per packet.
//
// The functions above take it when it is loaded and agreed with the JavaScript below at load. The
// flow's key goes through KEY, a block of memory the addon reads, rather than as arguments: N-API reads
// each argument for about as long as the whole key takes to write here. Addresses are stored as their
// bytes (little-endian words: the addon copies them into its pseudo header as they lie in memory).

const K_FAMILY = 0;
const K_PORTS = 1;
const K_ID = 2;
const K_FLAGS = 3;
const K_SRC = 4;
const K_DST = 8;
const K_MODE = 12;
const K_OUT = 13;
const MODE_STRICT = 0;
const MODE_RECOVER = 1;
const KEY = new Int32Array(16);

/** `writeKey` with `info`'s own IPv4 ID and flags (defaults 0 and DF), as the send side uses them. */
function writeInfoKey(info: UdpDatagramInfo): void {
  writeKey(info, (info.ipId ?? 0) & 0xffff, (info.ipFlagsFrag ?? IPV4_DF) & 0xffff);
}

/** Writes `info`'s flow into KEY (`info` already checked by `infoIsValid`). */
function writeKey(info: UdpDatagramInfo, ipId: number, flagsFrag: number): void {
  const k = KEY;
  const s = info.srcAddr;
  const d = info.dstAddr;
  k[K_PORTS] = ((info.srcPort & 0xffff) << 16) | (info.dstPort & 0xffff);
  k[K_ID] = ipId;
  k[K_FLAGS] = flagsFrag;
  if (info.family === 4) {
    k[K_FAMILY] = 4;
    k[K_SRC] = word(s, 0);
    k[K_DST] = word(d, 0);
  } else {
    writeAddresses6(k, s, d);
  }
}

/** IPv6's eight address words, out of line so that `writeKey` stays small enough to inline. */
function writeAddresses6(k: Int32Array, s: Uint8Array, d: Uint8Array): void {
  // Unrolled: the loop took half as long again.
  k[K_FAMILY] = 6;
  k[K_SRC] = word(s, 0);
  k[K_SRC + 1] = word(s, 4);
  k[K_SRC + 2] = word(s, 8);
  k[K_SRC + 3] = word(s, 12);
  k[K_DST] = word(d, 0);
  k[K_DST + 1] = word(d, 4);
  k[K_DST + 2] = word(d, 8);
  k[K_DST + 3] = word(d, 12);
}

/**
 * The pure JavaScript ICRC, as used where the addon is not built: exported for the tests that hold the
 * addon to it and for the benchmark's comparison.
 */
export const icrcJs = Object.freeze({
  icrcOfUdpPayload: jsIcrcOfUdpPayload,
  icrcOfParts: jsIcrcOfParts,
  verifyIcrc: jsVerifyIcrc,
  recoverIpv4Id: jsRecoverIpv4Id,
});

/**
 * Whether `a` computes what the JavaScript computes, on packets that take every branch: both families,
 * an IPv4 ID and DF other than assumed, a cache hit and miss, two parts split inside the BTH, a
 * corrupted packet. An addon that loads but disagrees (another byte order, a bad build) is not used.
 */
function addonAgrees(a: IcrcAddon): boolean {
  try {
    a.bind(KEY);
    const v4: UdpDatagramInfo = { family: 4, srcAddr: Uint8Array.of(10, 0, 0, 1), dstAddr: Uint8Array.of(10, 0, 0, 2), srcPort: 0xc000, dstPort: 4791, ipId: 0x1234, ipFlagsFrag: IPV4_DF };
    const v6: UdpDatagramInfo = { family: 6, srcAddr: new Uint8Array(16).fill(0xfe), dstAddr: new Uint8Array(16).fill(0x21), srcPort: 0xc001, dstPort: 4791, ipId: 0, ipFlagsFrag: 0 };
    const p = new Uint8Array(12 + 200 + 4);
    for (let i = 0; i < p.length; i++) p[i] = (i * 151 + 7) & 0xff;
    for (const info of [v4, v6, v4]) {
      const want = jsIcrcOfUdpPayload(info, p);
      writeInfoKey(info);
      if (a.icrc(p) >>> 0 !== want) return false;
      if (a.icrc2(p.subarray(0, 3), p.subarray(3, p.length - 4)) >>> 0 !== want) return false;
      writeIcrc(p, want);
      KEY[K_MODE] = MODE_STRICT;
      if (a.verify(p) !== ICRC_OK) return false;
    }
    // A queue's two messages in one call: a lone datagram (ID 0), and a train of segments of 40 B, 40 B
    // and 20 B (IDs 0, 1, 2).
    const ring = new Uint8Array(164);
    for (let i = 0; i < ring.length; i++) ring[i] = (i * 89 + 3) & 0xff;
    for (const info of [v4, v6]) {
      writeInfoKey(info);
      if (a.trains(ring, Int32Array.of(0, 64, 64, 100, 64, 40), 0, 2) !== 4) return false;
      const segments = [ring.subarray(0, 64), ring.subarray(64, 104), ring.subarray(104, 144), ring.subarray(144, 164)];
      const ids = [0, 0, 1, 2];
      if (!segments.every((d, i) => readIcrc(d) === jsIcrcOfUdpPayload({ ...info, ipId: ids[i]!, ipFlagsFrag: IPV4_DF }, d))) return false;
    }
    // The sender's ID 0x1234, a receiver assuming 0: recovered; one bit flipped: bad.
    const guess = { ...v4, ipId: 0 };
    writeKey(guess, 0, IPV4_DF);
    KEY[K_MODE] = MODE_RECOVER;
    if (a.verify(p) !== ICRC_RECOVERED || KEY[K_OUT] !== ((0x1234 << 1) | 1)) return false;
    // The same packet as the one datagram of a receive batch, from 10.0.0.1 port 0xc000 (its sockaddr_in
    // at 0), to 10.0.0.2 port 4791: recovered, with the same ID and DF.
    const mem = new Uint8Array(16 + p.length);
    mem.set([0, 0, 0xc0, 0x00, 10, 0, 0, 1]);
    mem.set(p, 16);
    const out = new Int32Array(1);
    writeReceivedKey(4, v4.dstAddr, 4791, 'recover');
    const judged = a.received(mem, Int32Array.of(16, p.length, 0, 0), 1, out);
    if (judged !== 1 || out[0] !== (ICRC_RECOVERED | (((0x1234 << 1) | 1) << 2))) return false;
    p[100] = p[100]! ^ 0x10;
    return a.verify(p) === ICRC_BAD && jsVerifyIcrc(guess, p, 'recover') === ICRC_BAD;
  } catch {
    return false;
  }
}

const ADDON: IcrcAddon | undefined = icrcAddon !== undefined && addonAgrees(icrcAddon) ? icrcAddon : undefined;

/** Which ICRC the functions above compute with: `'addon'` or `'js'` (the JS one over `crc32`). */
export const icrcImplementation: 'addon' | 'js' = ADDON !== undefined ? 'addon' : 'js';

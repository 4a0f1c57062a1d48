/**
 * Link-layer, IPv4, IPv6 and UDP codecs: everything between a captured frame and a RoCEv2
 * UDP payload (BTH onwards).
 *
 * Read first: RFC 791 (IPv4, header checksum per RFC 1071), RFC 8200 (IPv6, §4 extension
 * headers), RFC 768 (UDP) and RFC 8200 §8.1 (UDP over IPv6 must carry a checksum, relaxed to
 * "zero allowed" for tunnels by RFC 6935/6936, which is what rdma_rxe relies on), IEEE 802.1Q,
 * and the tcpdump.org LINKTYPE list for the cooked (SLL/SLL2) and raw-IP headers.
 *
 * Contract (as in the rest of `src/wire/`):
 * - `parseFrame` takes untrusted bytes and never throws: every failure is a typed
 *   `{ ok: false, error }`. On success every offset/length it returns lies inside the buffer,
 *   so callers may index without further checks. Addresses are views into the caller's buffer
 *   (no copies); they stay valid as long as that buffer is not reused.
 * - `emit*` functions take trusted arguments from the stack itself. A buffer that is too small or
 *   an option that cannot be encoded is a programming error and throws `RangeError`.
 */

/** pcap/pcapng link types understood here (tcpdump.org "LINKTYPE_*" values). */
export const LinkType = {
  ETHERNET: 1,
  RAW: 101,
  LINUX_SLL: 113,
  IPV4: 228,
  IPV6: 229,
  LINUX_SLL2: 276,
} as const;

export const ETHERTYPE_IPV4 = 0x0800;
export const ETHERTYPE_IPV6 = 0x86dd;
export const ETHERTYPE_VLAN = 0x8100;
/** 802.1ad service tag (outer tag of Q-in-Q). */
export const ETHERTYPE_QINQ = 0x88a8;
/** Pre-standard Q-in-Q outer tag still emitted by some switches. */
export const ETHERTYPE_QINQ_LEGACY = 0x9100;

export const IPPROTO_UDP = 17;
export const ETH_HEADER_LEN = 14;
export const VLAN_TAG_LEN = 4;
export const IPV4_HEADER_LEN = 20;
export const IPV6_HEADER_LEN = 40;
export const UDP_HEADER_LEN = 8;
const SLL_HEADER_LEN = 16;
const SLL2_HEADER_LEN = 20;
/** At most two tags (802.1Q, or 802.1ad + 802.1Q); a third is almost always garbage. */
const MAX_VLAN_TAGS = 2;

const IPV4_FLAG_DF = 0x4000;
const IPV4_FLAG_MF = 0x2000;
const IPV4_FRAG_OFFSET_MASK = 0x1fff;

// IPv6 next-header values (IANA "Assigned Internet Protocol Numbers").
const IPV6_EXT_HOP_BY_HOP = 0;
const IPV6_EXT_ROUTING = 43;
const IPV6_EXT_FRAGMENT = 44;
const IPV6_EXT_DEST_OPTS = 60;

export interface Ipv4Header {
  readonly family: 4;
  /** In bytes (IHL × 4); larger than 20 when options are present. */
  readonly headerLength: number;
  readonly tos: number;
  readonly totalLength: number;
  readonly id: number;
  /** The raw 16-bit flags + fragment offset word. */
  readonly flagsFrag: number;
  readonly dontFragment: boolean;
  readonly ttl: number;
  readonly protocol: number;
  readonly checksum: number;
  /** 4-byte view into the frame. */
  readonly src: Uint8Array;
  readonly dst: Uint8Array;
}

export interface Ipv6Header {
  readonly family: 6;
  readonly trafficClass: number;
  readonly flowLabel: number;
  readonly payloadLength: number;
  /** Next header of the fixed header (not of the last extension header). */
  readonly nextHeader: number;
  readonly hopLimit: number;
  /** 16-byte view into the frame. */
  readonly src: Uint8Array;
  readonly dst: Uint8Array;
}

export type IpHeader = Ipv4Header | Ipv6Header;

export interface UdpHeader {
  readonly srcPort: number;
  readonly dstPort: number;
  readonly length: number;
  readonly checksum: number;
}

export interface ParsedFrame {
  readonly linkType: number;
  readonly ip: IpHeader;
  readonly ipOffset: number;
  readonly udp: UdpHeader;
  readonly udpOffset: number;
  /** The UDP payload; for RoCEv2 this is the BTH. */
  readonly payloadOffset: number;
  /** From the UDP length field, so Ethernet padding after the datagram is excluded. */
  readonly payloadLength: number;
}

export type FrameErrorCode =
  /** The frame ends before a header or the datagram that its length fields announce. */
  | 'TRUNCATED'
  /** The pcap link type is not one of `LinkType`. */
  | 'UNSUPPORTED_LINKTYPE'
  /** The link layer carries something else (ARP, LLDP, 802.3 length frames, >2 VLAN tags). */
  | 'NOT_IP'
  /** The IP version nibble is not 4/6, or disagrees with the ethertype / link type. */
  | 'BAD_IP_VERSION'
  /** IHL < 5, total length shorter than the header, IPv6 jumbogram. */
  | 'BAD_IP_HEADER'
  /** An IPv4 fragment (MF set or offset ≠ 0) or an IPv6 fragment header: not reassembled. */
  | 'IP_FRAGMENT'
  /** A well-formed IP packet that is not UDP (TCP, ICMP, ESP, …). */
  | 'NOT_UDP'
  /** UDP length < 8 or longer than the IP payload. */
  | 'BAD_UDP_LENGTH';

export type FrameParseResult =
  | { readonly ok: true; readonly frame: ParsedFrame }
  | { readonly ok: false; readonly error: FrameErrorCode; readonly detail?: string };

function fail(error: FrameErrorCode, detail?: string): FrameParseResult {
  return detail === undefined ? { ok: false, error } : { ok: false, error, detail };
}

/**
 * Parses a captured frame of the given pcap link type down to its UDP payload.
 * Never throws; see the module contract.
 */
export function parseFrame(linkType: number, data: Uint8Array): FrameParseResult {
  const v = new DataView(data.buffer, data.byteOffset, data.byteLength);
  switch (linkType) {
    case LinkType.ETHERNET:
      if (data.length < ETH_HEADER_LEN) return fail('TRUNCATED', 'Ethernet header');
      return parseEthertype(linkType, data, v, ETH_HEADER_LEN - 2);
    case LinkType.LINUX_SLL:
      // SLL: packet type(2) ARPHRD(2) address length(2) address(8) protocol(2).
      if (data.length < SLL_HEADER_LEN) return fail('TRUNCATED', 'SLL header');
      return parseEthertype(linkType, data, v, SLL_HEADER_LEN - 2);
    case LinkType.LINUX_SLL2:
      // SLL2: protocol(2) reserved(2) ifindex(4) ARPHRD(2) packet type(1) addr len(1) addr(8).
      if (data.length < SLL2_HEADER_LEN) return fail('TRUNCATED', 'SLL2 header');
      return parseEthertypeAt(linkType, data, v, v.getUint16(0), SLL2_HEADER_LEN);
    case LinkType.RAW:
      return parseIp(linkType, data, v, 0, 0);
    case LinkType.IPV4:
      return parseIp(linkType, data, v, 0, 4);
    case LinkType.IPV6:
      return parseIp(linkType, data, v, 0, 6);
    default:
      return fail('UNSUPPORTED_LINKTYPE', `link type ${linkType}`);
  }
}

/** Ethernet and SLL both end in a 2-byte ethertype at `typeOffset`, payload right after it. */
function parseEthertype(linkType: number, data: Uint8Array, v: DataView, typeOffset: number): FrameParseResult {
  return parseEthertypeAt(linkType, data, v, v.getUint16(typeOffset), typeOffset + 2);
}

function parseEthertypeAt(
  linkType: number,
  data: Uint8Array,
  v: DataView,
  firstType: number,
  firstOffset: number,
): FrameParseResult {
  let type = firstType;
  let off = firstOffset;
  let tags = 0;
  while (type === ETHERTYPE_VLAN || type === ETHERTYPE_QINQ || type === ETHERTYPE_QINQ_LEGACY) {
    if (++tags > MAX_VLAN_TAGS) return fail('NOT_IP', 'more than two VLAN tags');
    if (data.length < off + VLAN_TAG_LEN) return fail('TRUNCATED', 'VLAN tag');
    // Tag = TCI(2) + inner ethertype(2).
    type = v.getUint16(off + 2);
    off += VLAN_TAG_LEN;
  }
  if (type === ETHERTYPE_IPV4) return parseIp(linkType, data, v, off, 4);
  if (type === ETHERTYPE_IPV6) return parseIp(linkType, data, v, off, 6);
  return fail('NOT_IP', `ethertype 0x${type.toString(16).padStart(4, '0')}`);
}

/** `expect` is 4 or 6 when the link layer fixed the version, 0 for raw IP. */
function parseIp(linkType: number, data: Uint8Array, v: DataView, off: number, expect: 0 | 4 | 6): FrameParseResult {
  if (data.length < off + 1) return fail('TRUNCATED', 'IP version');
  const version = (data[off] ?? 0) >> 4;
  if ((version !== 4 && version !== 6) || (expect !== 0 && version !== expect)) {
    return fail('BAD_IP_VERSION', `version ${version}${expect !== 0 ? `, expected ${expect}` : ''}`);
  }
  return version === 4 ? parseIpv4(linkType, data, v, off) : parseIpv6(linkType, data, v, off);
}

/*
 *  0                   1                   2                   3
 *  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
 * |Version|  IHL  |Type of Service|          Total Length         |
 * |         Identification        |Flags|      Fragment Offset    |
 * |  Time to Live |    Protocol   |         Header Checksum       |
 * |                       Source Address                          |
 * |                    Destination Address                        |
 * |                    Options                    |    Padding    |
 */
function parseIpv4(linkType: number, data: Uint8Array, v: DataView, off: number): FrameParseResult {
  if (data.length < off + IPV4_HEADER_LEN) return fail('TRUNCATED', 'IPv4 header');
  const headerLength = ((data[off] ?? 0) & 0x0f) * 4;
  if (headerLength < IPV4_HEADER_LEN) return fail('BAD_IP_HEADER', `IHL ${headerLength / 4}`);
  if (data.length < off + headerLength) return fail('TRUNCATED', 'IPv4 options');
  const totalLength = v.getUint16(off + 2);
  if (totalLength < headerLength) return fail('BAD_IP_HEADER', `total length ${totalLength} < header ${headerLength}`);
  // Ethernet pads short frames, so only "too short" is an error; the IP length is authoritative.
  if (data.length < off + totalLength) return fail('TRUNCATED', `IPv4 total length ${totalLength}`);
  const flagsFrag = v.getUint16(off + 6);
  const ip: Ipv4Header = {
    family: 4,
    headerLength,
    tos: data[off + 1] ?? 0,
    totalLength,
    id: v.getUint16(off + 4),
    flagsFrag,
    dontFragment: (flagsFrag & IPV4_FLAG_DF) !== 0,
    ttl: data[off + 8] ?? 0,
    protocol: data[off + 9] ?? 0,
    checksum: v.getUint16(off + 10),
    src: data.subarray(off + 12, off + 16),
    dst: data.subarray(off + 16, off + 20),
  };
  // Only a first fragment holds the UDP header, and even then its length covers bytes we lack.
  if ((flagsFrag & (IPV4_FLAG_MF | IPV4_FRAG_OFFSET_MASK)) !== 0) {
    const fragOff = (flagsFrag & IPV4_FRAG_OFFSET_MASK) * 8;
    return fail('IP_FRAGMENT', `IPv4 fragment offset ${fragOff}${(flagsFrag & IPV4_FLAG_MF) !== 0 ? ', MF' : ''}`);
  }
  if (ip.protocol !== IPPROTO_UDP) return fail('NOT_UDP', `IP protocol ${ip.protocol}`);
  return parseUdp(linkType, v, ip, off, off + headerLength, off + totalLength);
}

/*
 * |Version| Traffic Class |           Flow Label                  |
 * |         Payload Length        |  Next Header  |   Hop Limit   |
 * |                Source Address (128)                           |
 * |             Destination Address (128)                         |
 */
function parseIpv6(linkType: number, data: Uint8Array, v: DataView, off: number): FrameParseResult {
  if (data.length < off + IPV6_HEADER_LEN) return fail('TRUNCATED', 'IPv6 header');
  const word0 = v.getUint32(off);
  const payloadLength = v.getUint16(off + 4);
  const ip: Ipv6Header = {
    family: 6,
    trafficClass: (word0 >>> 20) & 0xff,
    flowLabel: word0 & 0xfffff,
    payloadLength,
    nextHeader: data[off + 6] ?? 0,
    hopLimit: data[off + 7] ?? 0,
    src: data.subarray(off + 8, off + 24),
    dst: data.subarray(off + 24, off + 40),
  };
  if (payloadLength === 0) return fail('BAD_IP_HEADER', 'IPv6 payload length 0 (jumbogram) is not supported');
  const end = off + IPV6_HEADER_LEN + payloadLength;
  if (data.length < end) return fail('TRUNCATED', `IPv6 payload length ${payloadLength}`);
  let next = ip.nextHeader;
  let p = off + IPV6_HEADER_LEN;
  // Each extension header is at least 8 bytes and must lie inside the payload, so this terminates.
  for (;;) {
    if (next === IPPROTO_UDP) return parseUdp(linkType, v, ip, off, p, end);
    if (next === IPV6_EXT_FRAGMENT) return fail('IP_FRAGMENT', 'IPv6 fragment header: reassembly is not supported');
    if (next !== IPV6_EXT_HOP_BY_HOP && next !== IPV6_EXT_ROUTING && next !== IPV6_EXT_DEST_OPTS) {
      return fail('NOT_UDP', `IPv6 next header ${next}`);
    }
    // Next Header(1) Hdr Ext Len(1, in 8-octet units not counting the first 8).
    if (end < p + 8) return fail('BAD_IP_HEADER', `IPv6 extension header ${next} overruns the payload`);
    const len = ((data[p + 1] ?? 0) + 1) * 8;
    if (end < p + len) return fail('BAD_IP_HEADER', `IPv6 extension header ${next} overruns the payload`);
    next = data[p] ?? 0;
    p += len;
  }
}

function parseUdp(
  linkType: number,
  v: DataView,
  ip: IpHeader,
  ipOffset: number,
  udpOffset: number,
  ipEnd: number,
): FrameParseResult {
  // ipEnd ≤ data.length was checked by the caller, so this also bounds the buffer.
  if (ipEnd < udpOffset + UDP_HEADER_LEN) return fail('TRUNCATED', 'UDP header');
  const length = v.getUint16(udpOffset + 4);
  if (length < UDP_HEADER_LEN || udpOffset + length > ipEnd) {
    return fail('BAD_UDP_LENGTH', `UDP length ${length}, IP payload ${ipEnd - udpOffset}`);
  }
  return {
    ok: true,
    frame: {
      linkType,
      ip,
      ipOffset,
      udp: {
        srcPort: v.getUint16(udpOffset),
        dstPort: v.getUint16(udpOffset + 2),
        length,
        checksum: v.getUint16(udpOffset + 6),
      },
      udpOffset,
      payloadOffset: udpOffset + UDP_HEADER_LEN,
      payloadLength: length - UDP_HEADER_LEN,
    },
  };
}

// ---------------------------------------------------------------------------------------------
// Checksums (RFC 1071)

/**
 * Adds `len` bytes at `off` to a running one's-complement sum. `odd` says whether an odd number
 * of bytes precedes them in the checksummed stream, so iovec parts of any length can be summed
 * in sequence. The result is unfolded; fold with `foldChecksum`. A JS number holds 2^37 words
 * before losing precision, far beyond any datagram.
 */
function sumBytes(acc: number, buf: Uint8Array, off: number, len: number, odd: boolean): number {
  let i = off;
  const end = off + len;
  if (odd && i < end) acc += buf[i++] ?? 0;
  for (; i + 1 < end; i += 2) acc += ((buf[i] ?? 0) << 8) | (buf[i + 1] ?? 0);
  if (i < end) acc += (buf[i] ?? 0) << 8;
  return acc;
}

function foldChecksum(acc: number): number {
  while (acc > 0xffff) acc = (acc % 0x10000) + Math.floor(acc / 0x10000);
  return acc;
}

/**
 * The Internet checksum of `len` bytes: the one's complement of their one's-complement sum.
 * Over a header whose checksum field is zero it gives the value to store; over a header with a
 * correct checksum in place it gives 0.
 */
export function ipv4Checksum(buf: Uint8Array, off: number, len: number): number {
  return ~foldChecksum(sumBytes(0, buf, off, len, false)) & 0xffff;
}

/** UDP checksum over the IPv4/IPv6 pseudo-header, the UDP header at `udp` and the payload parts. */
function udpChecksum(src: Uint8Array, dst: Uint8Array, udp: Uint8Array, udpOff: number, parts: readonly Uint8Array[]): number {
  const udpLength = ((udp[udpOff + 4] ?? 0) << 8) | (udp[udpOff + 5] ?? 0);
  // Pseudo-header: addresses, then zero + protocol + UDP length (IPv4) or the 32-bit length and
  // 24 zero bits + next header (IPv6); both sum to the same words.
  let acc = sumBytes(0, src, 0, src.length, false);
  acc = sumBytes(acc, dst, 0, dst.length, false);
  acc += IPPROTO_UDP + udpLength;
  acc = sumBytes(acc, udp, udpOff, UDP_HEADER_LEN, false);
  let odd = false;
  for (const part of parts) {
    acc = sumBytes(acc, part, 0, part.length, odd);
    if (part.length % 2 === 1) odd = !odd;
  }
  const c = ~foldChecksum(acc) & 0xffff;
  // RFC 768: a computed 0 is sent as all ones, because 0 means "no checksum".
  return c === 0 ? 0xffff : c;
}

// ---------------------------------------------------------------------------------------------
// Emit

/** Link types `emitUdpFrame` can produce. */
export type EmitLinkType = typeof LinkType.ETHERNET | typeof LinkType.RAW | typeof LinkType.IPV4 | typeof LinkType.IPV6;

export interface UdpFrameOptions {
  /** Default Ethernet. Raw IP (101) or 228/229 when writing a capture of that link type. */
  readonly linkType?: EmitLinkType;
  /** 4-byte (IPv4) or 16-byte (IPv6) addresses; both must be the same family. */
  readonly src: Uint8Array;
  readonly dst: Uint8Array;
  /** Checked against the address lengths when given. */
  readonly family?: 4 | 6;
  readonly srcPort: number;
  readonly dstPort: number;
  /** Ethernet only. Default: 02:00 followed by the low 4 bytes of the IP address. */
  readonly srcMac?: Uint8Array;
  readonly dstMac?: Uint8Array;
  /** Ethernet only: adds one 802.1Q tag with this TCI (PCP << 13 | DEI << 12 | VID). */
  readonly vlanTci?: number;
  /** IPv4 TOS / IPv6 traffic class (DSCP << 2 | ECN). Default 0. */
  readonly tos?: number;
  /** IPv4 TTL / IPv6 hop limit. Default 64, as rdma_rxe sends. */
  readonly ttl?: number;
  /** IPv4 identification. Default 0. */
  readonly ipId?: number;
  /** IPv4 DF bit. Default true, as rdma_rxe sends. */
  readonly dontFragment?: boolean;
  /** IPv6 flow label. Default 0. */
  readonly flowLabel?: number;
  /**
   * 'zero' sends checksum 0 (no checksum; RoCEv2 relies on the ICRC). Default 'zero' for IPv4 and
   * 'compute' for IPv6, where RFC 8200 requires one unless the receiver opts out (RFC 6935).
   */
  readonly udpChecksum?: 'zero' | 'compute';
}

function familyOf(opts: UdpFrameOptions): 4 | 6 {
  const n = opts.src.length;
  if ((n !== 4 && n !== 16) || opts.dst.length !== n) {
    throw new RangeError(`src/dst must both be 4 or 16 bytes, got ${n} and ${opts.dst.length}`);
  }
  const family = n === 4 ? 4 : 6;
  if (opts.family !== undefined && opts.family !== family) {
    throw new RangeError(`family ${opts.family} does not match ${n}-byte addresses`);
  }
  return family;
}

function linkHeaderLength(opts: UdpFrameOptions): number {
  const lt = opts.linkType ?? LinkType.ETHERNET;
  if (lt === LinkType.ETHERNET) return ETH_HEADER_LEN + (opts.vlanTci !== undefined ? VLAN_TAG_LEN : 0);
  if (lt === LinkType.RAW || lt === LinkType.IPV4 || lt === LinkType.IPV6) return 0;
  throw new RangeError(`cannot emit link type ${String(lt)}`);
}

/** Bytes of link + IP + UDP headers that `emitUdpHeaders` writes for these options. */
export function udpHeadersLength(opts: UdpFrameOptions): number {
  const family = familyOf(opts);
  return linkHeaderLength(opts) + (family === 4 ? IPV4_HEADER_LEN : IPV6_HEADER_LEN) + UDP_HEADER_LEN;
}

/** Total frame length for a UDP payload of `payloadLength` bytes. */
export function udpFrameLength(opts: UdpFrameOptions, payloadLength: number): number {
  return udpHeadersLength(opts) + payloadLength;
}

function totalLength(parts: readonly Uint8Array[]): number {
  let n = 0;
  for (const p of parts) n += p.length;
  return n;
}

function asParts(payload: Uint8Array | readonly Uint8Array[]): readonly Uint8Array[] {
  return payload instanceof Uint8Array ? [payload] : payload;
}

function checkUint(name: string, x: number, max: number): number {
  if (!Number.isInteger(x) || x < 0 || x > max) throw new RangeError(`${name} ${x} out of range 0..${max}`);
  return x;
}

/** A locally administered MAC (02:00:a.b.c.d) so each IP gets its own stable synthetic station. */
function defaultMac(out: Uint8Array, off: number, ip: Uint8Array): void {
  out[off] = 0x02;
  out[off + 1] = 0x00;
  out.set(ip.subarray(ip.length - 4), off + 2);
}

/**
 * Writes the link, IP and UDP headers for a datagram whose payload is `payload` (read only for
 * its length and, when computing the UDP checksum, its bytes) at `out[offset]`. Returns the
 * offset just past the UDP header, where the payload belongs. Every header byte is written.
 */
export function emitUdpHeaders(
  opts: UdpFrameOptions,
  payload: Uint8Array | readonly Uint8Array[],
  out: Uint8Array,
  offset = 0,
): number {
  const parts = asParts(payload);
  const family = familyOf(opts);
  const headersLen = udpHeadersLength(opts);
  const payloadLen = totalLength(parts);
  const udpLen = UDP_HEADER_LEN + payloadLen;
  const ipLen = (family === 4 ? IPV4_HEADER_LEN : 0) + udpLen;
  if (udpLen > 0xffff || ipLen > 0xffff) throw new RangeError(`UDP payload of ${payloadLen} bytes does not fit a datagram`);
  if (offset < 0 || out.length < offset + headersLen) throw new RangeError(`need ${headersLen} bytes at offset ${offset}, have ${out.length - offset}`);
  const v = new DataView(out.buffer, out.byteOffset, out.byteLength);
  const tos = checkUint('tos', opts.tos ?? 0, 0xff);
  const ttl = checkUint('ttl', opts.ttl ?? 64, 0xff);
  let p = offset;

  if ((opts.linkType ?? LinkType.ETHERNET) === LinkType.ETHERNET) {
    for (const [mac, ip, at] of [[opts.dstMac, opts.dst, p], [opts.srcMac, opts.src, p + 6]] as const) {
      if (mac === undefined) defaultMac(out, at, ip);
      else if (mac.length !== 6) throw new RangeError(`MAC must be 6 bytes, got ${mac.length}`);
      else out.set(mac, at);
    }
    p += 12;
    if (opts.vlanTci !== undefined) {
      v.setUint16(p, ETHERTYPE_VLAN);
      v.setUint16(p + 2, checkUint('vlanTci', opts.vlanTci, 0xffff));
      p += VLAN_TAG_LEN;
    }
    v.setUint16(p, family === 4 ? ETHERTYPE_IPV4 : ETHERTYPE_IPV6);
    p += 2;
  } else if (opts.linkType === LinkType.IPV4 && family !== 4) {
    throw new RangeError('link type 228 carries IPv4 only');
  } else if (opts.linkType === LinkType.IPV6 && family !== 6) {
    throw new RangeError('link type 229 carries IPv6 only');
  }

  if (family === 4) {
    out[p] = 0x45; // version 4, IHL 5: no options
    out[p + 1] = tos;
    v.setUint16(p + 2, ipLen);
    v.setUint16(p + 4, checkUint('ipId', opts.ipId ?? 0, 0xffff));
    v.setUint16(p + 6, (opts.dontFragment ?? true) ? IPV4_FLAG_DF : 0);
    out[p + 8] = ttl;
    out[p + 9] = IPPROTO_UDP;
    v.setUint16(p + 10, 0);
    out.set(opts.src, p + 12);
    out.set(opts.dst, p + 16);
    v.setUint16(p + 10, ipv4Checksum(out, p, IPV4_HEADER_LEN));
    p += IPV4_HEADER_LEN;
  } else {
    const flow = checkUint('flowLabel', opts.flowLabel ?? 0, 0xfffff);
    v.setUint32(p, ((6 << 28) | (tos << 20) | flow) >>> 0);
    v.setUint16(p + 4, udpLen);
    out[p + 6] = IPPROTO_UDP;
    out[p + 7] = ttl;
    out.set(opts.src, p + 8);
    out.set(opts.dst, p + 24);
    p += IPV6_HEADER_LEN;
  }

  v.setUint16(p, checkUint('srcPort', opts.srcPort, 0xffff));
  v.setUint16(p + 2, checkUint('dstPort', opts.dstPort, 0xffff));
  v.setUint16(p + 4, udpLen);
  v.setUint16(p + 6, 0);
  const mode = opts.udpChecksum ?? (family === 4 ? 'zero' : 'compute');
  if (mode === 'compute') v.setUint16(p + 6, udpChecksum(opts.src, opts.dst, out, p, parts));
  return p + UDP_HEADER_LEN;
}

/**
 * Writes a whole frame (headers, then the payload parts copied in order) into `out` at `offset`,
 * or into a new buffer when `out` is omitted. Returns the view of the written frame.
 */
export function emitUdpFrame(
  opts: UdpFrameOptions,
  payload: Uint8Array | readonly Uint8Array[],
  out?: Uint8Array,
  offset = 0,
): Uint8Array {
  const parts = asParts(payload);
  const len = udpFrameLength(opts, totalLength(parts));
  const buf = out ?? new Uint8Array(offset + len);
  if (offset < 0 || buf.length < offset + len) throw new RangeError(`need ${len} bytes at offset ${offset}, have ${buf.length - offset}`);
  let p = emitUdpHeaders(opts, parts, buf, offset);
  for (const part of parts) {
    buf.set(part, p);
    p += part.length;
  }
  return buf.subarray(offset, p);
}

/** Ethernet + IPv4 + UDP; `opts.src`/`dst` must be 4-byte addresses. */
export function emitEthIpv4Udp(
  opts: Omit<UdpFrameOptions, 'linkType' | 'family'>,
  payload: Uint8Array | readonly Uint8Array[],
  out?: Uint8Array,
  offset = 0,
): Uint8Array {
  return emitUdpFrame({ ...opts, family: 4 }, payload, out, offset);
}

/** Ethernet + IPv6 + UDP; `opts.src`/`dst` must be 16-byte addresses. */
export function emitEthIpv6Udp(
  opts: Omit<UdpFrameOptions, 'linkType' | 'family'>,
  payload: Uint8Array | readonly Uint8Array[],
  out?: Uint8Array,
  offset = 0,
): Uint8Array {
  return emitUdpFrame({ ...opts, family: 6 }, payload, out, offset);
}

// ---------------------------------------------------------------------------------------------
// Addresses

function parseIpv4Text(text: string, out: Uint8Array, off: number): boolean {
  const parts = text.split('.');
  if (parts.length !== 4) return false;
  for (let i = 0; i < 4; i++) {
    const s = parts[i] ?? '';
    // Leading zeros are rejected: some parsers read them as octal, so "010" is ambiguous.
    if (!/^(0|[1-9][0-9]{0,2})$/.test(s)) return false;
    const n = Number(s);
    if (n > 255) return false;
    out[off + i] = n;
  }
  return true;
}

/**
 * Parses dotted-quad IPv4 or RFC 4291 IPv6 text (with `::` and a trailing dotted quad) into 4 or
 * 16 bytes. Returns undefined for anything else, including zone ids (`%eth0`) and brackets,
 * because the text may come from a peer.
 */
export function parseIpAddress(text: string): Uint8Array | undefined {
  if (text.length === 0 || text.length > 45) return undefined;
  if (!text.includes(':')) {
    const out = new Uint8Array(4);
    return parseIpv4Text(text, out, 0) ? out : undefined;
  }
  const halves = text.split('::');
  if (halves.length > 2) return undefined;
  const groupsOf = (s: string): string[] => (s === '' ? [] : s.split(':'));
  const head = groupsOf(halves[0] ?? '');
  const tail = halves.length === 2 ? groupsOf(halves[1] ?? '') : [];
  // A dotted quad may only stand for the last 32 bits.
  const lastGroups = halves.length === 2 ? tail : head;
  const v4 = lastGroups[lastGroups.length - 1]?.includes('.') === true ? lastGroups.pop() : undefined;
  const words = head.length + tail.length + (v4 !== undefined ? 2 : 0);
  if (halves.length === 2 ? words > 7 : words !== 8) return undefined;
  const out = new Uint8Array(16);
  const put = (groups: string[], at: number): boolean =>
    groups.every((g, i) => {
      if (!/^[0-9a-fA-F]{1,4}$/.test(g)) return false;
      const w = parseInt(g, 16);
      out[2 * (at + i)] = w >> 8;
      out[2 * (at + i) + 1] = w & 0xff;
      return true;
    });
  if (!put(head, 0)) return undefined;
  if (!put(tail, 8 - tail.length - (v4 !== undefined ? 2 : 0))) return undefined;
  if (v4 !== undefined && !parseIpv4Text(v4, out, 12)) return undefined;
  return out;
}

/** 4 bytes → dotted quad; 16 bytes → RFC 5952 text (IPv4-mapped as ::ffff:a.b.c.d). */
export function formatIpAddress(bytes: Uint8Array): string {
  if (bytes.length === 4) return `${bytes[0]}.${bytes[1]}.${bytes[2]}.${bytes[3]}`;
  if (bytes.length !== 16) throw new RangeError(`an IP address is 4 or 16 bytes, got ${bytes.length}`);
  if (isIpv4MappedGid(bytes)) return `::ffff:${formatIpAddress(bytes.subarray(12))}`;
  const w: number[] = [];
  for (let i = 0; i < 16; i += 2) w.push(((bytes[i] ?? 0) << 8) | (bytes[i + 1] ?? 0));
  // RFC 5952 §4.2: compress the longest run of ≥2 zero words, the first one on a tie.
  let bestAt = -1;
  let bestLen = 1;
  for (let i = 0; i < 8; ) {
    if (w[i] !== 0) {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && w[j] === 0) j++;
    if (j - i > bestLen) {
      bestAt = i;
      bestLen = j - i;
    }
    i = j;
  }
  const hex = (a: number[]): string => a.map((x) => x.toString(16)).join(':');
  if (bestAt < 0) return hex(w);
  return `${hex(w.slice(0, bestAt))}::${hex(w.slice(bestAt + bestLen))}`;
}

/** True for ::ffff:a.b.c.d, the GID form rdma_rxe uses for an IPv4 address. */
export function isIpv4MappedGid(gid: Uint8Array): boolean {
  if (gid.length !== 16) return false;
  for (let i = 0; i < 10; i++) if (gid[i] !== 0) return false;
  return gid[10] === 0xff && gid[11] === 0xff;
}

/** The 16-byte GID for an IP address: IPv4 becomes IPv4-mapped IPv6. Always a new array. */
export function gidFromIp(ip: Uint8Array): Uint8Array {
  const gid = new Uint8Array(16);
  if (ip.length === 4) {
    gid[10] = 0xff;
    gid[11] = 0xff;
    gid.set(ip, 12);
  } else if (ip.length === 16) {
    gid.set(ip);
  } else {
    throw new RangeError(`an IP address is 4 or 16 bytes, got ${ip.length}`);
  }
  return gid;
}

/** The IP address a RoCEv2 GID stands for: a 4-byte view for IPv4-mapped GIDs, else the GID itself. */
export function ipFromGid(gid: Uint8Array): Uint8Array {
  if (gid.length !== 16) throw new RangeError(`a GID is 16 bytes, got ${gid.length}`);
  return isIpv4MappedGid(gid) ? gid.subarray(12, 16) : gid;
}

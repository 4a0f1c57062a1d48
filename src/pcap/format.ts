/**
 * Capture file formats: constants, header layouts and the error type shared by the reader and
 * the writers. Pure; no `node:*` imports.
 *
 * Read first: the libpcap file format (draft-ietf-opsawg-pcap) and pcapng
 * (draft-ietf-opsawg-pcapng) — §4.1 SHB, §4.2 IDB (if_tsresol, if_tsoffset), §4.3 EPB,
 * §4.4 SPB, Appendix A obsolete Packet Block.
 */

export { LinkType } from '../wire/frame.js';

/** One packet of a capture. `data` is a view; see the reader for how long it stays valid. */
export interface CaptureRecord {
  /** 1-based and counting only packet blocks, as Wireshark numbers frames. */
  readonly frame: number;
  /** Nanoseconds since the Unix epoch; 0n for pcapng Simple Packet Blocks, which carry none. */
  readonly timestampNs: bigint;
  readonly linkType: number;
  /** The captured bytes (possibly cut at the snap length). */
  readonly data: Uint8Array;
  /** Length of the packet on the wire. */
  readonly originalLength: number;
  /** pcapng interface id (0 for classic pcap). */
  readonly interfaceId: number;
}

export type CaptureErrorCode =
  /** Not a capture, or a structure that contradicts itself (bad magic, lengths, interface ids). */
  | 'ERR_CAPTURE_FORMAT'
  /** The input ends inside a header, record or block. */
  | 'ERR_CAPTURE_TRUNCATED'
  /** A recognised variant this reader does not decode (pcapng major ≠ 1, modified pcap). */
  | 'ERR_CAPTURE_UNSUPPORTED'
  /** The streaming reader was used after `end()` or after it failed. */
  | 'ERR_CAPTURE_STATE';

/** The only error the capture reader throws on bad input. */
export class CaptureError extends Error {
  override readonly name = 'CaptureError';
  readonly code: CaptureErrorCode;
  /** Byte offset in the capture of the header/record/block at fault. */
  readonly offset: number;

  constructor(code: CaptureErrorCode, message: string, offset: number) {
    super(`${message} (at byte ${offset})`);
    this.code = code;
    this.offset = offset;
  }
}

// --- classic pcap ------------------------------------------------------------------------------

export const PCAP_MAGIC_US = 0xa1b2c3d4;
export const PCAP_MAGIC_NS = 0xa1b23c4d;
/** Alexey Kuznetzov's "modified pcap": 8 extra bytes per record. Recognised only to name it. */
export const PCAP_MAGIC_MODIFIED = 0xa1b2cd34;
export const PCAP_VERSION_MAJOR = 2;
export const PCAP_VERSION_MINOR = 4;
export const PCAP_GLOBAL_HEADER_LEN = 24;
export const PCAP_RECORD_HEADER_LEN = 16;

/*
 * typedef struct pcap_hdr_s {
 *   guint32 magic_number;   // 0xa1b2c3d4 (µs) or 0xa1b23c4d (ns), in the writer's byte order
 *   guint16 version_major;  // 2
 *   guint16 version_minor;  // 4
 *   gint32  thiszone;       // GMT to local correction; always 0 in practice
 *   guint32 sigfigs;        // accuracy of timestamps; always 0
 *   guint32 snaplen;        // max length of captured packets, in octets
 *   guint32 network;        // link type in the low 16 bits, FCS info in the top bits
 * } pcap_hdr_t;
 */
export interface PcapGlobalHeader {
  readonly littleEndian: boolean;
  readonly nanosecond: boolean;
  readonly versionMajor: number;
  readonly versionMinor: number;
  readonly snapLength: number;
  readonly linkType: number;
}

/** Parses the 24-byte global header at `off`; `bytes` must hold at least that much. */
export function parsePcapGlobalHeader(bytes: Uint8Array, off: number, streamOffset: number): PcapGlobalHeader {
  const v = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const be = v.getUint32(off, false);
  const le = v.getUint32(off, true);
  let littleEndian: boolean;
  let magic: number;
  if (be === PCAP_MAGIC_US || be === PCAP_MAGIC_NS || be === PCAP_MAGIC_MODIFIED) {
    littleEndian = false;
    magic = be;
  } else if (le === PCAP_MAGIC_US || le === PCAP_MAGIC_NS || le === PCAP_MAGIC_MODIFIED) {
    littleEndian = true;
    magic = le;
  } else {
    throw new CaptureError('ERR_CAPTURE_FORMAT', `not a pcap file (magic 0x${be.toString(16).padStart(8, '0')})`, streamOffset);
  }
  if (magic === PCAP_MAGIC_MODIFIED) {
    throw new CaptureError('ERR_CAPTURE_UNSUPPORTED', 'modified (Kuznetzov) pcap is not supported', streamOffset);
  }
  const versionMajor = v.getUint16(off + 4, littleEndian);
  const versionMinor = v.getUint16(off + 6, littleEndian);
  if (versionMajor !== PCAP_VERSION_MAJOR) {
    throw new CaptureError('ERR_CAPTURE_UNSUPPORTED', `pcap version ${versionMajor}.${versionMinor}`, streamOffset);
  }
  return {
    littleEndian,
    nanosecond: magic === PCAP_MAGIC_NS,
    versionMajor,
    versionMinor,
    snapLength: v.getUint32(off + 16, littleEndian),
    linkType: v.getUint32(off + 20, littleEndian) & 0xffff,
  };
}

export function emitPcapGlobalHeader(
  out: Uint8Array,
  off: number,
  h: { readonly nanosecond: boolean; readonly snapLength: number; readonly linkType: number; readonly littleEndian?: boolean },
): number {
  const le = h.littleEndian ?? true;
  const v = new DataView(out.buffer, out.byteOffset, out.byteLength);
  v.setUint32(off, h.nanosecond ? PCAP_MAGIC_NS : PCAP_MAGIC_US, le);
  v.setUint16(off + 4, PCAP_VERSION_MAJOR, le);
  v.setUint16(off + 6, PCAP_VERSION_MINOR, le);
  v.setInt32(off + 8, 0, le);
  v.setUint32(off + 12, 0, le);
  v.setUint32(off + 16, h.snapLength, le);
  v.setUint32(off + 20, h.linkType, le);
  return off + PCAP_GLOBAL_HEADER_LEN;
}

/*
 * typedef struct pcaprec_hdr_s {
 *   guint32 ts_sec;    // timestamp seconds
 *   guint32 ts_usec;   // microseconds, or nanoseconds with the ns magic
 *   guint32 incl_len;  // octets of packet saved in file
 *   guint32 orig_len;  // actual length of packet
 * } pcaprec_hdr_t;
 */
export function emitPcapRecordHeader(
  out: Uint8Array,
  off: number,
  timestampNs: bigint,
  nanosecond: boolean,
  capturedLength: number,
  originalLength: number,
  littleEndian = true,
): number {
  if (timestampNs < 0n) throw new RangeError(`negative timestamp ${timestampNs}`);
  const sec = timestampNs / 1_000_000_000n;
  if (sec > 0xffffffffn) throw new RangeError(`timestamp ${timestampNs} ns does not fit pcap's 32-bit seconds`);
  const frac = timestampNs % 1_000_000_000n;
  const v = new DataView(out.buffer, out.byteOffset, out.byteLength);
  v.setUint32(off, Number(sec), littleEndian);
  v.setUint32(off + 4, Number(nanosecond ? frac : frac / 1000n), littleEndian);
  v.setUint32(off + 8, capturedLength, littleEndian);
  v.setUint32(off + 12, originalLength, littleEndian);
  return off + PCAP_RECORD_HEADER_LEN;
}

// --- pcapng -------------------------------------------------------------------------------------

export const PCAPNG_BLOCK_SHB = 0x0a0d0d0a;
export const PCAPNG_BLOCK_IDB = 0x00000001;
/** Obsolete Packet Block (Appendix A). */
export const PCAPNG_BLOCK_OPB = 0x00000002;
export const PCAPNG_BLOCK_SPB = 0x00000003;
export const PCAPNG_BLOCK_EPB = 0x00000006;
export const PCAPNG_BYTE_ORDER_MAGIC = 0x1a2b3c4d;
export const PCAPNG_VERSION_MAJOR = 1;
export const PCAPNG_VERSION_MINOR = 0;
/** Block type + block total length, and the trailing copy of the length. */
export const PCAPNG_BLOCK_OVERHEAD = 12;

export const PCAPNG_OPT_ENDOFOPT = 0;
export const PCAPNG_OPT_COMMENT = 1;
export const PCAPNG_OPT_SHB_USERAPPL = 4;
export const PCAPNG_OPT_IF_NAME = 2;
export const PCAPNG_OPT_IF_TSRESOL = 9;
export const PCAPNG_OPT_IF_TSOFFSET = 14;
export const PCAPNG_OPT_EPB_FLAGS = 2;
/** if_tsresol default when the option is absent: 10^-6 s. */
export const PCAPNG_DEFAULT_TSRESOL = 6;

/**
 * Largest block or record accepted. Wireshark's own limit is of this order; the point is that a
 * corrupt length must fail at once instead of making a streaming reader wait for (or a writer
 * allocate) gigabytes.
 */
export const MAX_CAPTURE_BLOCK = 16 * 1024 * 1024;

/** Rounds up to the 32-bit boundary pcapng pads every field to. */
export function pad4(n: number): number {
  return (n + 3) & ~3;
}

/**
 * Converts a timestamp in if_tsresol units to nanoseconds. tsresol's top bit selects a power of
 * two (2^-n s) instead of a power of ten (10^-n s); the result is floored.
 */
export function tsresolToNs(ticks: bigint, tsresol: number): bigint {
  const n = BigInt(tsresol & 0x7f);
  if ((tsresol & 0x80) !== 0) return (ticks * 1_000_000_000n) >> n;
  if (n <= 9n) return ticks * 10n ** (9n - n);
  return ticks / 10n ** (n - 9n);
}

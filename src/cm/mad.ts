/**
 * Management Datagram header (IBTA Vol. 1 §13.4.2, figure 145) and the 256-byte MAD that
 * carries it. Every MAD a General Services Interface (QP1, Q_Key `GSI_QKEY`) sends or
 * receives is exactly `MAD_LEN` bytes: a 24-byte common header and 232 bytes of class data.
 *
 *   0  BaseVersion (8)
 *   1  MgmtClass (8)
 *   2  ClassVersion (8)
 *   3  R (1) Method (7)
 *   4  Status (16)
 *   6  ClassSpecific (16)
 *   8  TransactionID (64)
 *  16  AttributeID (16)
 *  18  Reserved (16)
 *  20  AttributeModifier (32)
 *  24  class data (232)
 *
 * As in `src/wire/`: `parseMad` takes untrusted bytes and never throws (a typed error
 * instead); `emitMad` writes every one of the 256 bytes at the offset it is given.
 */

import { readU16, readU32, readU64, writeU16, writeU32, writeU64 } from '../wire/bytes.js';

/** Bytes of a MAD on the wire: UD SEND payload to or from QP1. */
export const MAD_LEN = 256;
/** Bytes of the common MAD header. */
export const MAD_HEADER_LEN = 24;
/** Bytes of class-specific data after the header. */
export const MAD_DATA_LEN = MAD_LEN - MAD_HEADER_LEN;

/** BaseVersion of every MAD format IBTA Vol. 1 defines (OPA's 0x80 is not ours). */
export const MAD_BASE_VERSION = 1;

/** Management classes (IBTA table 144) this stack names. */
export const MGMT_CLASS = {
  SUBN_LID_ROUTED: 0x01,
  SUBN_DIRECTED_ROUTE: 0x81,
  SUBN_ADM: 0x03,
  PERF: 0x04,
  BM: 0x05,
  DEV_MGT: 0x06,
  /** Communication Management (IBTA ch. 12). */
  CM: 0x07,
  SNMP: 0x08,
} as const;

/** Common methods (IBTA table 145). Responses set the R bit on top of the method. */
export const MAD_METHOD = {
  GET: 0x01,
  SET: 0x02,
  /** The only method the CM class uses: every CM message is a Send (IBTA 12.6.1). */
  SEND: 0x03,
  TRAP: 0x05,
  REPORT: 0x06,
  TRAP_REPRESS: 0x07,
} as const;

export interface MadHeader {
  baseVersion: number;
  mgmtClass: number;
  classVersion: number;
  /** The R bit: this MAD answers a request. */
  response: boolean;
  /** Method, 7 bits, without the R bit. */
  method: number;
  /** Status (IBTA table 146); class-defined bits 8..14. Zero on every CM Send. */
  status: number;
  classSpecific: number;
  /** 64 bits: the requester picks it, responses echo it, retransmissions keep it. */
  transactionId: bigint;
  attributeId: number;
  /** The 16 reserved bits after AttributeID; zero on emit unless a test wants otherwise. */
  reserved: number;
  attributeModifier: number;
}

export interface Mad {
  header: MadHeader;
  /** The 232 bytes after the header. On parse, a view into the input. */
  data: Uint8Array;
}

export type MadErrorCode =
  /** Fewer than 256 bytes: a GSI MAD is never shorter, and QP1 drops short datagrams. */
  | 'TOO_SHORT'
  /** BaseVersion is not 1. */
  | 'BAD_BASE_VERSION';

export type MadParse = { ok: true; mad: Mad } | { ok: false; error: MadErrorCode; detail: string };

export function parseMadHeader(b: Uint8Array, off: number): MadHeader {
  const rm = b[off + 3]!;
  return {
    baseVersion: b[off]!,
    mgmtClass: b[off + 1]!,
    classVersion: b[off + 2]!,
    response: (rm & 0x80) !== 0,
    method: rm & 0x7f,
    status: readU16(b, off + 4),
    classSpecific: readU16(b, off + 6),
    transactionId: readU64(b, off + 8),
    attributeId: readU16(b, off + 16),
    reserved: readU16(b, off + 18),
    attributeModifier: readU32(b, off + 20),
  };
}

export function emitMadHeader(h: MadHeader, b: Uint8Array, off: number): number {
  b[off] = h.baseVersion;
  b[off + 1] = h.mgmtClass;
  b[off + 2] = h.classVersion;
  b[off + 3] = (h.response ? 0x80 : 0) | (h.method & 0x7f);
  writeU16(b, off + 4, h.status & 0xffff);
  writeU16(b, off + 6, h.classSpecific & 0xffff);
  writeU64(b, off + 8, BigInt.asUintN(64, h.transactionId));
  writeU16(b, off + 16, h.attributeId & 0xffff);
  writeU16(b, off + 18, h.reserved & 0xffff);
  writeU32(b, off + 20, h.attributeModifier >>> 0);
  return off + MAD_HEADER_LEN;
}

/**
 * Parses the MAD at `off`. A UD SEND to QP1 may carry more than 256 bytes only if the
 * sender padded it; the MAD is the first 256 and the rest is ignored, as Linux's MAD layer does.
 */
export function parseMad(b: Uint8Array, off = 0, len = b.length - off): MadParse {
  if (off < 0 || len < 0 || off + len > b.length) return fail('TOO_SHORT', `range ${off}+${len} outside a ${b.length}-byte buffer`);
  if (len < MAD_LEN) return fail('TOO_SHORT', `${len} bytes, a MAD is ${MAD_LEN}`);
  const header = parseMadHeader(b, off);
  if (header.baseVersion !== MAD_BASE_VERSION) return fail('BAD_BASE_VERSION', `BaseVersion ${header.baseVersion}`);
  return { ok: true, mad: { header, data: b.subarray(off + MAD_HEADER_LEN, off + MAD_LEN) } };
}

function fail(error: MadErrorCode, detail: string): MadParse {
  return { ok: false, error, detail };
}

export class MadEmitError extends Error {
  readonly code = 'ERR_MAD_EMIT';
}

/**
 * Writes the 256-byte MAD at `off` and returns the offset after it. Class data shorter than
 * 232 bytes is zero-filled; longer data or a buffer too small is a programming error
 * (MadEmitError), not bad input.
 */
export function emitMad(m: Mad, b: Uint8Array, off = 0): number {
  if (off < 0 || off + MAD_LEN > b.length) throw new MadEmitError(`a MAD needs ${MAD_LEN} bytes at offset ${off} of ${b.length}`);
  if (m.data.length > MAD_DATA_LEN) throw new MadEmitError(`MAD data is ${m.data.length} bytes, at most ${MAD_DATA_LEN}`);
  const at = emitMadHeader(m.header, b, off);
  b.set(m.data, at);
  b.fill(0, at + m.data.length, off + MAD_LEN);
  return off + MAD_LEN;
}

/** The MAD as a fresh 256-byte array. */
export function madBytes(m: Mad): Uint8Array {
  const b = new Uint8Array(MAD_LEN);
  emitMad(m, b, 0);
  return b;
}

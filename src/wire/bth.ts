/**
 * Base Transport Header (IBTA Vol. 1 §9.2, figure 95), 12 bytes:
 *
 *   0  opcode
 *   1  SE(7) M(6) PadCnt(5..4) TVer(3..0)
 *   2  P_Key (16)
 *   4  FECN(7) BECN(6) resv6(5..0)   -- RoCEv2 puts FECN/BECN here; the ICRC masks the byte
 *   5  DestQP (24)
 *   8  AckReq(7) resv7(6..0)
 *   9  PSN (24)
 */

import { readU16, readU24, writeU16, writeU24 } from './bytes.js';

export interface Bth {
  opcode: number;
  /** Solicited event: the responder raises a completion event. */
  se: boolean;
  /** MigReq: path migration state. */
  m: boolean;
  /** Bytes of padding before the ICRC that round the payload up to a multiple of 4. */
  padCount: number;
  /** Transport header version: 0. */
  tver: number;
  pkey: number;
  /** Forward ECN: the packet met congestion on its way (RoCEv2 carries it here, not in the LRH). */
  fecn: boolean;
  /** Backward ECN: set on a CNP, and by a responder echoing congestion. */
  becn: boolean;
  /** The six reserved bits after FECN/BECN; zero on emit unless a test wants otherwise. */
  resv6: number;
  destQp: number;
  /** Acknowledge request: the responder must answer this packet. */
  ackReq: boolean;
  resv7: number;
  psn: number;
}

export const BTH_OFF = {
  OPCODE: 0,
  FLAGS: 1,
  PKEY: 2,
  ECN: 4,
  DEST_QP: 5,
  ACK_REQ: 8,
  PSN: 9,
} as const;

// Raw accessors: for the datapath, which reads a field or two without building a record.
export const bthOpcode = (b: Uint8Array, off: number): number => b[off]!;
export const bthPadCount = (b: Uint8Array, off: number): number => (b[off + 1]! >>> 4) & 3;
export const bthTver = (b: Uint8Array, off: number): number => b[off + 1]! & 0xf;
export const bthPkey = (b: Uint8Array, off: number): number => readU16(b, off + 2);
export const bthFecn = (b: Uint8Array, off: number): boolean => (b[off + 4]! & 0x80) !== 0;
export const bthBecn = (b: Uint8Array, off: number): boolean => (b[off + 4]! & 0x40) !== 0;
export const bthDestQp = (b: Uint8Array, off: number): number => readU24(b, off + 5);
export const bthAckReq = (b: Uint8Array, off: number): boolean => (b[off + 8]! & 0x80) !== 0;
export const bthPsn = (b: Uint8Array, off: number): number => readU24(b, off + 9);

/** Set or clear FECN in place. Byte 4 is outside the ICRC, so the packet stays valid. */
export function setBthFecn(b: Uint8Array, off: number, on: boolean): void {
  b[off + 4] = on ? b[off + 4]! | 0x80 : b[off + 4]! & 0x7f;
}

export function parseBth(b: Uint8Array, off: number): Bth {
  return parseBthInto(b, off, {
    opcode: 0, se: false, m: false, padCount: 0, tver: 0, pkey: 0, fecn: false, becn: false, resv6: 0, destQp: 0, ackReq: false, resv7: 0, psn: 0,
  });
}

/** `parseBth` into a record the caller reuses; returns it. */
export function parseBthInto(b: Uint8Array, off: number, h: Bth): Bth {
  const f = b[off + 1]!;
  const e = b[off + 4]!;
  const a = b[off + 8]!;
  h.opcode = b[off]!;
  h.se = (f & 0x80) !== 0;
  h.m = (f & 0x40) !== 0;
  h.padCount = (f >>> 4) & 3;
  h.tver = f & 0xf;
  h.pkey = readU16(b, off + 2);
  h.fecn = (e & 0x80) !== 0;
  h.becn = (e & 0x40) !== 0;
  h.resv6 = e & 0x3f;
  h.destQp = readU24(b, off + 5);
  h.ackReq = (a & 0x80) !== 0;
  h.resv7 = a & 0x7f;
  h.psn = readU24(b, off + 9);
  return h;
}

/** Writes all 12 bytes. Field values are masked to their widths. */
export function emitBth(h: Bth, b: Uint8Array, off: number): number {
  b[off] = h.opcode;
  b[off + 1] = (h.se ? 0x80 : 0) | (h.m ? 0x40 : 0) | ((h.padCount & 3) << 4) | (h.tver & 0xf);
  writeU16(b, off + 2, h.pkey & 0xffff);
  b[off + 4] = (h.fecn ? 0x80 : 0) | (h.becn ? 0x40 : 0) | (h.resv6 & 0x3f);
  writeU24(b, off + 5, h.destQp & 0xffffff);
  b[off + 8] = (h.ackReq ? 0x80 : 0) | (h.resv7 & 0x7f);
  writeU24(b, off + 9, h.psn & 0xffffff);
  return off + 12;
}

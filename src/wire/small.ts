/**
 * The four-byte extension headers: ImmDt (IBTA §9.3.7), IETH (§9.3.8, SEND with
 * Invalidate) and FETH (IBTA 1.5 FLUSH: selectivity level and placement type, laid out as
 * rdma_rxe does: placement type in bits 3..0, selectivity in bits 5..4).
 */

import { readU32, writeU32 } from './bytes.js';

export interface ImmDt {
  /** 32 bits of immediate data, delivered in the receive completion. */
  data: number;
}

export interface Ieth {
  /** The R_Key the responder invalidates on completion. */
  rkey: number;
}

export interface Feth {
  placementType: number;
  selectivity: number;
}

export const parseImmDt = (b: Uint8Array, off: number): ImmDt => parseImmDtInto(b, off, { data: 0 });
/** `parseImmDt` into a record the caller reuses; returns it. */
export function parseImmDtInto(b: Uint8Array, off: number, h: ImmDt): ImmDt {
  h.data = readU32(b, off);
  return h;
}
export function emitImmDt(h: ImmDt, b: Uint8Array, off: number): number {
  writeU32(b, off, h.data >>> 0);
  return off + 4;
}

export const parseIeth = (b: Uint8Array, off: number): Ieth => parseIethInto(b, off, { rkey: 0 });
/** `parseIeth` into a record the caller reuses; returns it. */
export function parseIethInto(b: Uint8Array, off: number, h: Ieth): Ieth {
  h.rkey = readU32(b, off);
  return h;
}
export function emitIeth(h: Ieth, b: Uint8Array, off: number): number {
  writeU32(b, off, h.rkey >>> 0);
  return off + 4;
}

export function parseFeth(b: Uint8Array, off: number): Feth {
  return parseFethInto(b, off, { placementType: 0, selectivity: 0 });
}
/** `parseFeth` into a record the caller reuses; returns it. */
export function parseFethInto(b: Uint8Array, off: number, h: Feth): Feth {
  const v = readU32(b, off);
  h.placementType = v & 0xf;
  h.selectivity = (v >>> 4) & 3;
  return h;
}
export function emitFeth(h: Feth, b: Uint8Array, off: number): number {
  writeU32(b, off, (h.placementType & 0xf) | ((h.selectivity & 3) << 4));
  return off + 4;
}

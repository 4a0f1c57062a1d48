/** Datagram Extended Transport Header (IBTA §9.3.2, figure 98): Q_Key(32) reserved(8) SrcQP(24). */

import { readU24, readU32, writeU24, writeU32 } from './bytes.js';

export interface Deth {
  qkey: number;
  srcQp: number;
}

export function parseDeth(b: Uint8Array, off: number): Deth {
  return parseDethInto(b, off, { qkey: 0, srcQp: 0 });
}

/** `parseDeth` into a record the caller reuses; returns it. */
export function parseDethInto(b: Uint8Array, off: number, h: Deth): Deth {
  h.qkey = readU32(b, off);
  h.srcQp = readU24(b, off + 5);
  return h;
}

export function emitDeth(h: Deth, b: Uint8Array, off: number): number {
  writeU32(b, off, h.qkey >>> 0);
  b[off + 4] = 0;
  writeU24(b, off + 5, h.srcQp & 0xffffff);
  return off + 8;
}

/** RDMA Extended Transport Header (IBTA §9.3.3, figure 99): VA(8) R_Key(4) DMA Length(4). */

import { readU32, readU64, writeU32, writeU64 } from './bytes.js';

export interface Reth {
  /** Remote virtual address; 64 bits, so a bigint. */
  va: bigint;
  rkey: number;
  /** Length of the whole RDMA operation in bytes, not of this packet. */
  dmaLength: number;
}

export function parseReth(b: Uint8Array, off: number): Reth {
  return parseRethInto(b, off, { va: 0n, rkey: 0, dmaLength: 0 });
}

/** `parseReth` into a record the caller reuses; returns it. */
export function parseRethInto(b: Uint8Array, off: number, h: Reth): Reth {
  h.va = readU64(b, off);
  h.rkey = readU32(b, off + 8);
  h.dmaLength = readU32(b, off + 12);
  return h;
}

export function emitReth(h: Reth, b: Uint8Array, off: number): number {
  writeU64(b, off, h.va);
  writeU32(b, off + 8, h.rkey >>> 0);
  writeU32(b, off + 12, h.dmaLength >>> 0);
  return off + 16;
}

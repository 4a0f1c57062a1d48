/** RDMA Extended Transport Header (IBTA §9.3.3, figure 99): VA(8) R_Key(4) DMA Length(4). */

import { readU32, readU64, writeU32, writeU64 } from './bytes.js';

export interface Reth {
  /** Remote virtual address; 64 bits, so a bigint. */
  va: bigint;
  rkey: number;
  /** Length of the whole RDMA operation in bytes, not of this packet. */
  dmaLength: number;
  /**
   * The VA's high and low 32 bits as numbers, kept by `parseRethInto` in a record made by
   * `newRethRecord` (and absent elsewhere): the responder's R_Key check finds the offset into the
   * region with them, where arithmetic on `va` would make a BigInt per request.
   */
  vaHi?: number | undefined;
  vaLo?: number | undefined;
}

export function parseReth(b: Uint8Array, off: number): Reth {
  return parseRethInto(b, off, { va: 0n, rkey: 0, dmaLength: 0 });
}

/**
 * A record for `parseRethInto` to refill that also keeps the VA's halves (`vaHi`, `vaLo`). They are
 * not enumerable, so that the record still compares, prints and serializes as the RETH it is.
 */
export function newRethRecord(): Reth {
  const h: Reth = { va: 0n, rkey: 0, dmaLength: 0 };
  Object.defineProperty(h, 'vaHi', { value: 0, writable: true, enumerable: false });
  Object.defineProperty(h, 'vaLo', { value: 0, writable: true, enumerable: false });
  return h;
}

/** `parseReth` into a record the caller reuses; returns it. */
export function parseRethInto(b: Uint8Array, off: number, h: Reth): Reth {
  h.va = readU64(b, off);
  if (h.vaHi !== undefined) {
    h.vaHi = readU32(b, off);
    h.vaLo = readU32(b, off + 4);
  }
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

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
   * `newRethRecord` (and absent elsewhere), whose `va` is made from them when read: the responder's
   * R_Key check finds the offset into the region with them, where `va` would be a BigInt per request.
   */
  vaHi?: number | undefined;
  vaLo?: number | undefined;
}

export function parseReth(b: Uint8Array, off: number): Reth {
  return parseRethInto(b, off, { va: 0n, rkey: 0, dmaLength: 0 });
}

/**
 * The record `parseRethInto` refills on the receive path (`newRethRecord`): it keeps the VA as its two
 * halves and makes `va` from them only when it is read. A WRITE's responder needs the halves alone, and
 * a BigInt per RETH packet was half the garbage a WRITE's target made per 4 KiB packet. `va` is an
 * accessor of the class, not of the record: one on the record itself turned it into a hash table
 * (test/runtime/hot-shapes.test.ts). It serializes and prints as the RETH it is (`va`, `rkey`,
 * `dmaLength`).
 */
class RethRecord implements Reth {
  rkey = 0;
  dmaLength = 0;
  declare vaHi: number;
  declare vaLo: number;

  constructor() {
    // Not enumerable: the record's own keys are a RETH's, less the VA that the class reads from these.
    Object.defineProperty(this, 'vaHi', { value: 0, writable: true, enumerable: false });
    Object.defineProperty(this, 'vaLo', { value: 0, writable: true, enumerable: false });
  }

  get va(): bigint {
    const hi = this.vaHi;
    const lo = this.vaLo;
    // One BigInt where the VA fits a double exactly (below 2^53, as user-space addresses do).
    return hi < 0x20_0000 ? BigInt(hi * 0x1_0000_0000 + lo) : (BigInt(hi) << 32n) | BigInt(lo);
  }

  set va(v: bigint) {
    const u = BigInt.asUintN(64, v);
    this.vaHi = Number(u >> 32n);
    this.vaLo = Number(u & 0xffff_ffffn);
  }

  toJSON(): Reth {
    return { va: this.va, rkey: this.rkey, dmaLength: this.dmaLength };
  }

  [Symbol.for('nodejs.util.inspect.custom')](): Reth {
    return this.toJSON();
  }
}

/** A record for `parseRethInto` to refill that keeps the VA's halves (`vaHi`, `vaLo`); see `RethRecord`. */
export function newRethRecord(): Reth {
  return new RethRecord();
}

/** `parseReth` into a record the caller reuses; returns it. */
export function parseRethInto(b: Uint8Array, off: number, h: Reth): Reth {
  if (h.vaHi !== undefined) {
    // `newRethRecord`'s: its `va` is made from these when read.
    h.vaHi = readU32(b, off);
    h.vaLo = readU32(b, off + 4);
  } else {
    h.va = readU64(b, off);
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

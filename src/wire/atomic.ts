/**
 * Atomic Extended Transport Header (IBTA §9.3.4, figure 100): VA(8) R_Key(4) Swap/Add
 * data(8) Compare data(8); and the Atomic Acknowledge ETH (figure 103): original remote
 * data(8). Operands are 64-bit, so bigints.
 */

import { readU32, readU64, writeU32, writeU64 } from './bytes.js';

export interface AtomicEth {
  va: bigint;
  rkey: number;
  /** The swap value of CmpSwap, or the addend of FetchAdd. */
  swapAdd: bigint;
  /** The compare value of CmpSwap; unused (zero) for FetchAdd. */
  compare: bigint;
}

export interface AtomicAckEth {
  /** The remote value before the atomic operation. */
  originalData: bigint;
}

export function parseAtomicEth(b: Uint8Array, off: number): AtomicEth {
  return parseAtomicEthInto(b, off, { va: 0n, rkey: 0, swapAdd: 0n, compare: 0n });
}

/** `parseAtomicEth` into a record the caller reuses; returns it. */
export function parseAtomicEthInto(b: Uint8Array, off: number, h: AtomicEth): AtomicEth {
  h.va = readU64(b, off);
  h.rkey = readU32(b, off + 8);
  h.swapAdd = readU64(b, off + 12);
  h.compare = readU64(b, off + 20);
  return h;
}

export function emitAtomicEth(h: AtomicEth, b: Uint8Array, off: number): number {
  writeU64(b, off, h.va);
  writeU32(b, off + 8, h.rkey >>> 0);
  writeU64(b, off + 12, h.swapAdd);
  writeU64(b, off + 20, h.compare);
  return off + 28;
}

export function parseAtomicAckEth(b: Uint8Array, off: number): AtomicAckEth {
  return parseAtomicAckEthInto(b, off, { originalData: 0n });
}

/** `parseAtomicAckEth` into a record the caller reuses; returns it. */
export function parseAtomicAckEthInto(b: Uint8Array, off: number, h: AtomicAckEth): AtomicAckEth {
  h.originalData = readU64(b, off);
  return h;
}

export function emitAtomicAckEth(h: AtomicAckEth, b: Uint8Array, off: number): number {
  writeU64(b, off, h.originalData);
  return off + 8;
}

/**
 * Work queue entries and the two work queues.
 *
 * A send WQE carries the user's request, normalised, plus the requester's and completer's
 * progress on it. Its life: posted → processing (some packets sent) → pending (all sent,
 * awaiting acknowledgement; RC only) → completed and removed; or done (UC/UD: sent, nothing to
 * await) → completed. The queue keeps absolute indices so that the requester's cursor and the
 * completer's head stay valid while entries are removed from the front.
 */

import type { AddressHandle, Psn, Rkey, Sge, WcStatus, WrId, WrOpcode } from './types.js';

export type WqeState = 'posted' | 'processing' | 'pending' | 'done';

export interface SendWqe {
  readonly wrId: WrId;
  readonly opcode: WrOpcode;
  readonly signaled: boolean;
  readonly fence: boolean;
  readonly solicited: boolean;
  readonly sges: readonly Sge[];
  /** INLINE: a private copy made at post time; replaces the SGEs. */
  readonly inlineData: Uint8Array | undefined;
  readonly length: number;
  readonly immData: number | undefined;
  readonly invalidateRkey: Rkey | undefined;
  readonly remoteAddr: bigint;
  readonly rkey: Rkey;
  readonly compareAdd: bigint;
  readonly swap: bigint;
  readonly ah: AddressHandle | undefined;
  readonly remoteQpn: number;
  readonly remoteQkey: number;
  readonly readOrAtomic: boolean;
  /** Local memory as views, resolved when the requester starts the WQE. */
  segments: Uint8Array[] | undefined;
  state: WqeState;
  /** Packets (PSNs) this WQE occupies: a READ occupies one per response packet. */
  npkts: number;
  firstPsn: Psn;
  lastPsn: Psn;
  /** Index of the next packet the requester emits (for READ: the response packet to request from). */
  nextPkt: number;
  /** The requester has counted this WQE against maxRdAtomic. */
  holdsRdAtomic: boolean;
  /** Bytes of READ response data placed so far. */
  readPlaced: number;
  status: WcStatus;
  vendorErr: number;
}

export interface RecvWqe {
  readonly wrId: WrId;
  readonly sges: readonly Sge[];
  readonly length: number;
  /** Resolved lazily, when a message first lands in this WQE. */
  segments: Uint8Array[] | undefined;
}

/** A FIFO with absolute indices: `at(i)` stays meaningful while the front is removed. */
export class WorkQueue<T> {
  private items: (T | undefined)[] = [];
  private base = 0;
  private start = 0;

  /** Absolute index of the oldest entry. */
  get head(): number {
    return this.base + this.start;
  }

  /** Absolute index one past the newest entry. */
  get tail(): number {
    return this.base + this.items.length;
  }

  get length(): number {
    return this.items.length - this.start;
  }

  push(x: T): void {
    this.items.push(x);
  }

  at(abs: number): T | undefined {
    const i = abs - this.base;
    return i >= this.start && i < this.items.length ? this.items[i] : undefined;
  }

  peek(): T | undefined {
    return this.at(this.head);
  }

  shift(): T | undefined {
    if (this.start >= this.items.length) return undefined;
    const x = this.items[this.start];
    this.items[this.start] = undefined;
    this.start++;
    // Compact now and then so the array does not grow without bound.
    if (this.start > 1024 && this.start * 2 > this.items.length) {
      this.items = this.items.slice(this.start);
      this.base += this.start;
      this.start = 0;
    }
    return x;
  }

  clear(): void {
    this.base += this.items.length;
    this.items = [];
    this.start = 0;
  }

  *[Symbol.iterator](): IterableIterator<T> {
    for (let i = this.start; i < this.items.length; i++) yield this.items[i]!;
  }
}

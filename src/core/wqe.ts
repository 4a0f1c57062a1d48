/**
 * Work queue entries, their free lists, and the ring under the receive queue (the send queue's ring is
 * in fields of its QP, qp.ts, with `grownRing` shared).
 *
 * A send WQE carries the user's request, normalised, plus the requester's and completer's
 * progress on it. Its life: posted → processing (some packets sent) → pending (all sent,
 * awaiting acknowledgement; RC only) → completed and removed; or done (UC/UD: sent, nothing to
 * await) → completed. The queue keeps absolute indices so that the requester's cursor and the
 * completer's head stay valid while entries are removed from the front.
 */

import type { AddressHandle, Psn, Rkey, Sge, WcStatus, WrId, WrOpcode } from './types.js';
import type { MemoryRegion } from './mr.js';

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
  segments: readonly Uint8Array[] | undefined;
  /** `MrTable.deregistrations` when `segments` were resolved or last found whole (`regionsStillHeld`). */
  mrEpoch: number;
  /**
   * The region, when the WQE's one SGE covers it whole and the message takes more than one packet:
   * each packet's payload is then a view from the region's own table (`MemoryRegion.viewAt`).
   */
  region: MemoryRegion | undefined;
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
  segments: readonly Uint8Array[] | undefined;
  /** As `SendWqe.mrEpoch`. */
  mrEpoch: number;
}

// ---------------------------------------------------------------------------------------------
// Free lists. A WQE was an object per post: the send WQE (29 fields, 248 B) four fifths of the garbage
// an initiator made per 4 KiB message, the receive WQE (54 B) half of a SEND target's. A WQE leaves
// its queue only when it completes, is flushed or is cleared, and nothing keeps it past that call, so
// the QP releases it there and the next post of any QP refills it. Each list is bounded: a burst of
// retirements beyond it is left to the collector. A released WQE lets go of the caller's objects
// (its SGE list, inline copy, address handle, id).

/** A send WQE as the QP fills it: `SendWqe`'s request fields are read-only only to the engines. */
export type SendWqeRecord = { -readonly [K in keyof SendWqe]: SendWqe[K] };
/** The same for a receive WQE. */
export type RecvWqeRecord = { -readonly [K in keyof RecvWqe]: RecvWqe[K] };

const NO_SGES: readonly Sge[] = Object.freeze([]);
const FREE_MAX = 4096;
const freeSend: SendWqeRecord[] = [];
const freeRecv: RecvWqeRecord[] = [];

/** A send WQE to fill, every field of which the caller then writes. */
export function takeSendWqe(): SendWqeRecord {
  return (
    freeSend.pop() ?? {
      wrId: 0, opcode: 'SEND', signaled: false, fence: false, solicited: false, sges: NO_SGES, inlineData: undefined, length: 0,
      immData: undefined, invalidateRkey: undefined, remoteAddr: 0n, rkey: 0, compareAdd: 0n, swap: 0n, ah: undefined, remoteQpn: 0,
      remoteQkey: 0, readOrAtomic: false, segments: undefined, mrEpoch: 0, region: undefined, state: 'posted', npkts: 0, firstPsn: 0, lastPsn: 0,
      nextPkt: 0, holdsRdAtomic: false, readPlaced: 0, status: 'SUCCESS', vendorErr: 0,
    }
  );
}

/** A send WQE out of its queue and completed (or dropped): back to the free list. */
export function releaseSendWqe(wqe: SendWqe): void {
  if (freeSend.length >= FREE_MAX) return;
  const w = wqe as SendWqeRecord;
  w.wrId = 0;
  w.sges = NO_SGES;
  w.inlineData = undefined;
  w.segments = undefined;
  w.region = undefined;
  w.ah = undefined;
  freeSend.push(w);
}

/** A receive WQE to fill, every field of which the caller then writes. */
export function takeRecvWqe(): RecvWqeRecord {
  return freeRecv.pop() ?? { wrId: 0, sges: NO_SGES, length: 0, segments: undefined, mrEpoch: 0 };
}

/** A receive WQE out of its queue and completed (or dropped): back to the free list. */
export function releaseRecvWqe(wqe: RecvWqe): void {
  if (freeRecv.length >= FREE_MAX) return;
  const w = wqe as RecvWqeRecord;
  w.wrId = 0;
  w.sges = NO_SGES;
  w.segments = undefined;
  freeRecv.push(w);
}

/**
 * A FIFO with absolute indices: `at(i)` stays meaningful while the front is removed. A ring whose
 * capacity doubles when full: in the steady state pushing and shifting allocate nothing, and a
 * queue that empties keeps no stale entries alive. (An array appended to and cleared from the front
 * grew with every WQE between compactions, which with thousands of QPs kept reallocating and
 * promoting thousands of mostly empty arrays.)
 */
export class WorkQueue<T> {
  private items: (T | undefined)[] = [];
  private mask = -1;
  private first = 0;
  private end = 0;

  /** Absolute index of the oldest entry. */
  get head(): number {
    return this.first;
  }

  /** Absolute index one past the newest entry. */
  get tail(): number {
    return this.end;
  }

  get length(): number {
    return this.end - this.first;
  }

  push(x: T): void {
    if (this.end - this.first === this.items.length) this.grow();
    this.items[this.end & this.mask] = x;
    this.end++;
  }

  at(abs: number): T | undefined {
    return abs >= this.first && abs < this.end ? this.items[abs & this.mask] : undefined;
  }

  peek(): T | undefined {
    return this.first < this.end ? this.items[this.first & this.mask] : undefined;
  }

  shift(): T | undefined {
    if (this.first >= this.end) return undefined;
    const i = this.first & this.mask;
    const x = this.items[i];
    this.items[i] = undefined;
    this.first++;
    return x;
  }

  clear(): void {
    for (let a = this.first; a < this.end; a++) this.items[a & this.mask] = undefined;
    this.first = this.end;
  }

  private grow(): void {
    this.items = grownRing(this.items, this.mask, this.first, this.end);
    this.mask = this.items.length - 1;
  }

  *[Symbol.iterator](): IterableIterator<T> {
    for (let a = this.first; a < this.end; a++) yield this.items[a & this.mask]!;
  }
}

/**
 * The ring that replaces a full one: twice its capacity (4 at first), entries `first` to `end`
 * (absolute indices) at their places under the new mask. Shared by `WorkQueue` and the send queue a
 * QP keeps in its own fields (qp.ts).
 */
export function grownRing<T>(items: readonly (T | undefined)[], mask: number, first: number, end: number): (T | undefined)[] {
  const cap = items.length === 0 ? 4 : items.length * 2;
  const next = new Array<T | undefined>(cap).fill(undefined);
  const m = cap - 1;
  for (let a = first; a < end; a++) next[a & m] = items[a & mask];
  return next;
}

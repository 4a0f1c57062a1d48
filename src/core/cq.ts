/**
 * Completion queues: a fixed-capacity ring the engines push into and the user polls.
 *
 * Overflow is a defined error (IBTA 11.4.2.1 / rxe RESPST_ERR_CQ_OVERFLOW, "class G"): the
 * completion is lost, the CQ is marked overflowed and the caller raises CQ_ERR; we never
 * grow the ring behind the user's back.
 *
 * Like an HCA's CQ buffer of CQEs, the ring is records written in place (each made at its slot's
 * first use): the engines write a completion into its slot (`reserve`, `commit`), or `push` copies
 * one there, so a stream of completions leaves no garbage. `pollInto` copies them out
 * into records the caller keeps (`ibv_poll_cq`'s array of `ibv_wc`); `poll` and `shift` hand out
 * new objects.
 */

import type { WorkCompletion } from './types.js';

/**
 * A completion record with every field present, the optional ones undefined: the ring's records,
 * the engines' scratch records and `pollInto`'s all have this one shape.
 */
export function newWorkCompletion(): WorkCompletion {
  return {
    wrId: 0, status: 'SUCCESS', opcode: 'SEND', vendorErr: 0, byteLen: 0, qpNum: 0, srcQp: 0, wcFlags: 0, pkeyIndex: 0,
    immData: undefined, invalidatedRkey: undefined,
  };
}

function copyCompletion(to: WorkCompletion, from: WorkCompletion): void {
  to.wrId = from.wrId;
  to.status = from.status;
  to.opcode = from.opcode;
  to.vendorErr = from.vendorErr;
  to.byteLen = from.byteLen;
  to.qpNum = from.qpNum;
  to.srcQp = from.srcQp;
  to.wcFlags = from.wcFlags;
  to.pkeyIndex = from.pkeyIndex;
  to.immData = from.immData;
  to.invalidatedRkey = from.invalidatedRkey;
}

/** A new completion object with the fields of `r`, the optional ones only when set. */
function handOut(r: WorkCompletion): WorkCompletion {
  const wc: WorkCompletion = {
    wrId: r.wrId, status: r.status, opcode: r.opcode, vendorErr: r.vendorErr, byteLen: r.byteLen,
    qpNum: r.qpNum, srcQp: r.srcQp, wcFlags: r.wcFlags, pkeyIndex: r.pkeyIndex,
  };
  if (r.immData !== undefined) wc.immData = r.immData;
  if (r.invalidatedRkey !== undefined) wc.invalidatedRkey = r.invalidatedRkey;
  return wc;
}

export class CompletionQueue {
  /** The slots' records, each made at its slot's first use. */
  private readonly ring: (WorkCompletion | undefined)[];
  private head = 0;
  private count = 0;
  /** Set once a completion was lost to a full ring. */
  overflowed = false;
  /** The QPs using it as a send or receive CQ (one per use), not yet destroyed: `destroyCq` refuses while any are. */
  users = 0;
  destroyed = false;
  /**
   * Low-level hook, called synchronously after each push (the async API hangs its waiters
   * here). Must not throw.
   */
  onCompletion: ((cq: CompletionQueue) => void) | undefined;

  constructor(readonly handle: number, readonly capacity: number) {
    this.ring = new Array<WorkCompletion | undefined>(capacity).fill(undefined);
  }

  get length(): number {
    return this.count;
  }

  /**
   * Adds a copy of `wc` (the caller may reuse it at once); false when the ring is full (the
   * completion is dropped).
   */
  push(wc: WorkCompletion): boolean {
    const r = this.reserve();
    if (r === undefined) return false;
    copyCompletion(r, wc);
    this.commit();
    return true;
  }

  /**
   * The record the next completion is written into, in place (every field: it holds an older
   * completion's), then `commit`; undefined when the ring is full (the completion is dropped, and
   * the CQ marked overflowed). Nothing may be pushed in between.
   */
  reserve(): WorkCompletion | undefined {
    if (this.count === this.capacity) {
      this.overflowed = true;
      return undefined;
    }
    const at = (this.head + this.count) % this.capacity;
    return (this.ring[at] ??= newWorkCompletion());
  }

  /** Adds the completion written into the record `reserve` returned. */
  commit(): void {
    this.count++;
    this.onCompletion?.(this);
  }

  /** Removes and returns up to `max` completions, oldest first, as new objects. */
  poll(max = 1): WorkCompletion[] {
    const n = Math.min(max, this.count);
    const out: WorkCompletion[] = new Array(n);
    for (let i = 0; i < n; i++) out[i] = handOut(this.take());
    return out;
  }

  /**
   * Removes up to `max` completions, oldest first, copying each into `out[0]`, `out[1]` … (records
   * the caller keeps and reuses; a missing one is made with `newWorkCompletion`); returns how many.
   * An optional field the completion does not carry reads undefined.
   */
  pollInto(out: WorkCompletion[], max = out.length): number {
    const n = Math.min(max, this.count);
    for (let i = 0; i < n; i++) copyCompletion((out[i] ??= newWorkCompletion()), this.take());
    return n;
  }

  /** Removes and returns the oldest completion, if any, as a new object. */
  shift(): WorkCompletion | undefined {
    return this.count === 0 ? undefined : handOut(this.take());
  }

  /** The oldest completion's record, removed from the ring (valid until the next push); count > 0. */
  private take(): WorkCompletion {
    const r = this.ring[this.head]!;
    this.head = (this.head + 1) % this.capacity;
    this.count--;
    return r;
  }
}

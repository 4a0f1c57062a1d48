/**
 * Completion queues: a fixed-capacity ring the engines push into and the user polls.
 *
 * Overflow is a defined error (IBTA 11.4.2.1 / rxe RESPST_ERR_CQ_OVERFLOW, "class G"): the
 * completion is lost, the CQ is marked overflowed and the caller raises CQ_ERR; we never
 * grow the ring behind the user's back.
 */

import type { WorkCompletion } from './types.js';

export class CompletionQueue {
  private readonly ring: (WorkCompletion | undefined)[];
  private head = 0;
  private count = 0;
  /** Set once a completion was lost to a full ring. */
  overflowed = false;
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

  /** Adds a completion; false when the ring is full (the completion is dropped). */
  push(wc: WorkCompletion): boolean {
    if (this.count === this.capacity) {
      this.overflowed = true;
      return false;
    }
    this.ring[(this.head + this.count) % this.capacity] = wc;
    this.count++;
    this.onCompletion?.(this);
    return true;
  }

  /** Removes and returns up to `max` completions, oldest first. */
  poll(max = 1): WorkCompletion[] {
    const n = Math.min(max, this.count);
    const out: WorkCompletion[] = new Array(n);
    for (let i = 0; i < n; i++) {
      out[i] = this.ring[this.head]!;
      this.ring[this.head] = undefined;
      this.head = (this.head + 1) % this.capacity;
    }
    this.count -= n;
    return out;
  }

  /** Removes and returns the oldest completion, if any. */
  shift(): WorkCompletion | undefined {
    if (this.count === 0) return undefined;
    const wc = this.ring[this.head];
    this.ring[this.head] = undefined;
    this.head = (this.head + 1) % this.capacity;
    this.count--;
    return wc;
  }
}

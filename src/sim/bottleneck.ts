/**
 * The congestion point (CP): one switch egress port with a FIFO, RED-style ECN marking and a
 * tail-drop limit.
 *
 * Read first: Zhu et al., SIGCOMM 2015, §3.1 "CP Algorithm": the switch marks ECN with a
 * probability that is 0 below Kmin, rises linearly to Pmax at Kmax, and is 1 above Kmax,
 * judged on the *instantaneous* egress queue length, not on RED's moving average: the mark
 * should say what the queue is now.
 *
 * The decision is made when a packet joins the queue, against the bytes already queued
 * (including the packet being serialized), as shared-buffer switches do at enqueue. A packet
 * that would push the queue past `limitBytes` is dropped; there is no PFC here, so an incast
 * that outruns the control loses packets instead of pausing senders.
 *
 * Packets are (flow, marked) pairs in a ring; every packet of a run has the same size, so
 * bytes are counts × size and nothing is allocated per packet.
 */

import type { Rng } from './rng.js';

export interface RedParams {
  /** Below this queue length nothing is marked, bytes. */
  kminBytes: number;
  /** At and above this queue length everything is marked, bytes. */
  kmaxBytes: number;
  /** Marking probability just below Kmax. */
  pMax: number;
  /** Tail-drop limit, bytes. */
  limitBytes: number;
  /** False: never mark (the --no-cc contrast run). */
  marking: boolean;
}

/** Marking probability for a queue of `q` bytes. */
export function redProbability(q: number, p: RedParams): number {
  if (q < p.kminBytes) return 0;
  if (q >= p.kmaxBytes) return 1;
  return (p.pMax * (q - p.kminBytes)) / (p.kmaxBytes - p.kminBytes);
}

/** What `enqueue` did with a packet. */
export const Enqueue = { Dropped: 0, Queued: 1, QueuedMarked: 2 } as const;
export type EnqueueResult = (typeof Enqueue)[keyof typeof Enqueue];

export class RedQueue {
  readonly params: RedParams;
  readonly packetBytes: number;
  private flows: Int32Array;
  private marks: Uint8Array;
  private head = 0;
  private count = 0;
  drops = 0;
  marked = 0;
  enqueued = 0;

  constructor(params: RedParams, packetBytes: number) {
    this.params = params;
    this.packetBytes = packetBytes;
    const cap = Math.max(1, Math.floor(params.limitBytes / packetBytes));
    this.flows = new Int32Array(cap);
    this.marks = new Uint8Array(cap);
  }

  get bytes(): number {
    return this.count * this.packetBytes;
  }

  get packets(): number {
    return this.count;
  }

  enqueue(flow: number, rng: Rng): EnqueueResult {
    const cap = this.flows.length;
    if (this.count >= cap) {
      this.drops++;
      return Enqueue.Dropped;
    }
    let mark = false;
    if (this.params.marking) {
      const pr = redProbability(this.count * this.packetBytes, this.params);
      // Draw only when the answer is uncertain: the stream of draws then depends on the
      // queue alone, and an unmarked region costs nothing.
      mark = pr >= 1 || (pr > 0 && rng.next() < pr);
    }
    const i = (this.head + this.count) % cap;
    this.flows[i] = flow;
    this.marks[i] = mark ? 1 : 0;
    this.count++;
    this.enqueued++;
    if (mark) this.marked++;
    return mark ? Enqueue.QueuedMarked : Enqueue.Queued;
  }

  /** Head packet's flow, its mark in `lastMarked`; the caller knows the queue is not empty. */
  dequeue(): number {
    const h = this.head;
    const flow = this.flows[h]!;
    this.lastMarked = this.marks[h] === 1;
    this.head = (h + 1) % this.flows.length;
    this.count--;
    return flow;
  }

  lastMarked = false;
}

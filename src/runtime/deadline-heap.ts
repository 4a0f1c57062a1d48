/**
 * A priority queue of deadlines: items ordered by time, then by insertion (entries with one deadline
 * come out in the order they went in). Used by the device's QP deadlines and `VirtualClock`.
 *
 * Two lanes, one order:
 * - a FIFO run of entries pushed in deadline order: push and pop O(1). Most deadlines are "now plus
 *   a constant" (every QP's ACK timeout is the same 4.096 µs · 2^timeout), so they arrive sorted;
 *   with thousands of QPs the device arms one per message, and a heap's O(log n) pop of each (most
 *   of them stale by then) was a measurable share of the per-message cost;
 * - a binary min-heap for the rest (an RNR wait or a pacing deadline earlier than the run's last).
 * `pop` takes the earlier head of the two by (deadline, insertion number), so the result is exactly
 * a stable sort by deadline whichever lane an entry went to.
 *
 * Both are parallel arrays, so pushing and popping allocate nothing in the steady state (a
 * `{ at, item }` record per deadline was garbage at that rate).
 */
export class DeadlineHeap<T> {
  private readonly at: number[] = [];
  private readonly seq: number[] = [];
  private readonly items: T[] = [];
  // The run: a ring of capacity `runAt.length` (a power of two), `runLen` entries from `runHead`.
  private runAt: number[] = new Array<number>(16).fill(0);
  private runSeq: number[] = new Array<number>(16).fill(0);
  private runItems: (T | undefined)[] = new Array<T | undefined>(16).fill(undefined);
  private runHead = 0;
  private runLen = 0;
  private nextSeq = 0;

  get size(): number {
    return this.at.length + this.runLen;
  }

  /** The earliest deadline; undefined when empty. */
  topAt(): number | undefined {
    if (this.runLen === 0) return this.at[0];
    return this.fromRun() ? this.runAt[this.runHead] : this.at[0];
  }

  /** The item with the earliest deadline; undefined when empty. */
  top(): T | undefined {
    return this.runLen > 0 && this.fromRun() ? this.runItems[this.runHead] : this.items[0];
  }

  push(at: number, item: T): void {
    const seq = this.nextSeq++;
    const n = this.runLen;
    if (n === 0 || at >= this.runAt[(this.runHead + n - 1) & (this.runAt.length - 1)]!) {
      if (n === this.runAt.length) this.growRun();
      const i = (this.runHead + n) & (this.runAt.length - 1);
      this.runAt[i] = at;
      this.runSeq[i] = seq;
      this.runItems[i] = item;
      this.runLen = n + 1;
      return;
    }
    this.heapPush(at, seq, item);
  }

  /** Removes and returns the item with the earliest deadline; undefined when empty. */
  pop(): T | undefined {
    if (this.runLen > 0 && this.fromRun()) {
      const h = this.runHead;
      const item = this.runItems[h];
      this.runItems[h] = undefined; // a popped QP is not kept reachable by the ring
      this.runHead = (h + 1) & (this.runAt.length - 1);
      this.runLen--;
      return item;
    }
    return this.heapPop();
  }

  clear(): void {
    this.at.length = 0;
    this.seq.length = 0;
    this.items.length = 0;
    this.runItems.fill(undefined);
    this.runHead = 0;
    this.runLen = 0;
  }

  /** The items, in no particular order (a new array: not for hot paths). */
  values(): T[] {
    const out = this.items.slice();
    for (let k = 0; k < this.runLen; k++) out.push(this.runItems[(this.runHead + k) & (this.runAt.length - 1)]!);
    return out;
  }

  /** Whether the run's head comes before the heap's top (the run is not empty). */
  private fromRun(): boolean {
    if (this.at.length === 0) return true;
    const a = this.runAt[this.runHead]!;
    const b = this.at[0]!;
    return a < b || (a === b && this.runSeq[this.runHead]! < this.seq[0]!);
  }

  private growRun(): void {
    const cap = this.runAt.length;
    const at = new Array<number>(2 * cap).fill(0);
    const seq = new Array<number>(2 * cap).fill(0);
    const items = new Array<T | undefined>(2 * cap).fill(undefined);
    for (let k = 0; k < this.runLen; k++) {
      const i = (this.runHead + k) & (cap - 1);
      at[k] = this.runAt[i]!;
      seq[k] = this.runSeq[i]!;
      items[k] = this.runItems[i];
    }
    this.runAt = at;
    this.runSeq = seq;
    this.runItems = items;
    this.runHead = 0;
  }

  private heapPush(at: number, seq: number, item: T): void {
    let i = this.at.length;
    this.at.push(at);
    this.seq.push(seq);
    this.items.push(item);
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (!this.before(at, seq, p)) break;
      this.move(p, i);
      i = p;
    }
    this.set(i, at, seq, item);
  }

  private heapPop(): T | undefined {
    const n = this.at.length - 1;
    if (n < 0) return undefined;
    const top = this.items[0];
    const at = this.at.pop()!;
    const seq = this.seq.pop()!;
    const item = this.items.pop()!;
    if (n === 0) return top;
    let i = 0;
    for (;;) {
      let c = 2 * i + 1;
      if (c >= n) break;
      if (c + 1 < n && this.before(this.at[c + 1]!, this.seq[c + 1]!, c)) c++;
      if (this.before(at, seq, c)) break;
      this.move(c, i);
      i = c;
    }
    this.set(i, at, seq, item);
    return top;
  }

  /** Whether (at, seq) comes before heap entry `i`. */
  private before(at: number, seq: number, i: number): boolean {
    const a = this.at[i]!;
    return at < a || (at === a && seq < this.seq[i]!);
  }

  private move(from: number, to: number): void {
    this.at[to] = this.at[from]!;
    this.seq[to] = this.seq[from]!;
    this.items[to] = this.items[from]!;
  }

  private set(i: number, at: number, seq: number, item: T): void {
    this.at[i] = at;
    this.seq[i] = seq;
    this.items[i] = item;
  }
}

/**
 * A min-heap of deadlines: items ordered by time, then by insertion (entries with one deadline come
 * out in the order they went in). Kept as parallel arrays, so that pushing and popping allocate
 * nothing in the steady state: the device arms a deadline per QP per message, and a `{ at, item }`
 * record each time was garbage at that rate. Used by the device's QP deadlines and `VirtualClock`.
 */
export class DeadlineHeap<T> {
  private readonly at: number[] = [];
  private readonly seq: number[] = [];
  private readonly items: T[] = [];
  private nextSeq = 0;

  get size(): number {
    return this.at.length;
  }

  /** The earliest deadline; undefined when empty. */
  topAt(): number | undefined {
    return this.at[0];
  }

  /** The item with the earliest deadline; undefined when empty. */
  top(): T | undefined {
    return this.items[0];
  }

  push(at: number, item: T): void {
    const seq = this.nextSeq++;
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

  /** Removes and returns the item with the earliest deadline; undefined when empty. */
  pop(): T | undefined {
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

  clear(): void {
    this.at.length = 0;
    this.seq.length = 0;
    this.items.length = 0;
  }

  /** The items, in no particular order. */
  values(): readonly T[] {
    return this.items;
  }

  /** Whether (at, seq) comes before entry `i`. */
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

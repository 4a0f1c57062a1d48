/**
 * The simulator's event queue: a binary min-heap over (time, insertion order), stored in
 * parallel typed arrays so that an event is four numbers, not an object. A simulated 100 ms
 * at 40 Gb/s is millions of events; allocating each one would make the garbage collector
 * the bottleneck.
 *
 * Ties in time pop in insertion order, which is what makes runs reproducible.
 */

export class EventQueue {
  private time: Float64Array;
  private seq: Float64Array;
  private kind: Uint8Array;
  private arg: Int32Array;
  private n = 0;
  private counter = 0;

  /** Time, kind and argument of the event `pop` returned last. */
  popTime = 0;
  popKind = 0;
  popArg = 0;

  constructor(capacity = 1024) {
    this.time = new Float64Array(capacity);
    this.seq = new Float64Array(capacity);
    this.kind = new Uint8Array(capacity);
    this.arg = new Int32Array(capacity);
  }

  get size(): number {
    return this.n;
  }

  push(time: number, kind: number, arg: number): void {
    if (this.n === this.time.length) this.grow();
    const T = this.time, S = this.seq, K = this.kind, A = this.arg;
    const s = this.counter++;
    let i = this.n++;
    while (i > 0) {
      const p = (i - 1) >> 1;
      const tp = T[p]!;
      if (tp < time || (tp === time && S[p]! < s)) break;
      T[i] = tp; S[i] = S[p]!; K[i] = K[p]!; A[i] = A[p]!;
      i = p;
    }
    T[i] = time; S[i] = s; K[i] = kind; A[i] = arg;
  }

  /** Removes the earliest event into popTime/popKind/popArg; false when empty. */
  pop(): boolean {
    if (this.n === 0) return false;
    const T = this.time, S = this.seq, K = this.kind, A = this.arg;
    this.popTime = T[0]!; this.popKind = K[0]!; this.popArg = A[0]!;
    const last = --this.n;
    if (last === 0) return true;
    const t = T[last]!, s = S[last]!, k = K[last]!, a = A[last]!;
    let i = 0;
    for (;;) {
      const l = 2 * i + 1;
      if (l >= last) break;
      const r = l + 1;
      let m = l;
      if (r < last && (T[r]! < T[l]! || (T[r] === T[l] && S[r]! < S[l]!))) m = r;
      const tm = T[m]!;
      if (t < tm || (t === tm && s < S[m]!)) break;
      T[i] = tm; S[i] = S[m]!; K[i] = K[m]!; A[i] = A[m]!;
      i = m;
    }
    T[i] = t; S[i] = s; K[i] = k; A[i] = a;
    return true;
  }

  /** Time of the earliest event, or Infinity. */
  peekTime(): number {
    return this.n === 0 ? Infinity : this.time[0]!;
  }

  private grow(): void {
    const cap = this.time.length * 2;
    const t = new Float64Array(cap); t.set(this.time); this.time = t;
    const s = new Float64Array(cap); s.set(this.seq); this.seq = s;
    const k = new Uint8Array(cap); k.set(this.kind); this.kind = k;
    const a = new Int32Array(cap); a.set(this.arg); this.arg = a;
  }
}

/**
 * Clocks. The protocol core never reads time itself: the runtime passes `now` in (µs) and
 * asks the core when it next needs to run. A clock is what the runtime asks.
 *
 * `SystemClock` is monotonic (process.hrtime) with real timers; `VirtualClock` advances only
 * when told to, so tests over `MemoryLink` are deterministic and as fast as the CPU.
 */

export type Micros = number;

export interface TimerHandle {
  cancel(): void;
}

export interface Clock {
  now(): Micros;
  /** Runs `fn` once at or after `at`. */
  at(at: Micros, fn: () => void): TimerHandle;
}

export class SystemClock implements Clock {
  // performance.now() is monotonic and a plain double: reading it allocates nothing, unlike
  // process.hrtime.bigint(), and the clock is read for every packet.
  private readonly origin = performance.now();

  now(): Micros {
    return Math.floor((performance.now() - this.origin) * 1000);
  }

  at(at: Micros, fn: () => void): TimerHandle {
    const delayMs = Math.max(0, (at - this.now()) / 1000);
    const t = setTimeout(fn, delayMs);
    t.unref?.();
    return { cancel: () => clearTimeout(t) };
  }
}

interface Pending {
  at: Micros;
  seq: number;
  fn: () => void;
  cancelled: boolean;
}

/** A discrete-event clock: timers fire in (time, insertion) order as `advance` moves time. */
export class VirtualClock implements Clock {
  private t: Micros;
  private seq = 0;
  private heap: Pending[] = [];

  constructor(start: Micros = 0) {
    this.t = start;
  }

  now(): Micros {
    return this.t;
  }

  at(at: Micros, fn: () => void): TimerHandle {
    const p: Pending = { at: Math.max(at, this.t), seq: this.seq++, fn, cancelled: false };
    this.push(p);
    return { cancel: () => { p.cancelled = true; } };
  }

  /** Time of the next live timer, if any. */
  next(): Micros | undefined {
    while (this.heap.length && this.heap[0]!.cancelled) this.pop();
    return this.heap[0]?.at;
  }

  /** Fires every timer due up to `until` (inclusive), moving time forward as it goes. */
  advanceTo(until: Micros): void {
    for (;;) {
      const n = this.next();
      if (n === undefined || n > until) break;
      const p = this.pop()!;
      this.t = Math.max(this.t, p.at);
      p.fn();
    }
    this.t = Math.max(this.t, until);
  }

  /**
   * Runs events until none is left or `limit` µs of virtual time have passed, and returns
   * the number of events fired. The limit keeps a protocol that never settles (a peer that
   * retries forever) from hanging a test.
   */
  run(limit: Micros = 60_000_000, until?: () => boolean): number {
    const end = this.t + limit;
    let fired = 0;
    for (;;) {
      if (until?.()) break;
      const n = this.next();
      if (n === undefined || n > end) break;
      const p = this.pop()!;
      this.t = Math.max(this.t, p.at);
      p.fn();
      fired++;
    }
    return fired;
  }

  private less(a: Pending, b: Pending): boolean {
    return a.at < b.at || (a.at === b.at && a.seq < b.seq);
  }

  private push(p: Pending): void {
    const h = this.heap;
    h.push(p);
    let i = h.length - 1;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (!this.less(h[i]!, h[parent]!)) break;
      [h[i], h[parent]] = [h[parent]!, h[i]!];
      i = parent;
    }
  }

  private pop(): Pending | undefined {
    const h = this.heap;
    const top = h[0];
    const last = h.pop();
    if (h.length && last) {
      h[0] = last;
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        const r = l + 1;
        let m = i;
        if (l < h.length && this.less(h[l]!, h[m]!)) m = l;
        if (r < h.length && this.less(h[r]!, h[m]!)) m = r;
        if (m === i) break;
        [h[i], h[m]] = [h[m]!, h[i]!];
        i = m;
      }
    }
    return top;
  }
}

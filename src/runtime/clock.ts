/**
 * Clocks. The protocol core never reads time itself: the runtime passes `now` in (µs) and
 * asks the core when it next needs to run. A clock is what the runtime asks.
 *
 * `SystemClock` is monotonic (process.hrtime) with real timers; `VirtualClock` advances only
 * when told to, so tests over `MemoryLink` are deterministic and as fast as the CPU.
 */

import { DeadlineHeap } from './deadline-heap.js';

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
    // Whole milliseconds: node keeps one timer list per distinct duration, so a fractional delay
    // (every deadline is in µs) built a list, a map entry and a queue insertion per timer. Node's
    // timers are millisecond-grained anyway; rounding up keeps them from firing early.
    const delayMs = Math.max(0, Math.ceil((at - this.now()) / 1000));
    const t = setTimeout(fn, delayMs);
    t.unref?.();
    return { cancel: () => clearTimeout(t) };
  }
}

interface Pending {
  at: Micros;
  fn: () => void;
  cancelled: boolean;
}

/** A discrete-event clock: timers fire in (time, insertion) order as `advance` moves time. */
export class VirtualClock implements Clock {
  private t: Micros;
  private readonly heap = new DeadlineHeap<Pending>();

  constructor(start: Micros = 0) {
    this.t = start;
  }

  now(): Micros {
    return this.t;
  }

  at(at: Micros, fn: () => void): TimerHandle {
    const p: Pending = { at: Math.max(at, this.t), fn, cancelled: false };
    this.heap.push(p.at, p);
    return { cancel: () => { p.cancelled = true; } };
  }

  /** Time of the next live timer, if any. */
  next(): Micros | undefined {
    while (this.heap.top()?.cancelled === true) this.heap.pop();
    return this.heap.topAt();
  }

  /** Fires every timer due up to `until` (inclusive), moving time forward as it goes. */
  advanceTo(until: Micros): void {
    for (;;) {
      const n = this.next();
      if (n === undefined || n > until) break;
      const p = this.heap.pop()!;
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
      const p = this.heap.pop()!;
      this.t = Math.max(this.t, p.at);
      p.fn();
      fired++;
    }
    return fired;
  }
}

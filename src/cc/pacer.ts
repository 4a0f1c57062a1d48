/**
 * A token bucket that turns a rate into send permission.
 *
 * Rate-based congestion control has no ACK clock: the rate limiter *is* the control. NICs
 * pace each QP with a hardware rate limiter; this is its software twin. The bucket fills at
 * the current rate up to `burstBytes`, a packet may leave when the bucket holds its size, and
 * sending drains it. The burst bound is what keeps a flow that was idle (or slowed by
 * something else) from dumping a window's worth into the bottleneck when it resumes.
 *
 * Pure and time-injected: every call takes `nowUs`; time never runs backwards per pacer.
 */

import type { Micros } from '../runtime/clock.js';

export class Pacer {
  private rate: number;
  private tokens: number;
  private at: Micros;
  readonly burstBytes: number;

  /**
   * @param rateBps initial rate, bit/s (> 0)
   * @param burstBytes bucket depth; at least one packet, or nothing could ever leave
   * @param nowUs the time the bucket starts full
   */
  constructor(rateBps: number, burstBytes: number, nowUs: Micros = 0) {
    if (!(rateBps > 0)) throw new RangeError(`pacer rate must be > 0 bit/s, not ${rateBps}`);
    if (!(burstBytes > 0)) throw new RangeError(`pacer burst must be > 0 bytes, not ${burstBytes}`);
    this.rate = rateBps;
    this.burstBytes = burstBytes;
    this.tokens = burstBytes;
    this.at = nowUs;
  }

  get rateBps(): number {
    return this.rate;
  }

  /** Changes the rate from `nowUs` on; what accrued before is kept at the old rate. */
  setRate(nowUs: Micros, rateBps: number): void {
    if (rateBps === this.rate) return;
    if (!(rateBps > 0)) throw new RangeError(`pacer rate must be > 0 bit/s, not ${rateBps}`);
    this.refill(nowUs);
    this.rate = rateBps;
  }

  /** Earliest time at which `bytes` may be sent; `nowUs` (or earlier) means now. */
  nextSendAt(nowUs: Micros, bytes: number): Micros {
    this.refill(nowUs);
    // A packet larger than the bucket needs a full bucket, not an impossible one.
    const need = Math.min(bytes, this.burstBytes);
    // The tolerance absorbs float rounding: waiting exactly the computed time must be enough.
    if (this.tokens >= need - 1e-6) return nowUs;
    return nowUs + ((need - this.tokens) * 8e6) / this.rate;
  }

  canSend(nowUs: Micros, bytes: number): boolean {
    return this.nextSendAt(nowUs, bytes) <= nowUs;
  }

  /** Takes `bytes` out of the bucket. Sending without permission leaves a debt, repaid first. */
  onSend(nowUs: Micros, bytes: number): void {
    this.refill(nowUs);
    this.tokens -= bytes;
  }

  private refill(nowUs: Micros): void {
    const dt = nowUs - this.at;
    if (dt <= 0) return;
    this.at = nowUs;
    // Summing a tiny increment into a full bucket is common; skip the float work then.
    if (this.tokens >= this.burstBytes) return;
    this.tokens = Math.min(this.burstBytes, this.tokens + (dt * this.rate) / 8e6);
  }
}

/**
 * The shared half of every rate-based controller: a pacer kept at the controller's rate, and
 * no-op defaults for the hooks an algorithm does not care about (the shape of smoltcp's
 * `Controller` trait). A subclass calls `setRate(atUs, bps)` whenever its rate changes, at
 * the time the change takes effect, and may override `advance(nowUs)` to run its own timers
 * lazily: every public entry point advances to `nowUs` before it does anything else, so a
 * timer that expired between two calls takes effect at its own expiry time, not at the call.
 *
 * It implements `CongestionControl` (controller.ts); it lives here so that the algorithms can
 * extend it without importing the module that chooses between them.
 */
export abstract class PacedController {
  private readonly pacer: Pacer;

  constructor(initialRateBps: number, burstBytes: number, nowUs: Micros) {
    this.pacer = new Pacer(initialRateBps, burstBytes, nowUs);
  }

  /** The rate the pacer enforces now, bit/s. */
  rateBps(nowUs: Micros): number {
    this.advance(nowUs);
    return this.pacer.rateBps;
  }

  nextSendAt(nowUs: Micros, bytes: number): Micros {
    this.advance(nowUs);
    return this.pacer.nextSendAt(nowUs, bytes);
  }

  canSend(nowUs: Micros, bytes: number): boolean {
    return this.nextSendAt(nowUs, bytes) <= nowUs;
  }

  onSend(nowUs: Micros, bytes: number): void {
    this.advance(nowUs);
    this.pacer.onSend(nowUs, bytes);
    this.afterSend(nowUs, bytes);
  }

  onCnp(nowUs: Micros): void {
    this.advance(nowUs);
  }

  onTimer(nowUs: Micros): void {
    this.advance(nowUs);
  }

  nextTimerAt(): Micros | undefined {
    return undefined;
  }

  /** Runs whatever was due up to `nowUs`. */
  protected advance(_nowUs: Micros): void {}

  /** Sees every send after the pacer has charged for it. */
  protected afterSend(_nowUs: Micros, _bytes: number): void {}

  protected setRate(atUs: Micros, rateBps: number): void {
    this.pacer.setRate(atUs, rateBps);
  }
}

/**
 * Time in the protocol core: plain microseconds passed in by the runtime, and the two
 * timer formulas IBTA fixes.
 *
 * The core never reads a clock. Every entry point takes `now` and every engine reports
 * the next time it needs to run (`pollAt`), so a virtual clock can drive it exactly.
 */

import { RNR_TIMER_US } from '../wire/aeth.js';

/** Microseconds on the runtime's clock (monotonic; the origin is the runtime's business). */
export type Micros = number;

/**
 * Local ACK timeout (IBTA 9.7.6.1.3, C9-140 area; `timeout` attribute of 11.2.4.2):
 * 4.096 µs × 2^timeout, rounded up to a whole microsecond. A value of 0 disables the timer
 * ("infinite"), which IBTA allows and libibverbs documents.
 *
 * Whole microseconds, as the runtime's clock reads: a deadline with a fraction is a heap number,
 * which V8 allocates at every write and which, stored into a QP that has been in the old generation
 * for a while, costs the write barrier's slow path too. The ACK deadline is written once per
 * message, so with thousands of QPs that was garbage and a remembered-set entry per message.
 */
export function ackTimeoutUs(timeout: number): Micros | undefined {
  if (timeout === 0) return undefined;
  // Asked for on every request sent; a table lookup, not a power with a variable exponent.
  return ACK_TIMEOUT_US[timeout & 0x1f]!;
}

const ACK_TIMEOUT_US = Array.from({ length: 32 }, (_, t) => Math.ceil(4.096 * 2 ** t));

/** The minimum delay an RNR NAK asks for, by its 5-bit timer code (IBTA table 45). */
export function rnrTimerUs(code: number): Micros {
  return RNR_TIMER_US[code & 0x1f]!;
}

/**
 * `retryCnt`/`rnrRetry` value that means "retry forever". IBTA gives 7 this meaning only
 * for the RNR retry count; rdma_rxe applies it to both counters
 * (`if (qp->comp.retry_cnt != 7) qp->comp.retry_cnt--`), and so do we, for interop.
 */
export const RETRY_INFINITE = 7;

/** The earlier of two optional deadlines. */
export function earliest(a: Micros | undefined, b: Micros | undefined): Micros | undefined {
  if (a === undefined) return b;
  if (b === undefined) return a;
  return a < b ? a : b;
}

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
 * 4.096 µs × 2^timeout. A value of 0 disables the timer ("infinite"), which IBTA allows
 * and libibverbs documents.
 */
export function ackTimeoutUs(timeout: number): Micros | undefined {
  if (timeout === 0) return undefined;
  // Asked for on every request sent; a table lookup, not a power with a variable exponent.
  return ACK_TIMEOUT_US[timeout & 0x1f] ?? 4.096 * 2 ** timeout;
}

const ACK_TIMEOUT_US = Array.from({ length: 32 }, (_, t) => 4.096 * 2 ** t);

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

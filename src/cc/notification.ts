/**
 * The DCQCN notification point (NP): the receiver side. A congestion-marked packet makes the
 * receiver send a CNP back to the QP that sent it, at most once per interval per QP.
 *
 * Read first: Zhu et al., SIGCOMM 2015, §3.1 "NP Algorithm" (at most one CNP per N = 50 µs
 * per flow; ConnectX: np_min_time_between_cnps, 4 µs by default, see profiles.ts), and IBTA
 * RoCEv2 Annex A17.9 for the CNP itself (wire/cnp.ts builds it).
 *
 * A packet is marked when the IP header says CE (`RxMeta.ce`, for links that can see it) or
 * when the BTH carries FECN: `node:dgram` can neither read nor set the IP ECN bits, so a
 * userspace bottleneck marks FECN instead (BTH byte 4, outside the ICRC).
 *
 * The NP only decides; the engine builds and sends the CNP (`cnpPacket(srcQp)`) and counts it.
 * Keys are the *sender's* QP number, the CNP's DestQP: for RC/UC the receiving QP's remote
 * QPN, for UD the DETH source QP.
 */

import type { Micros } from '../runtime/clock.js';
import { bthFecn } from '../wire/bth.js';

export interface NotificationPointOptions {
  /** At most one CNP per this many µs per sending QP. 0: one per marked packet. */
  minTimeBetweenCnpsUs: number;
}

export interface NotificationPointCounters {
  /** Marked packets seen. */
  marked: number;
  /** CNPs the NP asked for. */
  cnps: number;
  /** Marked packets that did not produce a CNP because one went out too recently. */
  suppressed: number;
}

/** True when the packet arrived congestion-marked: IP CE, or FECN in the BTH at `bthOff`. */
export function isCongestionMarked(ce: boolean, packet: Uint8Array, bthOff = 0): boolean {
  return ce || bthFecn(packet, bthOff);
}

export class NotificationPoint {
  readonly minTimeBetweenCnpsUs: number;
  readonly counters: NotificationPointCounters = { marked: 0, cnps: 0, suppressed: 0 };
  private readonly lastCnpAt = new Map<number, Micros>();

  constructor(opts: NotificationPointOptions) {
    if (!(opts.minTimeBetweenCnpsUs >= 0)) throw new RangeError(`minTimeBetweenCnpsUs must be ≥ 0, not ${opts.minTimeBetweenCnpsUs}`);
    this.minTimeBetweenCnpsUs = opts.minTimeBetweenCnpsUs;
  }

  /**
   * A marked packet from `srcQp` arrived at `nowUs`. Returns true when a CNP should be sent
   * to `srcQp` now; the NP then counts the interval from `nowUs`.
   */
  onMarkedPacket(nowUs: Micros, srcQp: number): boolean {
    this.counters.marked++;
    const last = this.lastCnpAt.get(srcQp);
    if (last !== undefined && nowUs - last < this.minTimeBetweenCnpsUs) {
      this.counters.suppressed++;
      return false;
    }
    this.lastCnpAt.set(srcQp, nowUs);
    this.counters.cnps++;
    return true;
  }

  /** Any packet: marked ones go through `onMarkedPacket`, others never produce a CNP. */
  onPacket(nowUs: Micros, srcQp: number, marked: boolean): boolean {
    return marked ? this.onMarkedPacket(nowUs, srcQp) : false;
  }

  /** Drops the state for a QP that went away (its number may be reused). */
  forget(srcQp: number): void {
    this.lastCnpAt.delete(srcQp);
  }
}

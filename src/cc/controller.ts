/**
 * The congestion-control seam between the transport engine and an algorithm.
 *
 * The engine asks one question per packet, "when may these bytes leave?" (`nextSendAt`),
 * tells the controller what it sent (`onSend`) and what came back (`onCnp`), and wakes it at
 * `nextTimerAt()` (`onTimer`). Everything is rate-based: RoCE has no ACK clock to hang a
 * window on, so a controller is a rate plus a pacer (pacer.ts). Implementations: `FixedRate`
 * (fixed.ts; no control, as rxe) and `DcqcnRp` (dcqcn.ts). Both inherit no-op hooks from
 * `PacedController`, so an algorithm only writes the hooks it cares about.
 *
 * Sans-IO: times are µs from the caller's clock; nothing here reads a clock or does I/O.
 */

import type { Micros } from '../runtime/clock.js';
import { DcqcnRp } from './dcqcn.js';
import { FixedRate } from './fixed.js';
import { NotificationPoint } from './notification.js';
import { DCQCN_PROFILES, type DcqcnParams, type DcqcnProfileName } from './profiles.js';

export interface CongestionControl {
  /** 'fixed' or 'dcqcn': for traces and counters. */
  readonly kind: string;
  /** The rate the sender is held to now, bit/s. */
  rateBps(nowUs: Micros): number;
  /** Earliest time `bytes` may be sent; a value ≤ `nowUs` means now. */
  nextSendAt(nowUs: Micros, bytes: number): Micros;
  /** `nextSendAt(nowUs, bytes) <= nowUs`. */
  canSend(nowUs: Micros, bytes: number): boolean;
  /** `bytes` left the QP (every packet: data, retransmission, ACK-less or not). */
  onSend(nowUs: Micros, bytes: number): void;
  /** A CNP for this QP arrived (BTH opcode 0x81). */
  onCnp(nowUs: Micros): void;
  /** The driver's wake-up at (or after) `nextTimerAt()`. Calling it early is harmless. */
  onTimer(nowUs: Micros): void;
  /** When the rate next changes by itself, if ever. */
  nextTimerAt(): Micros | undefined;
}

export type CongestionControlConfig =
  /** No congestion control: paced at the line rate, CNPs ignored. */
  | { kind: 'none'; lineRateBps: number; pacerBurstBytes?: number; nowUs?: Micros }
  /** A fixed rate below the line rate (a static rate limit). */
  | { kind: 'fixed'; rateBps: number; pacerBurstBytes?: number; nowUs?: Micros }
  /** DCQCN with a named profile, optionally with some parameters overridden. */
  | {
      kind: 'dcqcn';
      lineRateBps: number;
      profile?: DcqcnProfileName;
      overrides?: Partial<DcqcnParams>;
      pacerBurstBytes?: number;
      nowUs?: Micros;
    };

const DEFAULT_BURST_BYTES = 8192;

export function createCongestionControl(config: CongestionControlConfig): CongestionControl {
  const burst = config.pacerBurstBytes ?? DEFAULT_BURST_BYTES;
  const now = config.nowUs ?? 0;
  switch (config.kind) {
    case 'none':
      return new FixedRate(config.lineRateBps, burst, now);
    case 'fixed':
      return new FixedRate(config.rateBps, burst, now);
    case 'dcqcn':
      return new DcqcnRp({ lineRateBps: config.lineRateBps, params: dcqcnParams(config.profile, config.overrides), pacerBurstBytes: burst, nowUs: now });
  }
}

/** The profile's parameters with `overrides` on top. */
export function dcqcnParams(profile: DcqcnProfileName = 'paper', overrides?: Partial<DcqcnParams>): DcqcnParams {
  const base = DCQCN_PROFILES[profile];
  return overrides ? Object.freeze({ ...base, ...overrides }) : base;
}

/** The receiver half that goes with a profile: its CNP interval. */
export function createNotificationPoint(profile: DcqcnProfileName = 'paper', overrides?: Partial<DcqcnParams>): NotificationPoint {
  return new NotificationPoint({ minTimeBetweenCnpsUs: dcqcnParams(profile, overrides).minTimeBetweenCnpsUs });
}

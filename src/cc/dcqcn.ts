/**
 * The DCQCN reaction point (RP): the sender side, one per QP.
 *
 * Read first: Zhu et al., SIGCOMM 2015, §3.1 "RP Algorithm" (and its figure of the rate
 * increase state machine, inherited from QCN, IEEE 802.1Qau), and profiles.ts for what each
 * parameter is and where its value comes from.
 *
 * State: the current rate R_C (what the pacer enforces), the target rate R_T (where recovery
 * heads), α (an average of "was this flow told it congests"), the timer stage count T, the
 * byte stage count BC and the bytes sent since the last byte-counter event.
 *
 * On congestion (a CNP): R_T = R_C, R_C = R_C·(1 − α/2), α = (1 − g)·α + g, and T, BC, the
 * byte count and the rate-increase timer start over. Without congestion α decays,
 * α = (1 − g)·α, once per α period. Recovery runs on increase events, one per expiry of the
 * rate-increase timer (T += 1) and one per B bytes sent (BC += 1). Each event takes R_C
 * halfway to R_T, after first moving R_T:
 *   - fast recovery while max(T, BC) ≤ F: R_T stays, so R_C closes in on the rate it had
 *     before the cut (F halvings of the gap);
 *   - hyper increase once min(T, BC) > F: R_T += i·R_HAI with i = min(T, BC) − F
 *     ('connectx': R_T += R_HAI, as the HPCC model of the firmware has it);
 *   - additive increase otherwise: R_T += R_AI.
 * With the byte counter off (B = 0) the timer alone moves the stages: F fast-recovery events,
 * one additive, then hyper.
 * Counting an event into its counter before choosing the stage gives exactly F fast-recovery
 * events (QCN's rpg_threshold: "the number of times rpByteStage or rpTimeStage can count
 * before the state machine advances"), and a hyper multiplier i that starts at 1.
 *
 * The two profiles sequence the same arithmetic differently (profiles.ts `behaviour`):
 *   - 'paper': each CNP cuts immediately and updates α immediately; α's decay timer restarts
 *     on each CNP (α decays only after K µs without one).
 *   - 'connectx': a CNP only raises two flags. The cut happens at the next boundary of the
 *     rate-reduce monitor period (so at most one cut per period however many CNPs came), and
 *     α is recomputed at the end of every α period from "did a CNP arrive in it". The target
 *     is clamped to the current rate on a cut only if a timer increase happened since the
 *     previous cut (CLAMP_TGT_RATE_AFTER_TIME_INC), so back-to-back cuts keep aiming at the
 *     rate from before the first of them.
 *
 * Timers are lazy: nothing here needs a wake-up to stay correct. Every entry point first runs
 * all timer expiries up to `now`, each at its own expiry time, in time order, and α's
 * per-period updates are applied in closed form when α is needed. `nextTimerAt()` is still
 * reported, so a driver can wake a flow whose pacer waits on a rate that a timer would raise.
 *
 * Sans-IO: no clock, no I/O; all times are µs passed in.
 */

import type { Micros } from '../runtime/clock.js';
import type { CongestionControl } from './controller.js';
import { PacedController } from './pacer.js';
import { PAPER_PROFILE, checkDcqcnParams, type DcqcnParams } from './profiles.js';

/** Which rule the last rate change followed. */
export type DcqcnStage = 'line' | 'cut' | 'fast' | 'additive' | 'hyper';

export interface DcqcnOptions {
  /** The NIC's line rate, bit/s: the starting rate and, unless the profile says lower, the ceiling. */
  lineRateBps: number;
  /** Default: the paper's profile. */
  params?: DcqcnParams;
  /** Pacer bucket depth (default 8192 bytes: two 4 KiB MTU packets). */
  pacerBurstBytes?: number;
  /** Time the flow starts (default 0). */
  nowUs?: Micros;
}

/** A snapshot for tests and traces. */
export interface DcqcnState {
  rateBps: number;
  targetRateBps: number;
  alpha: number;
  timerStage: number;
  byteStage: number;
  stage: DcqcnStage;
}

export interface DcqcnCounters {
  cnps: number;
  cuts: number;
  fastRecovery: number;
  additive: number;
  hyper: number;
}

const DEFAULT_BURST_BYTES = 8192;

export class DcqcnRp extends PacedController implements CongestionControl {
  readonly kind = 'dcqcn';
  readonly params: DcqcnParams;
  readonly counters: DcqcnCounters = { cnps: 0, cuts: 0, fastRecovery: 0, additive: 0, hyper: 0 };

  private readonly maxRate: number;
  private rc: number;
  private rt: number;
  private alpha: number;
  /** Start of the current α period; undefined until the first CNP (α means nothing before). */
  private alphaAt: Micros | undefined;
  /** ConnectX: a CNP arrived in the current α period. */
  private alphaCnp = false;
  /** ConnectX: the monitor-period grid is anchored at the first CNP. */
  private monitorAnchor: Micros | undefined;
  /** ConnectX: a cut waiting for its monitor-period boundary. */
  private cutAt: Micros | undefined;
  /** Next rate-increase timer expiry; undefined while at the ceiling (nothing to recover). */
  private increaseAt: Micros | undefined;
  private timerStage = 0;
  private byteStage = 0;
  private bytesSinceEvent = 0;
  private lastStage: DcqcnStage = 'line';
  private seenCnp = false;
  /** ConnectX: the pending cut is the first one and goes to `rateOnFirstCnpBps`. */
  private firstCnpRate = false;

  constructor(opts: DcqcnOptions) {
    const params = opts.params ?? PAPER_PROFILE;
    const bad = checkDcqcnParams(params);
    if (bad) throw new RangeError(`DCQCN parameters: ${bad}`);
    if (!(opts.lineRateBps > 0)) throw new RangeError(`line rate must be > 0 bit/s, not ${opts.lineRateBps}`);
    const maxRate = params.maxRateBps > 0 ? Math.min(params.maxRateBps, opts.lineRateBps) : opts.lineRateBps;
    const now = opts.nowUs ?? 0;
    // §3.1: no slow start; a flow starts at line rate, and the first CNP is what slows it.
    super(maxRate, opts.pacerBurstBytes ?? DEFAULT_BURST_BYTES, now);
    this.params = params;
    this.maxRate = maxRate;
    this.rc = maxRate;
    this.rt = maxRate;
    this.alpha = params.initialAlpha;
  }

  override onCnp(nowUs: Micros): void {
    this.advance(nowUs);
    this.counters.cnps++;
    const p = this.params;
    const first = !this.seenCnp;
    this.seenCnp = true;
    if (p.behaviour === 'paper') {
      this.catchUpAlpha(nowUs);
      this.cut(nowUs, first);
      this.alpha = (1 - p.alphaGain) * this.alpha + p.alphaGain;
      // K counts from the last CNP: α decays only after K µs without one.
      this.alphaAt = nowUs;
      return;
    }
    if (first) {
      this.alphaAt = nowUs;
      this.monitorAnchor = nowUs;
    } else {
      this.catchUpAlpha(nowUs);
    }
    this.alphaCnp = true;
    if (this.cutAt !== undefined) return;
    const period = p.rateReduceMonitorPeriodUs;
    if (period <= 0) {
      this.cut(nowUs, first);
      return;
    }
    const anchor = this.monitorAnchor!;
    this.cutAt = anchor + (Math.floor((nowUs - anchor) / period) + 1) * period;
    if (first && p.rateOnFirstCnpBps > 0) this.firstCnpRate = true;
  }

  override nextTimerAt(): Micros | undefined {
    const a = this.increaseAt;
    const b = this.cutAt;
    if (a === undefined) return b;
    if (b === undefined) return a;
    return a < b ? a : b;
  }

  /** Everything a test or a trace wants to see, as of `nowUs`. */
  state(nowUs: Micros): DcqcnState {
    this.advance(nowUs);
    this.catchUpAlpha(nowUs);
    return {
      rateBps: this.rc,
      targetRateBps: this.rt,
      alpha: this.alpha,
      timerStage: this.timerStage,
      byteStage: this.byteStage,
      stage: this.lastStage,
    };
  }

  protected override advance(nowUs: Micros): void {
    for (;;) {
      const inc = this.increaseAt;
      const cut = this.cutAt;
      // A cut and an expiry at the same instant: the cut goes first and restarts the timer.
      if (cut !== undefined && cut <= nowUs && (inc === undefined || cut <= inc)) {
        this.cutAt = undefined;
        this.catchUpAlpha(cut);
        const first = this.firstCnpRate;
        this.firstCnpRate = false;
        this.cut(cut, first);
      } else if (inc !== undefined && inc <= nowUs) {
        this.timerStage++;
        this.increaseAt = inc + this.params.rateIncreaseTimerUs;
        this.increase(inc);
      } else {
        return;
      }
    }
  }

  protected override afterSend(nowUs: Micros, bytes: number): void {
    const b = this.params.byteCounterBytes;
    // Only while recovering: at the ceiling an increase event changes nothing, and a cut
    // resets the counter anyway.
    if (b <= 0 || this.increaseAt === undefined) return;
    this.bytesSinceEvent += bytes;
    while (this.bytesSinceEvent >= b && this.increaseAt !== undefined) {
      this.bytesSinceEvent -= b;
      this.byteStage++;
      this.increase(nowUs);
    }
  }

  private cut(atUs: Micros, first: boolean): void {
    const p = this.params;
    this.counters.cuts++;
    if (p.clampTargetRate || (p.clampTargetRateAfterTimeInc && this.timerStage > 0)) this.rt = this.rc;
    if (first && p.rateOnFirstCnpBps > 0) {
      this.rc = Math.max(p.minRateBps, Math.min(this.rc, p.rateOnFirstCnpBps));
    } else {
      const factor = Math.max(1 - this.alpha / 2, p.minDecreaseFactorPercent / 100);
      this.rc = Math.max(p.minRateBps, this.rc * factor);
    }
    this.timerStage = 0;
    this.byteStage = 0;
    this.bytesSinceEvent = 0;
    this.increaseAt = atUs + p.rateIncreaseTimerUs;
    this.lastStage = 'cut';
    this.setRate(atUs, this.rc);
  }

  private increase(atUs: Micros): void {
    const p = this.params;
    const f = p.fastRecoverySteps;
    const t = this.timerStage;
    // Two counters: the larger leaves fast recovery, the smaller enters hyper increase. With
    // the byte counter off, the timer alone does both, one event apart (F fast-recovery
    // events, one additive, then hyper), as in the HPCC model of the firmware.
    const lo = p.byteCounterBytes > 0 ? Math.min(t, this.byteStage) : t - 1;
    const hiStage = p.byteCounterBytes > 0 ? Math.max(t, this.byteStage) : t;
    if (hiStage <= f) {
      this.lastStage = 'fast';
      this.counters.fastRecovery++;
    } else if (lo > f) {
      // The paper (as QCN) grows the step with each hyper event; the ConnectX model adds R_HAI.
      const steps = p.behaviour === 'paper' ? lo - f : 1;
      this.rt = Math.min(this.maxRate, this.rt + steps * p.hyperIncreaseBps);
      this.lastStage = 'hyper';
      this.counters.hyper++;
    } else {
      this.rt = Math.min(this.maxRate, this.rt + p.additiveIncreaseBps);
      this.lastStage = 'additive';
      this.counters.additive++;
    }
    this.rc = (this.rt + this.rc) / 2;
    // Halving a gap never closes it in floating point; a bit per second is close enough.
    if (this.rt - this.rc < 1) this.rc = this.rt;
    if (this.rc >= this.maxRate) {
      // Back at the ceiling: the timer and byte counter could only repeat no-ops.
      this.rc = this.maxRate;
      this.increaseAt = undefined;
      this.lastStage = 'line';
    }
    this.setRate(atUs, this.rc);
  }

  /** Applies the α periods that ended at or before `t`. */
  private catchUpAlpha(t: Micros): void {
    const at = this.alphaAt;
    if (at === undefined) return;
    const period = this.params.alphaUpdatePeriodUs;
    const n = Math.floor((t - at) / period);
    if (n < 1) return;
    const keep = 1 - this.params.alphaGain;
    if (this.params.behaviour === 'connectx') {
      // The first period that ended saw the flag; the rest saw no CNP.
      this.alpha = keep * this.alpha + (this.alphaCnp ? this.params.alphaGain : 0);
      this.alphaCnp = false;
      if (n > 1) this.alpha *= keep ** (n - 1);
    } else {
      this.alpha *= keep ** n;
    }
    this.alphaAt = at + n * period;
  }
}

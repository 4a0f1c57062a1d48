/**
 * DCQCN parameter sets. Two profiles: the values of the paper, and the defaults a ConnectX NIC
 * ships with. Every number carries its unit in its name and its source in a comment.
 *
 * Read first: Zhu et al., "Congestion Control for Large-Scale RDMA Deployments", SIGCOMM 2015,
 * §3.1 (the CP, NP and RP algorithms), §5 (parameter choice; the values below are the ones the
 * paper settles on for 40 Gb/s). For ConnectX: the knob names are those of the Linux mlx5
 * drivers, `drivers/infiniband/hw/mlx5/cong.c` (`mlx5_ib_dbg_cc_name[]`: rp_time_reset,
 * rp_byte_reset, rp_threshold, rp_ai_rate, rp_hai_rate, rp_min_dec_fac, rp_min_rate,
 * rp_rate_to_set_on_first_cnp, rp_dce_tcp_g, rp_dce_tcp_rtt, rp_rate_reduce_monitor_period,
 * rp_initial_alpha_value, rp_gd, np_min_time_between_cnps, np_cnp_dscp, np_cnp_prio) and the
 * `cong_control_r_roce_ecn_rp/np` layouts of `include/linux/mlx5/mlx5_ifc.h`. The kernel only
 * forwards these to firmware, which owns the defaults; the values below are what
 * `mlxconfig -d <dev> query` prints for them on ConnectX-5/6 firmware (RPG_TIME_RESET_P1 300,
 * RPG_BYTE_RESET_P1 32767, RPG_THRESHOLD_P1 1, RPG_MAX_RATE_P1 0, RPG_AI_RATE_P1 5,
 * RPG_HAI_RATE_P1 50, RPG_GD_P1 11, RPG_MIN_DEC_FAC_P1 50, RPG_MIN_RATE_P1 1,
 * RATE_TO_SET_ON_FIRST_CNP_P1 0, DCE_TCP_G_P1 1019, DCE_TCP_RTT_P1 1,
 * RATE_REDUCE_MONITOR_PERIOD_P1 4, INITIAL_ALPHA_VALUE_P1 1023, MIN_TIME_BETWEEN_CNPS_P1 4,
 * CNP_802P_PRIO_P1 6, CNP_DSCP_P1 48, CLAMP_TGT_RATE_P1 False, CLAMP_TGT_RATE_AFTER_TIME_INC_P1
 * True). What each knob means is described in mstflint's `tools_layouts/tools_open_layouts.h`
 * (struct `tools_open_roce_cc_ecn`; its "Default:" lines are an older firmware's and are not
 * used here). How the firmware sequences them (a cut at most once per monitor period, α on a
 * fixed period, time-driven stages) follows the "Mellanox's version of DCQCN" model in the
 * HPCC simulator (alibaba-edu/High-Precision-Congestion-Control, `rdma-hw.cc`).
 */

/** Which of the two sequencings of the same algorithm a profile uses (see dcqcn.ts). */
export type DcqcnBehaviour =
  /** §3.1 of the paper: every CNP cuts at once and bumps α; α decays after K µs without a CNP. */
  | 'paper'
  /**
   * ConnectX: a CNP only raises flags; the cut happens at the next rate-reduce monitor period
   * boundary and α is recomputed once per α period from "was there a CNP in it".
   */
  | 'connectx';

export interface DcqcnParams {
  readonly behaviour: DcqcnBehaviour;
  /** g: weight of the newest CNP observation in α's moving average (0 < g ≤ 1). */
  readonly alphaGain: number;
  /** α when the first CNP of a flow arrives (0..1). */
  readonly initialAlpha: number;
  /** K (paper) / dce_tcp_rtt (ConnectX): the α update period, µs. */
  readonly alphaUpdatePeriodUs: number;
  /** T: the rate-increase timer, µs. */
  readonly rateIncreaseTimerUs: number;
  /** B: bytes sent between byte-counter driven increase events. 0 disables the byte counter. */
  readonly byteCounterBytes: number;
  /** F: increase events spent in fast recovery before additive increase starts. */
  readonly fastRecoverySteps: number;
  /** R_AI: target-rate step in additive increase, bit/s. */
  readonly additiveIncreaseBps: number;
  /** R_HAI: target-rate step in hyper increase, bit/s (multiplied by the hyper stage count). */
  readonly hyperIncreaseBps: number;
  /** Floor for the current rate, bit/s. */
  readonly minRateBps: number;
  /** Ceiling for current and target rate, bit/s. 0 means the line rate. */
  readonly maxRateBps: number;
  /** Shortest time between two cuts, µs. 0 cuts on every CNP (the paper). */
  readonly rateReduceMonitorPeriodUs: number;
  /** Rate to drop to on a flow's first CNP, bit/s, instead of the α cut. 0 disables. */
  readonly rateOnFirstCnpBps: number;
  /** A single cut leaves at least this percentage of the current rate (0 disables). */
  readonly minDecreaseFactorPercent: number;
  /** On a cut, always remember the current rate as the target. */
  readonly clampTargetRate: boolean;
  /** On a cut, remember the current rate as target only if a timer increase happened since the last cut. */
  readonly clampTargetRateAfterTimeInc: boolean;
  /** NP: at most one CNP per this many µs per QP. */
  readonly minTimeBetweenCnpsUs: number;
  /** DSCP the NP puts on CNPs (a link that can set TOS uses it). */
  readonly cnpDscp: number;
  /** 802.1p priority for CNPs on a VLAN-tagged link. */
  readonly cnp8021pPriority: number;
}

export type DcqcnProfileName = 'paper' | 'cx';

const MBPS = 1e6;

/** The paper's parameters (§5, for 40 Gb/s links). */
export const PAPER_PROFILE: DcqcnParams = Object.freeze({
  behaviour: 'paper',
  // §3.1/§5: α = (1 − g)α + g with g = 1/256: α is a slow average over many CNPs.
  alphaGain: 1 / 256,
  // §3.1: α starts at 1, so the first cut halves the rate.
  initialAlpha: 1,
  // §3.1: "K = 55 µs", chosen larger than the NP's 50 µs CNP interval so that a flow that is
  // still marked keeps α from decaying.
  alphaUpdatePeriodUs: 55,
  // §5: rate-increase timer T = 55 µs.
  rateIncreaseTimerUs: 55,
  // §5: byte counter B = 10 MB.
  byteCounterBytes: 10 * 1024 * 1024,
  // §3.1: F = 5 fast-recovery steps, as in QCN.
  fastRecoverySteps: 5,
  // §5: R_AI = 40 Mb/s.
  additiveIncreaseBps: 40 * MBPS,
  // §5: R_HAI = 200 Mb/s (5 × R_AI).
  hyperIncreaseBps: 200 * MBPS,
  // The paper sets no floor; ConnectX's 1 Mb/s (below) keeps the rate positive.
  minRateBps: 1 * MBPS,
  maxRateBps: 0,
  // §3.1: the RP cuts on every CNP; the NP's interval is what limits cuts.
  rateReduceMonitorPeriodUs: 0,
  rateOnFirstCnpBps: 0,
  // With α ≤ 1 the cut factor 1 − α/2 never goes below 1/2; no extra floor.
  minDecreaseFactorPercent: 0,
  // §3.1: on every CNP, R_T = R_C.
  clampTargetRate: true,
  clampTargetRateAfterTimeInc: false,
  // §3.1: "the NP generates at most one CNP packet every 50 µs for the flow" (N = 50 µs).
  minTimeBetweenCnpsUs: 50,
  // The paper sends CNPs at high priority without naming a code point; ConnectX's values.
  cnpDscp: 48,
  cnp8021pPriority: 6,
});

/** ConnectX-5/6 firmware defaults (see the header for the sources). */
export const CX_PROFILE: DcqcnParams = Object.freeze({
  behaviour: 'connectx',
  // DCE_TCP_G 1019: α keeps 1019/1024 of itself per period and moves 5/1024 toward "CNP seen".
  // mstflint words it as α = cnp·G + (1 − G)·α with G = dce_tcp_g/1024, which with 1019 would
  // make α forget everything in one microsecond; read as the retained share, the gain 5/1024
  // sits next to the paper's 1/256, which is what the value was chosen to be.
  alphaGain: (1024 - 1019) / 1024,
  // INITIAL_ALPHA_VALUE 1023, a fraction of 2^10.
  initialAlpha: 1023 / 1024,
  // DCE_TCP_RTT 1: α is recomputed every microsecond.
  alphaUpdatePeriodUs: 1,
  // RPG_TIME_RESET 300 µs.
  rateIncreaseTimerUs: 300,
  // Off, although RPG_BYTE_RESET is 32767 bytes (CX_RPG_BYTE_RESET_BYTES below). How the
  // firmware uses it is not documented, and the HPCC model of the firmware is timer-driven only.
  // Used as the paper uses B, one increase event per 32 KiB, it halves the gap to a target that
  // CLAMP_TGT_RATE_AFTER_TIME_INC leaves high every ~100 µs at 2.5 Gb/s, while the cuts that
  // α ≈ 0.07 allows under a CNP every ~13 µs are ~4 %: a 16-flow incast then keeps running the
  // queue into its tail-drop limit (see
  // test/sim/dcqcn-sim.test.ts). Set `byteCounterBytes: CX_RPG_BYTE_RESET_BYTES` to try it.
  byteCounterBytes: 0,
  // RPG_THRESHOLD 1: one fast-recovery step, then additive increase.
  fastRecoverySteps: 1,
  // RPG_AI_RATE 5 Mb/s.
  additiveIncreaseBps: 5 * MBPS,
  // RPG_HAI_RATE 50 Mb/s.
  hyperIncreaseBps: 50 * MBPS,
  // RPG_MIN_RATE 1 Mb/s.
  minRateBps: 1 * MBPS,
  // RPG_MAX_RATE 0: the port speed.
  maxRateBps: 0,
  // RATE_REDUCE_MONITOR_PERIOD 4 µs: at most one cut per 4 µs, at the next period boundary.
  rateReduceMonitorPeriodUs: 4,
  // RATE_TO_SET_ON_FIRST_CNP 0: disabled, the first CNP cuts like any other.
  rateOnFirstCnpBps: 0,
  // RPG_MIN_DEC_FAC 50 (%): one cut keeps at least half the rate.
  minDecreaseFactorPercent: 50,
  // CLAMP_TGT_RATE False, CLAMP_TGT_RATE_AFTER_TIME_INC True.
  clampTargetRate: false,
  clampTargetRateAfterTimeInc: true,
  // MIN_TIME_BETWEEN_CNPS 4 µs.
  minTimeBetweenCnpsUs: 4,
  // CNP_DSCP 48, CNP_802P_PRIO 6.
  cnpDscp: 48,
  cnp8021pPriority: 6,
  // RPG_GD 11 is not modelled: the documented cut (1 − α/2^rpg_gd) would be a 0.05 % cut at
  // α = 1, which is not what the hardware does; the HPCC model and measurements cut by α/2.
});

/** The ConnectX firmware's RPG_BYTE_RESET default, bytes (not used by `CX_PROFILE`; see there). */
export const CX_RPG_BYTE_RESET_BYTES = 32767;

export const DCQCN_PROFILES: Readonly<Record<DcqcnProfileName, DcqcnParams>> = Object.freeze({
  paper: PAPER_PROFILE,
  cx: CX_PROFILE,
});

/** Checks a parameter set; returns a one-line reason, or undefined when it is usable. */
export function checkDcqcnParams(p: DcqcnParams): string | undefined {
  const positive: (keyof DcqcnParams)[] = ['alphaUpdatePeriodUs', 'rateIncreaseTimerUs', 'minRateBps'];
  for (const k of positive) if (!((p[k] as number) > 0)) return `${k} must be > 0`;
  const nonNegative: (keyof DcqcnParams)[] = [
    'byteCounterBytes', 'fastRecoverySteps', 'additiveIncreaseBps', 'hyperIncreaseBps', 'maxRateBps',
    'rateReduceMonitorPeriodUs', 'rateOnFirstCnpBps', 'minDecreaseFactorPercent', 'minTimeBetweenCnpsUs',
  ];
  for (const k of nonNegative) if (!((p[k] as number) >= 0)) return `${k} must be ≥ 0`;
  if (!(p.alphaGain > 0 && p.alphaGain <= 1)) return 'alphaGain must be in (0, 1]';
  if (!(p.initialAlpha >= 0 && p.initialAlpha <= 1)) return 'initialAlpha must be in [0, 1]';
  if (p.minDecreaseFactorPercent > 100) return 'minDecreaseFactorPercent must be ≤ 100';
  if (!Number.isInteger(p.fastRecoverySteps)) return 'fastRecoverySteps must be an integer';
  return undefined;
}

/**
 * A deterministic discrete-event simulation of DCQCN: N senders, one switch egress port that
 * marks ECN (the CP, bottleneck.ts), one receiver whose notification point answers with CNPs.
 * The senders run the real reaction point (cc/dcqcn.ts, through createCongestionControl) and
 * the receiver the real notification point (cc/notification.ts); only the network is modelled.
 *
 * Read first: Zhu et al., SIGCOMM 2015, §3 (the three algorithms) and §5 (the 40 Gb/s
 * parameters: Kmin = 5 KB, Kmax = 200 KB, Pmax = 1 %, used as the defaults here).
 *
 * Topology, all links at `lineRateBps` unless the bottleneck is given its own rate:
 *
 *   sender i ──(delay d)──► switch egress queue ──(bottleneck, delay d)──► receiver
 *       ▲                                                                    │
 *       └──────────────────── CNP (2·d + serialization) ─────────────────────┘
 *
 * Each sender always has data (an incast of long flows), sends packets of one size when its
 * pacer allows and its NIC is free, and starts at line rate (DCQCN has no slow start). CNPs
 * travel the reverse direction, which carries nothing else, so they never queue. There is no
 * PFC and no retransmission: a packet dropped at the tail is simply lost, which is enough to
 * see what the control loop does with the queue.
 *
 * Modelling choices that keep 100 ms at 40 Gb/s to well under a second per flow-pair: an
 * event is four numbers in typed arrays (event-queue.ts), packets are (flow, mark) pairs in a
 * ring, receiving a packet is handled at the moment it leaves the switch (its arrival time is
 * that plus a constant delay, and arrivals stay in order), and a sender's timers are lazy
 * (dcqcn.ts) so only a sender whose pacer waits longer than its next timer gets a wake-up.
 * Randomness comes from one seeded generator (rng.ts): the RED draws and a sub-packet start
 * jitter that keeps identical flows from moving in lockstep.
 */

import { createCongestionControl, createNotificationPoint, type CongestionControl } from '../cc/controller.js';
import { DcqcnRp } from '../cc/dcqcn.js';
import type { DcqcnParams, DcqcnProfileName } from '../cc/profiles.js';
import { Enqueue, RedQueue } from './bottleneck.js';
import { EventQueue } from './event-queue.js';
import { Rng } from './rng.js';
import { jainIndex, percentile } from './stats.js';

/** Bytes a RoCEv2 packet adds to its payload on Ethernet: MAC 14 + FCS 4 + IPv4 20 + UDP 8 + BTH 12 + ICRC 4. */
export const ROCE_OVERHEAD_BYTES = 62;
/** A CNP on the wire: the overhead above plus its 16 reserved bytes. */
const CNP_WIRE_BYTES = ROCE_OVERHEAD_BYTES + 16;

export interface DcqcnSimOptions {
  flows: number;
  durationUs: number;
  /** Every NIC's rate, bit/s (default 40 Gb/s). */
  lineRateBps?: number;
  /** The switch egress rate, bit/s (default: the line rate). */
  bottleneckRateBps?: number;
  /** 'paper' (default) or 'cx'. */
  profile?: DcqcnProfileName;
  overrides?: Partial<DcqcnParams>;
  /** False: senders at line rate, nothing marked (default true). */
  cc?: boolean;
  seed?: number;
  /** RoCE payload per packet (default 1024); the wire adds ROCE_OVERHEAD_BYTES. */
  mtuBytes?: number;
  /** One-way propagation delay of each link, µs (default 1). */
  linkDelayUs?: number;
  kminBytes?: number;
  kmaxBytes?: number;
  pMax?: number;
  /** Egress tail-drop limit, bytes (default 4 MiB, a third of a 12 MB shared-buffer switch). */
  queueLimitBytes?: number;
  /** Sampling period for `onSample` and the queue statistics, µs (default 10). */
  sampleIntervalUs?: number;
  /** Flow i starts at i × startGapUs (default 0: all at once). */
  startGapUs?: number;
  /**
   * Called every sample period from 0 to the end, inclusive. `rates` holds each flow's current
   * rate (R_C, or the line rate without CC; 0 before the flow starts), bit/s; it is reused
   * between calls.
   */
  onSample?: (timeUs: number, rates: Float64Array, queueBytes: number) => void;
}

export type ResolvedSimOptions = Required<Omit<DcqcnSimOptions, 'onSample' | 'overrides'>>;

export interface DcqcnSimResult {
  options: ResolvedSimOptions;
  packetBytes: number;
  /** Bytes each flow delivered to the receiver over the whole run. */
  deliveredBytes: number[];
  /** Each flow's delivered rate over the second half of the run, bit/s. */
  secondHalfBps: number[];
  /** Jain's fairness index of `secondHalfBps`. */
  jainSecondHalf: number;
  /** Sampled queue length over the second half, bytes. */
  queueSecondHalf: { medianBytes: number; p99Bytes: number; maxBytes: number };
  /** Largest sampled queue over the whole run, bytes. */
  queueMaxBytes: number;
  drops: number;
  marked: number;
  enqueued: number;
  cnpsSent: number;
  cnpsSuppressed: number;
  /** Rate cuts across all reaction points. */
  cuts: number;
  events: number;
}

const SEND = 1;
const TIMER = 2;
const ARRIVE = 3;
const DEPART = 4;
const CNP = 5;
const SAMPLE = 6;

export function resolveSimOptions(o: DcqcnSimOptions): ResolvedSimOptions {
  const lineRateBps = o.lineRateBps ?? 40e9;
  const r: ResolvedSimOptions = {
    flows: o.flows,
    durationUs: o.durationUs,
    lineRateBps,
    bottleneckRateBps: o.bottleneckRateBps ?? lineRateBps,
    profile: o.profile ?? 'paper',
    cc: o.cc ?? true,
    seed: o.seed ?? 1,
    mtuBytes: o.mtuBytes ?? 1024,
    linkDelayUs: o.linkDelayUs ?? 1,
    kminBytes: o.kminBytes ?? 5 * 1024,
    kmaxBytes: o.kmaxBytes ?? 200 * 1024,
    pMax: o.pMax ?? 0.01,
    queueLimitBytes: o.queueLimitBytes ?? 4 * 1024 * 1024,
    sampleIntervalUs: o.sampleIntervalUs ?? 10,
    startGapUs: o.startGapUs ?? 0,
  };
  const bad = (m: string): never => {
    throw new RangeError(m);
  };
  if (!Number.isInteger(r.flows) || r.flows < 1 || r.flows > 4096) bad(`flows must be an integer in 1..4096, not ${r.flows}`);
  if (!(r.durationUs > 0)) bad(`duration must be > 0 µs, not ${r.durationUs}`);
  if (!(r.lineRateBps > 0) || !(r.bottleneckRateBps > 0)) bad('rates must be > 0 bit/s');
  if (!(r.mtuBytes > 0)) bad(`MTU must be > 0 bytes, not ${r.mtuBytes}`);
  if (!(r.linkDelayUs >= 0)) bad(`link delay must be ≥ 0 µs, not ${r.linkDelayUs}`);
  if (!(r.kminBytes >= 0 && r.kmaxBytes > r.kminBytes)) bad(`need 0 ≤ Kmin < Kmax, not ${r.kminBytes}, ${r.kmaxBytes}`);
  if (!(r.pMax >= 0 && r.pMax <= 1)) bad(`Pmax must be in [0, 1], not ${r.pMax}`);
  if (!(r.queueLimitBytes >= r.mtuBytes + ROCE_OVERHEAD_BYTES)) bad(`queue limit must hold at least one packet`);
  if (!(r.sampleIntervalUs > 0)) bad(`sample interval must be > 0 µs, not ${r.sampleIntervalUs}`);
  if (!(r.startGapUs >= 0)) bad(`start gap must be ≥ 0 µs, not ${r.startGapUs}`);
  return r;
}

export function runDcqcnSim(opts: DcqcnSimOptions): DcqcnSimResult {
  const o = resolveSimOptions(opts);
  const n = o.flows;
  const P = o.mtuBytes + ROCE_OVERHEAD_BYTES;
  const txHost = (P * 8e6) / o.lineRateBps;
  const txBottleneck = (P * 8e6) / o.bottleneckRateBps;
  const d = o.linkDelayUs;
  const cnpDelay = 2 * d + (2 * CNP_WIRE_BYTES * 8e6) / o.lineRateBps;
  const end = o.durationUs;
  const half = end / 2;
  const rng = new Rng(o.seed);

  const ccs: CongestionControl[] = [];
  const startAt = new Float64Array(n);
  for (let f = 0; f < n; f++) {
    startAt[f] = f * o.startGapUs + rng.next() * txHost;
    ccs.push(
      o.cc
        ? createCongestionControl({ kind: 'dcqcn', lineRateBps: o.lineRateBps, profile: o.profile, ...(opts.overrides ? { overrides: opts.overrides } : {}), pacerBurstBytes: P, nowUs: startAt[f]! })
        : createCongestionControl({ kind: 'none', lineRateBps: o.lineRateBps, pacerBurstBytes: P, nowUs: startAt[f]! }),
    );
  }
  const np = createNotificationPoint(o.profile, opts.overrides);
  const red = new RedQueue(
    { kminBytes: o.kminBytes, kmaxBytes: o.kmaxBytes, pMax: o.pMax, limitBytes: o.queueLimitBytes, marking: o.cc },
    P,
  );

  // Pending SEND / TIMER event time per flow; an event whose time differs is stale.
  const sendAt = new Float64Array(n).fill(-1);
  const timerAt = new Float64Array(n).fill(-1);
  const nicFreeAt = new Float64Array(n);
  const delivered = new Float64Array(n);
  const deliveredHalf = new Float64Array(n);
  const rates = new Float64Array(n);
  const nSamples = Math.floor(end / o.sampleIntervalUs) + 1;
  const queueSamples = new Float64Array(nSamples);
  let sampleCount = 0;
  let halfSampleStart = -1;
  let busy = false;
  let events = 0;

  const q = new EventQueue(Math.max(1024, 8 * n));

  const armTimer = (f: number, before: number): void => {
    const nt = ccs[f]!.nextTimerAt();
    if (nt === undefined || nt >= before) return;
    const pending = timerAt[f]!;
    if (pending >= 0 && pending <= nt) return;
    timerAt[f] = nt;
    q.push(nt, TIMER, f);
  };
  const scheduleSend = (f: number, at: number): void => {
    sendAt[f] = at;
    q.push(at, SEND, f);
    armTimer(f, at);
  };
  const nextSend = (f: number, t: number): number => {
    const at = ccs[f]!.nextSendAt(t, P);
    const nic = nicFreeAt[f]!;
    return at > nic ? at : nic;
  };

  for (let f = 0; f < n; f++) scheduleSend(f, startAt[f]!);
  q.push(0, SAMPLE, 0);

  while (q.pop()) {
    const t = q.popTime;
    if (t > end) break;
    events++;
    const f = q.popArg;
    switch (q.popKind) {
      case SEND: {
        if (sendAt[f] !== t) break;
        sendAt[f] = -1;
        const cc = ccs[f]!;
        const at = nextSend(f, t);
        if (at > t) {
          scheduleSend(f, at);
          break;
        }
        cc.onSend(t, P);
        nicFreeAt[f] = t + txHost;
        q.push(t + txHost + d, ARRIVE, f);
        scheduleSend(f, nextSend(f, t));
        break;
      }
      case TIMER: {
        if (timerAt[f] !== t) break;
        timerAt[f] = -1;
        ccs[f]!.onTimer(t);
        const pending = sendAt[f]!;
        if (pending > t) {
          const at = nextSend(f, t);
          if (at < pending) scheduleSend(f, at);
          else armTimer(f, pending);
        }
        break;
      }
      case ARRIVE: {
        if (red.enqueue(f, rng) !== Enqueue.Dropped && !busy) {
          busy = true;
          q.push(t + txBottleneck, DEPART, 0);
        }
        break;
      }
      case DEPART: {
        const g = red.dequeue();
        const arrival = t + d;
        if (arrival <= end) {
          delivered[g] = delivered[g]! + P;
          if (arrival >= half) deliveredHalf[g] = deliveredHalf[g]! + P;
          if (o.cc && red.lastMarked && np.onMarkedPacket(arrival, g)) q.push(arrival + cnpDelay, CNP, g);
        }
        if (red.packets > 0) q.push(t + txBottleneck, DEPART, 0);
        else busy = false;
        break;
      }
      case CNP: {
        ccs[f]!.onCnp(t);
        const pending = sendAt[f]!;
        if (pending >= 0) armTimer(f, pending);
        break;
      }
      case SAMPLE: {
        for (let i = 0; i < n; i++) rates[i] = t < startAt[i]! ? 0 : ccs[i]!.rateBps(t);
        const qb = red.bytes;
        opts.onSample?.(t, rates, qb);
        if (halfSampleStart < 0 && t >= half) halfSampleStart = sampleCount;
        queueSamples[sampleCount++] = qb;
        const next = t + o.sampleIntervalUs;
        if (next <= end + 1e-9) q.push(next, SAMPLE, 0);
        break;
      }
    }
  }

  const secondHalfBps = Array.from(deliveredHalf, (b) => (b * 8e6) / (end - half));
  const all = queueSamples.subarray(0, sampleCount);
  const late = Float64Array.from(all.subarray(Math.max(0, halfSampleStart))).sort();
  let cuts = 0;
  for (const cc of ccs) if (cc instanceof DcqcnRp) cuts += cc.counters.cuts;
  return {
    options: o,
    packetBytes: P,
    deliveredBytes: Array.from(delivered),
    secondHalfBps,
    jainSecondHalf: jainIndex(secondHalfBps),
    queueSecondHalf: { medianBytes: percentile(late, 0.5), p99Bytes: percentile(late, 0.99), maxBytes: late.length ? late[late.length - 1]! : 0 },
    queueMaxBytes: all.reduce((m, x) => (x > m ? x : m), 0),
    drops: red.drops,
    marked: red.marked,
    enqueued: red.enqueued,
    cnpsSent: np.counters.cnps,
    cnpsSuppressed: np.counters.suppressed,
    cuts,
    events,
  };
}

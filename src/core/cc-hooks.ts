/**
 * Congestion control in the engine: the reaction point (RP) on a QP's send path and the
 * notification point (NP) on the device's ingress. The engine calls in here from a handful of
 * lines (qp.ts `poll`/`pollAt`, device.ts `createQp`/`receive`); the algorithms themselves
 * are in src/cc.
 *
 * Read first: src/cc/controller.ts (the `CongestionControl` seam), src/cc/notification.ts (the
 * NP), IBTA RoCEv2 Annex A17.9 (CNPs), Zhu et al., SIGCOMM 2015 §3.1.
 *
 * RP. A QP with a controller sends a request packet only when `nextSendAt(now, bytes)` says so;
 * otherwise `pollAt` reports that time and the device wakes the QP then. Every request packet
 * is charged to the controller (`onSend`) with its exact size as handed to the link plus the
 * ICRC. Responses (ACKs, READ responses) are neither gated nor charged: they are clocked by the
 * peer's requests, and gating an ACK behind a data backlog would stall the peer's window.
 * While the pacer spaces packets widely, each request asks for its ACK (see `transmit` below).
 * Without a controller (`cc: 'none'`, the default) the QP takes none of these paths: the
 * requester runs exactly as before, with one `undefined` check per poll.
 *
 * NP. Every request packet the device accepts for a QP is checked for a congestion mark (IP CE
 * where the link sees it, else BTH FECN); a marked one asks the QP's `NotificationPoint`
 * (one per receiving QP, so that two senders on different hosts with the same QPN are not
 * confused) whether a CNP is due. The CNP goes to the QP's peer: RC/UC to the address and port
 * the QP answers to (the same place its ACKs go, so a relay in between sees it), UD to where
 * the datagram came from.
 *
 * CNPs received. A CNP for a connected QP with a controller feeds `onCnp` (rdma_rxe drops
 * CNPs; we do not) once the device has checked it came from the QP's peer.
 */

import type { CongestionControl, CongestionControlConfig } from '../cc/controller.js';
import { createCongestionControl, dcqcnParams } from '../cc/controller.js';
import type { DcqcnRp, DcqcnState } from '../cc/dcqcn.js';
import { isCongestionMarked, NotificationPoint } from '../cc/notification.js';
import type { DcqcnParams, DcqcnProfileName } from '../cc/profiles.js';
import type { Link, RxMeta } from '../link/link.js';
import { cnpPacket } from '../wire/cnp.js';
import { ICRC_LEN } from '../wire/icrc.js';
import { opcodeInfo } from '../wire/opcode.js';
import { emitPacket, padFor } from '../wire/packet.js';
import type { EngineContext } from './context.js';
import type { Counters } from './counters.js';
import type { MrTable, ProtectionDomain } from './mr.js';
import type { QueuePair } from './qp.js';
import { requestOpcode, type EmitResult } from './requester.js';
import { MAX_PKT_PER_ACK } from './limits.js';
import { ackTimeoutUs, type Micros } from './time.js';
import type { Endpoint, QpState, QpType, Qpn, WorkCompletion } from './types.js';

/**
 * The congestion control of a device (the default for its RC/UC QPs, and whether its NP sends
 * CNPs) or of one QP (the RP only).
 * - `'none'`: no control, as rdma_rxe: no pacing, CNPs ignored, no CNPs sent. The default.
 * - `'dcqcn'`: DCQCN with the paper's profile at `DEFAULT_LINE_RATE_BPS`.
 * - `{ kind: 'dcqcn', … }`: a profile, overrides, the line rate the RP starts at, the pacer's
 *   bucket, and `notificationPoint: false` to keep the RP but never send CNPs.
 * - `{ kind: 'fixed', rateBps }`: a static rate limit; CNPs ignored; no NP.
 */
export type CcOption =
  | 'none'
  | 'dcqcn'
  | { kind: 'none' }
  | { kind: 'fixed'; rateBps: number; pacerBurstBytes?: number }
  | {
      kind: 'dcqcn';
      profile?: DcqcnProfileName;
      overrides?: Partial<DcqcnParams>;
      /** Where the RP starts and its ceiling, bit/s. Default `DEFAULT_LINE_RATE_BPS`. */
      lineRateBps?: number;
      /** Pacer bucket, bytes. Default 8 KiB on a virtual clock, 64 KiB on a real one (see below). */
      pacerBurstBytes?: number;
      /** Send CNPs for marked packets (device level only). Default true. */
      notificationPoint?: boolean;
    };

/**
 * The port speed a DCQCN RP starts at when none is given. The stack has no port speed of its
 * own; the paper's profile is tuned for 40 Gb/s, so that is the speed its numbers make sense at.
 */
export const DEFAULT_LINE_RATE_BPS = 40e9;

/**
 * Pacer buckets. On a virtual clock a wake-up lands exactly when asked, so a bucket of two
 * 4 KiB packets paces finely. A real clock's timers fire on a ~1 ms grid (libuv), and a bucket
 * can only hand out what it holds per wake-up: 8 KiB per ms caps a flow at ~65 Mb/s whatever its
 * rate. 64 KiB per wake-up lets the pacer reach ~500 Mb/s; faster flows are at line rate and
 * barely paced anyway.
 */
const VIRTUAL_BURST_BYTES = 8192;
const REAL_BURST_BYTES = 65536;

function normalize(o: CcOption): Exclude<CcOption, string> {
  return typeof o === 'string' ? { kind: o } : o;
}

/** The controller config for `option`, or undefined for no control. */
export function controllerConfig(option: CcOption, virtualClock: boolean, nowUs: Micros): CongestionControlConfig | undefined {
  const o = normalize(option);
  switch (o.kind) {
    case 'none':
      return undefined;
    case 'fixed':
      return { kind: 'fixed', rateBps: o.rateBps, pacerBurstBytes: o.pacerBurstBytes ?? (virtualClock ? VIRTUAL_BURST_BYTES : REAL_BURST_BYTES), nowUs };
    case 'dcqcn': {
      const c: CongestionControlConfig = {
        kind: 'dcqcn',
        lineRateBps: o.lineRateBps ?? DEFAULT_LINE_RATE_BPS,
        pacerBurstBytes: o.pacerBurstBytes ?? (virtualClock ? VIRTUAL_BURST_BYTES : REAL_BURST_BYTES),
        nowUs,
      };
      if (o.profile !== undefined) c.profile = o.profile;
      if (o.overrides !== undefined) c.overrides = o.overrides;
      return c;
    }
  }
}

/** The RP half attached to a QP; `undefined` on QPs without congestion control. */
export function qpCongestion(option: CcOption | undefined, qp: QueuePair, virtualClock: boolean, nowUs: Micros): QpCongestion | undefined {
  if (option === undefined || qp.type === 'UD') return undefined;
  const config = controllerConfig(option, virtualClock, nowUs);
  return config === undefined ? undefined : new QpCongestion(qp, createCongestionControl(config));
}

/** Per-QP congestion state, for tests and the CLI. */
export interface QpCcState {
  kind: string;
  /** The rate the QP is paced at, bit/s. */
  rateBps: number;
  /** CNPs this QP's RP received. */
  cnpRcvd: number;
  /** CNPs sent to this QP's peer (its NP). */
  cnpSent: number;
  /** Marked request packets received on this QP. */
  markedRcvd: number;
  /** DCQCN only: target rate, α, stages. */
  dcqcn?: DcqcnState;
}

/**
 * The RP of one QP: the controller, and a view of the QP through which the requester's packets
 * are charged to it (the requester talks to its QP only through `EngineContext`).
 */
export class QpCongestion {
  readonly controller: CongestionControl;
  cnpRcvd = 0;
  private readonly qp: QueuePair;
  private readonly charged: EngineContext;

  constructor(qp: QueuePair, controller: CongestionControl) {
    this.qp = qp;
    this.controller = controller;
    this.charged = new ChargingContext(qp, controller);
  }

  /** When the next request packet may leave (≤ the QP's last `now` means now). */
  sendAt(): Micros {
    const qp = this.qp;
    return this.controller.nextSendAt(qp.lastNow, nextRequestBytes(qp));
  }

  /**
   * The RP's next timer. The QP wakes for it only while a packet waits on the pacer: the RP's
   * timers are lazy, so an idle QP catches up on its next send without being woken.
   */
  timerAt(): Micros | undefined {
    return this.controller.nextTimerAt();
  }

  /** Runs the RP's timers that are due (they are lazy: calling early is harmless). */
  onTimer(now: Micros): void {
    const t = this.controller.nextTimerAt();
    if (t !== undefined && t <= now) this.controller.onTimer(now);
  }

  onCnp(now: Micros): void {
    this.cnpRcvd++;
    this.controller.onCnp(now);
  }

  /** The requester's `emit`, one packet at a time, each only when the pacer allows it. */
  emit(now: Micros, budget: number): EmitResult {
    const qp = this.qp;
    const res: EmitResult = { sent: 0, expectsResponse: false };
    while (res.sent < budget) {
      if (qp.requester.blocked(qp, qp, qp.compPsn) !== undefined) break;
      if (this.controller.nextSendAt(now, nextRequestBytes(qp)) > now) break;
      const r = qp.requester.emit(qp, this.charged, qp.compPsn, 1);
      res.sent += r.sent;
      if (r.expectsResponse) res.expectsResponse = true;
      if (r.error) {
        res.error = r.error;
        break;
      }
      if (r.sent === 0) break;
    }
    return res;
  }
}

/**
 * The size of the next request packet the requester will build (headers + payload + pad +
 * ICRC): what the pacer must hold before it leaves. An estimate only decides *when*; the charge
 * is the exact size.
 */
function nextRequestBytes(qp: QueuePair): number {
  let i = Math.max(qp.reqCursor, qp.sqHead);
  let w = qp.sqAt(i);
  while (w && (w.state === 'pending' || w.state === 'done')) w = qp.sqAt(++i);
  if (!w) return 0;
  const mtu = qp.attrs.pathMtu;
  if (w.opcode === 'RDMA_READ' || w.opcode === 'ATOMIC_CMP_AND_SWP' || w.opcode === 'ATOMIC_FETCH_AND_ADD') {
    return headerLength(qp.type, w.opcode, 'ONLY') + ICRC_LEN;
  }
  const npkts = Math.max(1, Math.ceil(w.length / mtu));
  const k = w.state === 'posted' ? 0 : w.nextPkt;
  const len = Math.max(0, Math.min(mtu, w.length - k * mtu));
  const pos = npkts === 1 ? 'ONLY' : k === 0 ? 'FIRST' : k === npkts - 1 ? 'LAST' : 'MIDDLE';
  return headerLength(qp.type, w.opcode, pos) + len + padFor(len) + ICRC_LEN;
}

function headerLength(type: QpType, op: Parameters<typeof requestOpcode>[1], pos: Parameters<typeof requestOpcode>[2]): number {
  return opcodeInfo(requestOpcode(type, op, pos))?.headerLength ?? 12;
}

/** The QP as the requester sees it, with every transmitted packet charged to the controller. */
class ChargingContext implements EngineContext {
  constructor(private readonly qp: QueuePair, private readonly cc: CongestionControl) {}
  get qpn(): Qpn {
    return this.qp.qpn;
  }
  get type(): QpType {
    return this.qp.type;
  }
  get state(): QpState {
    return this.qp.state;
  }
  get stateEpoch(): number {
    return this.qp.stateEpoch;
  }
  get pd(): ProtectionDomain {
    return this.qp.pd;
  }
  get mrs(): MrTable {
    return this.qp.mrs;
  }
  get counters(): Counters {
    return this.qp.counters;
  }
  get attrs(): QueuePair['attrs'] {
    return this.qp.attrs;
  }
  transmit(dst: Endpoint, parts: readonly Uint8Array[]): void {
    const qp = this.qp;
    const now = qp.lastNow;
    let bytes = ICRC_LEN;
    for (const p of parts) bytes += p.length;
    this.cc.onSend(now, bytes);
    // The requester asks for an ACK every MAX_PKT_PER_ACK packets (rxe's coalescing). A sender
    // paced down far enough takes a good part of its ACK timeout to send that many, and the
    // queue that made it slow down delays the ACK further: it times out with nothing lost and
    // goes back N. So while the pacer spaces packets that far apart (64 gaps ≥ an eighth of the
    // timeout), every packet asks for its ACK.
    const h = parts[0];
    if (qp.type === 'RC' && h !== undefined && h.length >= 12 && (h[8]! & 0x80) === 0) {
      const timeout = ackTimeoutUs(qp.attrs.timeout);
      const gap = this.cc.nextSendAt(now, qp.attrs.pathMtu) - now;
      if (timeout !== undefined && gap * MAX_PKT_PER_ACK >= timeout / 8) h[8] = h[8]! | 0x80;
    }
    qp.transmit(dst, parts);
  }
  postRecvCompletion(wc: WorkCompletion): void {
    this.qp.postRecvCompletion(wc);
  }
}

/** The NP of a device: CNPs for marked request packets, at most one per interval per sending QP. */
export class DeviceNotificationPoint {
  private readonly minTimeBetweenCnpsUs: number;
  private readonly perQp = new WeakMap<QueuePair, NotificationPoint>();
  private readonly cnp = new Uint8Array(32);
  private readonly cnpParts: Uint8Array[];

  /** The device's NP for `option`, or undefined when it sends no CNPs. */
  static create(option: CcOption | undefined, link: Link, counters: Counters): DeviceNotificationPoint | undefined {
    if (option === undefined) return undefined;
    const o = normalize(option);
    if (o.kind !== 'dcqcn' || o.notificationPoint === false) return undefined;
    return new DeviceNotificationPoint(dcqcnParams(o.profile, o.overrides).minTimeBetweenCnpsUs, link, counters);
  }

  private constructor(minTimeBetweenCnpsUs: number, private readonly link: Link, private readonly counters: Counters) {
    this.minTimeBetweenCnpsUs = minTimeBetweenCnpsUs;
    // BTH + 16 reserved bytes; the link appends the ICRC.
    const end = emitPacket(cnpPacket(0), this.cnp, 0);
    this.cnpParts = [this.cnp.subarray(0, end - ICRC_LEN)];
  }

  /** An accepted request packet for `qp` (payload from offset 0 = BTH). */
  onRequest(qp: QueuePair, payload: Uint8Array, meta: RxMeta, now: Micros, udSrcQp: number | undefined): void {
    if (!isCongestionMarked(meta.ce, payload)) return;
    let np = this.perQp.get(qp);
    if (np === undefined) {
      np = new NotificationPoint({ minTimeBetweenCnpsUs: this.minTimeBetweenCnpsUs });
      this.perQp.set(qp, np);
    }
    const dst = qp.type === 'UD' ? meta.src : qp.attrs.dest;
    const srcQp = qp.type === 'UD' ? udSrcQp ?? 0 : qp.attrs.destQpNum;
    if (dst === undefined || !np.onMarkedPacket(now, srcQp)) return;
    // DestQP (bytes 5..7): the QP whose traffic was marked.
    this.cnp[5] = (srcQp >>> 16) & 0xff;
    this.cnp[6] = (srcQp >>> 8) & 0xff;
    this.cnp[7] = srcQp & 0xff;
    this.link.send(dst, qp.attrs.srcPort, this.cnpParts);
    this.counters.cnpSent++;
  }

  /** CNPs sent to `qp`'s peer and marked packets seen on `qp`. */
  stats(qp: QueuePair): { cnpSent: number; markedRcvd: number } {
    const np = this.perQp.get(qp);
    return { cnpSent: np?.counters.cnps ?? 0, markedRcvd: np?.counters.marked ?? 0 };
  }
}

/** The congestion state of `qp`, as of `now`. */
export function qpCcState(qp: QueuePair, np: DeviceNotificationPoint | undefined, now: Micros): QpCcState {
  const c = qp.cc;
  const n = np?.stats(qp) ?? { cnpSent: 0, markedRcvd: 0 };
  const s: QpCcState = {
    kind: c?.controller.kind ?? 'none',
    rateBps: c?.controller.rateBps(now) ?? Infinity,
    cnpRcvd: c?.cnpRcvd ?? 0,
    cnpSent: n.cnpSent,
    markedRcvd: n.markedRcvd,
  };
  if (c?.controller.kind === 'dcqcn') s.dcqcn = (c.controller as DcqcnRp).state(now);
  return s;
}

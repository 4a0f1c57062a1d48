/**
 * A queue pair: the one state variable, the two work queues, the three engines, and the timers.
 *
 * Read first: IBTA Vol. 1 §10.3 (QP states and what each allows), §11.2.4 (create/modify/query
 * QP), §11.4.1 (post send/receive), §10.7.3 (completions), §9.7.6 (ACK and RNR timers).
 * rdma_rxe: rxe_qp.c (`rxe_qp_chk_attr`/`rxe_qp_from_attr`, `rxe_qp_error`, drain).
 *
 * Sans-IO: every entry point takes `now`; the QP sends through `io.transmit` and tells the
 * runtime when it next needs to run through `pollAt()`. `setState(next, reason)` is the only
 * writer of `state`, and the state's side effects (flush on ERR, clear on RESET, engine resets
 * on RTR/RTS) live there.
 */

import type { OpcodeInfo } from '../wire/opcode.js';
import type { RocePacket } from '../wire/packet.js';
import { psnDiff } from '../wire/psn.js';
import { peerEndpoint, resolveAh } from './address.js';
import type { QpCongestion } from './cc-hooks.js';
import { COMPLETER, type CompleterAction, type CompleterState } from './completer.js';
import type { EngineContext, QpAttrs, RxInfo } from './context.js';
import type { Counters } from './counters.js';
import type { CompletionQueue } from './cq.js';
import { InvalidWrError, QpStateError, QueueFullError } from './errors.js';
import { connectedSourcePort, datagramSourcePort } from './flow.js';
import { MAX_ACK_BACKOFF, MAX_PKTS_PER_POLL } from './limits.js';
import { sgeTotal, type MemoryRegion, type MrTable, type ProtectionDomain } from './mr.js';
import { checkModify, maskFromAttr, mtuBytes } from './qp-state.js';
import { isReadOrAtomic, REQUESTER, WR_OPCODES_FOR, type RequesterState } from './requester.js';
import { NO_JOBS, NO_SEGMENTS, RESPONDER, type ReadJob, type Resource, type ResponderHost, type ResponderState } from './responder.js';
import { ackTimeoutUs, earliest, type Micros } from './time.js';
import {
  QP_ATTR_MASK as M, SEND_FLAGS, WC_FLAGS,
  type AsyncEvent, type Endpoint, type Sge, type Psn, type QpAttr, type QpCap, type QpState, type QpType, type Qpn, type RecvWr, type SendWr,
  type WcOpcode, type WcStatus, type WorkCompletion, type WrOpcode,
} from './types.js';
import { grownRing, releaseRecvWqe, releaseSendWqe, takeRecvWqe, takeSendWqe, WorkQueue, type RecvWqe, type SendWqe } from './wqe.js';

/** "Run me as soon as you can" from `pollAt`. */
export const ASAP: Micros = 0;

/** The SGE list of a receive WR that has none (a zero-length receive), shared. */
const NO_SGES: readonly Sge[] = Object.freeze([]);
/** The WQEs of a list being posted, between their checks and their queueing (`postSend`). */
const TAKEN: (SendWqe | undefined)[] = [];

/** How the QP reaches the outside world; the runtime implements it. */
export interface QpIo {
  transmit(dst: Endpoint, srcPort: number, parts: readonly Uint8Array[]): void;
  event(ev: AsyncEvent): void;
  /**
   * Called on every state change, for tracing (`qp 0x11 RTS=>ERR (retry exceeded)`), in order, after
   * the new state's work (ERR's flushes); it may move the QP again.
   */
  stateChanged?(qpn: Qpn, from: QpState, to: QpState, reason: string): void;
}

export interface QpInit {
  qpn: Qpn;
  type: QpType;
  pd: ProtectionDomain;
  mrs: MrTable;
  counters: Counters;
  sendCq: CompletionQueue;
  recvCq: CompletionQueue;
  cap: QpCap;
  sqSigAll: boolean;
  portMtu: number;
  io: QpIo;
}

const WC_OPCODE_OF: Readonly<Record<WrOpcode, WcOpcode>> = {
  SEND: 'SEND', SEND_WITH_IMM: 'SEND', SEND_WITH_INV: 'SEND', RDMA_WRITE: 'RDMA_WRITE', RDMA_WRITE_WITH_IMM: 'RDMA_WRITE',
  RDMA_READ: 'RDMA_READ', ATOMIC_CMP_AND_SWP: 'COMP_SWAP', ATOMIC_FETCH_AND_ADD: 'FETCH_ADD',
};

export class QueuePair implements EngineContext, CompleterState, RequesterState, ResponderState, ResponderHost {
  // Field order is memory order: V8 lays an object out in the order its fields are defined. The
  // fields a message reads come first, so that with thousands of QPs (each one cold in cache when its
  // turn comes) a message reads three or four lines of this record; the rest follow. It matters:
  // moving the responder's fields ahead of the requester's cost 8 % of the goodput at 10,000 QPs
  // (bench/PROFILE.md).
  readonly qpn: Qpn;
  private _state: QpState = 'RESET';
  /**
   * Counts the QP's entries into RESET, ERR and SQE, the states that take its work away (a reset
   * and reconnect counts: the work in hand was the old connection's). A send or a completion runs
   * the application's code (a link, a trace printer, a completion handler), which may do that: code
   * that goes on after one compares this count, and leaves the QP to the later change if it moved.
   * Other changes (RTS → RTS with new attributes, SQD and back) leave the work in hand to go on.
   */
  stateEpoch = 0;
  /** The runtime's: whether the QP is in the device's ready queue, to run on its next turn. */
  queued = false;
  /** Also the runtime's: whether the QP is in the queue of QPs posted to, which runs in a microtask. */
  postQueued = false;
  /** Also the runtime's: whether the device still holds this QP (destroyQp clears it). Read on every run and kick. */
  attached = false;
  /**
   * Also the runtime's, not protocol state: the deadline (µs) the device holds a timer entry for,
   * or -1 (src/runtime/device.ts, `kick`). A field rather than a device map: it is read on every kick.
   */
  timerAt = -1;
  /**
   * False only while the responder is known to have nothing to send: set after a run found it idle,
   * cleared by every request, the only way it gets work. A QP that only initiates then skips its
   * responder in `poll` and `pollAt`: with thousands of QPs, two more objects cold in cache per message.
   */
  private responderBusy = true;
  /** A work completion was pushed since the last `poll`: the application has something to react to. */
  private completedSinceRun = false;
  /** Congestion control (cc-hooks.ts): paces the requester; undefined = none, as rxe. */
  cc: QpCongestion | undefined;
  private now: Micros = 0;
  readonly requester = REQUESTER;
  readonly completer = COMPLETER;
  // The requester's and the completer's state (`RequesterState`, `CompleterState`), in this record
  // as rxe keeps `qp->req` and `qp->comp` in `struct rxe_qp`: objects of their own were two more
  // cold cache lines per message with thousands of QPs. The engines keep no state of their own.
  reqPsn: Psn = 0;
  reqCursor = 0;
  reqHighPsn: Psn = 0;
  reqNoackPkts = 0;
  reqRdAtomic = 0;
  // The send queue: a ring with absolute indices, as `WorkQueue` (wqe.ts) is, in fields of this
  // record rather than an object of its own. With thousands of QPs every post and every ACK is for
  // another QP, cold in cache, and the queue's own object was one more line to fetch each time.
  // Entries `sqHead` to `sqEnd`, the latter kept beside the requester's cursor (`RequesterState`).
  private sqItems: (SendWqe | undefined)[] = [];
  private sqMask = -1;
  sqHead = 0;
  sqEnd = 0;
  compPsn: Psn = 0;
  compOpcode = -1;
  compRetryCnt = 0;
  compRnrRetry = 0;
  compStartedRetry = false;
  compStaleReadPsn = -1;
  private ackDeadline: Micros | undefined;
  /** The ACK deadline passed on the last run; the timeout is decided on the next (see poll). */
  private ackExpired = false;
  /** Timeouts in a row without progress, up to MAX_ACK_BACKOFF: the timer runs 2^this × its base. */
  private ackBackoff = 0;
  /**
   * Smoothed time (µs) from sending a request to the response that acknowledges it; 0 until
   * measured. Kept in whole microseconds, like the deadlines it sets (see `ackTimeoutUs`).
   */
  private srttUs = 0;
  /** The PSN being timed, first sent at `rttSentAt`, or -1 (Karn: a retry discards the sample). */
  private rttPsn = -1;
  private rttSentAt = 0;
  private rnrUntil: Micros | undefined;
  readonly type: QpType;
  // The attributes (QpAttrs), held in this record as rxe embeds `struct ib_qp_attr` in `struct
  // rxe_qp`, for the same reason; `attrs` is this record. Those a message reads come first.
  pathMtu: number;
  destQpNum: Qpn = 0;
  dest: Endpoint | undefined = undefined;
  srcPort: number;
  timeout = 14;
  retryCnt = 7;
  rnrRetry = 7;
  sqSigAll: boolean;
  /** `cap.maxSendWr` and `cap.maxSendSge`, read by every post: here rather than in `cap`, likewise. */
  private readonly maxSendWr: number;
  private readonly maxSendSge: number;
  readonly counters: Counters;
  readonly sendCq: CompletionQueue;
  readonly mrs: MrTable;
  readonly pd: ProtectionDomain;
  private readonly io: QpIo;
  // The responder's state (`ResponderState`), likewise in this record, after the initiator's lines:
  // an object of its own behind the QP was one more dependent, cold load per request with thousands
  // of QPs. What a request reads first.
  respPsn: Psn = 0;
  respMsn = 0;
  respOpcode = -1;
  respAckPending = false;
  respAckPsn: Psn = 0;
  respAckMsn = 0;
  respJobs: ReadJob[] = NO_JOBS;
  respSentPsnNak = false;
  respDropMsg = false;
  respWriting = false;
  respWriteRkey = 0;
  respWriteLength = 0;
  respWriteResid = 0;
  respWriteMr: MemoryRegion | undefined = undefined;
  respWriteOff = 0;
  respRecvWqe: RecvWqe | undefined = undefined;
  respRecvSegments: readonly Uint8Array[] = NO_SEGMENTS;
  respRecvOffset = 0;
  respResources: Resource[] = [];
  respResCap = 0;
  respResHead = 0;
  // What a message does not read.
  readonly recvCq: CompletionQueue;
  readonly cap: QpCap;
  readonly rq = new WorkQueue<RecvWqe>();
  readonly responder = RESPONDER;
  /** Port MTU: the UD message limit and the cap on pathMtu. */
  readonly portMtu: number;
  /** 16-byte destination GID (RC/UC). */
  dgid: Uint8Array | undefined = undefined;
  accessFlags = 0;
  qkey = 0;
  pkeyIndex = 0;
  portNum = 1;
  minRnrTimer = 0;
  maxRdAtomic = 0;
  maxDestRdAtomic = 0;
  sqPsn = 0;
  rqPsn = 0;
  enSqdAsyncNotify = false;
  private rnrFrom = 0;
  private sqdNotifyPending = false;
  /** Why the QP last changed state. */
  stateReason = 'created';
  /** The state the last change left, until the change is reported (`reportStateChange`). */
  private unreportedFrom: QpState | undefined = undefined;

  constructor(init: QpInit) {
    this.qpn = init.qpn;
    this.type = init.type;
    this.pd = init.pd;
    this.mrs = init.mrs;
    this.counters = init.counters;
    this.sendCq = init.sendCq;
    this.recvCq = init.recvCq;
    this.cap = { ...init.cap };
    this.maxSendWr = init.cap.maxSendWr;
    this.maxSendSge = init.cap.maxSendSge;
    this.io = init.io;
    this.pathMtu = Math.min(1024, init.portMtu);
    this.portMtu = init.portMtu;
    this.srcPort = datagramSourcePort(init.qpn);
    this.sqSigAll = init.sqSigAll;
  }

  get state(): QpState {
    return this._state;
  }

  /** The QP's live attributes: the QP itself (see the fields above). */
  get attrs(): QpAttrs {
    return this;
  }

  // ---------------------------------------------------------------------------------------
  // State

  /**
   * The single writer of `state`; applies what entering `next` means. False, with nothing done, when
   * the send of the pending ACK moved the QP first (that change, the later one, stands).
   */
  setState(next: QpState, reason: string): boolean {
    // A coalesced ACK answers what was received before the change: it goes out first.
    if (this.responder.flushedAckLeftState(this)) return false;
    // A change whose work this one interrupts (a flushed WR's handler moving the QP) is reported first.
    this.reportStateChange();
    const from = this._state;
    this._state = next;
    if (next === 'RESET' || next === 'ERR' || next === 'SQE') this.stateEpoch++;
    this.stateReason = reason;
    if (from !== next) this.unreportedFrom = from;
    switch (next) {
      case 'RESET':
        this.sqClear();
        for (let w = this.rq.shift(); w; w = this.rq.shift()) releaseRecvWqe(w);
        this.responder.reset(this, 0, 0);
        this.requester.reset(this, 0, this.sqHead);
        this.completer.reset(this, 0, 0, 0);
        this.ackDeadline = undefined;
        this.ackBackoff = 0;
        this.srttUs = 0;
        this.rttPsn = -1;
        this.rnrUntil = undefined;
        break;
      case 'RTR':
        if (from === 'INIT') this.responder.reset(this, this.attrs.rqPsn, this.attrs.maxDestRdAtomic);
        break;
      case 'RTS':
        if (from === 'RTR') {
          this.requester.reset(this, this.attrs.sqPsn, this.sqHead);
          this.completer.reset(this, this.attrs.sqPsn, this.attrs.retryCnt, this.attrs.rnrRetry);
        }
        break;
      case 'SQE':
        this.flushSend();
        break;
      case 'ERR':
        // A flushed WR's completion handler may reset the QP (and bring it up again): what is left
        // of ERR's work is then that change's.
        if (!this.flushSend() || !this.flushRecv()) break;
        this.responder.abandon(this);
        this.ackDeadline = undefined;
        this.rnrUntil = undefined;
        break;
      default:
        break;
    }
    // Reported once the state's work is done: an observer that moves the QP on finds ERR's flush
    // completions written, and its change the later one.
    this.reportStateChange();
    return true;
  }

  private reportStateChange(): void {
    const from = this.unreportedFrom;
    if (from === undefined) return;
    this.unreportedFrom = undefined;
    this.io.stateChanged?.(this.qpn, from, this._state, this.stateReason);
  }

  /** Modify QP (11.2.4.2): check everything, then apply. Throws and changes nothing on error. */
  modify(now: Micros, attr: QpAttr, mask: number = maskFromAttr(attr)): void {
    this.now = now;
    const plan = checkModify({ type: this.type, state: this._state, portMtu: this.attrs.portMtu }, attr, mask);
    const ah = (mask & M.AV) !== 0 ? resolveAh(attr.ahAttr!) : undefined;
    // Apply.
    const a = this.attrs;
    if (mask & M.PATH_MTU) a.pathMtu = mtuBytes(attr.pathMtu!)!;
    if (mask & M.QKEY) a.qkey = attr.qkey! >>> 0;
    if (mask & M.RQ_PSN) a.rqPsn = attr.rqPsn!;
    if (mask & M.SQ_PSN) a.sqPsn = attr.sqPsn!;
    if (mask & M.DEST_QPN) a.destQpNum = attr.destQpNum!;
    if (mask & M.ACCESS_FLAGS) a.accessFlags = attr.qpAccessFlags!;
    if (mask & M.PKEY_INDEX) a.pkeyIndex = attr.pkeyIndex!;
    if (mask & M.PORT) a.portNum = attr.portNum!;
    if (mask & M.TIMEOUT) a.timeout = attr.timeout!;
    if (mask & M.RETRY_CNT) a.retryCnt = attr.retryCnt!;
    if (mask & M.RNR_RETRY) a.rnrRetry = attr.rnrRetry!;
    if (mask & M.MIN_RNR_TIMER) a.minRnrTimer = attr.minRnrTimer!;
    if (mask & M.MAX_QP_RD_ATOMIC) a.maxRdAtomic = attr.maxRdAtomic!;
    if (mask & M.MAX_DEST_RD_ATOMIC) a.maxDestRdAtomic = attr.maxDestRdAtomic!;
    if (mask & M.EN_SQD_ASYNC_NOTIFY) a.enSqdAsyncNotify = attr.enSqdAsyncNotify === true;
    if (ah) {
      a.dest = peerEndpoint(ah.address, ah.port);
      a.dgid = ah.dgid;
    }
    if ((mask & (M.DEST_QPN | M.AV)) !== 0 && this.type !== 'UD') a.srcPort = connectedSourcePort(this.qpn, a.destQpNum);
    if (plan.to === 'SQD' && plan.from !== 'SQD') this.sqdNotifyPending = a.enSqdAsyncNotify;
    if (this.setState(plan.to, 'modify') && (plan.to === 'RTS' || plan.to === 'SQD')) this.checkSqDrained();
  }

  /** Query QP (11.2.4.3): current attributes in libibverbs names. */
  query(): QpAttr & { cap: QpCap; sqDraining: boolean } {
    const a = this.attrs;
    const out: QpAttr & { cap: QpCap; sqDraining: boolean } = {
      qpState: this._state,
      curQpState: this._state,
      pathMtu: a.pathMtu as 256 | 512 | 1024 | 2048 | 4096,
      qkey: a.qkey,
      rqPsn: this._state === 'RESET' || this._state === 'INIT' ? a.rqPsn : this.respPsn,
      sqPsn: this._state === 'RTS' || this._state === 'SQD' || this._state === 'SQE' ? this.reqPsn : a.sqPsn,
      destQpNum: a.destQpNum,
      qpAccessFlags: a.accessFlags,
      cap: { ...this.cap },
      pkeyIndex: a.pkeyIndex,
      portNum: a.portNum,
      timeout: a.timeout,
      retryCnt: a.retryCnt,
      rnrRetry: a.rnrRetry,
      minRnrTimer: a.minRnrTimer,
      maxRdAtomic: a.maxRdAtomic,
      maxDestRdAtomic: a.maxDestRdAtomic,
      enSqdAsyncNotify: a.enSqdAsyncNotify,
      sqDraining: this._state === 'SQD' && this.hasUnfinishedSends(),
    };
    if (a.dest) out.ahAttr = { dgid: a.dgid!, address: a.dest.address, port: a.dest.port };
    return out;
  }

  // ---------------------------------------------------------------------------------------
  // Posting

  /** Post Send (11.4.1.1). All WRs are validated before any is queued. */
  postSend(now: Micros, wrs: readonly SendWr[]): void {
    // A list of one, the usual post, without the mapped array.
    if (wrs.length === 1) return this.postSendOne(now, wrs[0]!);
    const n = wrs.length;
    this.checkPost(now, n);
    // Every WR is checked before any is queued: a bad one posts none (11.4.1.1), and the WQEs taken
    // for those before it go back. They wait in a list shared by every QP (a post never runs inside
    // another) rather than a mapped array and its closure, garbage per post.
    const taken = TAKEN;
    let i = 0;
    try {
      for (; i < n; i++) taken[i] = this.toSendWqe(wrs[i]!, i);
    } catch (e) {
      for (let k = 0; k < i; k++) {
        releaseSendWqe(taken[k]!);
        taken[k] = undefined;
      }
      throw e;
    }
    for (let k = 0; k < n; k++) {
      this.sqPush(taken[k]!);
      taken[k] = undefined;
    }
    this.afterPost();
  }

  /** `postSend` of one WR, without the list around it. */
  postSendOne(now: Micros, wr: SendWr): void {
    this.checkPost(now, 1);
    this.sqPush(this.toSendWqe(wr, 0));
    this.afterPost();
  }

  private checkPost(now: Micros, n: number): void {
    this.now = now;
    const st = this._state;
    if (st === 'RESET' || st === 'INIT' || st === 'RTR') throw new QpStateError(`postSend in ${st}: the send queue opens in RTS`);
    if (this.sqEnd - this.sqHead + n > this.maxSendWr) {
      throw new QueueFullError(`send queue full: ${this.sqEnd - this.sqHead} + ${n} > ${this.maxSendWr}`);
    }
  }

  private afterPost(): void {
    // C10-?: in ERR (and SQE) newly posted WRs complete at once with a flush error.
    const st = this._state;
    if (st === 'ERR' || st === 'SQE') this.flushSend();
  }

  private toSendWqe(wr: SendWr, i: number): SendWqe {
    const bad = (m: string): never => {
      throw new InvalidWrError(`send WR ${i}: ${m}`);
    };
    if (!WR_OPCODES_FOR[this.type].includes(wr.opcode)) bad(`${wr.opcode} is not available on a ${this.type} QP`);
    const flags = wr.sendFlags ?? 0;
    const sges = wr.sgList ?? [];
    if (sges.length > this.maxSendSge) bad(`${sges.length} SGEs > maxSendSge ${this.maxSendSge}`);
    for (const s of sges) {
      if (typeof s.addr !== 'bigint' || !Number.isInteger(s.length) || s.length < 0) bad('an SGE needs { addr: bigint, length, lkey }');
    }
    const length = sgeTotal(sges);
    let inlineData: Uint8Array | undefined;
    if ((flags & SEND_FLAGS.INLINE) !== 0) {
      if (isReadOrAtomic(wr.opcode)) bad('INLINE is for SEND and RDMA WRITE only');
      if (length > this.cap.maxInlineData) bad(`inline ${length} bytes > maxInlineData ${this.cap.maxInlineData}`);
      // Inline data is copied now, so the caller may reuse the buffer at once (11.4.1.1).
      inlineData = new Uint8Array(length);
      let at = 0;
      for (const s of sges) {
        const mr = this.mrs.byLkey(s.lkey);
        const off = mr?.offsetOf(s.addr, s.length);
        if (!mr || off === undefined) bad('inline SGE outside any registered region');
        inlineData.set(mr!.buffer.subarray(off!, off! + s.length), at);
        at += s.length;
      }
    }
    const rdma = wr.rdma;
    const atomic = wr.atomic;
    if (wr.opcode === 'RDMA_WRITE' || wr.opcode === 'RDMA_WRITE_WITH_IMM' || wr.opcode === 'RDMA_READ') {
      if (!rdma || typeof rdma.remoteAddr !== 'bigint') bad(`${wr.opcode} needs rdma { remoteAddr: bigint, rkey }`);
    }
    if (wr.opcode === 'ATOMIC_CMP_AND_SWP' || wr.opcode === 'ATOMIC_FETCH_AND_ADD') {
      if (!atomic || typeof atomic.remoteAddr !== 'bigint' || typeof atomic.compareAdd !== 'bigint') {
        bad(`${wr.opcode} needs atomic { remoteAddr, compareAdd, swap?, rkey }`);
      }
      if (wr.opcode === 'ATOMIC_CMP_AND_SWP' && typeof atomic!.swap !== 'bigint') bad('CMP_AND_SWP needs atomic.swap');
    }
    if ((wr.opcode === 'SEND_WITH_IMM' || wr.opcode === 'RDMA_WRITE_WITH_IMM') && wr.immData === undefined) bad(`${wr.opcode} needs immData`);
    if (wr.opcode === 'SEND_WITH_INV' && wr.invalidateRkey === undefined) bad('SEND_WITH_INV needs invalidateRkey');
    if (this.type === 'UD' && !wr.ud) bad('a UD send needs ud { ah, remoteQpn, remoteQkey }');
    const readOrAtomic = isReadOrAtomic(wr.opcode);
    // The WR is checked: nothing below throws.
    const w = takeSendWqe();
    w.wrId = wr.wrId;
    w.opcode = wr.opcode;
    w.signaled = this.attrs.sqSigAll || (flags & SEND_FLAGS.SIGNALED) !== 0;
    w.fence = (flags & SEND_FLAGS.FENCE) !== 0;
    w.solicited = (flags & SEND_FLAGS.SOLICITED) !== 0;
    w.sges = sges;
    w.inlineData = inlineData;
    w.length = length;
    w.immData = wr.immData !== undefined ? wr.immData >>> 0 : undefined;
    w.invalidateRkey = wr.opcode === 'SEND_WITH_INV' ? wr.invalidateRkey! >>> 0 : undefined;
    w.remoteAddr = rdma?.remoteAddr ?? atomic?.remoteAddr ?? 0n;
    w.rkey = (rdma?.rkey ?? atomic?.rkey ?? 0) >>> 0;
    w.compareAdd = atomic?.compareAdd ?? 0n;
    w.swap = atomic?.swap ?? 0n;
    w.ah = wr.ud?.ah;
    w.remoteQpn = wr.ud?.remoteQpn ?? 0;
    w.remoteQkey = wr.ud?.remoteQkey ?? 0;
    w.readOrAtomic = readOrAtomic;
    w.segments = undefined;
    w.mrEpoch = 0;
    w.region = undefined;
    w.state = 'posted';
    w.npkts = 0;
    w.firstPsn = 0;
    w.lastPsn = 0;
    w.nextPkt = 0;
    w.holdsRdAtomic = false;
    w.readPlaced = 0;
    w.status = 'SUCCESS';
    w.vendorErr = 0;
    return w;
  }

  /** Send WQEs posted and not yet completed. */
  get sqLength(): number {
    return this.sqEnd - this.sqHead;
  }

  /** The send WQE at absolute index `abs`, if still queued. */
  sqAt(abs: number): SendWqe | undefined {
    return abs >= this.sqHead && abs < this.sqEnd ? this.sqItems[abs & this.sqMask] : undefined;
  }

  /** The oldest send WQE, if any. */
  sqPeek(): SendWqe | undefined {
    return this.sqHead < this.sqEnd ? this.sqItems[this.sqHead & this.sqMask] : undefined;
  }

  private sqPush(w: SendWqe): void {
    if (this.sqEnd - this.sqHead === this.sqItems.length) {
      this.sqItems = grownRing(this.sqItems, this.sqMask, this.sqHead, this.sqEnd);
      this.sqMask = this.sqItems.length - 1;
    }
    this.sqItems[this.sqEnd & this.sqMask] = w;
    this.sqEnd++;
  }

  private sqShift(): SendWqe | undefined {
    if (this.sqHead >= this.sqEnd) return undefined;
    const i = this.sqHead & this.sqMask;
    const w = this.sqItems[i];
    this.sqItems[i] = undefined;
    this.sqHead++;
    return w;
  }

  private sqClear(): void {
    for (let w = this.sqShift(); w; w = this.sqShift()) releaseSendWqe(w);
  }

  /** Post Receive (11.4.1.2). */
  postRecv(now: Micros, wrs: readonly RecvWr[]): void {
    this.now = now;
    if (this._state === 'RESET') throw new QpStateError('postRecv in RESET: the receive queue opens in INIT');
    if (this.rq.length + wrs.length > this.cap.maxRecvWr) {
      throw new QueueFullError(`receive queue full: ${this.rq.length} + ${wrs.length} > ${this.cap.maxRecvWr}`);
    }
    // Every WR checked before any is queued (a refused list posts nothing), then each queued: two
    // loops rather than a mapped array and its closure, garbage per post.
    const max = this.cap.maxRecvSge;
    for (let i = 0; i < wrs.length; i++) {
      const n = wrs[i]!.sgList?.length ?? 0;
      if (n > max) throw new InvalidWrError(`recv WR ${i}: ${n} SGEs > maxRecvSge ${max}`);
    }
    for (let i = 0; i < wrs.length; i++) {
      const wr = wrs[i]!;
      const sges = wr.sgList ?? NO_SGES;
      const wqe = takeRecvWqe();
      wqe.wrId = wr.wrId;
      wqe.sges = sges;
      wqe.length = sgeTotal(sges);
      wqe.segments = undefined;
      wqe.mrEpoch = 0;
      this.rq.push(wqe);
    }
    if (this._state === 'ERR') this.flushRecv();
  }

  // ---------------------------------------------------------------------------------------
  // Packets and time

  /** A packet the device has already matched to this QP (type, state, keys, address checked). */
  onPacket(now: Micros, pkt: RocePacket, info: OpcodeInfo, rx: RxInfo): void {
    this.now = now;
    const epoch = this.stateEpoch;
    if (info.request) {
      this.responderBusy = true;
      const out = this.responder.onRequest(this, this.rq, pkt, info, rx);
      if (out.kind === 'fatal') this.fail(`responder: ${out.reason}`, epoch);
      return;
    }
    if (this.type !== 'RC') {
      this.counters.unexpectedResponse++;
      return;
    }
    this.apply(now, this.completer.onResponse(this, pkt, info), epoch);
  }

  /**
   * A plain ACK the device matched to this RC QP (state, key and address checked), given by its PSN
   * and syndrome: true when it was the usual one, which retired the head WQE (`Completer.ackOfHead`);
   * false, with nothing changed, for anything the general path (`onPacket`) must see.
   */
  onAck(now: Micros, psn: Psn, syndrome: number): boolean {
    this.now = now;
    if (!this.completer.ackOfHead(this, psn, syndrome)) return false;
    this.progressed(now);
    return true;
  }

  /** Does the work that is due: timers, then sending (requests, then READ responses). Returns packets sent. */
  poll(now: Micros, budget: number = MAX_PKTS_PER_POLL): number {
    this.now = now;
    this.completedSinceRun = false;
    if (this.rnrUntil !== undefined && now >= this.rnrUntil) {
      this.rnrUntil = undefined;
      this.requester.rewind(this, this.rnrFrom);
    }
    if (this.ackDeadline !== undefined && now >= this.ackDeadline) {
      // Decided one run later: the runtime runs ASAP work after reading the input already
      // waiting (a real clock: on the next event-loop turn, after its I/O phase, where timers
      // come first), so a response that came in time but is not read yet still counts as the
      // progress that restarts the timer (9.7.6.1) and no spurious retry follows.
      if (!this.ackExpired) {
        this.ackExpired = true;
      } else {
        this.ackExpired = false;
        this.ackDeadline = undefined;
        if (this.outstanding()) {
          if (this.ackBackoff < MAX_ACK_BACKOFF) this.ackBackoff++;
          this.apply(now, this.completer.onTimeout(this), this.stateEpoch);
        }
      }
    }
    let sent = 0;
    const st = this._state;
    this.cc?.onTimer(now);
    if ((st === 'RTS' || st === 'SQD') && this.rnrUntil === undefined) {
      // A QP with nothing posted to send (a responder's) skips `emit`, which would find that out
      // from the send queue, cold in cache with thousands of QPs.
      if (this.reqCursor < this.sqEnd) {
        const high = this.reqHighPsn;
        const epoch = this.stateEpoch;
        const r = this.cc ? this.cc.emit(now, budget) : this.requester.emit(this, this, this.compPsn, budget);
        sent += r.sent;
        // Unless a send's hook reset the QP or failed it (its timer and queue are then the new
        // state's), or a link that delivers at once brought every answer in already.
        if (this.stateEpoch === epoch) {
          if (r.expectsResponse && this.outstanding()) {
            // Times the first PSN sent for the first time (a READ's first response answers it).
            if (this.rttPsn < 0 && this.reqHighPsn !== high) {
              this.rttPsn = high;
              this.rttSentAt = now;
            }
            if (this.ackDeadline === undefined) this.armAckTimer(now);
          }
          if (r.error) this.failSend(r.error.wqe, r.error.status, 0, 'local error', epoch);
        }
      }
      if (this.type !== 'RC') this.retireDone();
    }
    if (this.responderBusy) {
      // The coalesced ACK of the receive batch, after our own requests (a reply goes out first).
      if (this.respAckPending) {
        this.responder.flushAck(this);
        sent++;
      }
      // The state now: a send above may have moved the QP.
      const rs = this._state;
      if (rs === 'RTR' || rs === 'RTS' || rs === 'SQD' || rs === 'SQE') sent += this.responder.emitReads(this, budget - sent);
      this.responderBusy = this.respAckPending || this.respJobs.length > 0;
    }
    this.checkSqDrained();
    return sent;
  }

  /**
   * All the QP has to send is the coalesced ACK of what it received, and nothing it received
   * completed a work request: the application can have seen it only by polling memory (a WRITE).
   */
  onlyAckDue(): boolean {
    if (this.completedSinceRun || !this.responderBusy || !this.respAckPending || this.respJobs.length > 0) return false;
    return !this.requesterCanSend();
  }

  /** The requester has a packet it may send now (rate pacing aside). */
  private requesterCanSend(): boolean {
    // Nothing posted that is not sent yet: answered from this record, without reading the send
    // queue (a responder-only QP asks this on every kick).
    if (this.reqCursor >= this.sqEnd) return false;
    const st = this._state;
    return (st === 'RTS' || st === 'SQD') && this.rnrUntil === undefined &&
      this.requester.blocked(this, this, this.compPsn) === undefined;
  }

  /** The ACK timer has run out by `now` (a run will decide the timeout; see `poll`). */
  ackOverdue(now: Micros): boolean {
    return this.ackDeadline !== undefined && now >= this.ackDeadline;
  }

  /** When the QP next needs `poll`: ASAP, a timer deadline, or never (undefined). */
  pollAt(): Micros | undefined {
    let t: Micros | undefined;
    const st = this._state;
    // The responder first: an ACK to send answers ASAP whatever the requester could do.
    // READ responses only where `poll` sends them.
    if (this.responderBusy && (this.respAckPending || (this.respJobs.length > 0 && (st === 'RTR' || st === 'RTS' || st === 'SQD' || st === 'SQE')))) return ASAP;
    // A UC or UD WQE sent and not yet completed: the send's link or trace hook threw before `poll`
    // retired it, and its completion would otherwise wait for the QP's next post.
    if (this.type !== 'RC' && this.sqHead < this.reqCursor && (st === 'RTS' || st === 'SQD')) return ASAP;
    if (this.requesterCanSend()) {
      if (!this.cc) return ASAP;
      // Paced: the next packet waits for the rate, or for an RP timer that raises it.
      const at = this.cc.sendAt();
      if (at <= this.now) return ASAP;
      t = earliest(at, this.cc.timerAt());
    }
    if (this.ackExpired && this.ackDeadline !== undefined) return ASAP;
    t = earliest(t, this.rnrUntil);
    t = earliest(t, this.ackDeadline);
    return t;
  }

  // ---------------------------------------------------------------------------------------
  // EngineContext

  transmit(dst: Endpoint, parts: readonly Uint8Array[]): void {
    this.counters.sentPkts++;
    this.io.transmit(dst, this.attrs.srcPort, parts);
  }

  postRecvCompletion(wc: WorkCompletion): void {
    this.pushCompletion(this.recvCq, wc);
  }

  responderFailed(reason: string, epoch: number): void {
    this.fail(`responder: ${reason}`, epoch);
  }

  // ---------------------------------------------------------------------------------------
  // Internals

  private outstanding(): boolean {
    return this.type === 'RC' && psnDiff(this.reqPsn, this.compPsn) > 0;
  }

  private armAckTimer(now: Micros): void {
    const t = ackTimeoutUs(this.attrs.timeout);
    this.ackDeadline = t === undefined ? undefined
      : now + Math.min(Math.max(t, 2 * this.srttUs) * (1 << this.ackBackoff), t * (1 << MAX_ACK_BACKOFF));
    this.ackExpired = false;
  }

  /** Applies the completer's verdict, found since state change `epoch`: not if a completion's hook moved the QP since. */
  private apply(now: Micros, a: CompleterAction, epoch: number): void {
    if (this.stateEpoch !== epoch) return;
    switch (a.kind) {
      case 'none':
        return;
      case 'progress':
        this.progressed(now);
        return;
      case 'retry':
        this.requester.rewind(this, a.from);
        this.ackDeadline = undefined;
        this.rttPsn = -1;
        return;
      case 'rnrWait':
        this.rttPsn = -1;
        this.rnrFrom = a.from;
        this.rnrUntil = now + a.delayUs;
        this.ackDeadline = undefined;
        return;
      case 'fatal':
        this.failSend(a.wqe, a.status, a.vendorErr, `completer: ${a.status}`, epoch);
        return;
    }
  }

  /** The completer made progress: rxe UPDATE_COMP restarts the timer while anything is outstanding, at its own length. */
  private progressed(now: Micros): void {
    this.ackBackoff = 0;
    if (this.rttPsn >= 0 && psnDiff(this.compPsn, this.rttPsn) > 0) {
      const sample = now - this.rttSentAt;
      this.srttUs = this.srttUs === 0 ? Math.round(sample) : Math.round(this.srttUs + (sample - this.srttUs) / 8);
      this.rttPsn = -1;
    }
    // Only a sending state has a timer: a completion's hook may have moved the QP to ERR or RESET.
    const st = this._state;
    if ((st === 'RTS' || st === 'SQD') && this.outstanding()) this.armAckTimer(now);
    else this.ackDeadline = undefined;
    this.checkSqDrained();
  }

  /** The completer's way to retire the head WQE (`CompleterContext`). */
  retireWqe(wqe: SendWqe): void {
    this.retire(wqe);
  }

  /** Retires the head send WQE successfully (completer, or UC/UD after the last packet). */
  private retire(wqe: SendWqe): void {
    if (this.sqPeek() !== wqe) return;
    this.sqShift();
    if (wqe.holdsRdAtomic) {
      wqe.holdsRdAtomic = false;
      this.reqRdAtomic--;
    }
    if (wqe.opcode.startsWith('SEND')) this.counters.rdmaSends++;
    if (wqe.signaled) this.completeSend(wqe, 'SUCCESS', 0);
    releaseSendWqe(wqe);
  }

  private retireDone(): void {
    for (let w = this.sqPeek(); w && w.state === 'done'; w = this.sqPeek()) this.retire(w);
  }

  /**
   * A send WQE failed: it completes in error (always, signaled or not), then RC → ERR, UC/UD → SQE.
   * `epoch` is the state the failure was found in: if a hook has moved the QP since (before or
   * during these completions), the failure is no longer the QP's to act on, and `wqe` may already
   * be back in the free list, or be another WR's.
   */
  private failSend(wqe: SendWqe, status: WcStatus, vendorErr: number, why: string, epoch: number): void {
    // Complete everything before it first (UC/UD WQEs already sent), in order.
    if (this.type !== 'RC') this.retireDone();
    if (this.stateEpoch !== epoch) return;
    if (this.sqPeek() === wqe) {
      this.sqShift();
      if (wqe.holdsRdAtomic) this.reqRdAtomic--;
      this.completeSend(wqe, status, vendorErr);
      releaseSendWqe(wqe);
    }
    if (this.type === 'RC') this.fail(`${why} (${status})`, epoch);
    else if (this.stateEpoch === epoch) this.setState('SQE', `${why} (${status})`);
  }

  /** A transport error found in state change `epoch`: QP → ERR, with the affiliated asynchronous event. */
  private fail(reason: string, epoch: number): void {
    if (this._state === 'ERR' || this.stateEpoch !== epoch) return;
    if (this.setState('ERR', reason)) this.io.event({ type: 'QP_FATAL', qpNum: this.qpn, reason });
  }

  /** Completes `wqe` on the send CQ, written in place into the CQ's ring (no object per completion). */
  private completeSend(wqe: SendWqe, status: WcStatus, vendorErr: number): void {
    this.completedSinceRun = true;
    const cq = this.sendCq;
    const wc = cq.reserve();
    if (wc === undefined) {
      this.lostCompletion(cq);
      return;
    }
    wc.wrId = wqe.wrId;
    wc.status = status;
    wc.opcode = WC_OPCODE_OF[wqe.opcode];
    wc.vendorErr = vendorErr;
    wc.byteLen = wqe.length;
    wc.qpNum = this.qpn;
    wc.srcQp = 0;
    wc.wcFlags = wqe.immData !== undefined ? WC_FLAGS.WITH_IMM : 0;
    wc.pkeyIndex = 0;
    wc.immData = undefined;
    wc.invalidatedRkey = undefined;
    cq.commit();
  }

  /**
   * Every outstanding send WR completes with WR_FLUSH_ERR (10.3.1, C10-?: flushed WRs always
   * complete). False when a completion's handler reset or failed the QP: the WRs left are that
   * change's (RESET drops them; a QP brought up again from RESET posts new ones, not to be flushed).
   */
  private flushSend(): boolean {
    const epoch = this.stateEpoch;
    for (let w = this.sqShift(); w; w = this.sqShift()) {
      if (w.holdsRdAtomic) w.holdsRdAtomic = false;
      this.completeSend(w, 'WR_FLUSH_ERR', 0);
      releaseSendWqe(w);
      if (this.stateEpoch !== epoch) return false;
    }
    this.reqRdAtomic = 0;
    this.reqCursor = this.sqHead;
    return true;
  }

  /** As `flushSend`, for the receive queue. */
  private flushRecv(): boolean {
    const epoch = this.stateEpoch;
    for (let w = this.rq.shift(); w; w = this.rq.shift()) {
      this.pushCompletion(this.recvCq, {
        wrId: w.wrId, status: 'WR_FLUSH_ERR', opcode: 'RECV', vendorErr: 0, byteLen: 0, qpNum: this.qpn, srcQp: 0, wcFlags: 0, pkeyIndex: 0,
      });
      releaseRecvWqe(w);
      if (this.stateEpoch !== epoch) return false;
    }
    return true;
  }

  private pushCompletion(cq: CompletionQueue, wc: WorkCompletion): void {
    this.completedSinceRun = true;
    if (!cq.push(wc)) this.lostCompletion(cq);
  }

  /** Class G: the CQ overflowed. The completion is lost; report it (11.6.2, CQ error). */
  private lostCompletion(cq: CompletionQueue): void {
    this.counters.cqOverflow++;
    this.io.event({ type: 'CQ_ERR', cqHandle: cq.handle, qpNum: this.qpn, reason: 'CQ overflow' });
  }

  private hasUnfinishedSends(): boolean {
    for (let i = this.sqHead; i < this.sqEnd; i++) if (this.sqItems[i & this.sqMask]!.state !== 'posted') return true;
    return false;
  }

  /** SQD: once nothing started is unfinished, raise SQ_DRAINED (if asked for at RTS→SQD). */
  private checkSqDrained(): void {
    if (this._state !== 'SQD' || !this.sqdNotifyPending) return;
    if (this.hasUnfinishedSends()) return;
    this.sqdNotifyPending = false;
    this.io.event({ type: 'SQ_DRAINED', qpNum: this.qpn });
  }

  /** The last `now` the QP was given (for the runtime's traces). */
  get lastNow(): Micros {
    return this.now;
  }
}


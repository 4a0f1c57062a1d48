/**
 * The Communication Manager state machine (IBTA Vol. 1 §12.9) for both roles, sans-IO.
 *
 * A `CmAgent` is the CM of one port: it owns the connections keyed by their local
 * communication ID, the listeners keyed by service ID, and nothing else. It never reads a
 * clock, sends a datagram or touches a QP: every entry point takes `now` (µs) and returns
 * the actions the caller must carry out, in order:
 *
 *  - `{ send, to }`     emit `send` with `emitCmMad` and send it as a UD SEND to QP1 of `to`
 *                       (Q_Key GSI_QKEY, P_Key 0xffff);
 *  - `{ modifyQp }`     move the connection's QP (RTR, RTS, ERR) with the given attributes;
 *  - `{ event }`        tell the consumer (rdma_cm-style events).
 *
 * `nextTimeout()` says when `onTimer` must next run. Requests (REQ, REP, DREQ) are resent
 * unchanged, same TransactionID, when their response does not come within
 * `4.096 µs × 2^t + 2 × packet life time` (t: the peer's CM response timeout, or an MRA's
 * service timeout), up to the REQ's Max CM Retries; then the connection times out, as
 * Linux's CM does: REQ and REP back to IDLE with a `timeout` event, DREQ on to TIMEWAIT.
 *
 * States are those of IBTA figures 151..153; `A` is the caller's address type for a peer's
 * QP1 (an IP address, an address handle …), carried through untouched.
 *
 * Starting PSNs. A REQ's or REP's Starting PSN is the first PSN its *sender's receive queue*
 * expects, which is where the *other* side's send queue starts. That is what Linux's CM does
 * (ib_send_cm_req and ib_send_cm_rep keep their own Starting PSN as rq_psn; cm_req_handler and
 * cm_rep_handler take the peer's as sq_psn) and what the wire shows: in rxe's rping capture
 * (test/fixtures/rxe/rping.pcap) the REQ says 0x9da108 and the REP 0x31ede7, and the active
 * side's first SEND carries PSN 0x31ede7 while the passive side's first READ request carries
 * 0x9da108. So: active RTR rqPsn = REQ's, RTS sqPsn = REP's; passive RTR rqPsn = REP's, RTS
 * sqPsn = REQ's. `test/cm/state.test.ts` pins this against the capture.
 */

import {
  CM_MSG_CODE,
  CM_REJ_ARI_LEN,
  CM_REJ_REASON,
  CM_TRANSPORT,
  cmMadHeader,
  cmTimeoutUs,
  mtuOfCode,
  parseCmaHeader,
  parseCmMad,
  rejReasonName,
  type CmaHeader,
  type CmMad,
  type CmMessage,
  type CmPath,
  type CmRep,
  type CmReq,
} from './messages.js';

export type Micros = number;

export type CmState =
  | 'IDLE'
  // active side
  | 'REQ_SENT'
  | 'MRA_REQ_RCVD'
  | 'REP_RCVD'
  | 'MRA_REP_SENT'
  // passive side
  | 'REQ_RCVD'
  | 'MRA_REQ_SENT'
  | 'REP_SENT'
  | 'MRA_REP_RCVD'
  // both
  | 'ESTABLISHED'
  | 'DREQ_SENT'
  | 'DREQ_RCVD'
  | 'TIMEWAIT';

/** A QP transition the CM asks for; the attribute names are ibv_modify_qp's. */
export type QpTransition =
  | {
      state: 'RTR';
      destQpn: number;
      rqPsn: number;
      /** Bytes. */
      pathMtu: number;
      maxDestRdAtomic: number;
      /** The peer's GID (its IP address on RoCEv2) and the path fields of the REQ. */
      remoteGid: Uint8Array;
      flowLabel: number;
      hopLimit: number;
      trafficClass: number;
      sl: number;
    }
  | { state: 'RTS'; sqPsn: number; timeout: number; retryCnt: number; rnrRetry: number; maxRdAtomic: number }
  | { state: 'ERR' };

export type CmEvent<A> =
  /** Passive: a REQ for a listened service; answer with accept, reject or mra. */
  | { event: 'connect-request'; req: CmReq; peer: A; serviceId: bigint; cma?: CmaHeader; userData: Uint8Array }
  /** Active: the REP arrived and the QP was moved to RTS; RTU follows unless `autoRtu` is off. */
  | { event: 'rep'; rep: CmRep }
  | { event: 'established'; privateData: Uint8Array }
  | { event: 'rejected'; reason: number; reasonName: string; messageRejected: number; ari: Uint8Array; privateData: Uint8Array }
  /** The peer sent an MRA: it needs 4.096 µs × 2^serviceTimeout more. */
  | { event: 'mra'; serviceTimeout: number }
  /** No answer to a REQ, REP or DREQ after Max CM Retries resends. */
  | { event: 'timeout'; message: 'REQ' | 'REP' | 'DREQ' }
  /** The peer asked to disconnect; with `autoDrep` off, answer with `disconnect`. */
  | { event: 'disconnect-request'; privateData: Uint8Array }
  /** The connection is down (DREP received, DREQ answered, or DREQ timed out); TIMEWAIT starts. */
  | { event: 'disconnected' }
  /** TIMEWAIT is over: the connection is gone and its QP may be reused. */
  | { event: 'closed' };

export type CmAction<A> =
  | { connId: number; send: CmMad; to: A }
  | { connId: number; modifyQp: QpTransition }
  | ({ connId: number } & CmEvent<A>);

export interface CmAgentOptions {
  /** This port's CA GUID (the REQ's and REP's Local CA GUID). */
  caGuid: bigint;
  /** 32-bit random numbers, for communication IDs. Inject a seeded one for tests. */
  random: () => number;
  /**
   * High 32 bits of every TransactionID this agent forms (Linux: the MAD agent's hi_tid).
   * Default 1.
   */
  tidHigh?: number;
  /**
   * Packet life time exponent (4.096 µs × 2^t) added twice to every CM timeout. Default 16,
   * the value rdma_cm uses on RoCE (`CMA_IBOE_PACKET_LIFETIME`).
   */
  packetLifeTime?: number;
  /** TIMEWAIT length; default 4.096 µs × 2^(local ACK timeout) + 2 × packet life time. */
  timewaitUs?: Micros;
  /** Active side: send RTU as soon as the REP arrives (as rdma_cm does). Default true. */
  autoRtu?: boolean;
  /** Answer a DREQ with DREP at once (as rdma_cm does). Default true. */
  autoDrep?: boolean;
  /**
   * Service timeout (4.096 µs × 2^t) of the MRA this agent sends by itself when a REQ is
   * repeated while its consumer has not answered yet (IBTA 12.6.6). Default 24 (≈69 s), what
   * rdma_cm asks for (CMA_CM_MRA_SETTING).
   */
  mraServiceTimeout?: number;
}

/** What `connect` needs; the defaults are those of rping's REQ (librdmacm over rxe). */
export interface ConnectParams<A> {
  peer: A;
  serviceId: bigint;
  localQpn: number;
  /** The REQ's Starting PSN: the first PSN our receive queue expects (the peer sends from it). */
  startingPsn: number;
  primaryPath: CmPath;
  privateData?: Uint8Array;
  localQkey?: number;
  responderResources?: number;
  initiatorDepth?: number;
  /** Default 20 (≈4.3 s), rdma_cm's CMA_CM_RESPONSE_TIMEOUT. */
  remoteCmResponseTimeout?: number;
  localCmResponseTimeout?: number;
  transportServiceType?: number;
  retryCount?: number;
  rnrRetryCount?: number;
  /** Default 15, rdma_cm's CMA_MAX_CM_RETRIES. */
  maxCmRetries?: number;
  /** CM_MTU_CODE; default 3 (1024). */
  pathMtu?: number;
  pkey?: number;
  srq?: boolean;
}

export interface AcceptParams {
  localQpn: number;
  /** The REP's Starting PSN: the first PSN our receive queue expects (the peer sends from it). */
  startingPsn: number;
  /**
   * Move the QP to RTS together with RTR, before the REP leaves, as librdmacm's rdma_accept
   * does, so the active side's first request can be answered (an RDMA READ from here
   * included) even if the RTU is late. Default false: RTS on the RTU (or on "communication
   * established"), as IBTA's state machine has it.
   */
  rtsOnAccept?: boolean;
  privateData?: Uint8Array;
  localQkey?: number;
  responderResources?: number;
  initiatorDepth?: number;
  /** Default 15, what rxe's REP carries. */
  targetAckDelay?: number;
  rnrRetryCount?: number;
  srq?: boolean;
}

/** An operation the connection's state does not allow (a consumer bug, not bad input). */
export class CmStateError extends Error {
  readonly code = 'ERR_CM_STATE';
}

interface Conn<A> {
  localCommId: number;
  remoteCommId: number;
  state: CmState;
  active: boolean;
  peer: A;
  /** TransactionID of the connection's REQ: REP, MRA, REJ and RTU reuse it. */
  tid: bigint;
  req: CmReq;
  rep?: CmRep;
  /** The peer's CM response timeout exponent: how long to wait for its answers. */
  peerResponseTimeout: number;
  /** The request awaiting an answer (resent on timeout), and when. */
  pending?: { mad: CmMad; retries: number; deadline: Micros };
  /** The last reply sent, resent when the peer repeats its request (lost reply). */
  lastReply?: CmMad;
  /** TransactionID of the peer's DREQ, which our DREP echoes. */
  dreqTid?: bigint;
  /** Passive side: the QP was already moved to RTS (accept with rtsOnAccept). */
  rtsDone?: boolean;
  timewaitEnd?: Micros;
}

const enc = (connId: number) => ({ connId });

export class CmAgent<A> {
  private readonly conns = new Map<number, Conn<A>>();
  private readonly listeners = new Set<bigint>();
  private readonly tidHigh: number;
  private readonly packetLifeUs: Micros;
  private readonly autoRtu: boolean;
  private readonly autoDrep: boolean;

  constructor(private readonly opts: CmAgentOptions) {
    this.tidHigh = (opts.tidHigh ?? 1) >>> 0;
    this.packetLifeUs = cmTimeoutUs(opts.packetLifeTime ?? 16);
    this.autoRtu = opts.autoRtu ?? true;
    this.autoDrep = opts.autoDrep ?? true;
  }

  // ------------------------------------------------------------------------ consumer calls

  listen(serviceId: bigint): void {
    this.listeners.add(serviceId);
  }

  unlisten(serviceId: bigint): void {
    this.listeners.delete(serviceId);
  }

  /** The connection's state; IDLE for one that does not (or no longer) exist. */
  state(connId: number): CmState {
    return this.conns.get(connId)?.state ?? 'IDLE';
  }

  /** Local communication IDs of the connections that exist. */
  connections(): number[] {
    return [...this.conns.keys()];
  }

  /** Active side: sends a REQ. The returned connId is the local communication ID. */
  connect(now: Micros, p: ConnectParams<A>): { connId: number; actions: CmAction<A>[] } {
    const localCommId = this.newCommId();
    const req: CmReq = {
      kind: 'REQ',
      localCommId,
      serviceId: p.serviceId,
      localCaGuid: this.opts.caGuid,
      localQkey: p.localQkey ?? 0,
      localQpn: p.localQpn,
      responderResources: p.responderResources ?? 1,
      localEecn: 0,
      initiatorDepth: p.initiatorDepth ?? 1,
      remoteEecn: 0,
      remoteCmResponseTimeout: p.remoteCmResponseTimeout ?? 20,
      transportServiceType: p.transportServiceType ?? CM_TRANSPORT.RC,
      endToEndFlowControl: false,
      startingPsn: p.startingPsn,
      localCmResponseTimeout: p.localCmResponseTimeout ?? 20,
      retryCount: p.retryCount ?? 7,
      pkey: p.pkey ?? 0xffff,
      pathMtu: p.pathMtu ?? 3,
      rdcExists: false,
      rnrRetryCount: p.rnrRetryCount ?? 7,
      maxCmRetries: p.maxCmRetries ?? 15,
      srq: p.srq ?? false,
      extendedTransportType: 0,
      primaryPath: p.primaryPath,
      alternatePath: EMPTY_PATH,
      sapSupported: false,
      privateData: p.privateData ?? new Uint8Array(0),
    };
    const c: Conn<A> = {
      localCommId,
      remoteCommId: 0,
      state: 'REQ_SENT',
      active: true,
      peer: p.peer,
      tid: this.formTid(localCommId),
      req,
      peerResponseTimeout: req.remoteCmResponseTimeout,
    };
    this.conns.set(localCommId, c);
    const mad: CmMad = { header: cmMadHeader('REQ', c.tid), msg: req };
    return { connId: localCommId, actions: [this.request(now, c, mad)] };
  }

  /** Passive side: accepts a REQ (state REQ_RCVD or MRA_REQ_SENT): QP to RTR, REP out. */
  accept(now: Micros, connId: number, p: AcceptParams): CmAction<A>[] {
    const c = this.need(connId, 'accept', 'REQ_RCVD', 'MRA_REQ_SENT');
    const req = c.req;
    const rep: CmRep = {
      kind: 'REP',
      localCommId: c.localCommId,
      remoteCommId: c.remoteCommId,
      localQkey: p.localQkey ?? 0,
      localQpn: p.localQpn,
      localEecn: 0,
      startingPsn: p.startingPsn,
      responderResources: Math.min(p.responderResources ?? req.initiatorDepth, req.initiatorDepth),
      initiatorDepth: Math.min(p.initiatorDepth ?? req.responderResources, req.responderResources),
      targetAckDelay: p.targetAckDelay ?? 15,
      failoverAccepted: 0,
      endToEndFlowControl: false,
      rnrRetryCount: p.rnrRetryCount ?? 7,
      srq: p.srq ?? false,
      localCaGuid: this.opts.caGuid,
      privateData: p.privateData ?? new Uint8Array(0),
    };
    c.rep = rep;
    c.state = 'REP_SENT';
    const path = req.primaryPath;
    const out: CmAction<A>[] = [
      {
        ...enc(connId),
        modifyQp: {
          state: 'RTR',
          destQpn: req.localQpn,
          rqPsn: rep.startingPsn,
          pathMtu: mtuOfCode(req.pathMtu) ?? 1024,
          maxDestRdAtomic: rep.responderResources,
          remoteGid: path.localGid,
          flowLabel: path.flowLabel,
          hopLimit: path.hopLimit,
          trafficClass: path.trafficClass,
          sl: path.sl,
        },
      },
    ];
    if (p.rtsOnAccept === true) {
      c.rtsDone = true;
      out.push({ ...enc(connId), modifyQp: this.passiveRts(c) });
    }
    out.push(this.request(now, c, { header: cmMadHeader('REP', c.tid), msg: rep }));
    return out;
  }

  /** Refuses a REQ (passive) or a REP (active, with `autoRtu` off). */
  reject(_now: Micros, connId: number, reason: number = CM_REJ_REASON.CONSUMER_REJECT, privateData?: Uint8Array, ari?: Uint8Array): CmAction<A>[] {
    const c = this.need(connId, 'reject', 'REQ_RCVD', 'MRA_REQ_SENT', 'REP_RCVD', 'MRA_REP_SENT');
    const messageRejected = c.active ? CM_MSG_CODE.REP : CM_MSG_CODE.REQ;
    this.conns.delete(connId);
    return [{ ...enc(connId), send: this.rejMad(c.tid, c.localCommId, c.remoteCommId, messageRejected, reason, privateData, ari), to: c.peer }];
  }

  /** Sends an MRA: for the REQ (passive, REQ_RCVD) or the REP (active, REP_RCVD). */
  mra(_now: Micros, connId: number, serviceTimeout: number, privateData?: Uint8Array): CmAction<A>[] {
    const c = this.need(connId, 'mra', 'REQ_RCVD', 'REP_RCVD');
    const forReq = c.state === 'REQ_RCVD';
    c.state = forReq ? 'MRA_REQ_SENT' : 'MRA_REP_SENT';
    const mad: CmMad = {
      header: cmMadHeader('MRA', c.tid),
      msg: {
        kind: 'MRA',
        localCommId: c.localCommId,
        remoteCommId: c.remoteCommId,
        messageMraed: forReq ? CM_MSG_CODE.REQ : CM_MSG_CODE.REP,
        serviceTimeout: serviceTimeout & 0x1f,
        privateData: privateData ?? new Uint8Array(0),
      },
    };
    c.lastReply = mad;
    return [{ ...enc(connId), send: mad, to: c.peer }];
  }

  /** Active side, `autoRtu` off: sends the RTU after the REP (REP_RCVD or MRA_REP_SENT). */
  rtu(_now: Micros, connId: number, privateData?: Uint8Array): CmAction<A>[] {
    const c = this.need(connId, 'rtu', 'REP_RCVD', 'MRA_REP_SENT');
    return this.sendRtu(c, privateData);
  }

  /**
   * Passive side: the QP received its first packet before the RTU (IBTA's "communication
   * established" event, ibv IBV_EVENT_COMM_EST): the connection is up.
   */
  established(_now: Micros, connId: number): CmAction<A>[] {
    const c = this.conns.get(connId);
    if (c === undefined || (c.state !== 'REP_SENT' && c.state !== 'MRA_REP_RCVD')) return [];
    return this.passiveEstablished(c, new Uint8Array(0));
  }

  /** Sends a DREQ (ESTABLISHED) or answers one with DREP (DREQ_RCVD, `autoDrep` off). */
  disconnect(now: Micros, connId: number, privateData?: Uint8Array): CmAction<A>[] {
    const c = this.need(connId, 'disconnect', 'ESTABLISHED', 'REP_SENT', 'MRA_REP_RCVD', 'DREQ_RCVD');
    if (c.state === 'DREQ_RCVD') return this.sendDrep(now, c, privateData);
    c.state = 'DREQ_SENT';
    const mad: CmMad = {
      header: cmMadHeader('DREQ', this.formTid(c.localCommId)),
      msg: {
        kind: 'DREQ',
        localCommId: c.localCommId,
        remoteCommId: c.remoteCommId,
        remoteQpn: c.active ? c.rep!.localQpn : c.req.localQpn,
        privateData: privateData ?? new Uint8Array(0),
      },
    };
    return [{ ...enc(c.localCommId), modifyQp: { state: 'ERR' } }, this.request(now, c, mad)];
  }

  // ------------------------------------------------------------------------ time

  /** The earliest time `onTimer` has work, or undefined when nothing waits. */
  nextTimeout(): Micros | undefined {
    let t: Micros | undefined;
    for (const c of this.conns.values()) {
      const d = c.pending?.deadline ?? c.timewaitEnd;
      if (d !== undefined && (t === undefined || d < t)) t = d;
    }
    return t;
  }

  onTimer(now: Micros): CmAction<A>[] {
    const out: CmAction<A>[] = [];
    for (const c of [...this.conns.values()]) {
      if (c.timewaitEnd !== undefined && now >= c.timewaitEnd) {
        this.conns.delete(c.localCommId);
        out.push({ ...enc(c.localCommId), event: 'closed' });
        continue;
      }
      const p = c.pending;
      if (p === undefined || now < p.deadline) continue;
      if (p.retries < c.req.maxCmRetries) {
        p.retries++;
        p.deadline = now + this.waitUs(c.peerResponseTimeout);
        out.push({ ...enc(c.localCommId), send: p.mad, to: c.peer });
        continue;
      }
      delete c.pending;
      const message = p.mad.msg.kind as 'REQ' | 'REP' | 'DREQ';
      if (message === 'DREQ') {
        out.push({ ...enc(c.localCommId), event: 'timeout', message }, ...this.enterTimewait(now, c));
      } else {
        this.conns.delete(c.localCommId);
        out.push({ ...enc(c.localCommId), event: 'timeout', message });
      }
    }
    return out;
  }

  // ------------------------------------------------------------------------ wire

  /**
   * A MAD that arrived on QP1 from `from`: bytes (parsed here; anything that is not a CM
   * message this agent handles is dropped) or an already parsed record.
   */
  onMad(now: Micros, mad: Uint8Array | CmMad, from: A): CmAction<A>[] {
    let m: CmMad;
    if (mad instanceof Uint8Array) {
      const r = parseCmMad(mad);
      if (!r.ok) return [];
      m = r.mad;
    } else {
      m = mad;
    }
    const msg = m.msg;
    switch (msg.kind) {
      case 'REQ':
        return this.onReq(now, m.header.transactionId, msg, from);
      case 'REP':
        return this.onRep(msg);
      case 'RTU':
        return this.onRtu(msg);
      case 'MRA':
        return this.onMra(now, msg);
      case 'REJ':
        return this.onRej(msg);
      case 'DREQ':
        return this.onDreq(now, m.header.transactionId, msg, from);
      case 'DREP':
        return this.onDrep(now, msg);
    }
  }

  private onReq(now: Micros, tid: bigint, req: CmReq, from: A): CmAction<A>[] {
    // A repeated REQ (our answer was lost or is late): IBTA 12.9.6 / Linux cm_dup_req_handler.
    for (const c of this.conns.values()) {
      if (c.active || c.remoteCommId !== req.localCommId || c.req.localCaGuid !== req.localCaGuid) continue;
      switch (c.state) {
        case 'REQ_RCVD':
          // The consumer is still deciding and the active side is about to give up: tell it
          // to wait (IBTA 12.6.6), as Linux's CM does with a delayed MRA.
          return this.mra(now, c.localCommId, this.opts.mraServiceTimeout ?? 24);
        case 'MRA_REQ_SENT':
          return c.lastReply ? [{ ...enc(c.localCommId), send: c.lastReply, to: c.peer }] : [];
        case 'REP_SENT':
        case 'MRA_REP_RCVD':
          // Our REP was lost: send it again now rather than at our own resend timer. The resend
          // count is not charged (the peer is alive and asking).
          return c.pending?.mad.msg.kind === 'REP' ? [{ ...enc(c.localCommId), send: c.pending.mad, to: c.peer }] : [];
        case 'TIMEWAIT':
          return [{ ...enc(c.localCommId), send: this.rejMad(tid, c.localCommId, req.localCommId, CM_MSG_CODE.REQ, CM_REJ_REASON.STALE_CONN), to: from }];
        default:
          return [];
      }
    }
    if (!this.listeners.has(req.serviceId)) {
      // What Linux's CM answers a REQ nobody listens for; rdma_cm reports it as REJECTED, status 8.
      return [{ connId: 0, send: this.rejMad(tid, 0, req.localCommId, CM_MSG_CODE.REQ, CM_REJ_REASON.INVALID_SERVICE_ID), to: from }];
    }
    if (req.transportServiceType !== CM_TRANSPORT.RC && req.transportServiceType !== CM_TRANSPORT.UC) {
      return [{ connId: 0, send: this.rejMad(tid, 0, req.localCommId, CM_MSG_CODE.REQ, CM_REJ_REASON.INVALID_TRANSPORT_TYPE), to: from }];
    }
    const localCommId = this.newCommId();
    const c: Conn<A> = {
      localCommId,
      remoteCommId: req.localCommId,
      state: 'REQ_RCVD',
      active: false,
      peer: from,
      tid,
      req,
      peerResponseTimeout: req.localCmResponseTimeout,
    };
    this.conns.set(localCommId, c);
    const cma = parseCmaHeader(req.privateData);
    const ev: CmAction<A> = cma.ok
      ? { connId: localCommId, event: 'connect-request', req, peer: from, serviceId: req.serviceId, cma: cma.header, userData: cma.userData }
      : { connId: localCommId, event: 'connect-request', req, peer: from, serviceId: req.serviceId, userData: req.privateData };
    return [ev];
  }

  private onRep(rep: CmRep): CmAction<A>[] {
    const c = this.conns.get(rep.remoteCommId);
    if (c === undefined || !c.active) return [];
    if (c.state === 'ESTABLISHED' || c.state === 'MRA_REP_SENT') {
      // Our RTU (or MRA) was lost and the peer resent its REP.
      return c.lastReply && c.remoteCommId === rep.localCommId ? [{ ...enc(c.localCommId), send: c.lastReply, to: c.peer }] : [];
    }
    if (c.state !== 'REQ_SENT' && c.state !== 'MRA_REQ_RCVD') return [];
    delete c.pending;
    c.rep = rep;
    c.remoteCommId = rep.localCommId;
    c.state = 'REP_RCVD';
    const req = c.req;
    const path = req.primaryPath;
    const out: CmAction<A>[] = [
      {
        ...enc(c.localCommId),
        modifyQp: {
          state: 'RTR',
          destQpn: rep.localQpn,
          rqPsn: req.startingPsn,
          pathMtu: mtuOfCode(req.pathMtu) ?? 1024,
          maxDestRdAtomic: req.responderResources,
          remoteGid: path.remoteGid,
          flowLabel: path.flowLabel,
          hopLimit: path.hopLimit,
          trafficClass: path.trafficClass,
          sl: path.sl,
        },
      },
      {
        ...enc(c.localCommId),
        modifyQp: {
          state: 'RTS',
          sqPsn: rep.startingPsn,
          timeout: path.localAckTimeout,
          retryCnt: req.retryCount,
          rnrRetry: rep.rnrRetryCount,
          maxRdAtomic: Math.min(req.initiatorDepth, rep.responderResources),
        },
      },
      { ...enc(c.localCommId), event: 'rep', rep },
    ];
    if (this.autoRtu) out.push(...this.sendRtu(c));
    return out;
  }

  private onRtu(rtu: Extract<CmMessage, { kind: 'RTU' }>): CmAction<A>[] {
    const c = this.conns.get(rtu.remoteCommId);
    if (c === undefined || c.active || c.remoteCommId !== rtu.localCommId) return [];
    if (c.state !== 'REP_SENT' && c.state !== 'MRA_REP_RCVD') return [];
    return this.passiveEstablished(c, rtu.privateData);
  }

  private onMra(now: Micros, mra: Extract<CmMessage, { kind: 'MRA' }>): CmAction<A>[] {
    const c = this.conns.get(mra.remoteCommId);
    if (c === undefined || c.pending === undefined) return [];
    if (c.state === 'REQ_SENT' && mra.messageMraed === CM_MSG_CODE.REQ) c.state = 'MRA_REQ_RCVD';
    else if (c.state === 'REP_SENT' && mra.messageMraed === CM_MSG_CODE.REP) c.state = 'MRA_REP_RCVD';
    else return [];
    // The peer asks for its service timeout instead of its CM response timeout; resends go on
    // after that (Linux: ib_modify_mad with the MRA's timeout).
    c.pending.deadline = now + this.waitUs(mra.serviceTimeout);
    c.peerResponseTimeout = mra.serviceTimeout;
    return [{ ...enc(c.localCommId), event: 'mra', serviceTimeout: mra.serviceTimeout }];
  }

  private onRej(rej: Extract<CmMessage, { kind: 'REJ' }>): CmAction<A>[] {
    const c = this.conns.get(rej.remoteCommId);
    if (c === undefined) return [];
    const rejectable: CmState[] = ['REQ_SENT', 'MRA_REQ_RCVD', 'REP_RCVD', 'MRA_REP_SENT', 'REP_SENT', 'MRA_REP_RCVD'];
    if (!rejectable.includes(c.state)) return [];
    // Before the REP the peer's comm ID is unknown (0 in a REJ for a REQ); after it, it must match.
    if (c.remoteCommId !== 0 && rej.localCommId !== 0 && rej.localCommId !== c.remoteCommId) return [];
    this.conns.delete(c.localCommId);
    return [
      {
        ...enc(c.localCommId),
        event: 'rejected',
        reason: rej.reason,
        reasonName: rejReasonName(rej.reason),
        messageRejected: rej.messageRejected,
        ari: rej.ari.subarray(0, Math.min(rej.rejectedInfoLength, CM_REJ_ARI_LEN)),
        privateData: rej.privateData,
      },
    ];
  }

  private onDreq(now: Micros, tid: bigint, dreq: Extract<CmMessage, { kind: 'DREQ' }>, from: A): CmAction<A>[] {
    const c = this.conns.get(dreq.remoteCommId);
    if (c === undefined) {
      // The connection is gone (TIMEWAIT over) but the peer still asks, its DREP having been
      // lost: answer so it can stop resending, as Linux's cm_issue_drep does.
      const drep: CmMad = {
        header: cmMadHeader('DREP', tid),
        msg: { kind: 'DREP', localCommId: dreq.remoteCommId, remoteCommId: dreq.localCommId, privateData: new Uint8Array(0) },
      };
      return [{ connId: 0, send: drep, to: from }];
    }
    if (c.remoteCommId !== dreq.localCommId) return [];
    c.dreqTid = tid;
    switch (c.state) {
      case 'TIMEWAIT':
        // Our DREP was lost.
        return c.lastReply?.msg.kind === 'DREP' ? [{ ...enc(c.localCommId), send: c.lastReply, to: c.peer }] : [];
      case 'DREQ_SENT':
        // Both sides disconnect at once: answer, and stop waiting for our own DREP.
        delete c.pending;
        return this.sendDrep(now, c);
      case 'REP_SENT':
      case 'MRA_REP_RCVD':
      case 'ESTABLISHED': {
        delete c.pending;
        c.state = 'DREQ_RCVD';
        const out: CmAction<A>[] = [{ ...enc(c.localCommId), event: 'disconnect-request', privateData: dreq.privateData }];
        if (this.autoDrep) out.push(...this.sendDrep(now, c));
        return out;
      }
      default:
        return [];
    }
  }

  private onDrep(now: Micros, drep: Extract<CmMessage, { kind: 'DREP' }>): CmAction<A>[] {
    const c = this.conns.get(drep.remoteCommId);
    if (c === undefined || c.state !== 'DREQ_SENT' || c.remoteCommId !== drep.localCommId) return [];
    delete c.pending;
    return this.enterTimewait(now, c);
  }

  // ------------------------------------------------------------------------ helpers

  private passiveEstablished(c: Conn<A>, privateData: Uint8Array): CmAction<A>[] {
    delete c.pending;
    c.state = 'ESTABLISHED';
    const out: CmAction<A>[] = [];
    if (c.rtsDone !== true) out.push({ ...enc(c.localCommId), modifyQp: this.passiveRts(c) });
    c.rtsDone = true;
    out.push({ ...enc(c.localCommId), event: 'established', privateData });
    return out;
  }

  /** The passive side's RTS: it sends from the REQ's Starting PSN. */
  private passiveRts(c: Conn<A>): QpTransition {
    const req = c.req;
    return {
      state: 'RTS',
      sqPsn: req.startingPsn,
      timeout: req.primaryPath.localAckTimeout,
      retryCnt: req.retryCount,
      rnrRetry: req.rnrRetryCount,
      maxRdAtomic: c.rep!.initiatorDepth,
    };
  }

  private sendRtu(c: Conn<A>, privateData?: Uint8Array): CmAction<A>[] {
    const mad: CmMad = {
      header: cmMadHeader('RTU', c.tid),
      msg: { kind: 'RTU', localCommId: c.localCommId, remoteCommId: c.remoteCommId, privateData: privateData ?? new Uint8Array(0) },
    };
    c.lastReply = mad;
    c.state = 'ESTABLISHED';
    return [
      { ...enc(c.localCommId), send: mad, to: c.peer },
      { ...enc(c.localCommId), event: 'established', privateData: c.rep?.privateData ?? new Uint8Array(0) },
    ];
  }

  private sendDrep(now: Micros, c: Conn<A>, privateData?: Uint8Array): CmAction<A>[] {
    const mad: CmMad = {
      header: cmMadHeader('DREP', c.dreqTid ?? c.tid),
      msg: { kind: 'DREP', localCommId: c.localCommId, remoteCommId: c.remoteCommId, privateData: privateData ?? new Uint8Array(0) },
    };
    c.lastReply = mad;
    const wasUp = c.state !== 'DREQ_SENT';
    const out: CmAction<A>[] = [];
    if (wasUp) out.push({ ...enc(c.localCommId), modifyQp: { state: 'ERR' } });
    out.push({ ...enc(c.localCommId), send: mad, to: c.peer }, ...this.enterTimewait(now, c));
    return out;
  }

  private enterTimewait(now: Micros, c: Conn<A>): CmAction<A>[] {
    c.state = 'TIMEWAIT';
    c.timewaitEnd = now + (this.opts.timewaitUs ?? cmTimeoutUs(c.req.primaryPath.localAckTimeout) + 2 * this.packetLifeUs);
    return [{ ...enc(c.localCommId), event: 'disconnected' }];
  }

  /** Sends a request that expects an answer, and arms its resend timer. */
  private request(now: Micros, c: Conn<A>, mad: CmMad): CmAction<A> {
    c.pending = { mad, retries: 0, deadline: now + this.waitUs(c.peerResponseTimeout) };
    return { ...enc(c.localCommId), send: mad, to: c.peer };
  }

  private waitUs(responseTimeout: number): Micros {
    return cmTimeoutUs(responseTimeout) + 2 * this.packetLifeUs;
  }

  private rejMad(tid: bigint, localCommId: number, remoteCommId: number, messageRejected: number, reason: number, privateData?: Uint8Array, ari?: Uint8Array): CmMad {
    return {
      header: cmMadHeader('REJ', tid),
      msg: {
        kind: 'REJ',
        localCommId,
        remoteCommId,
        messageRejected,
        rejectedInfoLength: ari?.length ?? 0,
        reason,
        ari: ari ?? new Uint8Array(0),
        privateData: privateData ?? new Uint8Array(0),
      },
    };
  }

  /**
   * TransactionID of the requests this agent starts: tidHigh in the top 32 bits, the local
   * comm ID's bytes read little-endian below. That is what Linux sends (it ORs the
   * big-endian comm ID into a host-order number on x86), so our traces line up with rxe's.
   */
  private formTid(localCommId: number): bigint {
    const swapped = ((localCommId & 0xff) << 24) | ((localCommId >>> 8) & 0xff) << 16 | ((localCommId >>> 16) & 0xff) << 8 | (localCommId >>> 24);
    return (BigInt(this.tidHigh) << 32n) | BigInt(swapped >>> 0);
  }

  private newCommId(): number {
    for (;;) {
      const id = this.opts.random() >>> 0;
      if (id !== 0 && !this.conns.has(id)) return id;
    }
  }

  private need(connId: number, op: string, ...states: CmState[]): Conn<A> {
    const c = this.conns.get(connId);
    if (c === undefined) throw new CmStateError(`${op}: no connection ${connId}`);
    if (!states.includes(c.state)) throw new CmStateError(`${op}: connection ${connId} is ${c.state}, needs ${states.join(' or ')}`);
    return c;
  }
}

const EMPTY_PATH: CmPath = {
  localLid: 0,
  remoteLid: 0,
  localGid: new Uint8Array(16),
  remoteGid: new Uint8Array(16),
  flowLabel: 0,
  packetRate: 0,
  trafficClass: 0,
  hopLimit: 0,
  sl: 0,
  subnetLocal: false,
  localAckTimeout: 0,
};

/**
 * An RDMA connection manager shaped like librdmacm, over the device's CM agent (gsi.ts) and the
 * verbs API: IP addresses and rdma_cm ports in, connected RC QPs and events out.
 *
 *   const ch = createEventChannel(ctx);
 *   // passive
 *   const listener = ch.createId();
 *   listener.listen(7174);
 *   listener.on('connect_request', (ev) => {
 *     ev.id.createQp(pd, { sendCq: cq, recvCq: cq });
 *     postRecv(ev.id.qp!, …);
 *     ev.id.accept();
 *   });
 *   // active
 *   const id = ch.createId();
 *   id.connect({ address: '10.77.0.2', port: 7174, qp: { pd, sendCq: cq, recvCq: cq } });
 *   await id.waitFor('established');
 *   …
 *   id.disconnect();
 *
 * Events (librdmacm's RDMA_CM_EVENT_* in lower case) are emitted on the id and, as `event`, on
 * its channel, always on a later microtask than the call or MAD that caused them, as
 * `rdma_get_cm_event` would return them. `status` follows librdmacm: the REJ reason for
 * `rejected` (8 = no listener, 28 = the peer's consumer refused), -110 (ETIMEDOUT) for
 * `unreachable` and for a `disconnected` whose DREQ went unanswered.
 *
 * QPs follow the CM: `createQp` leaves an RC QP in INIT; the REP (active) or `accept`
 * (passive) takes it to RTR and RTS with the path of the REQ: the peer's GID (its IP address),
 * the PSNs, path MTU, responder resources and initiator depth, ACK timeout and retry counts; a
 * disconnect takes it to ERR.
 *
 * A listener whose application takes its time over a `connect_request` answers the REQ with an
 * MRA after `ListenOptions.mraAfterMs` (default 1 s), and the CM agent answers a repeated REQ
 * with one at once, so the active side waits instead of giving up (IBTA 12.6.6).
 */

import { randomBytes, randomInt } from 'node:crypto';
import { EventEmitter } from 'node:events';
import { normalizeAddress } from '../core/address.js';
import { ACCESS, type QpCap } from '../core/types.js';
import { createQp, destroyQp, modifyQp, type Context, type Cq, type Pd, type Qp } from '../api/verbs.js';
import { parseIpAddress } from '../wire/frame.js';
import { type CmConnHandler, type CmPeer, type Gsi, type GsiOptions } from './gsi.js';
import {
  CM_PRIVATE_DATA_LEN,
  CM_REJ_REASON,
  cmaAddressText,
  cmaHeaderFor,
  codeOfMtu,
  gidOfIp,
  rdmaCmServiceId,
  reqPrivateData,
  type CmPath,
} from './messages.js';
import type { CmAction, CmState, QpTransition } from './state.js';

/** librdmacm's event names. */
export type RdmaCmEventType =
  | 'connect_request'
  | 'established'
  | 'rejected'
  | 'unreachable'
  | 'disconnected'
  | 'timewait_exit';

export interface RdmaCmEvent {
  type: RdmaCmEventType;
  /** The id the event is about; for `connect_request`, the new connection's id. */
  id: RdmaCmId;
  /** For `connect_request`: the listening id. */
  listenId?: RdmaCmId;
  status: number;
  /** For `rejected`: the REJ reason's name. */
  reason?: string;
  /**
   * Private data: the REQ's after the IP CM header (56 bytes), the REP's, the REJ's, the RTU's
   * (rdma_cm delivers a message's whole private data field).
   */
  privateData: Uint8Array;
  /** For `connect_request`: what the REQ offers (librdmacm's `event->param.conn`). */
  param?: { responderResources: number; initiatorDepth: number; retryCount: number; rnrRetryCount: number; qpNum: number; srq: boolean };
}

/** rdma_cm's ETIMEDOUT status. */
export const CM_STATUS_TIMEDOUT = -110;

export interface CmQpInit {
  pd: Pd;
  sendCq: Cq;
  recvCq: Cq;
  cap?: Partial<QpCap>;
  sqSigAll?: boolean;
}

export interface ConnectOptions {
  /** The passive side's IP address (same family as the device's). */
  address: string;
  /** Its rdma_cm port (service ID 0x0000000001060000 + port, port space TCP). */
  port: number;
  /** Create the QP here instead of with `createQp` first. */
  qp?: CmQpInit;
  /** Up to 56 bytes, after the IP CM header. */
  privateData?: Uint8Array;
  /** Incoming RDMA READ/atomic we accept at once. Default 1 (rping's). */
  responderResources?: number;
  /** Outgoing RDMA READ/atomic we keep in flight. Default 1. */
  initiatorDepth?: number;
  /** Default 7. */
  retryCount?: number;
  /** Default 7 (retry forever). */
  rnrRetryCount?: number;
  /**
   * Path MTU, bytes. Default the smaller of the port MTU and 1024, what rdma_cm picks on a
   * 1500-byte Ethernet netdev.
   */
  pathMtu?: 256 | 512 | 1024 | 2048 | 4096;
  /** The UDP port of the peer's RoCE stack. Default: the channel's peer port. */
  rocePort?: number;
  /** Our rdma_cm source port in the IP CM header. Default: a random ephemeral port. */
  srcPort?: number;
  /** Starting PSN of our send queue. Default random. */
  startingPsn?: number;
  /** CM response timeout exponent, ours and the peer's (4.096 µs × 2^t). Default 20 (≈4.3 s). */
  cmResponseTimeout?: number;
  /** Resends of the REQ (and of every later request) before giving up. Default 15. */
  maxCmRetries?: number;
  /** The QPs' local ACK timeout exponent. Default 19, what rdma_cm over rxe puts in the REQ. */
  localAckTimeout?: number;
  /** Default 64. */
  hopLimit?: number;
  /** Default 0. */
  trafficClass?: number;
}

export interface AcceptOptions {
  qp?: CmQpInit;
  /** Up to 196 bytes. */
  privateData?: Uint8Array;
  /** Default: the REQ's initiator depth. */
  responderResources?: number;
  /** Default: the REQ's responder resources. */
  initiatorDepth?: number;
  startingPsn?: number;
  /** Default 7. */
  rnrRetryCount?: number;
}

export interface EventChannelOptions extends GsiOptions {}

export interface ListenOptions {
  /**
   * A connect request not accepted or rejected within this many ms is answered with an MRA
   * (IBTA 12.6.6), so the active side waits the service timeout instead of resending its REQ
   * and giving up. A REQ repeated before then gets one at once (the agent's own). Default 1000;
   * 0 or Infinity: only on a repeated REQ.
   */
  mraAfterMs?: number;
  /** The MRA's service timeout (4.096 µs × 2^t). Default 24 (≈69 s), rdma_cm's. */
  mraServiceTimeout?: number;
}

/**
 * RNR timer code our QPs put in their RNR NAKs (IBTA table 45: 12 = 0.64 ms), as
 * ibv_rc_pingpong does; rdma_cm's 0 would make a peer wait 655 ms each time.
 */
const MIN_RNR_TIMER = 12;

/** An event channel (librdmacm `rdma_event_channel`) on one device. */
export class EventChannel extends EventEmitter {
  readonly gsi: Gsi;

  constructor(readonly context: Context, opts: EventChannelOptions = {}) {
    super();
    this.gsi = context.device.gsi;
    this.gsi.configure(opts);
  }

  createId(): RdmaCmId {
    return new RdmaCmId(this);
  }

  /** @internal */
  deliver(target: RdmaCmId, ev: RdmaCmEvent): void {
    queueMicrotask(() => {
      target.emit(ev.type, ev);
      this.emit('event', ev);
    });
  }
}

export function createEventChannel(ctx: Context, opts: EventChannelOptions = {}): EventChannel {
  return new EventChannel(ctx, opts);
}

export type RdmaCmIdState = 'idle' | 'listening' | 'connecting' | 'request' | 'accepting' | 'connected' | 'disconnected' | 'destroyed';

/** A connection (or a listener): librdmacm's `rdma_cm_id`, RDMA_PS_TCP. */
export class RdmaCmId extends EventEmitter {
  qp: Qp | undefined;
  state: RdmaCmIdState = 'idle';
  localAddress: string;
  localPort = 0;
  remoteAddress = '';
  remotePort = 0;
  /** The CM's local communication ID of this connection (0 before connect/request). */
  connId = 0;
  /** The Starting PSN our REQ or REP announced: the first PSN our receive queue expects (see state.ts). */
  startingPsn = 0;
  private listening: bigint | undefined;
  private listenOpts: ListenOptions = {};
  private mraTimer: { cancel(): void } | undefined;
  private peer: CmPeer | undefined;
  private disconnectStatus = 0;
  private disconnectedSent = false;
  private established = false;
  private commEstHooked = false;

  constructor(readonly channel: EventChannel) {
    super();
    this.localAddress = channel.context.address;
  }

  get context(): Context {
    return this.channel.context;
  }

  private get gsi(): Gsi {
    return this.channel.gsi;
  }

  /** The CM state of this connection (IBTA's names), IDLE when there is none. */
  get cmState(): CmState {
    return this.connId === 0 ? 'IDLE' : this.gsi.agent.state(this.connId);
  }

  /**
   * rdma_create_qp: an RC QP on this id, in INIT with the access rights rdma_cm gives (remote
   * write; remote read and atomics, which the responder resources then bound).
   */
  createQp(pd: Pd, init: CmQpInit | Omit<CmQpInit, 'pd'>): Qp {
    if (this.qp !== undefined) throw new Error('this id already has a QP');
    if (pd.context !== this.context) throw new Error('the PD belongs to another device');
    const qp = createQp(pd, {
      type: 'RC', sendCq: init.sendCq, recvCq: init.recvCq, sqSigAll: init.sqSigAll ?? false, ...(init.cap ? { cap: init.cap } : {}),
    });
    modifyQp(qp, {
      qpState: 'INIT', pkeyIndex: 0, portNum: 1,
      qpAccessFlags: ACCESS.LOCAL_WRITE | ACCESS.REMOTE_WRITE | ACCESS.REMOTE_READ | ACCESS.REMOTE_ATOMIC,
    });
    this.qp = qp;
    return qp;
  }

  /** rdma_destroy_qp. */
  destroyQp(): void {
    if (this.qp === undefined) return;
    destroyQp(this.qp);
    this.qp = undefined;
  }

  /** rdma_bind_addr + rdma_listen on this device's address. */
  listen(port: number, opts: ListenOptions = {}): void {
    this.need('listen', 'idle');
    checkPort(port);
    this.listenOpts = opts;
    const sid = rdmaCmServiceId(port);
    this.gsi.listen(sid, (r) => this.onConnectRequest(r));
    this.listening = sid;
    this.localPort = port;
    this.state = 'listening';
  }

  /** rdma_resolve_addr + rdma_resolve_route + rdma_connect: sends the REQ. */
  connect(o: ConnectOptions): void {
    this.need('connect', 'idle');
    checkPort(o.port);
    const remote = normalizeAddress(o.address);
    if (remote === undefined) throw new Error(`not an IP address: ${o.address}`);
    const local = normalizeAddress(this.localAddress)!;
    if (parseIpAddress(remote)!.length !== parseIpAddress(local)!.length) throw new Error(`${remote} is not in the device's address family (${local})`);
    if (o.qp) this.createQp(o.qp.pd, o.qp);
    const qp = this.qp;
    if (qp === undefined) throw new Error('connect needs a QP: createQp first, or pass qp');
    const userData = o.privateData ?? new Uint8Array(0);
    const srcPort = o.srcPort ?? randomInt(32768, 61000);
    const peer = o.rocePort !== undefined ? { address: remote, port: o.rocePort } : this.gsi.peerAt(remote);
    const portMtu = this.context.device.portMtu;
    const pathMtu = Math.min(o.pathMtu ?? 1024, portMtu);
    const path: CmPath = {
      // RoCE has no LIDs: rdma_cm writes the permissive LID.
      localLid: 0xffff,
      remoteLid: 0xffff,
      localGid: gidOfIp(local),
      remoteGid: gidOfIp(remote),
      // rdma_cm's RoCEv2 flow label: a hash of the two rdma_cm ports (cma_get_roce_udp_flow_label).
      flowLabel: (srcPort * 31 + o.port) & 0xfffff,
      packetRate: 0,
      trafficClass: o.trafficClass ?? 0,
      hopLimit: o.hopLimit ?? 64,
      sl: 0,
      subnetLocal: false,
      localAckTimeout: o.localAckTimeout ?? 19,
    };
    this.peer = peer;
    this.localPort = srcPort;
    this.remoteAddress = remote;
    this.remotePort = o.port;
    this.state = 'connecting';
    const t = o.cmResponseTimeout ?? 20;
    this.startingPsn = (o.startingPsn ?? randomPsn()) & 0xffffff;
    this.gsi.run(
      (agent, now) =>
        agent.connect(now, {
          peer,
          serviceId: rdmaCmServiceId(o.port),
          localQpn: qp.qpNum,
          startingPsn: this.startingPsn,
          primaryPath: path,
          privateData: reqPrivateData(cmaHeaderFor(local, srcPort, remote), userData),
          responderResources: o.responderResources ?? 1,
          initiatorDepth: o.initiatorDepth ?? 1,
          remoteCmResponseTimeout: t,
          localCmResponseTimeout: t,
          retryCount: o.retryCount ?? 7,
          rnrRetryCount: o.rnrRetryCount ?? 7,
          maxCmRetries: o.maxCmRetries ?? 15,
          pathMtu: codeOfMtu(pathMtu),
        }),
      (r) => {
        this.connId = r.connId;
        this.gsi.bind(r.connId, this.handler);
      },
    );
  }

  /** rdma_accept: QP to RTR and RTS, REP out. */
  accept(o: AcceptOptions = {}): void {
    this.need('accept', 'request');
    if (o.qp) this.createQp(o.qp.pd, o.qp);
    const qp = this.qp;
    if (qp === undefined) throw new Error('accept needs a QP: createQp first, or pass qp');
    if (o.privateData && o.privateData.length > CM_PRIVATE_DATA_LEN.REP) throw new Error(`REP private data is at most ${CM_PRIVATE_DATA_LEN.REP} bytes`);
    this.startingPsn = (o.startingPsn ?? randomPsn()) & 0xffffff;
    this.cancelMra();
    this.state = 'accepting';
    this.hookCommEst(qp);
    this.gsi.run((agent, now) =>
      agent.accept(now, this.connId, {
        localQpn: qp.qpNum,
        startingPsn: this.startingPsn,
        // librdmacm's rdma_accept takes the QP to RTS before the REP leaves.
        rtsOnAccept: true,
        ...(o.initiatorDepth !== undefined ? { initiatorDepth: o.initiatorDepth } : {}),
        ...(o.privateData ? { privateData: o.privateData } : {}),
        ...(o.responderResources !== undefined ? { responderResources: o.responderResources } : {}),
        ...(o.rnrRetryCount !== undefined ? { rnrRetryCount: o.rnrRetryCount } : {}),
      }),
    );
  }

  /** rdma_reject: REJ with reason 28 (consumer reject) and our private data. */
  reject(privateData?: Uint8Array): void {
    this.need('reject', 'request');
    this.cancelMra();
    this.gsi.run((agent, now) => agent.reject(now, this.connId, CM_REJ_REASON.CONSUMER_REJECT, privateData));
    this.gsi.unbind(this.connId);
    this.state = 'idle';
  }

  /** rdma_disconnect: QP to ERR, DREQ out (or DREP, answering the peer's). No-op when already down. */
  disconnect(): void {
    if (this.connId === 0) return;
    const st = this.cmState;
    if (st !== 'ESTABLISHED' && st !== 'REP_SENT' && st !== 'MRA_REP_RCVD' && st !== 'DREQ_RCVD') {
      // Already disconnected (the peer's DREQ was answered at once), or never connected.
      this.toErr();
      return;
    }
    this.gsi.run((agent, now) => agent.disconnect(now, this.connId));
  }

  /** rdma_destroy_id: stops listening, disconnects a connected id (its CM keeps answering until TIMEWAIT ends). */
  destroy(): void {
    if (this.listening !== undefined) this.gsi.unlisten(this.listening);
    this.listening = undefined;
    this.cancelMra();
    if (this.connId !== 0 && this.state !== 'destroyed') this.disconnect();
    this.state = 'destroyed';
  }

  /**
   * The next event of `type`; rejects on `rejected` and `unreachable` (unless that is the
   * type asked for), on `disconnected` while waiting for `established`, and after `timeoutMs`.
   */
  waitFor(type: RdmaCmEventType, timeoutMs = 30_000): Promise<RdmaCmEvent> {
    return new Promise((resolve, reject) => {
      const failOn: RdmaCmEventType[] = ['rejected', 'unreachable', ...(type === 'established' ? ['disconnected' as const] : [])];
      const done = (): void => {
        clearTimeout(timer);
        this.off(type, ok);
        for (const f of failOn) this.off(f, bad);
      };
      const ok = (ev: RdmaCmEvent): void => {
        done();
        resolve(ev);
      };
      const bad = (ev: RdmaCmEvent): void => {
        done();
        reject(new RdmaCmError(ev));
      };
      const timer = setTimeout(() => {
        done();
        reject(new Error(`no ${type} event within ${timeoutMs} ms`));
      }, timeoutMs);
      this.on(type, ok);
      for (const f of failOn) if (f !== type) this.on(f, bad);
    });
  }

  // ------------------------------------------------------------------------ CM actions

  private readonly handler: CmConnHandler = (a) => {
    if ('modifyQp' in a) return this.onModifyQp(a.modifyQp);
    if (!('event' in a)) return;
    switch (a.event) {
      case 'established':
        this.established = true;
        this.state = 'connected';
        this.deliver({ type: 'established', id: this, status: 0, privateData: a.privateData });
        return;
      case 'rejected':
        this.state = 'idle';
        this.gsi.unbind(this.connId);
        this.deliver({ type: 'rejected', id: this, status: a.reason, reason: a.reasonName, privateData: a.privateData });
        return;
      case 'timeout':
        if (a.message === 'DREQ') {
          this.disconnectStatus = CM_STATUS_TIMEDOUT;
          return;
        }
        this.state = 'idle';
        this.gsi.unbind(this.connId);
        this.toErr();
        this.deliver({ type: 'unreachable', id: this, status: CM_STATUS_TIMEDOUT, privateData: new Uint8Array(0) });
        return;
      case 'disconnected':
        this.state = 'disconnected';
        if (this.disconnectedSent) return;
        this.disconnectedSent = true;
        this.deliver({ type: 'disconnected', id: this, status: this.disconnectStatus, privateData: new Uint8Array(0) });
        return;
      case 'closed':
        this.deliver({ type: 'timewait_exit', id: this, status: 0, privateData: new Uint8Array(0) });
        return;
      default:
        // mra, disconnect-request: the agent answers them itself (resends later, DREP).
        return;
    }
  };

  /**
   * The QP transitions the CM asks for, applied as they come: the CM agent fills in the PSNs
   * (a REQ's or REP's Starting PSN is what its sender's receive queue expects; see state.ts)
   * and the passive side's RTS comes with its RTR, before the REP (accept's rtsOnAccept).
   */
  private onModifyQp(t: QpTransition): void {
    const qp = this.qp;
    if (qp === undefined) return;
    switch (t.state) {
      case 'RTR':
        if (qp.state !== 'INIT') return;
        modifyQp(qp, {
          qpState: 'RTR',
          pathMtu: Math.min(t.pathMtu, this.context.device.portMtu) as 256,
          destQpNum: t.destQpn,
          rqPsn: t.rqPsn,
          maxDestRdAtomic: t.maxDestRdAtomic,
          minRnrTimer: MIN_RNR_TIMER,
          ahAttr: { dgid: t.remoteGid, port: this.peer!.port },
        });
        return;
      case 'RTS':
        if (qp.state !== 'RTR') return;
        modifyQp(qp, { qpState: 'RTS', sqPsn: t.sqPsn, timeout: t.timeout, retryCnt: t.retryCnt, rnrRetry: t.rnrRetry, maxRdAtomic: t.maxRdAtomic });
        return;
      case 'ERR':
        this.toErr();
        return;
    }
  }

  private toErr(): void {
    const qp = this.qp;
    if (qp !== undefined && qp.state !== 'ERR' && qp.state !== 'RESET') modifyQp(qp, { qpState: 'ERR' });
  }

  private onConnectRequest(r: Extract<CmAction<CmPeer>, { event: 'connect-request' }>): CmConnHandler | undefined {
    if (this.state !== 'listening') return undefined;
    const child = new RdmaCmId(this.channel);
    child.connId = r.connId;
    child.peer = r.peer;
    child.state = 'request';
    child.localPort = this.localPort;
    if (r.cma !== undefined) {
      child.remoteAddress = cmaAddressText(r.cma.ipVersion, r.cma.srcIp);
      child.remotePort = r.cma.srcPort;
    } else {
      child.remoteAddress = r.peer.address;
    }
    child.armMra(this.listenOpts);
    const req = r.req;
    this.deliver({
      type: 'connect_request',
      id: child,
      listenId: this,
      status: 0,
      privateData: r.userData,
      param: {
        responderResources: req.responderResources, initiatorDepth: req.initiatorDepth, retryCount: req.retryCount,
        rnrRetryCount: req.rnrRetryCount, qpNum: req.localQpn, srq: req.srq,
      },
    });
    return child.handler;
  }

  /**
   * IBTA's "communication established" (ibv IBV_EVENT_COMM_EST): a completion on the QP's
   * receive CQ before the RTU means the peer got our REP and is sending, so the connection is
   * up even if every RTU is lost.
   */
  private hookCommEst(qp: Qp): void {
    if (this.commEstHooked) return;
    this.commEstHooked = true;
    const cq = qp.recvCq.core;
    const prev = cq.onCompletion;
    const clock = this.context.device.clock;
    let pending = false;
    cq.onCompletion = (q) => {
      prev?.(q);
      if (this.established || pending || this.connId === 0) return;
      pending = true;
      clock.at(clock.now(), () => {
        pending = false;
        if (this.established) return;
        const st = this.cmState;
        if (st === 'REP_SENT' || st === 'MRA_REP_RCVD') this.gsi.run((agent, now) => agent.established(now, this.connId));
      });
    };
  }

  /** Passive, before accept or reject: the MRA of ListenOptions.mraAfterMs. */
  private armMra(o: ListenOptions): void {
    const after = o.mraAfterMs ?? 1000;
    if (!(after > 0) || !Number.isFinite(after)) return;
    const clock = this.context.device.clock;
    this.mraTimer = clock.at(clock.now() + after * 1000, () => {
      this.mraTimer = undefined;
      // Still undecided, and the agent has not sent one for a repeated REQ already.
      if (this.state !== 'request' || this.cmState !== 'REQ_RCVD') return;
      this.gsi.run((agent, now) => agent.mra(now, this.connId, o.mraServiceTimeout ?? 24));
    });
  }

  private cancelMra(): void {
    this.mraTimer?.cancel();
    this.mraTimer = undefined;
  }

  private deliver(ev: RdmaCmEvent): void {
    this.channel.deliver(ev.type === 'connect_request' ? ev.listenId! : this, ev);
  }

  private need(op: string, ...states: RdmaCmIdState[]): void {
    if (!states.includes(this.state)) throw new Error(`${op}: the id is ${this.state}, needs ${states.join(' or ')}`);
  }
}

/** A `rejected` or `unreachable` event as an error (from `waitFor`). */
export class RdmaCmError extends Error {
  readonly code = 'ERR_RDMA_CM';
  constructor(readonly event: RdmaCmEvent) {
    super(`RDMA_CM_EVENT_${event.type.toUpperCase()}, status ${event.status}${event.reason ? ` (${event.reason})` : ''}`);
  }
}

function checkPort(port: number): void {
  if (!Number.isInteger(port) || port < 0 || port > 0xffff) throw new RangeError(`rdma_cm port ${port} is not 0..65535`);
}

function randomPsn(): number {
  return randomBytes(3).readUIntBE(0, 3);
}

/**
 * QP1, the General Services Interface (IBTA Vol. 1 §13.5), of one device: a UD QP numbered 1
 * with the GSI Q_Key, carrying the 256-byte MADs of the Communication Manager, and the
 * `CmAgent` those MADs feed.
 *
 * The device creates one at open, as a kernel does for every port, so that a REQ for a service
 * nobody listens on is answered with a REJ even when no rdma_cm user exists. This file is the
 * agent's IO: MADs received on QP1 go to `onMad`; the agent's `send` actions leave as UD
 * SEND_ONLY to the peer's QP1 (P_Key 0xffff, DETH Q_Key 0x80010000, source QP 1); `onTimer`
 * runs at `nextTimeout()`; every other action (QP transitions and events) goes to whoever owns
 * the connection (`rdmacm.ts`).
 *
 * Received MADs and timers are handled on a later turn of the clock, never inside the engine's
 * packet processing: the consumers they reach modify QPs and post work.
 */

import { randomBytes } from 'node:crypto';
import { normalizeAddress, resolveAh } from '../core/address.js';
import type { CompletionQueue } from '../core/cq.js';
import type { MemoryRegion } from '../core/mr.js';
import type { QueuePair } from '../core/qp.js';
import { ACCESS, SEND_FLAGS, type WorkCompletion } from '../core/types.js';
import { GSI_QKEY } from '../wire/constants.js';
import { formatIpAddress } from '../wire/frame.js';
import type { Device } from '../runtime/device.js';
import type { TimerHandle } from '../runtime/clock.js';
import { MAD_LEN } from './mad.js';
import { emitCmMad } from './messages.js';
import { CmAgent, type CmAction, type CmAgentOptions, type Micros } from './state.js';

/** The GSI's QP number (IBTA 13.5.1): every port has it, no allocator hands it out. */
export const GSI_QPN = 1;

/** The 40-byte GRH area in front of every UD receive (IBTA 11.4.1.2). */
const GRH_LEN = 40;
/** Receive buffers kept posted on QP1: a burst of REQs (and their retries) must not find none. */
const RECV_SLOTS = 64;
const SEND_DEPTH = 64;

/** Where a peer's QP1 is: its IP address and the UDP port its RoCE stack listens on. */
export interface CmPeer {
  address: string;
  port: number;
}

/** The owner of one connection: receives every action of that connection but its MAD sends. */
export type CmConnHandler = (action: CmAction<CmPeer>) => void;

/**
 * The owner of a listened service ID: called with the connect-request action of a new passive
 * connection; returns the handler for the rest of that connection's actions (or undefined to
 * leave the REQ unanswered, so the peer's retries run out).
 */
export type CmListenHandler = (request: Extract<CmAction<CmPeer>, { event: 'connect-request' }>) => CmConnHandler | undefined;

export interface GsiOptions {
  /**
   * The UDP port of peers' RoCE stacks, where MADs to a peer's QP1 go: a number, or `same` for
   * this device's own port (every real RoCEv2 node uses 4791; tests that run two stacks on one
   * address give each its own port and say here where the other is). Default `same`.
   */
  peerPort?: number | 'same';
  /** Agent options (timeouts, TIMEWAIT, TID). Changing them drops nothing: see `configure`. */
  agent?: Partial<Omit<CmAgentOptions, 'caGuid'>>;
}

/** Per-device counters of the GSI, for tests and traces. */
export interface GsiCounters {
  madsIn: number;
  madsOut: number;
  /** Receives that were not one whole MAD from an address we can answer. */
  dropped: number;
  /** Sends the send queue had no room for (the CM's own retries cover them). */
  sendOverflow: number;
}

export class Gsi {
  readonly qp: QueuePair;
  readonly counters: GsiCounters = { madsIn: 0, madsOut: 0, dropped: 0, sendOverflow: 0 };
  private agentImpl: CmAgent<CmPeer>;
  private peerPort: number | 'same' = 'same';
  private readonly cq: CompletionQueue;
  private readonly recvMr: MemoryRegion;
  private readonly sendMr: MemoryRegion;
  private readonly conns = new Map<number, CmConnHandler>();
  private readonly listeners = new Map<bigint, CmListenHandler>();
  private timer: { handle: TimerHandle; at: Micros } | undefined;
  private drainPending = false;
  private closed = false;
  private readonly caGuid: bigint;

  constructor(private readonly device: Device) {
    const pd = device.allocPd(this);
    this.cq = device.createCq(RECV_SLOTS + SEND_DEPTH);
    this.qp = device.createQp({
      type: 'UD', pd, sendCq: this.cq, recvCq: this.cq, sqSigAll: false, qpn: GSI_QPN,
      cap: { maxSendWr: SEND_DEPTH, maxRecvWr: RECV_SLOTS, maxSendSge: 1, maxRecvSge: 1, maxInlineData: MAD_LEN },
    });
    this.recvMr = device.mrs.register(pd, new Uint8Array(RECV_SLOTS * (GRH_LEN + MAD_LEN)), ACCESS.LOCAL_WRITE);
    this.sendMr = device.mrs.register(pd, new Uint8Array(MAD_LEN), ACCESS.LOCAL_WRITE);
    const now = device.now();
    this.qp.modify(now, { qpState: 'INIT', pkeyIndex: 0, portNum: 1, qkey: GSI_QKEY });
    this.qp.modify(now, { qpState: 'RTR' });
    this.qp.modify(now, { qpState: 'RTS', sqPsn: 0 });
    for (let i = 0; i < RECV_SLOTS; i++) this.postRecv(i);
    this.cq.onCompletion = () => this.scheduleDrain();
    // A CA GUID in the EUI-64 shape rxe derives from its MAC, made from the GID's last bytes:
    // peers only compare it (duplicate REQ detection), never resolve it.
    const g = device.gid;
    this.caGuid = (0x020000fffe000000n | (BigInt(g[13]!) << 16n) | (BigInt(g[14]!) << 8n) | BigInt(g[15]!)) & 0xffffffffffffffffn;
    this.agentImpl = this.newAgent({});
    device.kick(this.qp);
  }

  /** The CM of this port. Drive it through `run`, never directly: its actions must be carried out. */
  get agent(): CmAgent<CmPeer> {
    return this.agentImpl;
  }

  /**
   * Sets the peer port and agent options. Agent options replace the agent, which is only
   * allowed while it has no connection (listeners carry over).
   */
  configure(o: GsiOptions): void {
    if (o.peerPort !== undefined) this.peerPort = o.peerPort;
    if (o.agent !== undefined) {
      if (this.agentImpl.connections().length > 0) throw new Error('the CM agent has connections: configure it before connecting');
      this.agentImpl = this.newAgent(o.agent);
      for (const sid of this.listeners.keys()) this.agentImpl.listen(sid);
    }
  }

  /** The peer at `address`, with the UDP port its RoCE stack is assumed to listen on. */
  peerAt(address: string): CmPeer {
    return { address, port: this.peerPort === 'same' ? this.device.link.local.port : this.peerPort };
  }

  listen(serviceId: bigint, handler: CmListenHandler): void {
    if (this.listeners.has(serviceId)) throw new Error(`service ID 0x${serviceId.toString(16).padStart(16, '0')} is already listened on`);
    this.listeners.set(serviceId, handler);
    this.agentImpl.listen(serviceId);
  }

  unlisten(serviceId: bigint): void {
    this.listeners.delete(serviceId);
    this.agentImpl.unlisten(serviceId);
  }

  /** Routes the actions of connection `connId` to `handler` from now on. */
  bind(connId: number, handler: CmConnHandler): void {
    this.conns.set(connId, handler);
  }

  unbind(connId: number): void {
    this.conns.delete(connId);
  }

  /**
   * Calls the agent with the clock's `now` and carries out the actions it returns; returns them.
   * `before` runs between the call and the actions (to bind a connection `connect` just made).
   */
  run<T extends { actions: CmAction<CmPeer>[] } | CmAction<CmPeer>[]>(call: (agent: CmAgent<CmPeer>, now: Micros) => T, before?: (r: T) => void): T {
    if (this.closed) throw new Error('the device is closed');
    const r = call(this.agentImpl, this.device.now());
    before?.(r);
    this.apply(Array.isArray(r) ? r : r.actions);
    return r;
  }

  /**
   * Resolves once QP1 has sent every MAD queued so far (at most `timeoutMs` later): a process
   * about to close its device waits here, or its last answer (a DREP) never leaves.
   */
  async flush(timeoutMs = 200): Promise<void> {
    const end = Date.now() + timeoutMs;
    while (!this.closed && this.qp.sqLength > 0 && Date.now() < end) await new Promise((r) => setTimeout(r, 1));
  }

  close(): void {
    this.closed = true;
    this.timer?.handle.cancel();
    this.timer = undefined;
  }

  // ------------------------------------------------------------------------ actions

  private apply(actions: readonly CmAction<CmPeer>[]): void {
    for (const a of actions) {
      if ('send' in a) {
        this.transmit(a.send, a.to);
        continue;
      }
      if ('event' in a && a.event === 'connect-request') {
        const owner = this.listeners.get(a.serviceId);
        const h = owner?.(a);
        if (h !== undefined) this.conns.set(a.connId, h);
        continue;
      }
      const h = this.conns.get(a.connId);
      if ('event' in a && a.event === 'closed') this.conns.delete(a.connId);
      h?.(a);
    }
    this.rearm();
  }

  private transmit(mad: Parameters<typeof emitCmMad>[0], to: CmPeer): void {
    if (this.closed) return;
    emitCmMad(mad, this.sendMr.buffer, 0);
    try {
      this.qp.postSend(this.device.now(), [{
        wrId: 0,
        opcode: 'SEND',
        sendFlags: SEND_FLAGS.INLINE,
        sgList: [this.sendMr.sge(0, MAD_LEN)],
        // QP1 to QP1 under the GSI Q_Key; P_Key index 0 is the default P_Key 0xffff.
        ud: { ah: resolveAh({ address: to.address, port: to.port }), remoteQpn: GSI_QPN, remoteQkey: GSI_QKEY },
      }]);
      this.counters.madsOut++;
    } catch {
      this.counters.sendOverflow++;
    }
    this.device.kick(this.qp);
  }

  private rearm(): void {
    if (this.closed) return;
    const at = this.agentImpl.nextTimeout();
    if (at === this.timer?.at) return;
    this.timer?.handle.cancel();
    this.timer = undefined;
    if (at === undefined) return;
    const handle = this.device.clock.at(at, () => {
      this.timer = undefined;
      if (this.closed) return;
      this.apply(this.agentImpl.onTimer(this.device.now()));
    });
    this.timer = { handle, at };
  }

  // ------------------------------------------------------------------------ receive

  private postRecv(slot: number): void {
    const len = GRH_LEN + MAD_LEN;
    this.qp.postRecv(this.device.now(), [{ wrId: slot, sgList: [this.recvMr.sge(slot * len, len)] }]);
  }

  private scheduleDrain(): void {
    if (this.drainPending || this.closed) return;
    this.drainPending = true;
    this.device.clock.at(this.device.now(), () => {
      this.drainPending = false;
      this.drain();
    });
  }

  private drain(): void {
    if (this.closed) return;
    for (let wc = this.cq.shift(); wc !== undefined; wc = this.cq.shift()) {
      if (wc.opcode !== 'RECV') continue;
      const slot = Number(wc.wrId);
      if (wc.status === 'SUCCESS') this.onRecv(wc, slot);
      else this.counters.dropped++;
      if (this.qp.state !== 'ERR') this.postRecv(slot);
    }
    this.device.kick(this.qp);
  }

  private onRecv(wc: WorkCompletion, slot: number): void {
    const base = slot * (GRH_LEN + MAD_LEN);
    const grh = this.recvMr.buffer.subarray(base, base + GRH_LEN);
    const src = grhSource(grh);
    if (wc.byteLen !== GRH_LEN + MAD_LEN || src === undefined || wc.srcQp !== GSI_QPN) {
      this.counters.dropped++;
      return;
    }
    this.counters.madsIn++;
    // A copy: the slot is reposted before the agent's records (which copy what they keep) are done.
    const mad = this.recvMr.buffer.slice(base + GRH_LEN, base + GRH_LEN + MAD_LEN);
    this.apply(this.agentImpl.onMad(this.device.now(), mad, this.peerAt(src)));
  }

  private newAgent(o: Partial<Omit<CmAgentOptions, 'caGuid'>>): CmAgent<CmPeer> {
    return new CmAgent<CmPeer>({ caGuid: this.caGuid, random: () => randomBytes(4).readUInt32BE(0), ...o });
  }
}

/** The sender's address from the GRH area of a UD receive: an IPv6 header, or 20 bytes then an IPv4 header. */
function grhSource(grh: Uint8Array): string | undefined {
  if (grh[0]! >>> 4 === 6) return normalizeAddress(formatIpAddress(grh.subarray(8, 24)));
  if (grh[20]! >>> 4 === 4) return formatIpAddress(grh.subarray(32, 36));
  return undefined;
}

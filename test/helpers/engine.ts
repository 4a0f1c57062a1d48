/**
 * Engine test helpers: device pairs on a VirtualClock over MemoryLink (optionally behind a
 * FaultyLink), QP connection through the whole IBTA state ladder, and clock-driven waits.
 */

import { createHash } from 'node:crypto';
import {
  allocPd, createCq, createQp, modifyQp, openDevice, pollCq, type Context, type Cq, type Pd, type Qp,
} from '../../src/api/verbs.js';
import { ACCESS, type MtuValue, type QpCap, type QpType, type WorkCompletion } from '../../src/core/types.js';
import { FaultyLink, type FaultOptions } from '../../src/link/fault.js';
import type { Link } from '../../src/link/link.js';
import { MemoryLink } from '../../src/link/memory.js';
import { VirtualClock } from '../../src/runtime/clock.js';

export const ALL_ACCESS = ACCESS.LOCAL_WRITE | ACCESS.REMOTE_WRITE | ACCESS.REMOTE_READ | ACCESS.REMOTE_ATOMIC;

export interface Side {
  ctx: Context;
  pd: Pd;
  cq: Cq;
}

export interface MemPair {
  clock: VirtualClock;
  a: Side;
  b: Side;
  links: [Link, Link];
}

export interface MemPairOptions {
  fault?: Omit<FaultOptions, 'seed'> & { seed: number };
  mtu?: number;
  latencyUs?: number;
  cqe?: number;
}

export async function memoryPair(o: MemPairOptions = {}): Promise<MemPair> {
  const clock = new VirtualClock();
  const [la, lb] = MemoryLink.pair(clock, { latencyUs: o.latencyUs ?? 2 });
  const wa: Link = o.fault ? new FaultyLink(la, clock, o.fault) : la;
  const wb: Link = o.fault ? new FaultyLink(lb, clock, { ...o.fault, seed: (o.fault.seed * 31 + 7) >>> 0 }) : lb;
  const side = async (link: Link): Promise<Side> => {
    const ctx = await openDevice(o.mtu !== undefined ? { address: link.local.address, link, clock, mtu: o.mtu } : { address: link.local.address, link, clock });
    const pd = allocPd(ctx);
    const cq = createCq(ctx, { cqe: o.cqe ?? 4096 });
    return { ctx, pd, cq };
  };
  return { clock, a: await side(wa), b: await side(wb), links: [wa, wb] };
}

export interface ConnectOptions {
  pathMtu?: MtuValue;
  sqPsnA?: number;
  sqPsnB?: number;
  timeout?: number;
  retryCnt?: number;
  rnrRetry?: number;
  minRnrTimer?: number;
  maxRdAtomic?: number;
  accessA?: number;
  accessB?: number;
  qkey?: number;
  cap?: Partial<QpCap>;
  sqSigAll?: boolean;
}

export function makeQp(s: Side, type: QpType, o: ConnectOptions = {}): Qp {
  return createQp(s.pd, {
    type, sendCq: s.cq, recvCq: s.cq, sqSigAll: o.sqSigAll ?? true,
    cap: { maxSendWr: 1024, maxRecvWr: 1024, maxSendSge: 8, maxRecvSge: 8, maxInlineData: 128, ...(o.cap ?? {}) },
  });
}

/** Walks a QP RESET → INIT → RTR → RTS towards `peer`. */
export function bringUp(qp: Qp, peer: Qp, peerCtx: Context, o: ConnectOptions, mySq: number, peerSq: number, access: number): void {
  if (qp.type === 'UD') {
    modifyQp(qp, { qpState: 'INIT', pkeyIndex: 0, portNum: 1, qkey: o.qkey ?? 0x11111111 });
    modifyQp(qp, { qpState: 'RTR' });
    modifyQp(qp, { qpState: 'RTS', sqPsn: mySq });
    return;
  }
  modifyQp(qp, { qpState: 'INIT', pkeyIndex: 0, portNum: 1, qpAccessFlags: access });
  const ah = { address: peerCtx.address, port: peerCtx.port };
  if (qp.type === 'RC') {
    modifyQp(qp, {
      qpState: 'RTR', ahAttr: ah, pathMtu: o.pathMtu ?? 1024, destQpNum: peer.qpNum, rqPsn: peerSq,
      maxDestRdAtomic: 16, minRnrTimer: o.minRnrTimer ?? 1,
    });
    modifyQp(qp, {
      qpState: 'RTS', sqPsn: mySq, timeout: o.timeout ?? 10, retryCnt: o.retryCnt ?? 7, rnrRetry: o.rnrRetry ?? 7,
      maxRdAtomic: o.maxRdAtomic ?? 16,
    });
  } else {
    modifyQp(qp, { qpState: 'RTR', ahAttr: ah, pathMtu: o.pathMtu ?? 1024, destQpNum: peer.qpNum, rqPsn: peerSq });
    modifyQp(qp, { qpState: 'RTS', sqPsn: mySq });
  }
}

export function connectPair(p: { a: Side; b: Side }, type: QpType, o: ConnectOptions = {}): [Qp, Qp] {
  const qa = makeQp(p.a, type, o);
  const qb = makeQp(p.b, type, o);
  const sa = o.sqPsnA ?? 0x100;
  const sb = o.sqPsnB ?? 0x200;
  bringUp(qa, qb, p.b.ctx, o, sa, sb, o.accessA ?? ALL_ACCESS);
  bringUp(qb, qa, p.a.ctx, o, sb, sa, o.accessB ?? ALL_ACCESS);
  return [qa, qb];
}

/** Runs the virtual clock until `cond` holds; false if `limitUs` of virtual time passed first. */
export function runUntil(clock: VirtualClock, cond: () => boolean, limitUs = 60_000_000): boolean {
  clock.run(limitUs, cond);
  return cond();
}

/** Collects `n` completions from `cq`, running the clock as needed. */
export function collect(clock: VirtualClock, cq: Cq, n: number, limitUs = 60_000_000): WorkCompletion[] {
  const out: WorkCompletion[] = [];
  runUntil(clock, () => {
    out.push(...pollCq(cq, n - out.length));
    return out.length >= n;
  }, limitUs);
  return out;
}

/** Deterministic bytes (an LCG), for payloads that catch misplaced data. */
export function pattern(n: number, seed = 1): Uint8Array {
  const b = new Uint8Array(n);
  let x = seed >>> 0 || 1;
  for (let i = 0; i < n; i++) {
    x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
    b[i] = x >>> 24;
  }
  return b;
}

export function sha256(b: Uint8Array): string {
  return createHash('sha256').update(b).digest('hex');
}

// ---------------------------------------------------------------------------------------------
// Engine harness: one QueuePair driven directly with crafted packets, no link, no clock.

import { newCounters } from '../../src/core/counters.js';
import { CompletionQueue } from '../../src/core/cq.js';
import { MrTable, ProtectionDomain, type MemoryRegion } from '../../src/core/mr.js';
import { ASAP, QueuePair } from '../../src/core/qp.js';
import type { AsyncEvent, QpState } from '../../src/core/types.js';
import { emitPacket, packetLength, parsePacket, type RocePacket } from '../../src/wire/packet.js';
import { opcodeOf } from '../../src/wire/opcode.js';
import type { Bth } from '../../src/wire/bth.js';

export const PEER = { address: '10.0.0.2', port: 4791 };
export const PEER_QPN = 0x22;

/** A BTH template for packets "from the peer"; override what the test is about. */
export function bth(opcode: string, psn: number, o: Partial<Bth> = {}): Bth {
  return {
    opcode: opcodeOf(opcode), se: false, m: false, padCount: 0, tver: 0, pkey: 0xffff, fecn: false, becn: false,
    resv6: 0, destQp: 0x11, ackReq: false, resv7: 0, psn, ...o,
  };
}

export class EngineHarness {
  now = 0;
  readonly counters = newCounters();
  readonly mrs = new MrTable();
  readonly pd = new ProtectionDomain(1, {});
  readonly scq = new CompletionQueue(1, 1024);
  readonly rcq = new CompletionQueue(2, 1024);
  readonly events: AsyncEvent[] = [];
  readonly qp: QueuePair;
  private sent: RocePacket[] = [];
  /** Every packet the QP sent, as its bytes (without the ICRC), in order. */
  readonly wire: Uint8Array[] = [];
  /** Called with each packet the QP sends, from inside its send, as a link's or tracer's hook is. */
  onTransmit: ((p: RocePacket) => void) | undefined;
  /** Called on each of the QP's state changes, as a device's `onStateChange` observer is. */
  onStateChange: ((from: QpState, to: QpState) => void) | undefined;

  constructor(type: QpType, o: ConnectOptions & { maxDestRdAtomic?: number } = {}) {
    this.qp = new QueuePair({
      qpn: 0x11, type, pd: this.pd, mrs: this.mrs, counters: this.counters, sendCq: this.scq, recvCq: this.rcq,
      cap: { maxSendWr: 1024, maxRecvWr: 1024, maxSendSge: 8, maxRecvSge: 8, maxInlineData: 64, ...(o.cap ?? {}) }, sqSigAll: true, portMtu: 4096,
      io: {
        transmit: (_dst, _port, parts) => {
          const len = parts.reduce((n, p) => n + p.length, 0);
          const b = new Uint8Array(len + 4);
          let at = 0;
          for (const p of parts) {
            b.set(p, at);
            at += p.length;
          }
          const r = parsePacket(b);
          if (!r.ok) throw new Error(`engine sent a malformed packet: ${r.detail}`);
          this.sent.push({ ...r.packet, payload: r.packet.payload.slice() });
          this.wire.push(b.slice(0, len));
          this.onTransmit?.(r.packet);
        },
        event: (ev) => this.events.push(ev),
        stateChanged: (_qpn, from, to) => this.onStateChange?.(from, to),
      },
    });
    const q = this.qp;
    const access = o.accessB ?? ALL_ACCESS;
    if (type === 'UD') {
      q.modify(0, { qpState: 'INIT', pkeyIndex: 0, portNum: 1, qkey: o.qkey ?? 0x11111111 });
      q.modify(0, { qpState: 'RTR' });
      q.modify(0, { qpState: 'RTS', sqPsn: o.sqPsnA ?? 100 });
      return;
    }
    q.modify(0, { qpState: 'INIT', pkeyIndex: 0, portNum: 1, qpAccessFlags: access });
    if (type === 'RC') {
      q.modify(0, {
        qpState: 'RTR', ahAttr: PEER, pathMtu: o.pathMtu ?? 256, destQpNum: PEER_QPN, rqPsn: o.sqPsnB ?? 500,
        maxDestRdAtomic: o.maxDestRdAtomic ?? 4, minRnrTimer: o.minRnrTimer ?? 12,
      });
      q.modify(0, {
        qpState: 'RTS', sqPsn: o.sqPsnA ?? 100, timeout: o.timeout ?? 10, retryCnt: o.retryCnt ?? 3, rnrRetry: o.rnrRetry ?? 3,
        maxRdAtomic: o.maxRdAtomic ?? 4,
      });
    } else {
      q.modify(0, { qpState: 'RTR', ahAttr: PEER, pathMtu: o.pathMtu ?? 256, destQpNum: PEER_QPN, rqPsn: o.sqPsnB ?? 500 });
      q.modify(0, { qpState: 'RTS', sqPsn: o.sqPsnA ?? 100 });
    }
  }

  mr(bytes: Uint8Array | number, access = ALL_ACCESS): MemoryRegion {
    return this.mrs.register(this.pd, typeof bytes === 'number' ? new Uint8Array(bytes) : bytes, access);
  }

  /** Delivers a packet from the peer, as the device would after its checks. */
  send(p: Partial<RocePacket> & { bth: Bth }, at = this.now): void {
    this.now = at;
    const full: RocePacket = { payload: new Uint8Array(0), icrc: 0, ...p };
    if (full.payload.length % 4 !== 0 && full.bth.padCount === 0) full.bth = { ...full.bth, padCount: (4 - (full.payload.length % 4)) % 4 };
    const b = new Uint8Array(packetLength(full));
    emitPacket(full, b, 0);
    const r = parsePacket(b);
    if (!r.ok) throw new Error(r.detail);
    this.qp.onPacket(this.now, r.packet, r.info, { srcAddress: PEER.address, dstAddress: '10.0.0.1', udpLength: b.length });
  }

  /**
   * Runs the QP's due work at `at` (default: now), as the device would: again while it asks to
   * run at once (an expired ACK timer is decided on the run after the one that saw it expire);
   * returns what it sent since the last call.
   */
  poll(at = this.now, budget = 1 << 20): RocePacket[] {
    this.now = at;
    this.qp.poll(at, budget);
    for (let i = 0; i < 4 && this.qp.pollAt() === ASAP; i++) this.qp.poll(at, budget);
    return this.take();
  }

  /** What the QP sent since the last call; the receive batch ends here, so a coalesced ACK goes out first. */
  take(): RocePacket[] {
    this.qp.responder.flushAck(this.qp);
    const s = this.sent;
    this.sent = [];
    return s;
  }

  names(pkts: RocePacket[]): string[] {
    return pkts.map((p) => `${opcodeNameOf(p.bth.opcode)}@${p.bth.psn}${p.bth.ackReq ? '!' : ''}`);
  }
}

import { opcodeName } from '../../src/wire/opcode.js';
function opcodeNameOf(op: number): string {
  return opcodeName(op).replace(/^(RC|UC|UD)_/, '');
}

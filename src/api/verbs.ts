/**
 * The verbs API: libibverbs in camelCase, over the sans-IO core and a device runtime.
 *
 *   const ctx = await openDevice({ address: '127.0.0.1', port: 4791 });
 *   const pd = allocPd(ctx);
 *   const mr = regMr(pd, Buffer.alloc(4096), ACCESS.LOCAL_WRITE | ACCESS.REMOTE_WRITE);
 *   const cq = createCq(ctx, { cqe: 64 });
 *   const qp = createQp(pd, { type: 'RC', sendCq: cq, recvCq: cq, cap: { maxSendWr: 16, … } });
 *   modifyQp(qp, { qpState: 'INIT', pkeyIndex: 0, portNum: 1, qpAccessFlags: … });
 *   …RTR, RTS…
 *   postSend(qp, { wrId: 1, opcode: 'RDMA_WRITE', sgList: [mr.sge(0, 64)], rdma: { remoteAddr, rkey } });
 *   const wc = await cq.next();
 *
 * Misuse throws a `RoceError` with a stable `code`; transport failures arrive as completions
 * with a libibverbs status and, for QP errors, as a `QP_FATAL` event on `ctx.events`.
 */

import type { UdpLinkOptions } from '../link/udp.js';
import type { Link } from '../link/link.js';
import { SystemClock, type Clock } from '../runtime/clock.js';
import { Device, type DeviceOptions } from '../runtime/device.js';
import type { CcOption, QpCcState } from '../core/cc-hooks.js';
import { resolveAh } from '../core/address.js';
import type { Counters } from '../core/counters.js';
import type { CompletionQueue } from '../core/cq.js';
import { RoceError } from '../core/errors.js';
import { DEVICE_LIMITS } from '../core/limits.js';
import type { MemoryRegion, ProtectionDomain } from '../core/mr.js';
import type { QueuePair } from '../core/qp.js';
import {
  type AddressHandle, type AhAttr, type QpAttr, type QpCap, type QpState, type QpType, type Qpn, type RecvWr, type SendWr,
  type WorkCompletion,
} from '../core/types.js';
import { ROCEV2_UDP_PORT } from '../wire/constants.js';
import { abortWaiters, completions, nextCompletion, waitCompletion, type WaitOptions } from './async.js';
import { DeviceEvents } from './events.js';

export interface OpenDeviceOptions {
  /** Local IPv4 or IPv6 address; the GID is its IPv4-mapped form or the IPv6 address itself. */
  address: string;
  /** Local UDP port. Default 4791. */
  port?: number;
  /** A ready link (MemoryLink, FaultyLink, …). Default: a UdpLink bound to address:port. */
  link?: Link;
  /** Default: a SystemClock (a VirtualClock when the link runs on one, pass it here). */
  clock?: Clock;
  /** Active MTU of the port, bytes. Default 4096. */
  mtu?: number;
  /**
   * Extra options for the default UdpLink (buffer sizes, ICRC mode, …). Unlike a bare UdpLink,
   * the device defaults to `sourcePorts: 'per-flow'`: datagrams leave from rxe's per-QP source
   * port (0xC000 | a hash of the QPNs), the ECMP entropy RoCEv2 NICs put on the wire. On a
   * loopback address, which has one path and nothing to spread over, the default is `bound`: one
   * socket, so that the datagrams of all QPs share `sendmmsg` calls and GSO trains (with 100 QPs,
   * per-flow ports cost over a third of the aggregate goodput; bench/README.md, QP scale).
   */
  udp?: Partial<Omit<UdpLinkOptions, 'address' | 'port' | 'clock'>>;
  /** Congestion control for the device's RC/UC QPs and its CNPs (core/cc-hooks.ts). Default 'none'. */
  cc?: CcOption;
}

export interface PortAttr {
  state: 'ACTIVE' | 'DOWN';
  activeMtu: number;
  maxMtu: number;
  gidTblLen: number;
  pkeyTblLen: number;
}

/** An open device (libibverbs `ibv_context`). */
export class Context {
  readonly events = new DeviceEvents();

  constructor(readonly device: Device) {
    device.onEvent = (ev) => this.events.publish(ev);
  }

  /** The port's GID (index 0): 16 bytes. */
  get gid(): Uint8Array {
    return this.device.gid;
  }

  /** The local UDP endpoint. */
  get address(): string {
    return this.device.link.local.address;
  }

  get port(): number {
    return this.device.link.local.port;
  }

  /** Device counters (rxe names plus drop reasons), a snapshot. */
  get counters(): Counters {
    return this.device.snapshot();
  }

  queryPort(): PortAttr {
    return { state: this.device.isClosed ? 'DOWN' : 'ACTIVE', activeMtu: this.device.portMtu, maxMtu: this.device.portMtu, gidTblLen: 1, pkeyTblLen: 1 };
  }

  queryDevice(): typeof DEVICE_LIMITS {
    return DEVICE_LIMITS;
  }

  allocPd(): Pd {
    return allocPd(this);
  }

  createCq(attr: { cqe: number }): Cq {
    return createCq(this, attr);
  }

  close(): Promise<void> {
    return closeDevice(this);
  }
}

/** A protection domain. */
export class Pd {
  constructor(readonly context: Context, readonly core: ProtectionDomain) {}

  regMr(buffer: Uint8Array, access: number): MemoryRegion {
    return regMr(this, buffer, access);
  }

  createQp(init: QpInitAttr): Qp {
    return createQp(this, init);
  }

  createAh(attr: AhAttr): AddressHandle {
    return createAh(this, attr);
  }
}

/** A completion queue, with async sugar. */
export class Cq implements AsyncIterable<WorkCompletion> {
  constructor(readonly context: Context, readonly core: CompletionQueue) {}

  get cqe(): number {
    return this.core.capacity;
  }

  poll(max = 1): WorkCompletion[] {
    return this.core.poll(max);
  }

  /** `pollCqInto(this, wcs, max)`. */
  pollInto(wcs: WorkCompletion[], max = wcs.length): number {
    return this.core.pollInto(wcs, max);
  }

  next(opts?: WaitOptions): Promise<WorkCompletion> {
    return nextCompletion(this.core, opts);
  }

  wait(n = 1, opts?: WaitOptions): Promise<WorkCompletion[]> {
    return waitCompletion(this.core, n, opts);
  }

  [Symbol.asyncIterator](): AsyncIterator<WorkCompletion> {
    return completions(this.core);
  }
}

export interface QpInitAttr {
  type: QpType;
  sendCq: Cq;
  recvCq: Cq;
  cap?: Partial<QpCap>;
  /** Every send WR generates a completion (libibverbs `sq_sig_all`). */
  sqSigAll?: boolean;
  /** This QP's congestion control, instead of the device's (RC/UC). */
  cc?: CcOption;
}

/** A queue pair. */
export class Qp {
  constructor(readonly pd: Pd, readonly core: QueuePair, readonly sendCq: Cq, readonly recvCq: Cq) {}

  get qpNum(): Qpn {
    return this.core.qpn;
  }

  get type(): QpType {
    return this.core.type;
  }

  get state(): QpState {
    return this.core.state;
  }

  get device(): Device {
    return this.pd.context.device;
  }
}

const DEFAULT_CAP: QpCap = { maxSendWr: 256, maxRecvWr: 256, maxSendSge: 4, maxRecvSge: 4, maxInlineData: 64 };

// -------------------------------------------------------------------------------------------
// Free functions, as libibverbs names them

export async function openDevice(opts: OpenDeviceOptions): Promise<Context> {
  const clock = opts.clock ?? new SystemClock();
  let link = opts.link;
  if (!link) {
    // Loaded on demand so that code driving the core over other links never loads sockets/FFI.
    const { UdpLink, isLoopbackAddress } = await import('../link/udp.js');
    const sourcePorts = isLoopbackAddress(opts.address) ? 'bound' : 'per-flow';
    link = await UdpLink.open({ sourcePorts, ...(opts.udp ?? {}), address: opts.address, port: opts.port ?? ROCEV2_UDP_PORT, clock });
  }
  const dopts: DeviceOptions = { link, clock };
  if (opts.mtu !== undefined) dopts.mtu = opts.mtu;
  if (opts.cc !== undefined) dopts.cc = opts.cc;
  const device = new Device(dopts);
  const ctx = new Context(device);
  queueMicrotask(() => ctx.events.publish({ type: 'PORT_ACTIVE' }));
  return ctx;
}

export async function closeDevice(ctx: Context): Promise<void> {
  if (ctx.device.isClosed) return;
  await ctx.device.close();
  ctx.events.publish({ type: 'PORT_ERR', reason: 'device closed' });
}

export function allocPd(ctx: Context): Pd {
  const pd = new Pd(ctx, undefined as unknown as ProtectionDomain);
  (pd as { core: ProtectionDomain }).core = ctx.device.allocPd(pd);
  return pd;
}

/**
 * Frees a protection domain (`ibv_dealloc_pd`). Throws ERR_BUSY while a region registered in it or a
 * QP created in it remains; on a closed device it always succeeds.
 */
export function deallocPd(pd: Pd): void {
  pd.context.device.deallocPd(pd.core);
}

/** Registers `buffer` for the access rights in `access` (ACCESS bits). */
export function regMr(pd: Pd, buffer: Uint8Array, access: number): MemoryRegion {
  return pd.context.device.mrs.register(pd.core, buffer, access);
}

export function deregMr(mr: MemoryRegion): void {
  const owner = mr.pd.owner as Pd;
  owner.context.device.mrs.deregister(mr);
}

export function createCq(ctx: Context, attr: { cqe: number }): Cq {
  return new Cq(ctx, ctx.device.createCq(attr.cqe));
}

/**
 * Destroys a CQ (`ibv_destroy_cq`) and rejects its pending `next()`/`wait()` calls. Throws ERR_BUSY
 * while a QP that uses it remains; on a closed device it always succeeds.
 */
export function destroyCq(cq: Cq): void {
  cq.context.device.destroyCq(cq.core);
  // As a wait begun after the destroy is rejected (async.ts): one error for both.
  abortWaiters(cq.core, new RoceError('ERR_RESOURCE', 'CQ destroyed'));
}

export function createQp(pd: Pd, init: QpInitAttr): Qp {
  if (init.type !== 'RC' && init.type !== 'UC' && init.type !== 'UD') {
    throw new RoceError('ERR_NOT_SUPPORTED', `QP type ${String(init.type)}`);
  }
  const ctx = pd.context;
  if (init.sendCq.context !== ctx || init.recvCq.context !== ctx) throw new RoceError('ERR_RESOURCE', 'CQs belong to another device');
  const core = ctx.device.createQp({
    type: init.type, pd: pd.core, sendCq: init.sendCq.core, recvCq: init.recvCq.core,
    cap: { ...DEFAULT_CAP, ...(init.cap ?? {}) }, sqSigAll: init.sqSigAll === true, ...(init.cc !== undefined ? { cc: init.cc } : {}),
  });
  return new Qp(pd, core, init.sendCq, init.recvCq);
}

export function destroyQp(qp: Qp): void {
  qp.device.destroyQp(qp.core);
}

/**
 * Modify QP. `mask` (QP_ATTR_MASK bits) defaults to the fields present in `attr`. The whole
 * request is checked against the IBTA transition table first; on error nothing changes.
 */
export function modifyQp(qp: Qp, attr: QpAttr, mask?: number): void {
  const d = qp.device;
  if (mask === undefined) qp.core.modify(d.now(), attr);
  else qp.core.modify(d.now(), attr, mask);
  d.kick(qp.core);
}

/** The QP's congestion control: its rate, CNPs received and sent, DCQCN state (core/cc-hooks.ts). */
export function queryQpCc(qp: Qp): QpCcState {
  return qp.device.ccState(qp.core);
}

export function queryQp(qp: Qp): ReturnType<QueuePair['query']> {
  return qp.core.query();
}

/** An address handle for UD sends: `{ dgid }` or `{ address }`, plus the peer's UDP port. */
export function createAh(_pd: Pd, attr: AhAttr): AddressHandle {
  return resolveAh(attr);
}

export function postSend(qp: Qp, wr: SendWr | readonly SendWr[]): void {
  const d = qp.device;
  const now = d.postTime(qp.core);
  if (Array.isArray(wr)) qp.core.postSend(now, wr);
  else qp.core.postSendOne(now, wr as SendWr);
  d.posted(qp.core, now);
}

export function postRecv(qp: Qp, wr: RecvWr | readonly RecvWr[]): void {
  const d = qp.device;
  const now = d.now();
  qp.core.postRecv(now, Array.isArray(wr) ? wr : [wr as RecvWr]);
  d.kick(qp.core, now);
}

export function pollCq(cq: Cq, max = 1): WorkCompletion[] {
  return cq.core.poll(max);
}

/**
 * `ibv_poll_cq`: up to `max` completions copied into the caller's records `wcs[0]`, `wcs[1]` … (a
 * missing one is made, with `newWorkCompletion`); returns how many. Records kept from poll to poll
 * make a stream of completions leave no garbage, which `pollCq`'s new objects do.
 */
export function pollCqInto(cq: Cq, wcs: WorkCompletion[], max = wcs.length): number {
  return cq.core.pollInto(wcs, max);
}

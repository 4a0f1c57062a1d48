/**
 * What the RC suites' children share (`rc.bench.ts`, `latency.bench.ts`, `qpscale.bench.ts`): a device
 * on a loopback address over the default `UdpLink`, RC QPs walked RESET → INIT → RTR → RTS towards a
 * peer announced through `ctx.ready`, and a bounded wait for completions.
 *
 * The two children of an RC suite sit on different loopback addresses (127.0.0.1 and 127.0.0.2) so that
 * each QP's `check_addr` sees a distinct peer, and each listens on port 0 (the kernel's choice), so
 * that no fixed port can collide with another run.
 *
 * The harness gives one barrier per round (`ctx.ready` → start). A QP that reaches RTR a moment after
 * its peer's first request would answer nothing and cost the initiator an ACK timeout, so an
 * initiator primes the connection with one small request and waits for it to complete before it
 * starts the clock.
 */

import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import {
  allocPd, closeDevice, createCq, createQp, modifyQp, openDevice, type Context, type Cq, type Pd, type Qp,
} from '../src/api/verbs.js';
import { abortWaiters } from '../src/api/async.js';
import { newWorkCompletion } from '../src/core/cq.js';
import { ACCESS, type MtuValue, type QpCap, type WorkCompletion } from '../src/core/types.js';

export const TX_ADDRESS = '127.0.0.1';
export const RX_ADDRESS = '127.0.0.2';
export const ALL_ACCESS = ACCESS.LOCAL_WRITE | ACCESS.REMOTE_WRITE | ACCESS.REMOTE_READ;
/**
 * Outstanding RDMA READs per QP, both directions (maxRdAtomic / maxDestRdAtomic): the device maximum,
 * 128, as rdma_rxe reports it and as perftest's ib_read_bw uses by default.
 */
export const RD_ATOMIC = 128;
/**
 * Local ACK timeout exponent: 4.096 µs · 2^14 ≈ 67 ms, libibverbs' and perftest's usual value. The
 * figures count retransmissions; with no loss it never fires.
 */
export const ACK_TIMEOUT = 14;

export interface Side {
  ctx: Context;
  pd: Pd;
  cq: Cq;
}

/** Opens a device on `address`, port 0, with one PD and one CQ. */
export async function openSide(address: string, mtu: number, cqe: number): Promise<Side> {
  // ROCE_BENCH_SEND_MODE=ring|scatter compares UdpLink's dgram send paths with the batched one
  // (the default), ROCE_BENCH_SOURCE_PORTS=per-flow the device's loopback default of one source
  // port with rxe's per-QP ports, ROCE_BENCH_GSO=0 / ROCE_BENCH_GRO=0 the batched path without
  // trains / without UDP_GRO at the receiver, ROCE_BENCH_WATCH=poll with koffi's poll instead of the
  // addon's watch, ROCE_BENCH_CALLS=koffi with koffi's sendmmsg/recvmmsg instead of the addon's (see
  // src/link/udp.ts).
  const mode = process.env['ROCE_BENCH_SEND_MODE'];
  const ports = process.env['ROCE_BENCH_SOURCE_PORTS'];
  const udp: { sendMode?: 'ring' | 'scatter'; batchIo?: boolean; sourcePorts?: 'bound' | 'per-flow'; gso?: boolean; gro?: boolean; watch?: 'poll'; calls?: 'koffi' } = {
    ...(mode === 'ring' || mode === 'scatter' ? { sendMode: mode, batchIo: false } : {}),
    ...(ports === 'bound' || ports === 'per-flow' ? { sourcePorts: ports } : {}),
    ...(process.env['ROCE_BENCH_GSO'] === '0' ? { gso: false } : {}),
    ...(process.env['ROCE_BENCH_GRO'] === '0' ? { gro: false } : {}),
    ...(process.env['ROCE_BENCH_WATCH'] === 'poll' ? { watch: 'poll' as const } : {}),
    ...(process.env['ROCE_BENCH_CALLS'] === 'koffi' ? { calls: 'koffi' as const } : {}),
  };
  const ctx = await openDevice({ address, port: 0, mtu, udp });
  const pd = allocPd(ctx);
  const cq = createCq(ctx, { cqe });
  return { ctx, pd, cq };
}

export async function closeSide(s: Side | undefined): Promise<void> {
  if (s !== undefined) await closeDevice(s.ctx);
}

/** How a QP is reached: what each child announces through `ctx.ready`. */
export interface QpInfo {
  address: string;
  port: number;
  qpn: number;
  psn: number;
}

export function peerInfo<T>(peers: Record<string, unknown>, name: string): T {
  const p = peers[name];
  if (p === undefined || p === null) throw new Error(`peer ${name} announced nothing`);
  return p as T;
}

/** An RC QP in INIT (receives may be posted from here on). */
export function makeRcQp(s: Side, cap: Partial<QpCap>, sqSigAll: boolean): Qp {
  const qp = createQp(s.pd, { type: 'RC', sendCq: s.cq, recvCq: s.cq, sqSigAll, cap });
  modifyQp(qp, { qpState: 'INIT', pkeyIndex: 0, portNum: 1, qpAccessFlags: ALL_ACCESS });
  return qp;
}

/** INIT → RTR → RTS towards `peer` (its address, port, QPN and first PSN), with `rdAtomic` READs outstanding each way. */
export function connectRc(qp: Qp, peer: QpInfo, myPsn: number, mtu: number, rdAtomic = RD_ATOMIC): void {
  modifyQp(qp, {
    qpState: 'RTR', ahAttr: { address: peer.address, port: peer.port }, pathMtu: mtu as MtuValue, destQpNum: peer.qpn,
    rqPsn: peer.psn, maxDestRdAtomic: rdAtomic, minRnrTimer: 1,
  });
  modifyQp(qp, { qpState: 'RTS', sqPsn: myPsn, timeout: ACK_TIMEOUT, retryCnt: 7, rnrRetry: 7, maxRdAtomic: rdAtomic });
}

/** A start PSN that differs per QP (PSNs are 24 bits). */
export function psnFor(i: number, salt: number): number {
  return (Math.imul(i + 1, 0x9e3779b1) ^ salt) & 0xffffff;
}

/** Fails a round that stopped making progress, with what the QP was doing. */
export async function nextWc(cq: Cq, what: string, timeoutMs = 5000, signal?: AbortSignal): Promise<WorkCompletion> {
  const opts = signal !== undefined ? { timeoutMs, signal } : { timeoutMs };
  const wc = await cq.next(opts).catch((e: Error) => {
    throw new Error(`${what}: ${e.message}`);
  });
  if (wc.status !== 'SUCCESS') throw new Error(`${what}: completion ${wc.status} (vendor 0x${wc.vendorErr.toString(16)}, wr ${String(wc.wrId)})`);
  return wc;
}

/** Lets the peer's child finish its own RTR/RTS transition after the start barrier. */
export function settle(): Promise<void> {
  return sleep(5);
}

/** The counters worth reporting next to a figure: retransmissions, drops, RNR, timeouts. */
export function healthOf(s: Side): Record<string, number> {
  const c = s.ctx.counters as unknown as Record<string, number>;
  const out: Record<string, number> = {};
  for (const k of ['sentPkts', 'rcvdPkts', 'retransPkts', 'ackTimeouts', 'compRetry', 'rcvRnr', 'sndRnr', 'outOfSeqReq', 'rcvSeqErr', 'dupReq', 'icrcErr', 'cqOverflow']) {
    if (c[k] !== undefined) out[k] = c[k];
  }
  const drops = s.ctx.device.link.drops as Record<string, number>;
  for (const [k, v] of Object.entries(drops)) if (v !== 0) out[`link.${k}`] = v;
  return out;
}

export interface PumpResult {
  /** Messages and payload bytes completed inside the measuring window. */
  msgs: number;
  bytes: number;
  seconds: number;
  /** Whether every outstanding WR completed after the window (false: the drain timed out). */
  drained: boolean;
  /** CPU time (user + system) this process spent inside the window, µs: steadier than goodput on a loaded machine. */
  cpuUs: number;
}

/**
 * Keeps `depth` WRs outstanding: `post(n)` posts n more (every one signaled), each batch of
 * completions is answered by as many new WRs. Completions during the first `warmupMs` are not
 * counted; then it counts for `windowMs` and drains what is still outstanding.
 *
 * The loop waits with a bare `cq.next()`: a per-wait timeout would arm and clear a timer per batch,
 * which at 4 KiB messages showed in the profile as the benchmark's own largest allocation. A stall
 * is caught instead by one watchdog interval that rejects the CQ's waiters when no
 * completion arrived for `stallMs`.
 */
export async function pump(cq: Cq, post: (n: number) => void, depth: number, warmupMs: number, windowMs: number, what: string, stallMs = 5000): Promise<PumpResult> {
  post(depth);
  let outstanding = depth;
  let msgs = 0;
  let bytes = 0;
  const tWarm = performance.now() + warmupMs;
  let measuring = false;
  let t0 = 0;
  let tEnd = Infinity;
  let m0 = 0;
  let b0 = 0;
  let cpu0 = process.cpuUsage();
  let result: PumpResult | undefined;
  let seen = -1;
  let stalled = false;
  // The records every poll copies into (`pollCqInto`), kept for the whole run.
  const wcs: WorkCompletion[] = Array.from({ length: depth }, newWorkCompletion);
  const watchdog = setInterval(() => {
    if (msgs === seen) {
      stalled = true;
      abortWaiters(cq.core, 'stalled');
    }
    seen = msgs;
  }, stallMs);
  try {
    while (result === undefined) {
      let wc: WorkCompletion;
      try {
        wc = await cq.next();
      } catch (e) {
        throw new Error(`${what}: ${stalled ? `no completion for ${stallMs} ms` : (e as Error).message}`);
      }
      if (wc.status !== 'SUCCESS') throw new Error(`${what}: completion ${wc.status} (vendor 0x${wc.vendorErr.toString(16)})`);
      let n = 1;
      bytes += wc.byteLen;
      if (cq.core.length > 0) {
        const got = cq.pollInto(wcs, depth);
        for (let i = 0; i < got; i++) {
          const w = wcs[i]!;
          if (w.status !== 'SUCCESS') throw new Error(`${what}: completion ${w.status} (vendor 0x${w.vendorErr.toString(16)})`);
          bytes += w.byteLen;
        }
        n += got;
      }
      msgs += n;
      outstanding -= n;
      const now = performance.now();
      if (!measuring) {
        if (now >= tWarm) {
          measuring = true;
          t0 = now;
          tEnd = now + windowMs;
          m0 = msgs;
          b0 = bytes;
          cpu0 = process.cpuUsage();
        }
      } else if (now >= tEnd) {
        const cpu = process.cpuUsage(cpu0);
        result = { msgs: msgs - m0, bytes: bytes - b0, seconds: (now - t0) / 1000, drained: false, cpuUs: cpu.user + cpu.system };
        break;
      }
      post(n);
      outstanding += n;
    }
  } finally {
    clearInterval(watchdog);
  }
  try {
    while (outstanding > 0) {
      await nextWc(cq, `${what} (drain)`, 3000);
      outstanding -= 1 + cq.pollInto(wcs, depth);
    }
    result.drained = true;
  } catch {
    // Reported through `drained`; the figure stands.
  }
  return result;
}

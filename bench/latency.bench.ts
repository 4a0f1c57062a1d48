/**
 * RC ping-pong latency between two processes over loopback, against the raw `dgram` ping-pong of the
 * same datagram size, which the suite runs in the same pair of processes between its RC cases, round
 * by round (`latBaselineName`). The pinger (127.0.0.1) runs on CPU 0 and the ponger (127.0.0.2) on
 * CPU 1, as the `dgram` pinger and echo do, so that both pay the same cross-CPU wake-ups.
 *
 * - SEND/RECV: the pinger posts a SEND and waits for the ponger's SEND in its receive completion; the
 *   ponger answers each receive with a SEND. Sends are unsignaled (no send completions to reap); each
 *   message is still acknowledged, so a round trip moves four datagrams where `dgram` moves two.
 * - WRITE, polled: the pinger RDMA-WRITEs into the ponger's buffer with a sequence number in the last
 *   byte; the ponger spins on that byte (one check per event-loop turn, `setImmediate`) and writes back
 *   the same way. Both sides poll, so neither sleeps in epoll between messages (perftest's
 *   ib_write_lat does the same), which the `dgram` ping-pong does: this row can beat its baseline.
 * - WRITE_WITH_IMM: as WRITE, but each side waits for the immediate's receive completion (it sleeps
 *   in epoll, like the `dgram` ping-pong).
 *
 * Message sizes make the request datagram 64 bytes (BTH 12 + ICRC 4, plus RETH 16 for WRITE and ImmDt 4
 * with an immediate) so that the baseline is the 64-byte `dgram` ping-pong; one SEND case fills a
 * 1100-byte datagram. Path MTU 4096.
 *
 * Run alone: `node dist/bench/latency.bench.js [--quick]` (after `npm run build`).
 */

import { performance } from 'node:perf_hooks';
import { setImmediate as yieldTurn } from 'node:timers/promises';
import { pathToFileURL } from 'node:url';
import { abortWaiters } from '../src/api/async.js';
import { postRecv, postSend, regMr } from '../src/api/verbs.js';
import type { RecvWr, SendWr } from '../src/core/types.js';
import { workloads as dgramWorkloads } from './dgram.bench.js';
import { formatRows, median, pairedRatios, type BenchRow } from './harness.js';
import { machineLine, runCases, type CaseOutcome, type ChildContext, type ProcCase, type Workload } from './procs.js';
import {
  closeSide, connectRc, makeRcQp, openSide, peerInfo, psnFor, settle, RX_ADDRESS, TX_ADDRESS, type QpInfo, type Side,
} from './rc-common.js';
import { spawnPair, withBaseline, type SuiteOptions } from './rc.bench.js';

export type LatMode = 'SEND' | 'WRITE' | 'WRITE_WITH_IMM';
const MTU = 4096;
const RECV_DEPTH = 16;

interface LatArgs {
  mode: LatMode;
  size: number;
  warmup: number;
  windowMs: number;
  maxSamples: number;
  /** The ponger: echoes before its CPU time is counted (the pinger's warmup). */
  cpuAfter?: number;
}
interface LatInfo extends QpInfo {
  rkey: number;
  va: string;
}
export interface LatResult {
  n: number;
  medianUs: number;
  p99Us: number;
  /**
   * The pinger's CPU time (user + system) per round trip of the timed window, µs: steadier than the
   * round trip on a shared machine, where another process delays a side but does not add to its CPU.
   */
  cpuUs?: number;
}
/** The ponger's answer: messages echoed, and its CPU time per echo after `cpuAfter` of them, µs. */
export interface PongResult {
  echoed: number;
  cpuUs?: number;
}

/** One side of the exchange: its device, QP, buffer, and how to send and wait for one message. */
interface Peer {
  side: Side;
  send: (seq: number) => void;
  /** Resolves when message `seq` from the other side has arrived. */
  wait: (seq: number) => Promise<void>;
}

async function setUp(args: LatArgs, ctx: ChildContext, me: 'tx' | 'rx', stop: AbortSignal): Promise<Peer> {
  const side = await openSide(me === 'tx' ? TX_ADDRESS : RX_ADDRESS, MTU, 64);
  try {
    const buf = regMr(side.pd, Buffer.alloc(Math.max(64, args.size)), 0x7);
    const src = regMr(side.pd, Buffer.alloc(Math.max(64, args.size), 0x11), 0x7);
    const qp = makeRcQp(side, { maxSendWr: 64, maxRecvWr: RECV_DEPTH, maxSendSge: 1, maxRecvSge: 1, maxInlineData: 0 }, false);
    const polled = args.mode === 'WRITE';
    const recv: RecvWr = args.mode === 'SEND' ? { wrId: 1, sgList: [buf.sge(0, args.size)] } : { wrId: 1 };
    if (!polled) postRecv(qp, new Array<RecvWr>(RECV_DEPTH).fill(recv));
    const psn = psnFor(qp.qpNum, me === 'tx' ? 0x1234 : 0x4321);
    const peers = await ctx.ready({ address: side.ctx.address, port: side.ctx.port, qpn: qp.qpNum, psn, rkey: buf.rkey, va: buf.va(0).toString() } satisfies LatInfo);
    const other = peerInfo<LatInfo>(peers, me === 'tx' ? 'rx' : 'tx');
    connectRc(qp, other, psn, MTU);
    const last = args.size - 1;
    const wr: SendWr = args.mode === 'SEND'
      ? { wrId: 2, opcode: 'SEND', sgList: [src.sge(0, args.size)] }
      : {
          wrId: 2, opcode: args.mode === 'WRITE' ? 'RDMA_WRITE' : 'RDMA_WRITE_WITH_IMM', sgList: [src.sge(0, args.size)],
          rdma: { remoteAddr: BigInt(other.va), rkey: other.rkey }, ...(args.mode === 'WRITE_WITH_IMM' ? { immData: 0 } : {}),
        };
    const send = (seq: number): void => {
      src.buffer[last] = seq;
      if (args.mode === 'WRITE_WITH_IMM') wr.immData = seq;
      postSend(qp, wr);
    };
    const mem = buf.buffer;
    const wait = polled
      ? (seq: number): Promise<void> =>
          new Promise<void>((resolve, reject) => {
            const deadline = performance.now() + 5000;
            const check = (): void => {
              if (mem[last] === seq) return resolve();
              if (stop.aborted) return reject(new Error('stopped'));
              if (performance.now() > deadline) return reject(new Error(`WRITE ${seq} not seen within 5 s`));
              setImmediate(check);
            };
            check();
          })
      : async (): Promise<void> => {
          // No timer or abort listener per wait: a stall or a stop rejects the CQ's waiters.
          const wc = await side.cq.next().catch((e: Error) => {
            throw new Error(stop.aborted ? 'stopped' : `${args.mode} receive: ${e.message}`);
          });
          if (wc.status !== 'SUCCESS') throw new Error(`${args.mode} receive: completion ${wc.status}`);
          postRecv(qp, recv);
        };
    stop.addEventListener('abort', () => abortWaiters(side.cq.core, 'stopped'), { once: true });
    return { side, send, wait };
  } catch (e) {
    await closeSide(side);
    throw e;
  }
}

/** Sequence numbers 1..255: never 0, the polled buffer's initial value. */
const nextSeq = (s: number): number => (s % 255) + 1;

const latPinger: Workload = async (args: LatArgs, ctx: ChildContext): Promise<LatResult> => {
  const stall = new AbortController();
  const p = await setUp(args, ctx, 'tx', stall.signal);
  let progress = 0;
  let seen = -1;
  const watchdog = setInterval(() => {
    if (progress === seen) stall.abort();
    seen = progress;
  }, 5000);
  try {
    await settle();
    const rtts = new Float64Array(args.maxSamples);
    let n = 0;
    let seq = 0;
    for (let i = 0; i < args.warmup; i++) {
      seq = nextSeq(seq);
      p.send(seq);
      await p.wait(seq);
      progress++;
    }
    const tEnd = performance.now() + args.windowMs;
    const c0 = process.cpuUsage();
    for (;;) {
      seq = nextSeq(seq);
      const t0 = performance.now();
      p.send(seq);
      await p.wait(seq);
      const t1 = performance.now();
      rtts[n++] = (t1 - t0) * 1000;
      progress++;
      if (t1 >= tEnd || n === args.maxSamples) break;
    }
    const c = process.cpuUsage(c0);
    const v = Array.from(rtts.subarray(0, n)).sort((a, b) => a - b);
    const q = (x: number): number => v[Math.min(v.length - 1, Math.floor(x * v.length))] ?? NaN;
    return { n, medianUs: q(0.5), p99Us: q(0.99), cpuUs: (c.user + c.system) / n };
  } catch (e) {
    throw stall.signal.aborted ? new Error(`${args.mode} ping-pong: no answer for 5 s`) : e;
  } finally {
    clearInterval(watchdog);
    await closeSide(p.side);
  }
};

const latPonger: Workload = async (args: LatArgs, ctx: ChildContext): Promise<PongResult> => {
  const ac = new AbortController();
  void ctx.stopped.then(() => ac.abort());
  const p = await setUp(args, ctx, 'rx', ac.signal);
  let echoed = 0;
  const cpuAfter = args.cpuAfter ?? 0;
  let c0 = cpuAfter === 0 ? process.cpuUsage() : undefined;
  try {
    let seq = 0;
    while (!ctx.isStopped()) {
      seq = nextSeq(seq);
      try {
        await p.wait(seq);
      } catch (e) {
        if (ctx.isStopped()) break;
        throw e;
      }
      p.send(seq);
      if (++echoed === cpuAfter) c0 = process.cpuUsage();
    }
    // Read when the stop ends the wait: what it costs once is nothing spread over the echoes.
    const c = c0 !== undefined ? process.cpuUsage(c0) : undefined;
    // Let the last answer leave before the device closes.
    await yieldTurn();
    return { echoed, ...(c !== undefined && echoed > cpuAfter ? { cpuUs: (c.user + c.system) / (echoed - cpuAfter) } : {}) };
  } finally {
    await closeSide(p.side);
  }
};

// The `dgram` ping-pong's two sides as well: the suite runs its baseline between its own rounds.
export const workloads: Record<string, Workload> = { latPinger, latPonger, pingPinger: dgramWorkloads['pingPinger']!, pingPonger: dgramWorkloads['pingPonger']! };

// ---------------------------------------------------------------------------------------------------
// Suite

interface LatCase {
  mode: LatMode;
  size: number;
  /** The datagram the request makes: the `dgram` ping-pong row it is compared with. */
  datagram: number;
}
const CASES: readonly LatCase[] = [
  { mode: 'SEND', size: 48, datagram: 64 },
  { mode: 'WRITE', size: 32, datagram: 64 },
  { mode: 'WRITE_WITH_IMM', size: 28, datagram: 64 },
  { mode: 'SEND', size: 1084, datagram: 1100 },
];

export function latRowName(c: LatCase, stat: 'median' | 'p99'): string {
  const how = c.mode === 'WRITE' ? 'WRITE polled' : c.mode === 'SEND' ? 'SEND/RECV' : 'WRITE_WITH_IMM';
  return `rc ping-pong ${how} ${c.size} B (${c.datagram} B datagram): RTT ${stat}`;
}

/** The baseline row: the `dgram` ping-pong of a datagram size, run between this suite's own rounds. */
export function latBaselineName(datagram: number, stat: 'median' | 'p99'): string {
  return `dgram ping-pong ${datagram} B, between the RC rounds: RTT ${stat}`;
}

const BASELINE_SIZES = [64, 1100] as const;

export async function run(opts: SuiteOptions): Promise<BenchRow[]> {
  const quick = opts.quick;
  const windowMs = quick ? 300 : 1000;
  // Seven rounds, where the goodput suites take five: a single round's ratio to its baseline ranges
  // from 0.6 to 2.9 on this VM (the wake-up of an idle virtual CPU dominates both figures).
  const rounds = quick ? 3 : 7;
  const warmup = quick ? 500 : 2000;
  // The baseline runs in the same pair of processes, round by round between the RC cases: this VM's
  // wake-up latency, most of a sleeping round trip, drifts by half within minutes, so a baseline taken
  // in the `dgram` suite minutes earlier moved the ratios more than the code did.
  const baselineCases: ProcCase[] = BASELINE_SIZES.map((size) => ({
    name: latBaselineName(size, 'median'),
    timeoutMs: 5000 + 3 * windowMs,
    tasks: {
      tx: { workload: 'pingPinger', args: { size, warmup, windowMs, maxSamples: 200_000 } },
      rx: { workload: 'pingPonger', primary: false },
    },
    measure: (r) => {
      const p = r['tx'] as LatResult;
      return { median: p.medianUs, p99: p.p99Us, n: p.n };
    },
  }));
  const rcCases: ProcCase[] = CASES.map((c) => ({
    name: latRowName(c, 'median'),
    timeoutMs: 15_000 + 3 * windowMs,
    tasks: {
      tx: { workload: 'latPinger', args: { mode: c.mode, size: c.size, warmup, windowMs, maxSamples: 200_000 } satisfies LatArgs },
      rx: { workload: 'latPonger', primary: false, args: { mode: c.mode, size: c.size, warmup: 0, windowMs, maxSamples: 0, cpuAfter: warmup } satisfies LatArgs },
    },
    measure: (r) => {
      const p = r['tx'] as LatResult;
      return { median: p.medianUs, p99: p.p99Us, n: p.n, cpu: (p.cpuUs ?? NaN) + ((r['rx'] as PongResult).cpuUs ?? NaN) };
    },
  }));
  let noted = false;
  // Each baseline just before the RC cases of its datagram size.
  const order = [baselineCases[0]!, ...rcCases.slice(0, 3), baselineCases[1]!, rcCases[3]!];
  const outcomeOf = (c: ProcCase): CaseOutcome => outcomes[order.indexOf(c)]!;
  const outcomes = await runCases(() => spawnPair(new URL(import.meta.url)), order, rounds, (g) => {
    if (!noted) opts.log?.(`${g.pinning}; ${rounds} rounds of ${windowMs} ms after ${warmup} round trips of warmup, the dgram ping-pong between the RC cases of every round; path MTU ${MTU}; medians`);
    noted = true;
  });
  const rows: BenchRow[] = [];
  BASELINE_SIZES.forEach((size, i) => {
    const o = outcomeOf(baselineCases[i]!);
    for (const stat of ['median', 'p99'] as const) {
      rows.push({ name: latBaselineName(size, stat), value: o.error !== undefined || o.rounds.length === 0 ? NaN : o.medians[stat]!, unit: 'µs' });
    }
    if (o.error !== undefined) opts.log?.(`FAILED ${latBaselineName(size, 'median')}: ${o.error}`);
  });
  const baselines = rows.slice();
  CASES.forEach((c, i) => {
    const o = outcomeOf(rcCases[i]!);
    if (o.error !== undefined || o.rounds.length === 0) {
      opts.log?.(`FAILED ${latRowName(c, 'median')}: ${o.error ?? 'no round'}`);
      rows.push({ name: latRowName(c, 'median'), value: NaN, unit: 'µs' });
      return;
    }
    const base = outcomeOf(baselineCases[BASELINE_SIZES.indexOf(c.datagram as (typeof BASELINE_SIZES)[number])]!);
    for (const stat of ['median', 'p99'] as const) {
      const row = withBaseline({ name: latRowName(c, stat), value: o.medians[stat]!, unit: 'µs' }, latBaselineName(c.datagram, stat), baselines);
      // The median of the rounds' own ratios: the baseline ran just before this case in each round.
      const perRound = base.error === undefined ? pairedRatios(o.rounds, base.rounds, stat) : [];
      rows.push(row.ratio !== undefined && perRound.length > 0 ? { ...row, ratio: median(perRound) } : row);
      if (stat === 'median') {
        opts.log?.(
          `${latRowName(c, 'median')}: ${Math.round(o.medians['n']!)} round trips per round; CPU ${o.medians['cpu']!.toFixed(1)} µs per round trip, ` +
            `both sides; over the baseline, round by round: ${perRound.map((x) => x.toFixed(2)).join(' ')}`,
        );
      }
    }
  });
  return rows;
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href && process.send === undefined) {
  console.log(machineLine());
  const quick = process.argv.includes('--quick');
  const log = (l: string): void => console.log(l);
  console.log(formatRows(await run({ quick, log })));
}

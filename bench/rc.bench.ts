/**
 * RC goodput between two processes over loopback: RDMA WRITE, READ and SEND at path MTU 1024 and 4096,
 * 1 MiB and 4 KiB messages. The initiator (127.0.0.1, CPU 0) keeps a fixed number of WRs outstanding,
 * every one signaled, and counts the payload bytes of the WRs that complete in the window; the target
 * (127.0.0.2, CPU 1) serves WRITE and READ without its application doing anything, and for SEND keeps
 * receives posted (reposting as they complete). The same placement as the `dgram` baselines.
 *
 * Each figure's ratio is to the `dgram` connected blast at the datagram size of a full packet of the
 * same path MTU (1024 → 1100 B, 4096 → 4150 B; `dgramBaselineName`), measured earlier in the same run.
 * Goodput counts payload bytes, the baseline UDP payload bytes, so a perfect stack reads 0.987 (4096 /
 * 4150) or 0.93 (1024 / 1100) of it; the practical no-loss ceiling is the windowed unconnected row
 * (~0.8 of the blast), which the log line after the table compares against too.
 *
 * Run alone: `node dist/bench/rc.bench.js [--quick] [--baseline]` (after `npm run build`); ratios need
 * `--baseline`, which runs the `dgram` suite first.
 */

import { pathToFileURL } from 'node:url';
import { abortWaiters } from '../src/api/async.js';
import { postRecv, postSend, regMr } from '../src/api/verbs.js';
import { newWorkCompletion } from '../src/core/cq.js';
import type { RecvWr, SendWr, WorkCompletion, WrOpcode } from '../src/core/types.js';
import { dgramBaselineName } from './dgram.bench.js';
import { formatRows, type BenchRow } from './harness.js';
import { machineLine, ProcGroup, runCases, type ChildContext, type ProcCase, type Workload } from './procs.js';
import {
  closeSide, connectRc, healthOf, makeRcQp, nextWc, openSide, peerInfo, psnFor, pump, settle, RX_ADDRESS, TX_ADDRESS,
  type QpInfo, type Side,
} from './rc-common.js';

export type RcOp = 'WRITE' | 'READ' | 'SEND';
export const RC_OPS: readonly RcOp[] = ['WRITE', 'READ', 'SEND'];
export const RC_MTUS = [1024, 4096] as const;
const MiB = 1 << 20;
const KiB = 1 << 10;

/** UDP payload of a full-MTU RoCE packet, i.e. the `dgram` baseline size for a path MTU. */
export function datagramSizeForMtu(mtu: number): number {
  return mtu === 1024 ? 1100 : mtu === 2048 ? 2100 : mtu === 4096 ? 4150 : mtu === 256 ? 300 : mtu + 54;
}

function sizeLabel(size: number): string {
  return size >= MiB ? `${size / MiB} MiB` : `${size / KiB} KiB`;
}

export function rcRowName(op: RcOp, mtu: number, size: number): string {
  return `rc ${op} ${sizeLabel(size)} mtu ${mtu}: goodput`;
}

const WR_OPCODE: Record<RcOp, WrOpcode> = { WRITE: 'RDMA_WRITE', READ: 'RDMA_READ', SEND: 'SEND' };

// ---------------------------------------------------------------------------------------------------
// Child workloads

interface TargetArgs {
  op: RcOp;
  mtu: number;
  size: number;
  /** Receives kept posted (SEND). */
  recvDepth: number;
}
interface TargetInfo extends QpInfo {
  rkey: number;
  va: string;
}

/** The passive side: exposes one region; for SEND keeps `recvDepth` receives posted until stopped. */
const rcTarget: Workload = async (args: TargetArgs, ctx: ChildContext) => {
  let side: Side | undefined;
  try {
    side = await openSide(RX_ADDRESS, args.mtu, Math.max(16, args.recvDepth * 2));
    const s = side;
    const region = regMr(s.pd, Buffer.alloc(args.size, 0x3c), 0x7);
    const qp = makeRcQp(s, { maxSendWr: 16, maxRecvWr: Math.max(1, args.recvDepth), maxSendSge: 1, maxRecvSge: 1 }, false);
    // Every receive lands in the same region: the benchmark moves bytes, it does not read them.
    const recv: RecvWr = { wrId: 1, sgList: [region.sge(0, args.size)] };
    const recvs: RecvWr[] = new Array<RecvWr>(args.recvDepth).fill(recv);
    // The list of the first n, made once per n (as the initiator's, below).
    const recvLists: RecvWr[][] = [];
    if (args.op === 'SEND') postRecv(qp, recvs);
    const psn = psnFor(qp.qpNum, 0x5a5a);
    const info: TargetInfo = { address: RX_ADDRESS, port: s.ctx.port, qpn: qp.qpNum, psn, rkey: region.rkey, va: region.va(0).toString() };
    const peers = await ctx.ready(info);
    connectRc(qp, peerInfo<QpInfo>(peers, 'tx'), psn, args.mtu);
    let received = 0;
    // The records the receive completions are copied into (`pollCqInto`), kept for the whole run.
    const wcs: WorkCompletion[] = Array.from({ length: args.recvDepth }, newWorkCompletion);
    if (args.op === 'SEND') {
      // No timer or abort listener per wait (they would cost the target per batch): the stop
      // rejects the CQ's pending wait.
      void ctx.stopped.then(() => abortWaiters(s.cq.core, 'stopped'));
      while (!ctx.isStopped()) {
        let wc: WorkCompletion;
        try {
          wc = await s.cq.next();
        } catch (e) {
          if (ctx.isStopped()) break;
          throw e;
        }
        if (wc.status !== 'SUCCESS') throw new Error(`target receive: completion ${wc.status}`);
        const got = s.cq.pollInto(wcs, args.recvDepth);
        for (let i = 0; i < got; i++) if (wcs[i]!.status !== 'SUCCESS') throw new Error(`target receive: completion ${wcs[i]!.status}`);
        const n = 1 + got;
        received += n;
        postRecv(qp, recvLists[n] ??= recvs.slice(0, n));
      }
    } else {
      await ctx.stopped;
    }
    return { received, health: healthOf(s) };
  } finally {
    await closeSide(side);
  }
};

interface InitiatorArgs {
  op: RcOp;
  mtu: number;
  size: number;
  depth: number;
  warmupMs: number;
  windowMs: number;
}
export interface InitiatorResult {
  msgs: number;
  bytes: number;
  seconds: number;
  drained: boolean;
  cpuUs: number;
  health: Record<string, number>;
}

/** Keeps `depth` WRs of `size` bytes outstanding against the target and counts what completes. */
const rcInitiator: Workload = async (args: InitiatorArgs, ctx: ChildContext): Promise<InitiatorResult> => {
  let side: Side | undefined;
  try {
    side = await openSide(TX_ADDRESS, args.mtu, args.depth * 2);
    const s = side;
    const local = regMr(s.pd, Buffer.alloc(args.size, 0xa5), 0x7);
    const qp = makeRcQp(s, { maxSendWr: args.depth, maxRecvWr: 1, maxSendSge: 1, maxRecvSge: 1 }, true);
    const psn = psnFor(qp.qpNum, 0xa5a5);
    const peers = await ctx.ready({ address: TX_ADDRESS, port: s.ctx.port, qpn: qp.qpNum, psn } satisfies QpInfo);
    const rx = peerInfo<TargetInfo>(peers, 'rx');
    connectRc(qp, rx, psn, args.mtu);
    await settle();
    const opcode = WR_OPCODE[args.op];
    const rdma = args.op === 'SEND' ? undefined : { remoteAddr: BigInt(rx.va), rkey: rx.rkey };
    const wrOf = (len: number): SendWr => ({ wrId: 1, opcode, sgList: [local.sge(0, len)], ...(rdma ? { rdma } : {}) });
    postSend(qp, wrOf(Math.min(64, args.size)));
    await nextWc(s.cq, `${args.op} priming`);
    // One WR object, posted as many times as there is room: posting copies it into a WQE.
    const wr = wrOf(args.size);
    const batch: SendWr[] = new Array<SendWr>(args.depth).fill(wr);
    // The list of the first n, made once per n: a slice per post was the benchmark's own garbage.
    const lists: SendWr[][] = [];
    const post = (n: number): void => postSend(qp, (lists[n] ??= batch.slice(0, n)));
    const r = await pump(s.cq, post, args.depth, args.warmupMs, args.windowMs, `${args.op} ${args.size} B`);
    return { ...r, health: healthOf(s) };
  } finally {
    await closeSide(side);
  }
};

export const workloads: Record<string, Workload> = { rcTarget, rcInitiator };

// ---------------------------------------------------------------------------------------------------
// Suite

export interface SuiteOptions {
  quick: boolean;
  log?: (line: string) => void;
  /** Rows measured earlier in the same run (the `dgram` baselines); ratios are to these. */
  baselines?: readonly BenchRow[];
}

export function spawnPair(module: URL, execArgv: string[] = []): Promise<ProcGroup> {
  return ProcGroup.spawn([
    { name: 'tx', module, cpu: 0, execArgv },
    { name: 'rx', module, cpu: 1, execArgv },
  ]);
}

/** Adds the ratio to `baseline` when that row was measured in this run. */
export function withBaseline(row: BenchRow, baseline: string, baselines: readonly BenchRow[] | undefined): BenchRow {
  const b = baselines?.find((r) => r.name === baseline);
  if (b === undefined || !Number.isFinite(b.value) || !Number.isFinite(row.value)) return row;
  return { ...row, baseline, ratio: row.value / b.value };
}

/** Depth per message size: 32 WRs of 1 MiB (the PSN window, not the WR count, bounds the bytes in flight), 128 of 4 KiB. */
function depthFor(size: number): number {
  return size >= MiB ? 32 : 128;
}

export async function run(opts: SuiteOptions): Promise<BenchRow[]> {
  const quick = opts.quick;
  const warmupMs = quick ? 100 : 250;
  const windowMs = quick ? 300 : 1000;
  const rounds = quick ? 3 : 5;
  const cases: (ProcCase & { op: RcOp; mtu: number; size: number })[] = [];
  // ROCE_BENCH_ONLY=<regexp>: only the rows whose name matches (for before/after runs of one case).
  const onlyEnv = process.env['ROCE_BENCH_ONLY'];
  const only = onlyEnv ? new RegExp(onlyEnv) : undefined;
  for (const mtu of RC_MTUS) {
    for (const size of [MiB, 4 * KiB]) {
      for (const op of RC_OPS) {
        const depth = depthFor(size);
        if (only !== undefined && !only.test(rcRowName(op, mtu, size))) continue;
        cases.push({
          name: rcRowName(op, mtu, size),
          op, mtu, size,
          timeoutMs: 15_000 + 3 * (warmupMs + windowMs),
          tasks: {
            tx: { workload: 'rcInitiator', args: { op, mtu, size, depth, warmupMs, windowMs } satisfies InitiatorArgs },
            rx: { workload: 'rcTarget', primary: false, args: { op, mtu, size, recvDepth: op === 'SEND' ? 2 * depth : 0 } satisfies TargetArgs },
          },
          measure: (r) => {
            const tx = r['tx'] as InitiatorResult;
            const h = tx.health;
            return {
              gbps: (tx.bytes * 8) / tx.seconds / 1e9,
              kmsgs: tx.msgs / tx.seconds / 1e3,
              retrans: h['retransPkts'] ?? 0,
              timeouts: (h['ackTimeouts'] ?? 0) + (h['compRetry'] ?? 0),
              drained: tx.drained ? 1 : 0,
              txCpuUsPerMB: tx.cpuUs / (tx.bytes / 1e6),
              txBusy: tx.cpuUs / 1e6 / tx.seconds,
            };
          },
        });
      }
    }
  }
  let noted = false;
  const outcomes = await runCases(() => spawnPair(new URL(import.meta.url)), cases, rounds, (g) => {
    if (!noted) opts.log?.(`${g.pinning}; ${rounds} rounds, window ${windowMs} ms after ${warmupMs} ms warmup; depth 32 × 1 MiB or 128 × 4 KiB, every WR signaled; medians`);
    noted = true;
  });
  const rows: BenchRow[] = [];
  const notes: string[] = [];
  cases.forEach((c, i) => {
    const o = outcomes[i]!;
    if (o.error !== undefined || o.rounds.length === 0) {
      opts.log?.(`FAILED ${c.name}: ${o.error ?? 'no round'}`);
      rows.push({ name: c.name, value: NaN, unit: 'Gbit/s' });
      return;
    }
    const dsize = datagramSizeForMtu(c.mtu);
    rows.push(withBaseline({ name: c.name, value: o.medians['gbps']!, unit: 'Gbit/s' }, dgramBaselineName(dsize), opts.baselines));
    const retrans = o.rounds.reduce((a, x) => a + (x['retrans'] ?? 0), 0);
    const timeouts = o.rounds.reduce((a, x) => a + (x['timeouts'] ?? 0), 0);
    const undrained = o.rounds.filter((x) => x['drained'] === 0).length;
    const windowed = opts.baselines?.find((b) => b.name === dgramBaselineName(dsize, 'windowed unconnected'));
    const vsWindowed = windowed && Number.isFinite(windowed.value) ? `, ${(o.medians['gbps']! / windowed.value).toFixed(2)} of windowed unconnected` : '';
    notes.push(`${c.name}: ${o.medians['kmsgs']!.toFixed(1)} k msgs/s${vsWindowed}; initiator CPU ${o.medians['txCpuUsPerMB']!.toFixed(0)} µs/MB, busy ${(100 * o.medians['txBusy']!).toFixed(0)} %; over ${o.rounds.length} rounds ${retrans} retransmitted packets, ${timeouts} ACK timeouts/retries${undrained ? `, ${undrained} rounds not drained` : ''}`);
  });
  for (const n of notes) opts.log?.(n);
  return rows;
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href && process.send === undefined) {
  console.log(machineLine());
  const quick = process.argv.includes('--quick');
  const log = (l: string): void => console.log(l);
  const { run: runDgram } = await import('./dgram.bench.js');
  const baselines = process.argv.includes('--baseline') ? await runDgram({ quick, log }) : undefined;
  const rows = await run(baselines ? { quick, log, baselines } : { quick, log });
  console.log(formatRows(rows));
}

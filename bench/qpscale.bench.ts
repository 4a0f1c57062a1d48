/**
 * QP scale: 1, 100, 1,000 and 10,000 connected RC QPs between one pair of processes (127.0.0.1 on
 * CPU 0, 127.0.0.2 on CPU 1, one device each).
 *
 * - Heap per idle QP: each child, started with `--expose-gc`, collects garbage and reads
 *   `process.memoryUsage().heapUsed` after opening its device, PD, CQ and region, then again after
 *   creating its N QPs (the default caps) and connecting every one to RTS (idle: nothing posted, no
 *   timer armed). The
 *   difference over N is what one connected RC QP costs on the JS heap, its `Qp` handle and every
 *   per-QP entry of the device included. Not reported for N = 1, where it is below the noise of a GC.
 * - Aggregate goodput: the initiator keeps 128 RDMA WRITEs of 4 KiB outstanding in total (path MTU
 *   4096), each new one on the next QP in round-robin order, so every QP carries traffic and the bytes
 *   in flight stay those of the single-QP case: the ratio to one QP measures what the number of QPs
 *   costs, not a larger window. (128 WRs on one QP is also the `rc WRITE 4 KiB mtu 4096` case.)
 *
 * Run alone: `node dist/bench/qpscale.bench.js [--quick]` (after `npm run build`); `--qps 1000 --ms 5000
 * --rounds 1` runs only the listed QP counts with a longer window, e.g. for `perf record` of one case;
 * `--warmup MS` changes the warm-up before each window.
 */

import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { postSend, regMr, type Qp } from '../src/api/verbs.js';
import type { SendWr } from '../src/core/types.js';
import { dgramBaselineName } from './dgram.bench.js';
import { formatRows, median, pairedRatios, type BenchRow } from './harness.js';
import { machineLine, runCases, type ChildContext, type ProcCase, type Workload } from './procs.js';
import {
  closeSide, connectRc, healthOf, makeRcQp, nextWc, openSide, peerInfo, psnFor, pump, settle, RX_ADDRESS, TX_ADDRESS, type Side,
} from './rc-common.js';
import { spawnPair, withBaseline, type SuiteOptions } from './rc.bench.js';

export const QP_COUNTS = [1, 100, 1000, 10_000] as const;
const MTU = 4096;
const SIZE = 4096;
const DEPTH = 128;
/**
 * READs outstanding per QP: 16, a common HCA maximum, rather than the 128 the goodput suite asks for.
 * (The responder's table for them grows on use, so it no longer shows in the idle figure.)
 */
const RD_ATOMIC_SCALE = 16;

interface ScaleArgs {
  n: number;
  warmupMs: number;
  windowMs: number;
}
interface ScaleInfo {
  address: string;
  port: number;
  qpns: number[];
  rkey: number;
  va: string;
}
export interface ScaleResult {
  heapPerQp: number;
  setupMs: number;
  msgs: number;
  bytes: number;
  seconds: number;
  /** The initiator's CPU time (user + system) inside the window, µs; 0 for the target. */
  cpuUs: number;
  drained: boolean;
  health: Record<string, number>;
}

function collect(): number {
  const gc = (globalThis as { gc?: () => void }).gc;
  if (gc === undefined) throw new Error('qpscale children need --expose-gc');
  gc();
  gc();
  return process.memoryUsage().heapUsed;
}

/** Both roles: N QPs, connected pairwise by index to the other child's; `tx` then drives WRITEs. */
async function scaleSide(args: ScaleArgs, ctx: ChildContext, me: 'tx' | 'rx'): Promise<ScaleResult> {
  let side: Side | undefined;
  try {
    side = await openSide(me === 'tx' ? TX_ADDRESS : RX_ADDRESS, MTU, DEPTH * 2);
    const s = side;
    const region = regMr(s.pd, Buffer.alloc(SIZE, 0x5a), 0x7);
    const t0 = Date.now();
    const heap0 = collect();
    const qps: Qp[] = new Array<Qp>(args.n);
    const qpns: number[] = new Array<number>(args.n);
    for (let i = 0; i < args.n; i++) {
      qps[i] = makeRcQp(s, {}, true);
      qpns[i] = qps[i]!.qpNum;
    }
    let peers: Record<string, unknown> | undefined = await ctx.ready({ address: s.ctx.address, port: s.ctx.port, qpns, rkey: region.rkey, va: region.va(0).toString() } satisfies ScaleInfo);
    const other = peerInfo<ScaleInfo>(peers, me === 'tx' ? 'rx' : 'tx');
    const otherQpns = other.qpns;
    if (otherQpns.length !== args.n) throw new Error(`peer has ${otherQpns.length} QPs, not ${args.n}`);
    const peer = { address: other.address, port: other.port, qpn: 0, psn: 0 };
    for (let i = 0; i < args.n; i++) {
      peer.qpn = otherQpns[i]!;
      peer.psn = psnFor(peer.qpn, 0x77);
      connectRc(qps[i]!, peer, psnFor(qps[i]!.qpNum, 0x77), MTU, RD_ATOMIC_SCALE);
    }
    const remote = { remoteAddr: BigInt(other.va), rkey: other.rkey };
    // Only what the QPs themselves hold may stay reachable for the second reading.
    peers = undefined;
    other.qpns = [];
    qpns.length = 0;
    const heap1 = collect();
    const setupMs = Date.now() - t0;
    const heapPerQp = (heap1 - heap0) / args.n;
    if (me === 'rx') {
      await ctx.stopped;
      return { heapPerQp, setupMs, msgs: 0, bytes: 0, seconds: 0, cpuUs: 0, drained: true, health: healthOf(s) };
    }
    await settle();
    const wr: SendWr = { wrId: 1, opcode: 'RDMA_WRITE', sgList: [region.sge(0, SIZE)], rdma: remote };
    // The peer connects all its QPs in one synchronous loop before it reads any packet: one
    // completed WRITE on the last QP shows that it is done.
    postSend(qps[args.n - 1]!, { ...wr, sgList: [region.sge(0, 64)] });
    await nextWc(s.cq, 'priming WRITE', 15_000);
    let rr = 0;
    const post = (k: number): void => {
      for (let j = 0; j < k; j++) {
        postSend(qps[rr]!, wr);
        rr = rr + 1 === args.n ? 0 : rr + 1;
      }
    };
    const r = await pump(s.cq, post, DEPTH, args.warmupMs, args.windowMs, `WRITE over ${args.n} QPs`);
    return { heapPerQp, setupMs, ...r, health: healthOf(s) };
  } finally {
    await closeSide(side);
  }
}

export const workloads: Record<string, Workload> = {
  scaleTx: (args: ScaleArgs, ctx: ChildContext) => scaleSide(args, ctx, 'tx'),
  scaleRx: (args: ScaleArgs, ctx: ChildContext) => scaleSide(args, ctx, 'rx'),
};

// ---------------------------------------------------------------------------------------------------
// Suite

const qpLabel = (n: number): string => `${n.toLocaleString('en-US')} RC QP${n === 1 ? '' : 's'}`;
export const heapRowName = (n: number): string => `qpscale ${qpLabel(n)}: heap per idle QP`;
export const goodputRowName = (n: number): string => `qpscale ${qpLabel(n)}: aggregate WRITE 4 KiB goodput`;

/** Run alone, the suite's cases can be narrowed: only some QP counts, another window or number of rounds. */
interface ScaleSuiteOptions extends SuiteOptions {
  counts?: readonly number[];
  warmupMs?: number;
  windowMs?: number;
  rounds?: number;
}


export async function run(opts: ScaleSuiteOptions): Promise<BenchRow[]> {
  const quick = opts.quick;
  const warmupMs = opts.warmupMs ?? (quick ? 100 : 250);
  const windowMs = opts.windowMs ?? (quick ? 300 : 1000);
  // Twenty-one rounds, where the other suites take five: each round's ratio to one QP is a ratio of two
  // one-second figures that a shared machine moves by up to ±30 %, so single rounds spread over 0.4–1.6,
  // and the median of nine still moved by 0.16 between runs of the same code. About two minutes.
  const rounds = opts.rounds ?? (quick ? 3 : 21);
  const counts = opts.counts ?? QP_COUNTS;
  const cases: ProcCase[] = counts.map((n) => ({
    name: goodputRowName(n),
    timeoutMs: 30_000 + 3 * (warmupMs + windowMs),
    tasks: {
      tx: { workload: 'scaleTx', args: { n, warmupMs, windowMs } satisfies ScaleArgs },
      rx: { workload: 'scaleRx', primary: false, args: { n, warmupMs, windowMs } satisfies ScaleArgs },
    },
    measure: (r) => {
      const tx = r['tx'] as ScaleResult;
      const rx = r['rx'] as ScaleResult;
      return {
        gbps: (tx.bytes * 8) / tx.seconds / 1e9,
        heapTx: tx.heapPerQp,
        heapRx: rx.heapPerQp,
        setupMs: Math.max(tx.setupMs, rx.setupMs),
        retrans: tx.health['retransPkts'] ?? 0,
        // What a message costs the initiator (user + system): steadier than goodput on a shared machine.
        cpuPerMsg: tx.cpuUs / tx.msgs,
      };
    },
  }));
  let noted = false;
  const outcomes = await runCases(() => spawnPair(new URL(import.meta.url), ['--expose-gc']), cases, rounds, (g) => {
    if (!noted) opts.log?.(`${g.pinning}; ${rounds} rounds, window ${windowMs} ms after ${warmupMs} ms warmup; ${DEPTH} WRITEs of ${SIZE} B outstanding in total, round-robin over the QPs, path MTU ${MTU}; medians`);
    noted = true;
  });
  const rows: BenchRow[] = [];
  const heapRows: BenchRow[] = [];
  const single = counts[0] === 1 ? outcomes[0]! : undefined;
  counts.forEach((n, i) => {
    const o = outcomes[i]!;
    if (o.error !== undefined || o.rounds.length === 0) {
      opts.log?.(`FAILED ${goodputRowName(n)}: ${o.error ?? 'no round'}`);
      rows.push({ name: goodputRowName(n), value: NaN, unit: 'Gbit/s' });
      if (n > 1) heapRows.push({ name: heapRowName(n), value: NaN, unit: 'B' });
      return;
    }
    const gbps = o.medians['gbps']!;
    const row: BenchRow = { name: goodputRowName(n), value: gbps, unit: 'Gbit/s' };
    if (n === 1) rows.push(withBaseline(row, dgramBaselineName(4150), opts.baselines));
    else if (single !== undefined && single.error === undefined && single.rounds.length > 0) {
      // The ratio is the median of the rounds' own ratios: round k of every QP count runs back to back
      // (runCases interleaves them), so a slow stretch of this shared machine moves both figures of a
      // round together, where it moved a ratio of two medians taken from different rounds.
      const perRound = pairedRatios(o.rounds, single.rounds, 'gbps');
      rows.push({ ...row, baseline: goodputRowName(1), ratio: median(perRound) });
      opts.log?.(`${qpLabel(n)} over 1 RC QP, round by round: ${perRound.map((x) => x.toFixed(2)).join(' ')}`);
    } else rows.push(row);
    if (n > 1) heapRows.push({ name: heapRowName(n), value: o.medians['heapTx']!, unit: 'B' });
    const retrans = o.rounds.reduce((a, x) => a + (x['retrans'] ?? 0), 0);
    // With one QP the difference is the first QP's one-time costs (code compiled, caches made) and what
    // the collector freed meanwhile, not a QP's size, so it is neither a row nor printed.
    const heap = n > 1 ? `heap per idle QP ${Math.round(o.medians['heapTx']!)} B (initiator), ${Math.round(o.medians['heapRx']!)} B (target); ` : '';
    opts.log?.(`${qpLabel(n)}: ${heap}setup ${Math.round(o.medians['setupMs']!)} ms; initiator CPU ${o.medians['cpuPerMsg']!.toFixed(2)} µs per message; ${retrans} retransmitted packets over ${o.rounds.length} rounds; Gbit/s by round ${o.rounds.map((x) => (x['gbps'] ?? NaN).toFixed(2)).join(' ')}`);
  });
  return [...heapRows, ...rows];
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href && process.send === undefined) {
  const { values } = parseArgs({ options: { quick: { type: 'boolean', default: false }, qps: { type: 'string' }, warmup: { type: 'string' }, ms: { type: 'string' }, rounds: { type: 'string' } } });
  console.log(machineLine());
  const rows = await run({
    quick: values.quick,
    log: (l) => console.log(l),
    ...(values.qps !== undefined ? { counts: values.qps.split(',').map(Number) } : {}),
    ...(values.warmup !== undefined ? { warmupMs: Number(values.warmup) } : {}),
    ...(values.ms !== undefined ? { windowMs: Number(values.ms) } : {}),
    ...(values.rounds !== undefined ? { rounds: Number(values.rounds) } : {}),
  });
  console.log(formatRows(rows));
}

/**
 * Profiles one RC goodput case (default: RDMA WRITE, 1 MiB messages, path MTU 4096) in both processes,
 * the figures behind `bench/PROFILE.md`:
 *
 * 1. CPU: the pair runs under `node --cpu-prof`; the top self-time functions of each side, in % of
 *    its samples (idle time included, so a side that waits shows `(idle)`).
 * 2. Allocation: a second pair runs with V8's sampling heap profiler started from inside the child
 *    (inspector `HeapProfiler.startSampling`, objects collected by minor and major GCs included, so it
 *    counts garbage and not only what survives), and counts GCs with a `PerformanceObserver`; bytes
 *    and GCs are divided by the packets that side sent + received.
 *
 *   node dist/bench/rc-profile.js [--op WRITE|READ|SEND] [--mtu 4096] [--size 1048576] [--ms 3000] [--out DIR] [--top 25]
 *   node dist/bench/rc-profile.js --qps 100 [--ms 3000]     # the QP scale case instead: WRITE 4 KiB round-robin over N QPs
 *   node dist/bench/rc-profile.js --no-inline ...           # the children with V8's inlining off: costs under their own functions
 *
 * The raw `.cpuprofile` files stay in DIR (default a fresh folder under the OS temp dir) for Chrome
 * DevTools or speedscope.
 */

import { mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { Session } from 'node:inspector/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PerformanceObserver, constants as perfConstants } from 'node:perf_hooks';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { machineLine, ProcGroup, type ChildContext, type Workload } from './procs.js';
import { workloads as scaleWorkloads } from './qpscale.bench.js';
import { workloads as rcWorkloads, type InitiatorResult, type RcOp } from './rc.bench.js';

// ---------------------------------------------------------------------------------------------------
// Child side: the rc workloads, wrapped in an allocation sampler and a GC counter

interface Sampled {
  result: unknown;
  /** Sampled bytes allocated by function (`name file:line`), and their total. */
  alloc: Record<string, number>;
  allocTotal: number;
  gcs: Record<string, number>;
  gcMs: number;
}

interface ProfileNode {
  callFrame: { functionName: string; url: string; lineNumber: number };
  selfSize: number;
  children: ProfileNode[];
}

function frameName(cf: { functionName: string; url: string; lineNumber: number }): string {
  const file = cf.url.replace(/^file:\/\//, '').replace(/^.*\/dist\//, '');
  return `${cf.functionName || '(anonymous)'} ${file ? `${file}:${cf.lineNumber + 1}` : '(native)'}`;
}

const GC_KINDS: Record<number, string> = {
  [perfConstants.NODE_PERFORMANCE_GC_MINOR]: 'scavenge',
  [perfConstants.NODE_PERFORMANCE_GC_MAJOR]: 'mark-sweep',
  [perfConstants.NODE_PERFORMANCE_GC_INCREMENTAL]: 'incremental',
  [perfConstants.NODE_PERFORMANCE_GC_WEAKCB]: 'weak-callbacks',
};

function sampled(inner: Workload): Workload {
  return async (args: { sampleAlloc: boolean }, ctx: ChildContext): Promise<Sampled> => {
    const gcs: Record<string, number> = {};
    let gcMs = 0;
    const obs = new PerformanceObserver((list) => {
      for (const e of list.getEntries()) {
        const kind = GC_KINDS[(e as unknown as { detail?: { kind?: number } }).detail?.kind ?? -1] ?? 'other';
        gcs[kind] = (gcs[kind] ?? 0) + 1;
        gcMs += e.duration;
      }
    });
    obs.observe({ entryTypes: ['gc'] });
    const session = new Session();
    session.connect();
    try {
      if (args.sampleAlloc) {
        await session.post('HeapProfiler.startSampling', {
          samplingInterval: 4096, includeObjectsCollectedByMajorGC: true, includeObjectsCollectedByMinorGC: true,
        });
      }
      const result = await inner(args, ctx);
      const alloc: Record<string, number> = {};
      let allocTotal = 0;
      if (args.sampleAlloc) {
        const { profile } = (await session.post('HeapProfiler.stopSampling')) as { profile: { head: ProfileNode } };
        const walk = (n: ProfileNode): void => {
          if (n.selfSize > 0) {
            const k = frameName(n.callFrame);
            alloc[k] = (alloc[k] ?? 0) + n.selfSize;
            allocTotal += n.selfSize;
          }
          for (const c of n.children) walk(c);
        };
        walk(profile.head);
      }
      return { result, alloc, allocTotal, gcs, gcMs };
    } finally {
      obs.disconnect();
      session.disconnect();
    }
  };
}

export const workloads: Record<string, Workload> = {
  profInitiator: sampled(rcWorkloads['rcInitiator']!),
  profTarget: sampled(rcWorkloads['rcTarget']!),
  profScaleTx: sampled(scaleWorkloads['scaleTx']!),
  profScaleRx: sampled(scaleWorkloads['scaleRx']!),
};

// ---------------------------------------------------------------------------------------------------
// Parent side

interface CpuProfile {
  nodes: { id: number; callFrame: { functionName: string; url: string; lineNumber: number } }[];
  samples: number[];
  timeDeltas: number[];
}

/** Self time by function, in % of the profile's duration, highest first. */
export function selfTimes(p: CpuProfile): { name: string; pct: number; ms: number }[] {
  const byId = new Map(p.nodes.map((n) => [n.id, n]));
  const ms = new Map<string, number>();
  let total = 0;
  p.samples.forEach((id, i) => {
    const dt = (p.timeDeltas[i + 1] ?? 0) / 1000;
    const n = byId.get(id);
    if (!n) return;
    const k = frameName(n.callFrame);
    ms.set(k, (ms.get(k) ?? 0) + dt);
    total += dt;
  });
  return [...ms].map(([name, t]) => ({ name, ms: t, pct: (100 * t) / total })).sort((a, b) => b.ms - a.ms);
}

function packetsOf(h: Record<string, number> | undefined): number {
  return (h?.['sentPkts'] ?? 0) + (h?.['rcvdPkts'] ?? 0);
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      op: { type: 'string', default: 'WRITE' }, mtu: { type: 'string', default: '4096' }, size: { type: 'string', default: String(1 << 20) },
      ms: { type: 'string', default: '3000' }, out: { type: 'string' }, top: { type: 'string', default: '25' },
      qps: { type: 'string' }, 'no-inline': { type: 'boolean', default: false },
    },
  });
  const op = values.op as RcOp;
  const mtu = Number(values.mtu);
  const size = Number(values.size);
  const windowMs = Number(values.ms);
  const top = Number(values.top);
  const out = values.out ?? join(tmpdir(), `roce-profile-${Date.now()}`);
  mkdirSync(out, { recursive: true });
  const depth = size >= 1 << 20 ? 32 : 128;
  const module = new URL(import.meta.url);
  const qps = values.qps === undefined ? undefined : Number(values.qps);
  const tasks = (sampleAlloc: boolean): Parameters<ProcGroup['round']>[0] => qps !== undefined
    ? {
      tx: { workload: 'profScaleTx', args: { n: qps, warmupMs: 300, windowMs, sampleAlloc } },
      rx: { workload: 'profScaleRx', primary: false, args: { n: qps, warmupMs: 300, windowMs, sampleAlloc } },
    }
    : {
      tx: { workload: 'profInitiator', args: { op, mtu, size, depth, warmupMs: 300, windowMs, sampleAlloc } },
      rx: { workload: 'profTarget', primary: false, args: { op, mtu, size, recvDepth: op === 'SEND' ? 2 * depth : 0, sampleAlloc } },
    };
  // The QP scale children read their heap after a forced collection. With --no-inline, V8 inlines
  // nothing: an optimized frame is its outermost function with what was inlined into it, and both
  // profilers name that function, so an allocation or a cost inside an inlined callee shows up under
  // its caller; without inlining each shows under its own function (at some cost in speed).
  const gcArgv = [...(qps !== undefined ? ['--expose-gc'] : []), ...(values['no-inline'] ? ['--max-inlined-bytecode-size=0'] : [])];
  console.log(machineLine());
  if (values['no-inline']) console.log('V8 inlining off in the children (--max-inlined-bytecode-size=0)');
  console.log(qps !== undefined
    ? `QP scale: WRITE 4096 B round-robin over ${qps} QPs, 128 outstanding, path MTU 4096, ${windowMs} ms; profiles in ${out}\n`
    : `${op} ${size} B, path MTU ${mtu}, depth ${depth}, ${windowMs} ms; profiles in ${out}\n`);

  // 1. CPU profile.
  const cpuGroup = await ProcGroup.spawn(['tx', 'rx'].map((name, cpu) => ({
    name, module, cpu, execArgv: [...gcArgv, '--cpu-prof', `--cpu-prof-dir=${out}`, `--cpu-prof-name=${name}.cpuprofile`, '--cpu-prof-interval=200'],
  })));
  console.log(cpuGroup.pinning);
  try {
    const r = await cpuGroup.round(tasks(false), { timeoutMs: 20_000 + 2 * windowMs });
    const tx = (r['tx'] as Sampled).result as InitiatorResult;
    const gbps = (tx.bytes * 8) / tx.seconds / 1e9;
    console.log(`under --cpu-prof: ${gbps.toFixed(2)} Gbit/s, ${(tx.msgs / tx.seconds).toFixed(0)} msgs/s`);
  } finally {
    await cpuGroup.close(10_000);
  }
  for (const name of ['tx', 'rx']) {
    const file = readdirSync(out).find((f) => f === `${name}.cpuprofile`);
    if (!file) {
      console.log(`no CPU profile from ${name}`);
      continue;
    }
    const rows = selfTimes(JSON.parse(readFileSync(join(out, file), 'utf8')) as CpuProfile);
    console.log(`\n### ${name}: self time, top ${top}\n\n| % | ms | function |\n|---:|---:|---|`);
    for (const x of rows.slice(0, top)) console.log(`| ${x.pct.toFixed(1)} | ${x.ms.toFixed(0)} | \`${x.name}\` |`);
  }

  // 2. Allocation and GC, in a separate pair (the sampler slows the run down).
  const allocGroup = await ProcGroup.spawn([{ name: 'tx', module, cpu: 0, execArgv: gcArgv }, { name: 'rx', module, cpu: 1, execArgv: gcArgv }]);
  try {
    const r = await allocGroup.round(tasks(true), { timeoutMs: 20_000 + 2 * windowMs });
    const summary: Record<string, unknown> = {};
    for (const name of ['tx', 'rx']) {
      const s = r[name] as Sampled;
      const h = (s.result as { health?: Record<string, number> }).health;
      const pkts = packetsOf(h);
      summary[name] = { packets: pkts, allocTotal: s.allocTotal, gcs: s.gcs, gcMs: s.gcMs };
      console.log(`\n### ${name}: allocation (sampled, whole round incl. warmup) — ${pkts} packets sent + received, ` +
        `${(s.allocTotal / Math.max(1, pkts)).toFixed(0)} B per packet; GCs ${JSON.stringify(s.gcs)} ` +
        `(${((1000 * Object.values(s.gcs).reduce((a, b) => a + b, 0)) / Math.max(1, pkts)).toFixed(2)} per 1000 packets, ${s.gcMs.toFixed(0)} ms)\n`);
      console.log('| B per packet | % | function |\n|---:|---:|---|');
      const rows = Object.entries(s.alloc).sort((a, b) => b[1] - a[1]).slice(0, top);
      for (const [k, v] of rows) console.log(`| ${(v / Math.max(1, pkts)).toFixed(1)} | ${((100 * v) / Math.max(1, s.allocTotal)).toFixed(1)} | \`${k}\` |`);
    }
    writeFileSync(join(out, 'alloc.json'), JSON.stringify({ summary, tx: (r['tx'] as Sampled).alloc, rx: (r['rx'] as Sampled).alloc }, null, 1));
  } finally {
    await allocGroup.close(10_000);
  }
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href && process.send === undefined) {
  await main();
}

/**
 * Before/after of the QP scale workload between two built trees, paired round by round: each round
 * runs every QP count on tree A, then on tree B, in one pair of long-lived processes per tree, so
 * the two builds see the same moment of a shared machine. Prints medians per tree and the median
 * of the per-round B/A ratios (goodput, and the initiator's CPU per message), and each tree's ratio
 * of N QPs to one QP (median of the per-round ratios).
 *
 *   node dist/bench/qpscale-ab.js OLD_TREE NEW_TREE [--rounds 8] [--qps 1,100,1000,10000] [--ms 1000]
 *
 * A tree is a checkout built with `npx tsc` (e.g. `git archive REV | tar -x -C /tmp/old`, its
 * `node_modules` linked to this one's).
 */

import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { median } from './harness.js';
import type { ProcGroup } from './procs.js';
import type { ScaleResult } from './qpscale.bench.js';

interface Sample {
  gbps: number;
  cpu: number;
}

async function main(): Promise<void> {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: { rounds: { type: 'string', default: '8' }, qps: { type: 'string', default: '1,100,1000,10000' }, ms: { type: 'string', default: '1000' } },
  });
  if (positionals.length !== 2) throw new Error('usage: qpscale-ab.js OLD_TREE NEW_TREE [--rounds N] [--qps 1,100,…] [--ms W]');
  const counts = values.qps.split(',').map(Number);
  if (!counts.includes(1)) counts.unshift(1);
  const rounds = Number(values.rounds);
  const windowMs = Number(values.ms);
  const groups: ProcGroup[] = [];
  for (const tree of positionals) {
    const dir = resolve(tree, 'dist/bench');
    const rc = (await import(pathToFileURL(`${dir}/rc.bench.js`).href)) as { spawnPair(m: URL, execArgv: string[]): Promise<ProcGroup> };
    groups.push(await rc.spawnPair(pathToFileURL(`${dir}/qpscale.bench.js`), ['--expose-gc']));
  }
  const got = new Map<number, Sample[][]>(counts.map((n) => [n, [[], []]]));
  try {
    for (let r = 0; r < rounds; r++) {
      for (const n of counts) {
        for (let t = 0; t < 2; t++) {
          const args = { n, warmupMs: 250, windowMs };
          const out = await groups[t]!.round({ tx: { workload: 'scaleTx', args }, rx: { workload: 'scaleRx', primary: false, args } }, { timeoutMs: 60_000 + 3 * windowMs });
          const tx = out['tx'] as ScaleResult;
          got.get(n)![t]!.push({ gbps: (tx.bytes * 8) / tx.seconds / 1e9, cpu: tx.cpuUs / tx.msgs });
        }
      }
    }
  } finally {
    for (const g of groups) await g.close();
  }
  const one = got.get(1)!;
  console.log(`A = ${positionals[0]}, B = ${positionals[1]}; ${rounds} rounds of ${windowMs} ms, paired`);
  console.log('| QPs | Gbit/s A → B | paired B/A | ratio to 1 QP A → B | CPU µs/msg A → B | paired B/A |');
  console.log('|---|---|---|---|---|---|');
  for (const n of counts) {
    const [a, b] = got.get(n)! as [Sample[], Sample[]];
    const pair = (k: keyof Sample): number => median(a.map((x, i) => b[i]![k] / x[k]));
    const toOne = (t: number, s: Sample[]): string => (n === 1 ? '—' : median(s.map((x, i) => x.gbps / one[t]![i]!.gbps)).toFixed(2));
    console.log(
      `| ${n.toLocaleString('en-US')} | ${median(a.map((x) => x.gbps)).toFixed(2)} → ${median(b.map((x) => x.gbps)).toFixed(2)} | ${pair('gbps').toFixed(3)} | ` +
        `${toOne(0, a)} → ${toOne(1, b)} | ${median(a.map((x) => x.cpu)).toFixed(2)} → ${median(b.map((x) => x.cpu)).toFixed(2)} | ${pair('cpu').toFixed(3)} |`,
    );
  }
}

await main();

/**
 * `npm run bench [-- --quick] [--json FILE]`: runs every benchmark in this folder, one after another,
 * and prints one table per suite of medians with ratios to each group's baseline (measured in the
 * same run). The two-process suites spawn their own pinned children (`procs.ts`); the rest run in this
 * process. Benchmarks never run as part of `npm test`.
 */

import { writeFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { formatRows, type BenchRow } from './harness.js';
import * as crc from './crc.bench.js';
import * as dgramBench from './dgram.bench.js';
import { machineLine } from './procs.js';
import * as wire from './wire.bench.js';
import * as dcqcn from './dcqcn.bench.js';
import * as latency from './latency.bench.js';
import * as qpscale from './qpscale.bench.js';
import * as rc from './rc.bench.js';
import { formatVerdicts, judgeTargets } from './targets.js';

interface SuiteOptions {
  quick: boolean;
  log: (line: string) => void;
  /** The rows of the suites before this one: the baselines its ratios refer to. */
  baselines: readonly BenchRow[];
}

const SUITES: { name: string; run: (o: SuiteOptions) => Promise<BenchRow[]> }[] = [
  { name: 'dgram baselines, two processes over 127.0.0.1', run: dgramBench.run },
  // Right after the baselines they are compared with, so that little time separates them.
  { name: 'RC goodput, two processes over 127.0.0.1/127.0.0.2', run: rc.run },
  { name: 'RC ping-pong latency', run: latency.run },
  { name: 'RC QP scale', run: qpscale.run },
  { name: 'CRC-32 and ICRC', run: crc.run },
  { name: 'header codecs', run: wire.run },
  { name: 'DCQCN simulator', run: dcqcn.run },
];

const { values } = parseArgs({ options: { quick: { type: 'boolean', default: false }, json: { type: 'string' } } });
const quick = values.quick ?? false;
console.log(`roce-ts benchmarks${quick ? ' (quick)' : ''} — ${new Date().toISOString()}`);
console.log(machineLine());
const all: BenchRow[] = [];
const log = (line: string): void => console.log(line);
for (const s of SUITES) {
  console.log(`\n## ${s.name}\n`);
  const t0 = performance.now();
  try {
    const rows = await s.run({ quick, log, baselines: all });
    console.log(formatRows(rows));
    all.push(...rows);
  } catch (e) {
    console.log(`FAILED: ${e instanceof Error ? e.message : String(e)}`);
    process.exitCode = 1;
  }
  console.log(`(${((performance.now() - t0) / 1000).toFixed(1)} s)`);
}
// Judged on this run alone: one run on a shared machine says what held then, not what holds reliably.
console.log(`\n## Targets, in this run\n\n${formatVerdicts(judgeTargets(all))}`);
const num = (x: number | undefined): number | null => (x === undefined || !Number.isFinite(x) ? null : x);
if (values.json) {
  writeFileSync(values.json, JSON.stringify(all.map((r) => ({ name: r.name, value: num(r.value), unit: r.unit, baseline: r.baseline ?? null, ratio: num(r.ratio) })), null, 2) + '\n');
  console.log(`\nrows written to ${values.json}`);
}

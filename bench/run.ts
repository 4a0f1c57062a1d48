/**
 * `npm run bench [-- --quick] [--json FILE]`: runs every benchmark in this folder in one
 * process, one after another, and prints one table of medians with ratios to each group's
 * baseline (measured in the same run). Benchmarks never run as part of `npm test`.
 */

import { writeFileSync } from 'node:fs';
import { cpus } from 'node:os';
import { parseArgs } from 'node:util';
import { formatRows, type BenchRow } from './harness.js';
import * as crc from './crc.bench.js';
import * as wire from './wire.bench.js';

const SUITES: { name: string; run: (o: { quick: boolean }) => Promise<BenchRow[]> }[] = [
  { name: 'CRC-32 and ICRC', run: crc.run },
  { name: 'header codecs', run: wire.run },
];

const { values } = parseArgs({ options: { quick: { type: 'boolean', default: false }, json: { type: 'string' } } });
const quick = values.quick ?? false;
const cpu = cpus()[0]?.model ?? 'unknown CPU';
console.log(`roce-ts benchmarks — node ${process.version}, ${cpus().length} × ${cpu}${quick ? ' (quick)' : ''}`);
const all: BenchRow[] = [];
for (const s of SUITES) {
  const t0 = performance.now();
  const rows = await s.run({ quick });
  console.log(`\n## ${s.name} (${((performance.now() - t0) / 1000).toFixed(1)} s)\n`);
  console.log(formatRows(rows));
  all.push(...rows);
}
if (values.json) {
  writeFileSync(values.json, JSON.stringify(all.map((r) => ({ name: r.name, value: r.value, unit: r.unit, baseline: r.baseline ?? null, ratio: r.ratio ?? null })), null, 2) + '\n');
  console.log(`\nrows written to ${values.json}`);
}

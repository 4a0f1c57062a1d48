/**
 * `node dist/bench/crosscheck.js [--quick]`: the same CRC-32 cases timed by the hand harness
 * (`harness.ts`: calibrated batches, warmup, median of N samples) and by `benchmark` 2.1.4 (the library
 * named in the design), to show how far the two agree on this machine. Each case runs hand, benchmark,
 * hand again, and the agreement is benchmark's mean against the mean of the two hand medians, so that
 * a load change during the case shows up as a spread between the two hand figures rather than as a
 * disagreement. Figures are recorded in bench/README.md.
 */

import Benchmark from 'benchmark';
import { performance } from 'node:perf_hooks';
import { crc32Implementations } from '../src/wire/crc32.js';
import { measure } from './harness.js';
import { machineLine } from './procs.js';

const quick = process.argv.includes('--quick');

function filled(n: number): Uint8Array {
  const b = new Uint8Array(n + 1);
  let s = n;
  for (let i = 0; i < b.length; i++) {
    s = (s * 1103515245 + 12345) >>> 0;
    b[i] = s >>> 24;
  }
  return b.subarray(1); // unaligned, as payload views are
}

const impl = (name: string): ((d: Uint8Array) => number) => {
  const found = crc32Implementations.find((c) => c.name === name) ?? crc32Implementations[0]!;
  return found.fn;
};
const fastest = crc32Implementations[0]!.name;
const cases: { name: string; fn: (d: Uint8Array) => number; data: Uint8Array }[] = [
  { name: `crc32 ${fastest} 256 B`, fn: impl(fastest), data: filled(256) },
  { name: `crc32 ${fastest} 4096 B`, fn: impl(fastest), data: filled(4096) },
  { name: 'crc32 crc-32 1024 B', fn: impl('crc-32'), data: filled(1024) },
];

let acc = 0;
function viaBenchmark(fn: (d: Uint8Array) => number, data: Uint8Array): { ns: number; rme: number; samples: number } {
  const b = new Benchmark(
    () => {
      acc ^= fn(data);
    },
    quick ? { maxTime: 1, minSamples: 5 } : {},
  );
  b.run();
  if (b.error) throw b.error;
  return { ns: b.stats.mean * 1e9, rme: b.stats.rme, samples: b.stats.sample.length };
}

console.log(`crosscheck: hand harness vs benchmark ${Benchmark.version}${quick ? ' (quick)' : ''}`);
console.log(machineLine());
console.log('');
const w = Math.max(...cases.map((c) => c.name.length));
console.log(`${'case'.padEnd(w)}  ${'hand ns/op (a, b)'.padStart(20)}  ${'benchmark ns/op ±rme'.padStart(22)}  ${'bench/hand'.padStart(10)}  time hand / benchmark`);
const handOpts = quick ? { warmupMs: 50, samples: 7, sampleMs: 10 } : { warmupMs: 200, samples: 15, sampleMs: 20 };
for (const c of cases) {
  const t0 = performance.now();
  const a = measure(() => c.fn(c.data), handOpts).nsPerOp;
  const t1 = performance.now();
  const bm = viaBenchmark(c.fn, c.data);
  const t2 = performance.now();
  const b = measure(() => c.fn(c.data), handOpts).nsPerOp;
  const t3 = performance.now();
  const hand = (a + b) / 2;
  const ratio = bm.ns / hand;
  console.log(
    `${c.name.padEnd(w)}  ${`${a.toFixed(1)}, ${b.toFixed(1)}`.padStart(20)}  ${`${bm.ns.toFixed(1)} ±${bm.rme.toFixed(1)} %`.padStart(22)}  ${ratio.toFixed(3).padStart(10)}  ${((t1 - t0 + t3 - t2) / 2000).toFixed(1)} s / ${((t2 - t1) / 1000).toFixed(1)} s`,
  );
}

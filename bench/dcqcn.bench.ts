/**
 * The DCQCN simulator's speed: simulated µs per wall-clock second for 2, 16 and 64 flows into
 * one 40 Gb/s port, and the wall time of the 64-flow, 100 ms incast (the figure the issue asks
 * to stay well under a minute). Whole runs, timed once each after one warm-up run: a run is
 * long enough that per-run noise is small next to the differences that matter.
 */

import { performance } from 'node:perf_hooks';
import { runDcqcnSim } from '../src/sim/dcqcn-sim.js';
import type { BenchRow } from './harness.js';

function timed(flows: number, durationUs: number, cc = true): { wallMs: number; events: number } {
  const t0 = performance.now();
  const r = runDcqcnSim({ flows, durationUs, cc, seed: 1 });
  return { wallMs: performance.now() - t0, events: r.events };
}

export async function run(opts: { quick: boolean }): Promise<BenchRow[]> {
  const durationUs = opts.quick ? 10_000 : 100_000;
  timed(2, 2_000); // warm-up: JIT, not measured
  const rows: BenchRow[] = [];
  for (const flows of [2, 16, 64]) {
    const { wallMs, events } = timed(flows, durationUs);
    rows.push({ name: `dcqcn sim ${flows} flows: simulated µs per wall s`, value: durationUs / (wallMs / 1000), unit: 'µs/s' });
    rows.push({ name: `dcqcn sim ${flows} flows: events per wall s`, value: events / (wallMs / 1000), unit: 'ev/s' });
  }
  const big = timed(64, 100_000);
  rows.push({ name: 'dcqcn sim 64-flow incast, 100 ms, paper: wall time', value: big.wallMs, unit: 'ms' });
  if (!opts.quick) {
    const nocc = timed(64, 100_000, false);
    rows.push({ name: 'dcqcn sim 64-flow incast, 100 ms, no CC: wall time', value: nocc.wallMs, unit: 'ms' });
  }
  return rows;
}

/**
 * A small hand harness for micro-benchmarks: calibrate a batch size so one sample lasts about
 * `sampleMs`, warm up, take N samples, report the median. The median rather than the mean because the
 * machines this runs on are shared and noisy: a descheduled sample is an outlier, not information.
 */
import { performance } from 'node:perf_hooks';

/** One line of a benchmark's output. `ratio` is `value` relative to the row named by `baseline`. */
export interface BenchRow {
  name: string;
  value: number;
  unit: string;
  baseline?: string;
  ratio?: number;
}

export interface MeasureOptions {
  /** Time spent running the workload before sampling, in ms (lets the JIT settle). */
  warmupMs?: number;
  /** Number of timed samples. */
  samples?: number;
  /** Target duration of one sample, in ms. */
  sampleMs?: number;
}

export interface Measurement {
  /** Median time of one operation, in ns. */
  nsPerOp: number;
  /** Operations per sample. */
  batch: number;
  /** Every sample's time per operation, in ns, sorted. */
  samples: number[];
}

/** Results land here so that the JIT cannot drop a workload whose result is unused. */
export let sink = 0;

/** Runs `op` in timed batches; `op` returns a number that is folded into `sink`. */
export function measure(op: () => number, opts: MeasureOptions = {}): Measurement {
  const warmupMs = opts.warmupMs ?? 200;
  const nSamples = opts.samples ?? 15;
  const sampleMs = opts.sampleMs ?? 20;
  const runBatch = (n: number): number => {
    let acc = 0;
    const t0 = performance.now();
    for (let i = 0; i < n; i++) acc ^= op();
    const dt = performance.now() - t0;
    sink ^= acc;
    return dt;
  };
  let batch = 1;
  for (;;) {
    const dt = runBatch(batch);
    if (dt >= sampleMs / 4 || batch >= 1 << 30) {
      batch = Math.max(1, Math.round((batch * sampleMs) / Math.max(dt, 1e-3)));
      break;
    }
    batch *= 4;
  }
  const warmEnd = performance.now() + warmupMs;
  while (performance.now() < warmEnd) runBatch(batch);
  const samples: number[] = [];
  for (let s = 0; s < nSamples; s++) samples.push((runBatch(batch) * 1e6) / batch);
  samples.sort((a, b) => a - b);
  const mid = samples.length >> 1;
  const nsPerOp = samples.length % 2 === 1 ? samples[mid]! : (samples[mid - 1]! + samples[mid]!) / 2;
  return { nsPerOp, batch, samples };
}

/** What `measureInterleaved` returns: per workload, in the order given. */
export interface Interleaved {
  /** Median time of one operation, in ns. */
  nsPerOp: number[];
  /** Median of the per-round differences to the first workload, in ns (0 for the first). */
  diffToFirst: number[];
  /** Median of the per-round ratios to the first workload (1 for the first). */
  ratioToFirst: number[];
  /** Every round's time per operation, in ns, in round order (round k of each workload ran together). */
  samples: number[][];
}

/**
 * Measures several workloads with their samples interleaved (a, b, a, b, …), so that a load change on
 * a shared machine hits all of them alike, and returns each median plus the median of the per-round
 * differences and ratios to the first: the way to measure a small extra cost on top of a large common
 * one, or a ratio to a baseline that a slow stretch between two separate measurements would skew.
 */
export function measureInterleaved(ops: readonly (() => number)[], opts: MeasureOptions = {}): Interleaved {
  const nSamples = opts.samples ?? 15;
  const calibrated = ops.map((op) => measure(op, { ...opts, samples: 1 }).batch);
  const per: number[][] = ops.map(() => []);
  for (let s = 0; s < nSamples; s++) {
    ops.forEach((op, k) => {
      const batch = calibrated[k]!;
      let acc = 0;
      const t0 = performance.now();
      for (let i = 0; i < batch; i++) acc ^= op();
      per[k]!.push(((performance.now() - t0) * 1e6) / batch);
      sink ^= acc;
    });
  }
  const first = per[0]!;
  return {
    nsPerOp: per.map(median),
    diffToFirst: per.map((xs) => median(xs.map((x, i) => x - first[i]!))),
    ratioToFirst: per.map((xs) => median(xs.map((x, i) => x / first[i]!))),
    samples: per,
  };
}

/**
 * The median of the finite numbers of a list (the mean of the middle two for an even count); NaN when
 * there are none, e.g. every round of a case failed. The one median of the benchmarks.
 */
export function median(xs: readonly number[]): number {
  const v = xs.filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
  if (v.length === 0) return NaN;
  const m = v.length >> 1;
  return v.length % 2 === 1 ? v[m]! : (v[m - 1]! + v[m]!) / 2;
}

/**
 * Round k's `key` over round k's `key` of a baseline, for the rounds both cases have: the ratios whose
 * median the two-process suites report (QP scale, ping-pong), because round k of every case runs back
 * to back and a slow stretch of a shared machine moves both figures of a round together, where it
 * moves a ratio of two medians taken from different rounds.
 */
export function pairedRatios(rounds: readonly Record<string, number>[], baseline: readonly Record<string, number>[], key: string): number[] {
  const n = Math.min(rounds.length, baseline.length);
  const out: number[] = [];
  for (let k = 0; k < n; k++) out.push(rounds[k]![key]! / baseline[k]![key]!);
  return out;
}

/** Fills in `baseline`/`ratio` for each group of rows: ratio = value / the group's best value. */
export function ratioToBest(rows: BenchRow[], higherIsBetter: boolean): BenchRow[] {
  const best = rows.reduce((a, b) => ((higherIsBetter ? b.value > a.value : b.value < a.value) ? b : a));
  return rows.map((r) => ({ ...r, baseline: best.name, ratio: r.value / best.value }));
}

/** A fixed-format table, so that two runs can be diffed. */
export function formatRows(rows: readonly BenchRow[]): string {
  const w = Math.max(4, ...rows.map((r) => r.name.length));
  const lines = [`${'name'.padEnd(w)}  ${'value'.padStart(10)} unit     ratio  baseline`];
  for (const r of rows) {
    const v = r.value >= 100 ? r.value.toFixed(0) : r.value >= 1 ? r.value.toFixed(2) : r.value.toPrecision(3);
    const ratio = r.ratio === undefined ? '' : r.ratio.toFixed(2);
    lines.push(`${r.name.padEnd(w)}  ${v.padStart(10)} ${r.unit.padEnd(7)} ${ratio.padStart(6)}  ${r.baseline ?? ''}`);
  }
  return lines.join('\n');
}

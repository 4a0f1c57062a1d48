/**
 * The performance targets, judged on one run's rows: `npm run bench` prints the verdicts after its
 * tables, so that a run says by itself which targets it meets (bench/README.md keeps them across runs).
 *
 * Each target names the rows it reads by a pattern over their names, the figure it reads (a ratio to
 * the row's baseline in the same run, or the value itself) and the bound. A row that failed (a suite
 * that crashed, a `NaN` row) or is missing leaves its target without a verdict, never with a pass.
 */

import type { BenchRow } from './harness.js';

export interface Target {
  name: string;
  /** The rows it reads. */
  rows: RegExp;
  /** `ratio`: the row's ratio to its baseline; `value`: the row's own value. */
  figure: 'ratio' | 'value';
  /** The bound each row's figure must keep. */
  bound: { atLeast: number } | { atMost: number } | { below: number };
}

/** ICRC at ≥ 0.9 of the fastest CRC: its time at most 1 / 0.9 of the raw call's. */
const ICRC_MAX_RATIO = 1 / 0.9;

export const TARGETS: readonly Target[] = [
  { name: 'RC WRITE ≥ 0.8 of the dgram blast (MTU 4096)', rows: /^rc WRITE .* mtu 4096: goodput$/, figure: 'ratio', bound: { atLeast: 0.8 } },
  { name: 'RC READ and SEND ≥ 0.7 of the dgram blast (MTU 4096)', rows: /^rc (READ|SEND) .* mtu 4096: goodput$/, figure: 'ratio', bound: { atLeast: 0.7 } },
  { name: 'ping-pong ≤ 1.5 × the dgram round trip', rows: /^rc ping-pong .*: RTT median$/, figure: 'ratio', bound: { atMost: 1.5 } },
  // The stack's own paths (rows named "(… path)"), not the JavaScript fallback used where the addon is not built.
  { name: 'ICRC ≥ 0.9 of the fastest CRC-32 (ratio ≤ 1.111)', rows: /^MTU \d+: (?!JS ICRC).*path\)$/, figure: 'ratio', bound: { atMost: ICRC_MAX_RATIO } },
  { name: '< 4 KiB of heap per idle RC QP', rows: /^qpscale [\d,]+ RC QPs: heap per idle QP$/, figure: 'value', bound: { below: 4096 } },
  { name: 'aggregate goodput at 100 to 10,000 QPs ≥ 0.8 of one QP', rows: /^qpscale [\d,]+ RC QPs: aggregate /, figure: 'ratio', bound: { atLeast: 0.8 } },
];

export interface TargetVerdict {
  target: Target;
  /** The rows read, each with its figure and whether it keeps the bound (undefined: no figure). */
  rows: { name: string; unit: string; figure: number | undefined; met: boolean | undefined }[];
  /** false when a row misses the bound; else undefined when a row has no figure (or none matches); else true. */
  met: boolean | undefined;
}

function keeps(bound: Target['bound'], x: number): boolean {
  if ('atLeast' in bound) return x >= bound.atLeast;
  if ('atMost' in bound) return x <= bound.atMost;
  return x < bound.below;
}

/** Each target's verdict on `rows`. A row without a finite figure counts as missing, never as met. */
export function judgeTargets(rows: readonly BenchRow[], targets: readonly Target[] = TARGETS): TargetVerdict[] {
  return targets.map((target) => {
    const read = rows
      .filter((r) => target.rows.test(r.name))
      .map((r) => {
        const x = target.figure === 'ratio' ? r.ratio : r.value;
        const figure = x !== undefined && Number.isFinite(x) ? x : undefined;
        return { name: r.name, unit: r.unit, figure, met: figure === undefined ? undefined : keeps(target.bound, figure) };
      });
    // A row that misses the bound decides; otherwise a row without a figure leaves the target open
    // (judged on what was measured, it could still miss), and it is listed.
    const missed = read.some((r) => r.met === false);
    const missing = read.length === 0 || read.some((r) => r.met === undefined);
    const met = missed ? false : missing ? undefined : true;
    return { target, rows: read, met };
  });
}

/** A ratio to two decimals; a value as the row gives it, in the row's unit. */
function fmt(x: number, figure: Target['figure'], unit: string): string {
  return figure === 'ratio' ? x.toFixed(2) : `${Math.round(x)} ${unit}`;
}

/** The verdicts as lines: one per target, then the rows that miss it or have no figure. */
export function formatVerdicts(verdicts: readonly TargetVerdict[]): string {
  const lines: string[] = [];
  for (const v of verdicts) {
    const f = v.target.figure;
    const judged = v.rows.filter((r) => r.figure !== undefined);
    const lo = judged.reduce((a, r) => (r.figure! < a.figure! ? r : a), judged[0]!);
    const hi = judged.reduce((a, r) => (r.figure! > a.figure! ? r : a), judged[0]!);
    const range = judged.length === 0 ? 'no figure' : `${fmt(lo.figure!, f, lo.unit)}–${fmt(hi.figure!, f, hi.unit)} over ${judged.length} row${judged.length === 1 ? '' : 's'}`;
    const word = v.met === true ? 'met    ' : v.met === false ? 'MISSED ' : 'UNKNOWN';
    lines.push(`${word} ${v.target.name}: ${range}`);
    for (const r of v.rows) {
      if (r.met === false) lines.push(`          ${r.name}: ${fmt(r.figure!, f, r.unit)}`);
      else if (r.met === undefined) lines.push(`          ${r.name}: no figure`);
    }
    if (v.rows.length === 0) lines.push('          no row of this run matches');
  }
  return lines.join('\n');
}

/** Small statistics for simulation results. */

/**
 * Jain's fairness index, (Σx)² / (n·Σx²): 1 when all are equal, 1/n when one takes all.
 * An all-zero input is perfectly fair (nobody got anything).
 */
export function jainIndex(xs: ArrayLike<number>): number {
  let s = 0;
  let s2 = 0;
  for (let i = 0; i < xs.length; i++) {
    const x = xs[i]!;
    s += x;
    s2 += x * x;
  }
  if (xs.length === 0 || s2 === 0) return 1;
  return (s * s) / (xs.length * s2);
}

/** The q-quantile (0..1) of an ascending array, nearest-rank; 0 for an empty one. */
export function percentile(sorted: ArrayLike<number>, q: number): number {
  if (sorted.length === 0) return 0;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1));
  return sorted[i]!;
}

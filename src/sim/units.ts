/**
 * Rates and sizes as `tc` spells them, for the simulator's and the bottleneck's flags:
 * rates in bits with SI multipliers (`40gbit`, `200mbit`, `1e9`), sizes in bytes with binary
 * multipliers (`5kb`, `200kb`, `4mb`). Deliberately no `bps`: tc reads it as bytes per second,
 * most people as bits, and a flag that is off by eight is worse than one that is refused.
 */

const RATE_UNITS: Record<string, number> = { '': 1, bit: 1, kbit: 1e3, mbit: 1e6, gbit: 1e9, tbit: 1e12 };
const SIZE_UNITS: Record<string, number> = { '': 1, b: 1, kb: 1024, k: 1024, mb: 1024 ** 2, m: 1024 ** 2, gb: 1024 ** 3, g: 1024 ** 3 };

/** Bits per second, or undefined when `text` is not a rate. */
export function parseRate(text: string): number | undefined {
  const m = /^\s*(\d+(?:\.\d+)?(?:e\d+)?)\s*([a-z]*)\s*$/i.exec(text);
  if (!m) return undefined;
  const unit = RATE_UNITS[m[2]!.toLowerCase()];
  const v = Number(m[1]) * (unit ?? NaN);
  return Number.isFinite(v) && v > 0 ? v : undefined;
}

/** Bytes, or undefined when `text` is not a size. */
export function parseSize(text: string): number | undefined {
  const m = /^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$/i.exec(text);
  if (!m) return undefined;
  const unit = SIZE_UNITS[m[2]!.toLowerCase()];
  const v = Math.round(Number(m[1]) * (unit ?? NaN));
  return Number.isFinite(v) && v >= 0 ? v : undefined;
}

/** `40000000000` → `40 Gb/s`. */
export function formatRate(bps: number): string {
  if (bps >= 1e9) return `${+(bps / 1e9).toFixed(2)} Gb/s`;
  if (bps >= 1e6) return `${+(bps / 1e6).toFixed(2)} Mb/s`;
  if (bps >= 1e3) return `${+(bps / 1e3).toFixed(2)} kb/s`;
  return `${+bps.toFixed(0)} b/s`;
}

/** `204800` → `200 KiB`. */
export function formatSize(bytes: number): string {
  if (bytes >= 1024 ** 2) return `${+(bytes / 1024 ** 2).toFixed(2)} MiB`;
  if (bytes >= 1024) return `${+(bytes / 1024).toFixed(1)} KiB`;
  return `${Math.round(bytes)} B`;
}

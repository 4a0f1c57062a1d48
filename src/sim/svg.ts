/**
 * The simulator's picture: per-flow rates over time above, the bottleneck queue below, on a
 * shared time axis. Plain SVG 1.1 with no script and no external fonts, so that a browser,
 * rsvg-convert and an XML parser all read it the same way.
 *
 * Samples arrive every few µs; a 100 ms run is 10 000 of them per flow. `PlotBuilder`
 * averages rates into a fixed number of time buckets and keeps each bucket's largest queue
 * (so short peaks stay visible), which bounds the file size whatever the run length.
 */

export interface PlotInput {
  title: string;
  durationUs: number;
  /** Bucket start times, µs. */
  timesUs: Float64Array;
  /** rates[flow][bucket], bit/s. */
  rates: Float64Array[];
  /** Largest queue per bucket, bytes. */
  queueMax: Float64Array;
  /** Mean queue per bucket, bytes. */
  queueMean: Float64Array;
  kminBytes: number;
  kmaxBytes: number;
  /** Tail-drop limit, bytes. */
  limitBytes: number;
  /** Bottleneck rate / flows, bit/s: drawn as a reference line. */
  fairShareBps: number;
  lineRateBps: number;
}

/** Accumulates samples into buckets for `renderSvg`. */
export class PlotBuilder {
  private readonly sums: Float64Array[];
  private readonly counts: Float64Array;
  private readonly qmax: Float64Array;
  private readonly qsum: Float64Array;

  constructor(readonly flows: number, readonly durationUs: number, readonly buckets = 800) {
    this.sums = Array.from({ length: flows }, () => new Float64Array(buckets));
    this.counts = new Float64Array(buckets);
    this.qmax = new Float64Array(buckets);
    this.qsum = new Float64Array(buckets);
  }

  add(timeUs: number, rates: ArrayLike<number>, queueBytes: number): void {
    const b = Math.min(this.buckets - 1, Math.floor((timeUs / this.durationUs) * this.buckets));
    for (let f = 0; f < this.flows; f++) {
      const s = this.sums[f]!;
      s[b] = s[b]! + rates[f]!;
    }
    this.counts[b] = this.counts[b]! + 1;
    this.qsum[b] = this.qsum[b]! + queueBytes;
    if (queueBytes > this.qmax[b]!) this.qmax[b] = queueBytes;
  }

  input(meta: Omit<PlotInput, 'timesUs' | 'rates' | 'queueMax' | 'queueMean' | 'durationUs'>): PlotInput {
    const used: number[] = [];
    for (let b = 0; b < this.buckets; b++) if (this.counts[b]! > 0) used.push(b);
    const pick = (a: Float64Array, div: boolean): Float64Array => Float64Array.from(used, (b) => (div ? a[b]! / this.counts[b]! : a[b]!));
    return {
      ...meta,
      durationUs: this.durationUs,
      timesUs: Float64Array.from(used, (b) => (b / this.buckets) * this.durationUs),
      rates: this.sums.map((s) => pick(s, true)),
      queueMax: pick(this.qmax, false),
      queueMean: pick(this.qsum, true),
    };
  }
}

// Tableau 10: distinguishable, and readable on white.
const PALETTE = ['#4e79a7', '#f28e2b', '#e15759', '#76b7b2', '#59a14f', '#edc948', '#b07aa1', '#ff9da7', '#9c755f', '#bab0ac'];

const W = 960;
const H = 680;
const M = { left: 78, right: 200, top: 48, bottom: 52 };
const GAP = 56;

/** Round tick positions covering [0, max]. */
export function niceTicks(max: number, target = 5): number[] {
  if (!(max > 0)) return [0, 1];
  const raw = max / target;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((k) => k * mag).find((s) => s >= raw) ?? 10 * mag;
  const ticks: number[] = [];
  for (let v = 0; v <= max * (1 + 1e-9) + step * 1e-9; v += step) ticks.push(+v.toPrecision(12));
  if (ticks[ticks.length - 1]! < max) ticks.push(+(ticks[ticks.length - 1]! + step).toPrecision(12));
  return ticks;
}

const esc = (s: string): string => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');
const fmt = (v: number): string => (Math.abs(v - Math.round(v)) < 1e-9 ? String(Math.round(v)) : String(+v.toFixed(2)));

export function renderSvg(p: PlotInput): string {
  const plotW = W - M.left - M.right;
  const panelH = (H - M.top - M.bottom - GAP) / 2;
  const top1 = M.top;
  const top2 = M.top + panelH + GAP;
  const tMaxMs = p.durationUs / 1000;
  const xTicks = niceTicks(tMaxMs, 8).filter((v) => v <= tMaxMs + 1e-9);
  const x = (us: number): number => M.left + (us / 1000 / tMaxMs) * plotW;

  let rateMax = 0;
  for (const r of p.rates) for (const v of r) if (v > rateMax) rateMax = v;
  const rTicks = niceTicks(Math.max(rateMax, p.fairShareBps) / 1e9 || 1);
  const rTop = rTicks[rTicks.length - 1]!;
  const yR = (bps: number): number => top1 + panelH - (bps / 1e9 / rTop) * panelH;

  // A start-up spike (an incast before the first CNPs land) can be 20× the steady queue; let
  // it run off the top, with a note, rather than flatten everything after it to the axis.
  let peak = 0;
  let peakAt = 0;
  p.queueMax.forEach((v, i) => {
    if (v > peak) {
      peak = v;
      peakAt = p.timesUs[i]!;
    }
  });
  const sortedMax = Float64Array.from(p.queueMax).sort();
  const typical = sortedMax[Math.floor(sortedMax.length * 0.98)] ?? 0;
  const clipped = peak > 4 * Math.max(typical, p.kmaxBytes);
  const qMax = clipped ? Math.max(typical * 1.2, p.kmaxBytes * 1.25) : Math.max(peak, p.kmaxBytes);
  const qTicks = niceTicks(qMax / 1024);
  const qTop = qTicks[qTicks.length - 1]!;
  const yQ = (bytes: number): number => top2 + panelH - (Math.min(bytes / 1024, qTop * 1.02) / qTop) * panelH;

  const out: string[] = [];
  out.push(`<?xml version="1.0" encoding="UTF-8"?>`);
  out.push(`<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="Helvetica, Arial, sans-serif" font-size="12">`);
  out.push(`<rect x="0" y="0" width="${W}" height="${H}" fill="white"/>`);
  out.push(`<text x="${M.left}" y="26" font-size="16" font-weight="bold">${esc(p.title)}</text>`);

  const axes = (top: number, ticks: number[], y: (v: number) => number, label: string, id: string): void => {
    out.push(`<g id="${id}-axes" stroke="#000" stroke-width="1" fill="none">`);
    out.push(`<rect x="${M.left}" y="${top.toFixed(1)}" width="${plotW}" height="${panelH.toFixed(1)}" stroke="#888"/>`);
    out.push(`</g>`);
    out.push(`<g id="${id}-grid" stroke="#e6e6e6" stroke-width="1">`);
    for (const v of ticks) out.push(`<line x1="${M.left}" x2="${M.left + plotW}" y1="${y(v).toFixed(1)}" y2="${y(v).toFixed(1)}"/>`);
    for (const v of xTicks) out.push(`<line x1="${x(v * 1000).toFixed(1)}" x2="${x(v * 1000).toFixed(1)}" y1="${top.toFixed(1)}" y2="${(top + panelH).toFixed(1)}"/>`);
    out.push(`</g>`);
    out.push(`<g id="${id}-ticks" text-anchor="end" fill="#222">`);
    for (const v of ticks) out.push(`<text x="${M.left - 6}" y="${(y(v) + 4).toFixed(1)}">${fmt(v)}</text>`);
    out.push(`</g>`);
    out.push(`<g text-anchor="middle" fill="#222">`);
    for (const v of xTicks) out.push(`<text x="${x(v * 1000).toFixed(1)}" y="${(top + panelH + 16).toFixed(1)}">${fmt(v)}</text>`);
    out.push(`</g>`);
    const cy = top + panelH / 2;
    out.push(`<text x="22" y="${cy.toFixed(1)}" text-anchor="middle" transform="rotate(-90 22 ${cy.toFixed(1)})">${esc(label)}</text>`);
  };

  const path = (xs: Float64Array, ys: Float64Array, y: (v: number) => number): string => {
    let d = '';
    for (let i = 0; i < xs.length; i++) d += `${i ? 'L' : 'M'}${x(xs[i]!).toFixed(1)},${y(ys[i]!).toFixed(1)}`;
    return d;
  };

  // Rates panel.
  axes(top1, rTicks, (g) => yR(g * 1e9), 'rate (Gb/s)', 'rates');
  out.push(`<g id="rates" fill="none" stroke-width="1.3" stroke-linejoin="round">`);
  p.rates.forEach((r, f) => {
    out.push(`<path class="series rate" data-flow="${f}" stroke="${PALETTE[f % PALETTE.length]}" d="${path(p.timesUs, r, yR)}"/>`);
  });
  out.push(`</g>`);
  const fy = yR(p.fairShareBps).toFixed(1);
  out.push(`<line id="fair-share" x1="${M.left}" x2="${M.left + plotW}" y1="${fy}" y2="${fy}" stroke="#000" stroke-dasharray="6 4" stroke-width="1"/>`);

  // Queue panel: the per-bucket maximum as a filled area, the mean as a line, Kmin/Kmax dashed.
  axes(top2, qTicks, (k) => yQ(k * 1024), 'queue (KiB)', 'queue');
  let area = `M${x(p.timesUs[0] ?? 0).toFixed(1)},${yQ(0).toFixed(1)}`;
  for (let i = 0; i < p.timesUs.length; i++) area += `L${x(p.timesUs[i]!).toFixed(1)},${yQ(p.queueMax[i]!).toFixed(1)}`;
  area += `L${x(p.timesUs[p.timesUs.length - 1] ?? 0).toFixed(1)},${yQ(0).toFixed(1)}Z`;
  out.push(`<path class="series queue-max" fill="#9ecae1" fill-opacity="0.6" stroke="none" d="${area}"/>`);
  out.push(`<path class="series queue" fill="none" stroke="#08519c" stroke-width="1.3" d="${path(p.timesUs, p.queueMean, yQ)}"/>`);
  const hline = (bytes: number, color: string, id: string): void => {
    if (bytes / 1024 > qTop) return;
    const y = yQ(bytes).toFixed(1);
    out.push(`<line id="${id}" x1="${M.left}" x2="${M.left + plotW}" y1="${y}" y2="${y}" stroke="${color}" stroke-dasharray="6 4" stroke-width="1.2"/>`);
  };
  if (clipped) {
    out.push(`<text id="clip-note" x="${M.left + plotW - 6}" y="${(top2 + 16).toFixed(1)}" text-anchor="end" fill="#444">peak ${fmt(peak / 1024)} KiB at ${fmt(peakAt / 1000)} ms (off scale)</text>`);
  }
  hline(p.kminBytes, '#2ca02c', 'kmin');
  hline(p.kmaxBytes, '#d62728', 'kmax');
  hline(p.limitBytes, '#000', 'limit');

  out.push(`<text x="${(M.left + plotW / 2).toFixed(1)}" y="${H - 14}" text-anchor="middle">time (ms)</text>`);

  // Legend.
  const lx = M.left + plotW + 16;
  out.push(`<g id="legend" font-size="12">`);
  let ly = top1 + 6;
  const entry = (draw: (y: number) => string, text: string): void => {
    out.push(`${draw(ly)}<text x="${lx + 30}" y="${(ly + 4).toFixed(1)}">${esc(text)}</text>`);
    ly += 18;
  };
  const swatch = (color: string, dash = '') => (y: number): string =>
    `<line x1="${lx}" x2="${lx + 24}" y1="${y.toFixed(1)}" y2="${y.toFixed(1)}" stroke="${color}" stroke-width="2"${dash ? ` stroke-dasharray="${dash}"` : ''}/>`;
  const box = (color: string) => (y: number): string => `<rect x="${lx}" y="${(y - 6).toFixed(1)}" width="24" height="12" fill="${color}"/>`;
  const shown = p.rates.length <= 12 ? p.rates.length : 10;
  for (let f = 0; f < shown; f++) entry(swatch(PALETTE[f % PALETTE.length]!), `flow ${f}`);
  if (shown < p.rates.length) entry(swatch('#999'), `… ${p.rates.length} flows in all`);
  entry(swatch('#000', '6 4'), `fair share ${fmt(p.fairShareBps / 1e9)} Gb/s`);
  ly = top2 + 6;
  entry(box('#9ecae1'), 'queue (max)');
  entry(swatch('#08519c'), 'queue (mean)');
  entry(swatch('#2ca02c', '6 4'), `Kmin ${fmt(p.kminBytes / 1024)} KiB`);
  entry(swatch('#d62728', '6 4'), `Kmax ${fmt(p.kmaxBytes / 1024)} KiB`);
  if (p.limitBytes / 1024 <= qTop) entry(swatch('#000', '6 4'), `limit ${fmt(p.limitBytes / 1024)} KiB`);
  out.push(`</g>`);
  out.push(`</svg>`);
  return out.join('\n') + '\n';
}

/**
 * `roce sim dcqcn --flows N --duration-ms D [--line-rate 40gbit] [--profile paper|cx] [--no-cc]
 *  [--csv FILE] [--svg FILE] [--seed S]` and, for experiments, `[--kmin 5kb] [--kmax 200kb]
 *  [--pmax 0.01] [--queue-limit 4mb] [--mtu 1024] [--delay-us 1] [--start-gap-us 0]
 *  [--sample-us 10]`.
 *
 * Runs the DCQCN simulation (src/sim/dcqcn-sim.ts) and prints a summary: per-flow rates over
 * the second half, Jain's index, the queue against Kmin/Kmax, drops and CNPs. The CSV is
 * `time_us,kind,id,value`, a `rate` row per flow (id = flow number, bit/s) and a `queue` row
 * (id = `bottleneck`, bytes) per sample; the SVG plots both. Exit 0 on a completed run, 2 on
 * bad usage, 4 when a file cannot be written.
 */

import { closeSync, openSync, writeFileSync, writeSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { runDcqcnSim } from '../sim/dcqcn-sim.js';
import { PlotBuilder, renderSvg } from '../sim/svg.js';
import { formatRate, formatSize, parseRate, parseSize } from '../sim/units.js';
import { CliError, EXIT } from './errors.js';

export const SIM_USAGE =
  'roce sim dcqcn --flows N --duration-ms D [--line-rate 40gbit] [--profile paper|cx] [--no-cc] --csv FILE --svg FILE [--seed S]';

export function simCommand(argv: string[], out: (line: string) => void): number {
  const { values, positionals } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      flows: { type: 'string' },
      'duration-ms': { type: 'string' },
      'line-rate': { type: 'string', default: '40gbit' },
      profile: { type: 'string', default: 'paper' },
      'no-cc': { type: 'boolean', default: false },
      csv: { type: 'string' },
      svg: { type: 'string' },
      seed: { type: 'string', default: '1' },
      kmin: { type: 'string', default: '5kb' },
      kmax: { type: 'string', default: '200kb' },
      pmax: { type: 'string', default: '0.01' },
      'queue-limit': { type: 'string', default: '4mb' },
      mtu: { type: 'string', default: '1024' },
      'delay-us': { type: 'string', default: '1' },
      'start-gap-us': { type: 'string', default: '0' },
      'sample-us': { type: 'string', default: '10' },
    },
  });
  if (positionals.length !== 1 || positionals[0] !== 'dcqcn') throw new CliError(`usage: ${SIM_USAGE}`);

  const flows = intArg('--flows', values.flows, 1, 4096);
  const durationMs = numArg('--duration-ms', values['duration-ms'], (v) => v > 0 && v <= 10_000);
  const lineRate = parseRate(values['line-rate']!);
  if (lineRate === undefined) throw new CliError(`--line-rate must be a rate such as 40gbit, not '${values['line-rate']}'`);
  const profile = values.profile;
  if (profile !== 'paper' && profile !== 'cx') throw new CliError(`--profile must be paper or cx, not '${profile}'`);
  const seed = intArg('--seed', values.seed, 0, 0xffffffff);
  const kmin = sizeArg('--kmin', values.kmin!);
  const kmax = sizeArg('--kmax', values.kmax!);
  if (!(kmax > kmin)) throw new CliError(`--kmax must be above --kmin (${kmin} and ${kmax} bytes)`);
  const pMax = numArg('--pmax', values.pmax, (v) => v >= 0 && v <= 1);
  const limit = sizeArg('--queue-limit', values['queue-limit']!);
  const mtu = intArg('--mtu', values.mtu, 64, 9000);
  if (limit < mtu + 62) throw new CliError(`--queue-limit must hold at least one packet (${mtu + 62} bytes)`);
  const delayUs = numArg('--delay-us', values['delay-us'], (v) => v >= 0 && v <= 1e6);
  const startGapUs = numArg('--start-gap-us', values['start-gap-us'], (v) => v >= 0);
  // The CSV promises a sample at least every 10 µs of simulated time.
  const sampleUs = numArg('--sample-us', values['sample-us'], (v) => v > 0 && v <= 10);
  const cc = !values['no-cc'];
  const durationUs = durationMs * 1000;

  const csv = values.csv === undefined ? undefined : new CsvWriter(values.csv);
  const plot = values.svg === undefined ? undefined : new PlotBuilder(flows, durationUs);
  const t0 = performance.now();
  let result;
  try {
    result = runDcqcnSim({
      flows, durationUs, lineRateBps: lineRate, profile, cc, seed, kminBytes: kmin, kmaxBytes: kmax, pMax,
      queueLimitBytes: limit, mtuBytes: mtu, linkDelayUs: delayUs, startGapUs, sampleIntervalUs: sampleUs,
      onSample: (t, rates, q) => {
        if (csv) {
          const ts = fmtTime(t);
          for (let f = 0; f < rates.length; f++) csv.line(`${ts},rate,${f},${Math.round(rates[f]!)}`);
          csv.line(`${ts},queue,bottleneck,${q}`);
        }
        plot?.add(t, rates, q);
      },
    });
  } finally {
    csv?.close();
  }
  const wallMs = performance.now() - t0;

  if (plot && values.svg !== undefined) {
    const title = `DCQCN (${cc ? `${profile} profile` : 'no congestion control'}): ${flows} flow${flows === 1 ? '' : 's'} into one ${formatRate(lineRate)} port, seed ${seed}`;
    const svg = renderSvg(plot.input({ title, kminBytes: kmin, kmaxBytes: kmax, limitBytes: limit, fairShareBps: lineRate / flows, lineRateBps: lineRate }));
    try {
      writeFileSync(values.svg, svg);
    } catch (e) {
      throw new CliError(`cannot write ${values.svg}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`, EXIT.LOCAL);
    }
  }

  const r = result;
  const half = `${fmtTime(durationUs / 2 / 1000)}–${fmtTime(durationMs)} ms`;
  out(`dcqcn ${cc ? profile : 'no-cc'}: ${flows} flows, ${durationMs} ms at ${formatRate(lineRate)}, seed ${seed}: ${r.events} events in ${(wallMs / 1000).toFixed(2)} s`);
  const rates = r.secondHalfBps;
  const shown = rates.length <= 16 ? rates.map((b, i) => `${i}:${formatRate(b)}`).join(' ') : `min ${formatRate(Math.min(...rates))}, max ${formatRate(Math.max(...rates))}`;
  out(`throughput ${half}: total ${formatRate(rates.reduce((a, b) => a + b, 0))}; ${shown}`);
  out(`jain ${half}: ${r.jainSecondHalf.toFixed(4)}`);
  out(
    `queue ${half}: median ${formatSize(r.queueSecondHalf.medianBytes)}, p99 ${formatSize(r.queueSecondHalf.p99Bytes)}, max ${formatSize(r.queueSecondHalf.maxBytes)} ` +
      `(Kmin ${formatSize(kmin)}, Kmax ${formatSize(kmax)}, limit ${formatSize(limit)}); max over the run ${formatSize(r.queueMaxBytes)}`,
  );
  out(`packets: ${r.enqueued} queued, ${r.marked} marked, ${r.drops} dropped; CNPs: ${r.cnpsSent} sent, ${r.cnpsSuppressed} suppressed by the NP interval; ${r.cuts} rate cuts`);
  if (values.csv !== undefined) out(`csv: ${values.csv}`);
  if (values.svg !== undefined) out(`svg: ${values.svg}`);
  return EXIT.OK;
}

/** µs with at most three decimals and no trailing zeros: 10, 12.5, 0.125. */
const fmtTime = (t: number): string => String(+t.toFixed(3));

function intArg(flag: string, text: string | undefined, min: number, max: number): number {
  if (text === undefined) throw new CliError(`${flag} is required (usage: ${SIM_USAGE})`);
  const v = Number(text);
  if (!Number.isInteger(v) || v < min || v > max) throw new CliError(`${flag} must be an integer in ${min}..${max}, not '${text}'`);
  return v;
}

function numArg(flag: string, text: string | undefined, ok: (v: number) => boolean): number {
  if (text === undefined) throw new CliError(`${flag} is required (usage: ${SIM_USAGE})`);
  const v = Number(text);
  if (text.trim() === '' || !Number.isFinite(v) || !ok(v)) throw new CliError(`${flag}: '${text}' is out of range`);
  return v;
}

function sizeArg(flag: string, text: string): number {
  const v = parseSize(text);
  if (v === undefined) throw new CliError(`${flag} must be a size such as 5kb or 4mb, not '${text}'`);
  return v;
}

/** A CSV file written in large chunks: a 64-flow run is a million rows. */
class CsvWriter {
  private fd: number;
  private buf = '';

  constructor(readonly path: string) {
    try {
      this.fd = openSync(path, 'w');
    } catch (e) {
      throw new CliError(`cannot write ${path}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`, EXIT.LOCAL);
    }
    this.line('time_us,kind,id,value');
  }

  line(s: string): void {
    this.buf += s + '\n';
    if (this.buf.length > 1 << 20) this.flush();
  }

  close(): void {
    this.flush();
    closeSync(this.fd);
  }

  private flush(): void {
    if (!this.buf) return;
    try {
      writeSync(this.fd, this.buf);
    } catch (e) {
      throw new CliError(`cannot write ${this.path}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`, EXIT.LOCAL);
    }
    this.buf = '';
  }
}

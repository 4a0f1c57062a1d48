/**
 * `roce perf write|read|send|atomic [HOST] [-p port] [-d dev] [-i ibport] [-x gidx] [-s size]
 *      [-n iters] [-m mtu] [-c RC|UC|UD] [-A CMP_AND_SWAP|FETCH_AND_ADD] [-t tx-depth]
 *      [-o outs] [-q qps] [-S sl] [-u qp-timeout] [-F] [--report_gbits]
 *      [--rate_limit=rate [--rate_units=M|g] [--rate_limit_type=HW]]`
 *
 * The flags, defaults and checks of perftest 6.06 (Debian 4.5+0.17) ib_write_bw, ib_read_bw,
 * ib_send_bw and ib_atomic_bw, and the lines they print (perftest_parameters.h,
 * perftest_communication.h).
 */

import { parseArgs } from 'node:util';
import { cAltHex, cFixed, cLeft } from '../oob/common.js';
import type { PerftestBwReport, PerftestKey, PerftestVerb } from '../oob/perftest.js';
import { CliError } from './errors.js';
import { parseCNumber } from './pingpong-args.js';

export const PERF_USAGE =
  'roce perf write|read|send|atomic [HOST] [-p port] [-d dev] [-i ibport] [-x gidx] [-s size] [-n iters] [-m mtu] ' +
  '[-c RC|UC|UD] [-A CMP_AND_SWAP|FETCH_AND_ADD] [-t tx-depth] [-o outs] [-q qps] [-S sl] [-u qp-timeout] [-F] [--report_gbits] ' +
  '[--rate_limit=rate [--rate_units=M|g] [--rate_limit_type=HW]]';

export type PerfConnection = 'RC' | 'UC' | 'UD';
export type AtomicType = 'CMP_AND_SWAP' | 'FETCH_AND_ADD';

export interface PerfOptions {
  verb: PerftestVerb;
  /** Absent: we are the server. */
  host?: string;
  /** -p (default 18515). */
  port: number;
  /** -d (default: the first device). */
  ibDev?: string;
  /** -i (default 1). */
  ibPort: number;
  /** -x; -1 (default): perftest's choice, the best RoCE GID of the port. */
  gidIndex: number;
  /** -s (default 65536; atomic: 8, and nothing else). */
  size: number;
  /** -n (at least 5; default 5000 for write, 1000 otherwise). */
  iters: number;
  /** -m in bytes; absent: the port's active MTU. */
  mtu?: 256 | 512 | 1024 | 2048 | 4096;
  /** -c (default RC): UC for write/send, UD for send only. */
  connection: PerfConnection;
  /** -A, atomic only (default FETCH_AND_ADD). */
  atomicType: AtomicType;
  /** -t (default 128), at most iters. */
  txDepth: number;
  /** -o for read/atomic: outstanding reads; 0 (default) means the device maximum. */
  outReads: number;
  /** -q (default 1). */
  qps: number;
  /** -S (default 0). */
  sl: number;
  /** -u (default 14): local ACK timeout exponent. */
  qpTimeout: number;
  /** --report_gbits: Gb/s instead of MB/s. */
  reportGbits: boolean;
  /**
   * --rate_limit (with --rate_units, --rate_limit_type HW, perftest's default type): the QP's
   * send rate, bit/s, kept by its packet pacer (per packet, as a NIC's QP rate limit; the
   * only kind this stack has). Absent: no limit.
   */
  rateLimitBps?: number;
}

const VERBS: readonly PerftestVerb[] = ['write', 'read', 'send', 'atomic'];
const MTUS = [256, 512, 1024, 2048, 4096] as const;

export function parsePerfArgs(argv: string[]): PerfOptions {
  const { values, positionals } = parseArgs({
    args: argv,
    allowPositionals: true,
    strict: true,
    options: {
      port: { type: 'string', short: 'p' },
      'ib-dev': { type: 'string', short: 'd' },
      'ib-port': { type: 'string', short: 'i' },
      'gid-index': { type: 'string', short: 'x' },
      size: { type: 'string', short: 's' },
      iters: { type: 'string', short: 'n' },
      mtu: { type: 'string', short: 'm' },
      connection: { type: 'string', short: 'c' },
      atomic_type: { type: 'string', short: 'A' },
      'tx-depth': { type: 'string', short: 't' },
      outs: { type: 'string', short: 'o' },
      qp: { type: 'string', short: 'q' },
      sl: { type: 'string', short: 'S' },
      'qp-timeout': { type: 'string', short: 'u' },
      'CPU-freq': { type: 'boolean', short: 'F', default: false },
      report_gbits: { type: 'boolean', default: false },
      rate_limit: { type: 'string' },
      rate_units: { type: 'string' },
      rate_limit_type: { type: 'string' },
    },
  });
  const [verbArg, host, ...extra] = positionals;
  const verb = VERBS.find((v) => v === verbArg);
  if (!verb) throw new CliError(`the test must be write, read, send or atomic${verbArg ? `, not '${verbArg}'` : ''}; usage: ${PERF_USAGE}`);
  if (extra.length) throw new CliError(`at most one HOST, not ${[host, ...extra].join(' ')}; usage: ${PERF_USAGE}`);

  const conn = (values.connection ?? 'RC') as string;
  if (conn !== 'RC' && conn !== 'UC' && conn !== 'UD') throw new CliError(`-c must be RC, UC or UD, not '${conn}'`);
  // change_conn_type() in perftest_parameters.c
  if (conn === 'UC' && (verb === 'read' || verb === 'atomic')) throw new CliError('UC connection not possible in READ/ATOMIC verbs');
  if (conn === 'UD' && verb !== 'send') throw new CliError('UD connection only possible in SEND verb');

  let atomicType: AtomicType = 'FETCH_AND_ADD';
  if (values.atomic_type !== undefined) {
    if (verb !== 'atomic') throw new CliError('-A: you are not running the atomic test; the atomic action type applies to atomic only');
    if (values.atomic_type !== 'CMP_AND_SWAP' && values.atomic_type !== 'FETCH_AND_ADD') {
      throw new CliError(`-A must be CMP_AND_SWAP or FETCH_AND_ADD, not '${values.atomic_type}'`);
    }
    atomicType = values.atomic_type;
  }

  let size = verb === 'atomic' ? 8 : 65536;
  if (values.size !== undefined) {
    size = parseCNumber('-s/--size', values.size, 1, 8388608);
    if (verb === 'atomic' && size !== 8) throw new CliError('Message size cannot be changed for Atomic tests');
  }
  let mtu: PerfOptions['mtu'];
  if (values.mtu !== undefined) {
    const m = parseCNumber('-m/--mtu', values.mtu, 0, 1 << 20);
    mtu = MTUS.find((x) => x === m);
    if (!mtu) throw new CliError(`-m/--mtu must be 256, 512, 1024, 2048 or 4096, not ${values.mtu}`);
  }
  if (conn === 'UD' && size > (mtu ?? 4096)) throw new CliError(`Max message size in UD cannot be greater than MTU (${mtu ?? 4096})`);

  const iters = values.iters === undefined ? (verb === 'write' ? 5000 : 1000) : parseCNumber('-n/--iters', values.iters, 5, 100000000);
  const txDepth = Math.min(values['tx-depth'] === undefined ? 128 : parseCNumber('-t/--tx-depth', values['tx-depth'], 1, 0xffff), iters);
  if (values.outs !== undefined && verb !== 'read' && verb !== 'atomic') throw new CliError('-o (outstanding reads) applies to read and atomic only');

  const opts: PerfOptions = {
    verb,
    port: values.port === undefined ? 18515 : parseCNumber('-p/--port', values.port, 1, 65535),
    ibPort: values['ib-port'] === undefined ? 1 : parseCNumber('-i/--ib-port', values['ib-port'], 1, 255),
    gidIndex: values['gid-index'] === undefined ? -1 : parseCNumber('-x/--gid-index', values['gid-index'], 0, 255),
    size,
    iters,
    connection: conn,
    atomicType,
    txDepth,
    outReads: values.outs === undefined ? 0 : parseCNumber('-o/--outs', values.outs, 1, 0xffff),
    qps: values.qp === undefined ? 1 : parseCNumber('-q/--qp', values.qp, 1, 0xffff),
    sl: values.sl === undefined ? 0 : parseCNumber('-S/--sl', values.sl, 0, 15),
    qpTimeout: values['qp-timeout'] === undefined ? 14 : parseCNumber('-u/--qp-timeout', values['qp-timeout'], 0, 31),
    reportGbits: values.report_gbits === true,
  };
  if (mtu !== undefined) opts.mtu = mtu;
  if (host !== undefined) opts.host = host;
  const rate = parseRateLimit(values.rate_limit, values.rate_units, values.rate_limit_type);
  if (rate !== undefined) opts.rateLimitBps = rate;
  if (values['ib-dev'] !== undefined) opts.ibDev = values['ib-dev'];
  return opts;
}

/** MB as perftest counts it (its reports: "MB=2^20 byte"). */
const MB = 0x100000;

/**
 * perftest's rate limiter flags: the rate in Gb/s (g, the default) or MB/s (M); the type HW
 * (perftest's default once a rate is given). SW (perftest's pause between bursts of whole
 * messages) and PP are not implemented, nor packets/s, which perftest's HW limit refuses too.
 */
function parseRateLimit(rate: string | undefined, units: string | undefined, type: string | undefined): number | undefined {
  if (rate === undefined) {
    if (units !== undefined || type !== undefined) throw new CliError('--rate_units and --rate_limit_type go with --rate_limit');
    return undefined;
  }
  const v = Number(rate);
  if (rate.trim() === '' || !Number.isFinite(v) || v <= 0) throw new CliError(`--rate_limit must be a positive number, not '${rate}'`);
  if (type !== undefined && type !== 'HW' && type !== 'SW' && type !== 'PP') throw new CliError('Invalid rate limit type flag. Please use HW, SW or PP.');
  if (type === 'SW' || type === 'PP') {
    throw new CliError(`--rate_limit_type=${type} is not implemented: this stack limits a QP's rate in its packet pacer, which is --rate_limit_type=HW (the default)`);
  }
  const u = units ?? 'g';
  if (u === 'p') throw new CliError('--rate_units=p: packets per second are not supported with the HW rate limit');
  if (u !== 'M' && u !== 'g') throw new CliError('Invalid rate limit units. Please use M,g or p');
  return u === 'g' ? v * 1e9 : v * MB * 8;
}

// ---------------------------------------------------------------------------------------------
// The lines perftest prints

/** RESULT_LINE */
export const PERF_RESULT_LINE = '-'.repeat(87);
/** RESULT_FMT / RESULT_FMT_G (each followed by RESULT_EXT, "\n"). */
export const PERF_RESULT_FMT = ' #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]';
export const PERF_RESULT_FMT_G = ' #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]';

/** The test title line of ctx_print_test_info: "                    RDMA_Write BW Test". */
export function formatPerfTitle(verb: PerftestVerb, atomicType: AtomicType = 'FETCH_AND_ADD'): string {
  const name = { send: 'Send', write: 'RDMA_Write', read: 'RDMA_Read', atomic: 'Atomic' }[verb];
  return `${' '.repeat(20)}${name} ${verb === 'atomic' ? `${atomicType} ` : ''}BW Test`;
}

/** The result table's head: RESULT_LINE, then the column titles. */
export function formatPerfReportHeader(gbits = false): [string, string] {
  return [PERF_RESULT_LINE, gbits ? PERF_RESULT_FMT_G : PERF_RESULT_FMT];
}

/**
 * print_full_bw_report's line (without a remote report to add):
 *   REPORT_FMT     " %-7lu    %-10" PRIu64 "       %-7.2lf            %-7.2lf\t\t   %-7.6lf"
 *   REPORT_FMT_EXT " %-7lu    %" PRIu64 "           %-7.6lf            %-7.6lf            %-7.6lf"
 * the second when --report_gbits and the average is under 0.1 Gb/s.
 */
export function formatPerfReportLine(r: PerftestBwReport, gbits = false): string {
  const ext = gbits && r.bwAvg < 0.1;
  if (ext) {
    return ` ${cLeft(String(r.size), 7)}    ${r.iters}           ${cLeft(cFixed(r.bwPeak, 6), 7)}            ${cLeft(cFixed(r.bwAvg, 6), 7)}            ${cLeft(cFixed(r.msgRateAvg, 6), 7)}`;
  }
  return ` ${cLeft(String(r.size), 7)}    ${cLeft(String(r.iters), 10)}       ${cLeft(cFixed(r.bwPeak, 2), 7)}            ${cLeft(cFixed(r.bwAvg, 2), 7)}\t\t   ${cLeft(cFixed(r.msgRateAvg, 6), 7)}`;
}

/**
 * print_report_bw's arithmetic for a run of `iters` messages of `size` bytes taking
 * `elapsedSec` from the first post to the last completion; `bestSecPerMsg` is the shortest
 * per-message time seen (the peak), default the average.
 */
export function computePerfReport(size: number, iters: number, elapsedSec: number, gbits = false, bestSecPerMsg?: number): PerftestBwReport {
  const unit = gbits ? 125000000 : 0x100000;
  const best = bestSecPerMsg ?? elapsedSec / iters;
  return {
    size: BigInt(size),
    iters: BigInt(iters),
    bwPeak: size / (best * unit),
    bwAvg: (size * iters) / (elapsedSec * unit),
    msgRateAvg: iters / (elapsedSec * 1e6),
  };
}

/**
 * ctx_print_pingpong_data's lines (full verbosity, GID in use):
 *   " %s address: LID %#04x QPN %#06x PSN %#06x" [+ " OUT %#04x" for read] [+ " RKey %#08x VAddr %#016llx" for write/read]
 *   " GID: %02d:…:%02d" (decimal bytes, as perftest prints them)
 */
export function formatPerfAddress(side: 'local' | 'remote', verb: PerftestVerb, key: PerftestKey): string[] {
  let line = ` ${side} address: LID ${cAltHex(key.lid, 4)} QPN ${cAltHex(key.qpn, 6)} PSN ${cAltHex(key.psn, 6)}`;
  if (verb === 'read') line += ` OUT ${cAltHex(key.outReads, 4)}`;
  if (verb === 'read' || verb === 'write') line += ` RKey ${cAltHex(key.rkey, 8)} VAddr ${cAltHex(key.vaddr, 16)}`;
  const out = [line];
  if (key.gid) out.push(` GID: ${Array.from(key.gid, (b) => String(b).padStart(2, '0')).join(':')}`);
  return out;
}

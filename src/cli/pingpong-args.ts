/**
 * `roce pingpong [HOST] [-p port] [-d dev] [-i ibport] [-g gidx] [-s size] [-n iters] [-m mtu]
 *                [-r rx-depth] [-l sl] [-e] [--transport rc|uc|ud]`
 *
 * The flags, defaults and result lines of ibv_rc_pingpong / ibv_uc_pingpong / ibv_ud_pingpong
 * (rdma-core 44): without HOST we are the server, with it the client.
 */

import { parseArgs } from 'node:util';
import { cFixed } from '../oob/common.js';
import type { PingpongTransport } from '../oob/pingpong.js';
import { CliError } from './errors.js';

export const PINGPONG_USAGE =
  'roce pingpong [HOST] [-p port] [-d dev] [-i ibport] [-g gidx] [-s size] [-n iters] [-m mtu] [-r rx-depth] [-l sl] [-e] [--transport rc|uc|ud]';

export interface PingpongOptions {
  /** Absent: we are the server. */
  host?: string;
  transport: PingpongTransport;
  /** TCP port of the exchange (default 18515). */
  port: number;
  /** -d: device name (default: the first one). */
  ibDev?: string;
  /** -i: port of the device (default 1). */
  ibPort: number;
  /** -g: GID index; -1 (default) means no GID (the tools then send an all-zero GID). */
  gidIndex: number;
  /**
   * -s: message size (default 4096; 2048 for ud, whose message must fit the port MTU). 0 only for
   * ud: ibv_ud_pingpong runs it (its buffer is size + 40 for the GRH), ibv_rc/uc_pingpong fail on
   * it (a 0-byte MR cannot be registered), and so does this.
   */
  size: number;
  /** -n: iterations (default 1000). */
  iters: number;
  /** -m: path MTU in bytes (default 1024; rc and uc only). */
  mtu: 256 | 512 | 1024 | 2048 | 4096;
  /** -r: receives posted at a time (default 500). */
  rxDepth: number;
  /** -l: service level (default 0). */
  sl: number;
  /** -e: sleep on completion events instead of polling. */
  events: boolean;
}

/** strtoul(optarg, NULL, 0) without its silent zero for garbage: decimal, 0x hex or 0 octal. */
export function parseCNumber(flag: string, text: string, min: number, max: number): number {
  const t = text.trim();
  let v: number;
  if (/^0x[0-9a-f]+$/i.test(t)) v = parseInt(t.slice(2), 16);
  else if (/^0[0-7]+$/.test(t)) v = parseInt(t.slice(1), 8);
  else if (/^-?\d+$/.test(t)) v = Number(t);
  else throw new CliError(`${flag} needs a number, not '${text}'`);
  if (!Number.isSafeInteger(v) || v < min || v > max) throw new CliError(`${flag} must be between ${min} and ${max}, not ${text}`);
  return v;
}

const MTUS = [256, 512, 1024, 2048, 4096] as const;

export function parsePingpongArgs(argv: string[]): PingpongOptions {
  const { values, positionals } = parseArgs({
    args: argv,
    allowPositionals: true,
    strict: true,
    options: {
      port: { type: 'string', short: 'p' },
      'ib-dev': { type: 'string', short: 'd' },
      'ib-port': { type: 'string', short: 'i' },
      'gid-idx': { type: 'string', short: 'g' },
      size: { type: 'string', short: 's' },
      iters: { type: 'string', short: 'n' },
      mtu: { type: 'string', short: 'm' },
      'rx-depth': { type: 'string', short: 'r' },
      sl: { type: 'string', short: 'l' },
      events: { type: 'boolean', short: 'e', default: false },
      transport: { type: 'string', default: 'rc' },
    },
  });
  if (positionals.length > 1) throw new CliError(`at most one HOST, not ${positionals.join(' ')}; usage: ${PINGPONG_USAGE}`);
  const transport = values.transport as string;
  if (transport !== 'rc' && transport !== 'uc' && transport !== 'ud') throw new CliError(`--transport must be rc, uc or ud, not '${transport}'`);
  if (transport === 'ud' && values.mtu !== undefined) throw new CliError('-m/--mtu does not apply to ud (ibv_ud_pingpong has no -m: the port MTU bounds the message size)');

  let mtu: PingpongOptions['mtu'] = 1024;
  if (values.mtu !== undefined) {
    const m = parseCNumber('-m/--mtu', values.mtu, 0, 1 << 20);
    const known = MTUS.find((x) => x === m);
    if (!known) throw new CliError(`-m/--mtu must be 256, 512, 1024, 2048 or 4096, not ${values.mtu}`);
    mtu = known;
  }
  // ud_pingpong.c: `unsigned int size = 2048`; rc/uc_pingpong.c: 4096.
  const size = values.size === undefined ? (transport === 'ud' ? 2048 : 4096) : parseCNumber('-s/--size', values.size, 0, 0xffffffff);
  if (size === 0 && transport !== 'ud') {
    throw new CliError(`-s 0: ibv_${transport}_pingpong cannot run 0-byte messages either (it fails to register a 0-byte MR); use -s 1 or more`);
  }
  const opts: PingpongOptions = {
    transport,
    port: values.port === undefined ? 18515 : parseCNumber('-p/--port', values.port, 1, 65535),
    ibPort: values['ib-port'] === undefined ? 1 : parseCNumber('-i/--ib-port', values['ib-port'], 1, 255),
    gidIndex: values['gid-idx'] === undefined ? -1 : parseCNumber('-g/--gid-idx', values['gid-idx'], -1, 0xffff),
    size,
    iters: values.iters === undefined ? 1000 : parseCNumber('-n/--iters', values.iters, 1, 0xffffffff),
    mtu,
    rxDepth: values['rx-depth'] === undefined ? 500 : parseCNumber('-r/--rx-depth', values['rx-depth'], 1, 0xffffffff),
    sl: values.sl === undefined ? 0 : parseCNumber('-l/--sl', values.sl, 0, 15),
    events: values.events === true,
  };
  if (transport === 'ud' && size > 4096) throw new CliError(`-s/--size ${size} does not fit a UD message (at most the port MTU, 4096)`);
  const host = positionals[0];
  if (host !== undefined) opts.host = host;
  if (values['ib-dev'] !== undefined) opts.ibDev = values['ib-dev'];
  return opts;
}

export interface PingpongTiming {
  size: number;
  iters: number;
  /** Elapsed microseconds between the first post and the last completion. */
  usec: number;
}

/**
 * The two lines every pingpong tool prints at the end (rc_pingpong.c):
 *   printf("%lld bytes in %.2f seconds = %.2f Mbit/sec\n", bytes, usec / 1000000., bytes * 8. / usec);
 *   printf("%d iters in %.2f seconds = %.2f usec/iter\n", iters, usec / 1000000., usec / iters);
 * with `float usec` and bytes = size * iters * 2.
 */
export function formatPingpongSummary(t: PingpongTiming): [string, string] {
  const usec = Math.fround(t.usec);
  const bytes = BigInt(t.size) * BigInt(t.iters) * 2n;
  const secs = cFixed(usec / 1000000, 2);
  return [
    `${bytes} bytes in ${secs} seconds = ${cFixed((Number(bytes) * 8) / usec, 2)} Mbit/sec`,
    `${t.iters} iters in ${secs} seconds = ${cFixed(usec / t.iters, 2)} usec/iter`,
  ];
}

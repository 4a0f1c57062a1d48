/**
 * `roce bottleneck --listen ADDR:PORT --to ADDR:PORT --rate 200mbit --kmin 5kb --kmax 200kb
 *  --pmax 0.01 [--limit 1mb] [--seed N] [--no-mark]`
 *
 * Runs the ECN-marking relay of src/app/bottleneck.ts (read its header for the topology: one
 * sender per IP, senders point their QPs at --listen, the receiver at --to names each sender's
 * IP and the listen port as its peer) until SIGINT or SIGTERM, then prints its counters.
 *
 * Output: one `ready` line as soon as the sockets are bound (written at once, so a script can
 * wait for it), `sender …` lines as senders appear, and on exit one `key=value` line each for
 * forwarded, marked, dropped, returned, bad_icrc, ignored, queue_max, queue_median, queue_p99
 * (bytes) and a `sender IP forwarded=… marked=… dropped=…` line per sender. Exit 0, 2 on bad
 * usage.
 */

import { parseArgs } from 'node:util';
import { BottleneckRelay } from '../app/bottleneck.js';
import type { PeerAddress } from '../link/link.js';
import { formatRate, formatSize, parseRate, parseSize } from '../sim/units.js';
import { parseIpAddress } from '../wire/frame.js';
import { CliError } from './errors.js';

export const BOTTLENECK_USAGE =
  'roce bottleneck --listen ADDR:PORT --to ADDR:PORT --rate 200mbit --kmin 5kb --kmax 200kb --pmax 0.01 [--limit 1mb] [--seed N] [--no-mark]';

export async function bottleneckCommand(argv: string[], out: (line: string) => void): Promise<number> {
  const { values, positionals } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      listen: { type: 'string' },
      to: { type: 'string' },
      rate: { type: 'string', default: '200mbit' },
      kmin: { type: 'string', default: '5kb' },
      kmax: { type: 'string', default: '200kb' },
      pmax: { type: 'string', default: '0.01' },
      limit: { type: 'string', default: '1mb' },
      seed: { type: 'string', default: '1' },
      'no-mark': { type: 'boolean', default: false },
    },
  });
  if (positionals.length) throw new CliError(`unexpected argument '${positionals[0]}'`);
  if (values.listen === undefined || values.to === undefined) throw new CliError('--listen and --to are required');
  const listen = endpoint('--listen', values.listen);
  const to = endpoint('--to', values.to);
  const rateBps = parseRate(values.rate!);
  if (rateBps === undefined) throw new CliError(`--rate must be a rate such as 200mbit, not '${values.rate}'`);
  const kminBytes = size('--kmin', values.kmin!);
  const kmaxBytes = size('--kmax', values.kmax!);
  if (!(kmaxBytes > kminBytes)) throw new CliError(`--kmax must be above --kmin (${kminBytes} and ${kmaxBytes} bytes)`);
  const pMax = Number(values.pmax);
  if (!(pMax >= 0 && pMax <= 1)) throw new CliError(`--pmax must be in 0..1, not '${values.pmax}'`);
  const limitBytes = size('--limit', values.limit!);
  if (limitBytes < 2048) throw new CliError('--limit must hold a packet (at least 2kb)');
  const seed = Number(values.seed);
  if (!Number.isInteger(seed) || seed < 0 || seed > 0xffffffff) throw new CliError(`--seed must be an integer, not '${values.seed}'`);

  // Lines before the end go out at once: a long-running command is watched while it runs.
  const now = (line: string): void => void process.stdout.write(line + '\n');
  const relay = await BottleneckRelay.open({
    listen, to, rateBps, kminBytes, kmaxBytes, pMax, limitBytes, seed, marking: !values['no-mark'], log: now,
  });
  const l = relay.listen;
  now(
    `ready listen=${l.address}:${l.port} to=${to.address}:${to.port} rate=${formatRate(rateBps)} ` +
      `kmin=${formatSize(kminBytes)} kmax=${formatSize(kmaxBytes)} pmax=${pMax} limit=${formatSize(limitBytes)} ` +
      `marking=${values['no-mark'] ? 'off' : 'on'} seed=${seed}`,
  );
  await new Promise<void>((resolve) => {
    const stop = (): void => {
      process.off('SIGINT', stop);
      process.off('SIGTERM', stop);
      resolve();
    };
    process.on('SIGINT', stop);
    process.on('SIGTERM', stop);
  });
  await relay.close();
  const s = relay.summary();
  out(`forwarded=${s.forwarded} forwarded_bytes=${s.forwardedBytes}`);
  out(`marked=${s.marked}`);
  out(`dropped=${s.dropped}`);
  out(`returned=${s.returned}`);
  out(`bad_icrc=${s.badIcrc} ignored=${s.ignored}`);
  out(`queue_max=${s.queueMaxBytes} queue_median=${s.queueMedianBytes} queue_p99=${s.queueP99Bytes}`);
  for (const [ip, p] of Object.entries(s.perSender)) {
    out(`sender ${ip} forwarded=${p.forwarded} forwarded_bytes=${p.forwardedBytes} marked=${p.marked} dropped=${p.dropped}`);
  }
  return 0;
}

function endpoint(flag: string, text: string): PeerAddress {
  // ADDR:PORT, or [V6ADDR]:PORT.
  const m = /^\[([^\]]+)\]:(\d+)$/.exec(text) ?? /^([^:]+):(\d+)$/.exec(text);
  const port = m ? Number(m[2]) : NaN;
  if (!m || parseIpAddress(m[1]!) === undefined || !(port >= 0 && port <= 0xffff)) {
    throw new CliError(`${flag} must be ADDR:PORT (IPv6 as [ADDR]:PORT), not '${text}'`);
  }
  return { address: m[1]!, port };
}

function size(flag: string, text: string): number {
  const v = parseSize(text);
  if (v === undefined) throw new CliError(`${flag} must be a size such as 200kb, not '${text}'`);
  return v;
}

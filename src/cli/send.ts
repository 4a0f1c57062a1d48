/**
 * `roce send FILE --to HOST [--op write|send] [--as NAME] [--mtu 256..4096] [--capture FILE.pcap]
 *  [--cc dcqcn|none] [--loss PCT --seed N] [--trace] [--oob-port 18515] [--cm [--peer-port 4791]]
 *  [--bind ADDR] [--port N] [--timeout SEC] [--snaplen BYTES]`
 *
 * Rendezvous: by default a TCP connection to --oob-port carries the out-of-band exchange
 * (protocol.ts). With --cm it is an RDMA CM connection instead (cm-channel.ts): a REQ on QP1 to
 * the server's RoCE UDP port (--peer-port, default our own --port, which --cm makes 4791) for
 * rdma_cm port --oob-port; no TCP at all. A missing listener is a REJ (exit 3, at once); a
 * silent peer gets the REQ four times over about --timeout seconds (exit 3).
 *
 * Uploads FILE to a `roce serve` on HOST over an RC QP: the file streams through a registered
 * window in chunks, each moved by RDMA WRITE_WITH_IMM (default) or SEND_WITH_IMM; the server
 * verifies sha256 before the file appears under its name. This file also holds what `send` and
 * `get` share: the client options, the run loop (signals, progress, summary) and the exit codes.
 *
 * Exit codes (send, get, serve, demo):
 *
 *   0    done; the sha256 was verified end to end
 *   1    the data arrived but its sha256 does not match (integrity)
 *   2    bad usage: unknown option, bad --mtu / --op / --cc / --loss / --seed / --timeout,
 *        FILE missing or unreadable, bad remote name
 *   3    the peer: unreachable (connection refused, or no answer within --timeout: never a
 *        hang), refused (no such file, name busy, DISK FULL ON THE SERVER, other protocol
 *        version), went away, or stopped acknowledging RDMA traffic
 *   4    a local resource: address not local, port in use, --out or --capture not writable,
 *        local disk full
 *   130  interrupted (Ctrl-C, SIGTERM): the transfer is abandoned, partial files are removed on
 *        both ends, and the server keeps serving others
 *   70   internal error (a bug; ROCE_DEBUG=1 shows the stack)
 *
 * Every error is one line on stderr: `roce send: <what went wrong>`.
 */

import { parseArgs } from 'node:util';
import { dropsByReason, EndpointError, hostPort, localAddressFor, MTUS, openEndpoint, resolveHost, type Endpoint } from '../app/endpoint.js';
import { DEFAULT_OOB_PORT } from '../app/protocol.js';
import { fmtBytes, sendFile, TransferError, type ClientOptions, type TransferResult } from '../app/transfer.js';
import { CliError, EXIT } from './errors.js';
import { fmtRate, linePrinter, Progress, type Printer } from './progress.js';

export const SEND_USAGE =
  'roce send FILE --to HOST [--op write|send] [--as NAME] [--mtu 256..4096] [--capture FILE.pcap] [--cc dcqcn|none] ' +
  '[--loss PCT --seed N] [--trace] [--oob-port 18515] [--cm [--peer-port 4791]] [--bind ADDR] [--port N] [--timeout SEC] [--snaplen BYTES]';

/** Exit code for data that arrived with the wrong sha256. */
export const EXIT_INTEGRITY = EXIT.FINDINGS;

/** parseArgs options every client command takes. */
export const CLIENT_ARG_OPTIONS = {
  mtu: { type: 'string', default: '4096' },
  'oob-port': { type: 'string', default: String(DEFAULT_OOB_PORT) },
  bind: { type: 'string' },
  // Default 0 (any), or 4791 with --cm: RDMA CM peers answer on the RoCE port.
  port: { type: 'string' },
  cm: { type: 'boolean', default: false },
  'peer-port': { type: 'string' },
  capture: { type: 'string' },
  snaplen: { type: 'string' },
  cc: { type: 'string', default: 'none' },
  loss: { type: 'string' },
  seed: { type: 'string' },
  timeout: { type: 'string', default: '10' },
  trace: { type: 'boolean', default: false },
} as const;

/** The endpoint options every command (client or server) takes, checked. */
export interface EndpointCli {
  mtu: number;
  port: number;
  capture?: string;
  snapLength?: number;
  cc: 'dcqcn' | 'none';
  lossPct?: number;
  seed: number;
  timeoutMs: number;
  trace: boolean;
}

export interface ClientCli extends EndpointCli {
  host: string;
  oobPort: number;
  bind?: string;
  /** Rendezvous over RDMA CM (oobPort is the rdma_cm port); the server's RoCE UDP port if not ours. */
  cm?: { peerRocePort?: number };
}

type Values = Record<string, string | boolean | undefined>;

export function parseCommandArgs(argv: string[], options: Record<string, { type: 'string' | 'boolean'; default?: string | boolean }>, usage: string): { values: Values; positionals: string[] } {
  try {
    const r = parseArgs({ args: argv, allowPositionals: true, options, strict: true });
    return { values: r.values as Values, positionals: r.positionals };
  } catch (e) {
    throw new CliError(`${(e as Error).message}; usage: ${usage}`, EXIT.USAGE);
  }
}

function intArg(v: string | boolean | undefined, name: string, min: number, max: number): number {
  const n = Number(v);
  if (typeof v !== 'string' || v.trim() === '' || !Number.isInteger(n) || n < min || n > max) {
    throw new CliError(`${name} must be an integer in ${min}..${max}, not '${String(v)}'`, EXIT.USAGE);
  }
  return n;
}

export function parseEndpointArgs(v: Values): EndpointCli {
  const mtuText = v['mtu'] as string;
  const mtu = Number(mtuText);
  if (!(MTUS as readonly number[]).includes(mtu)) throw new CliError(`--mtu must be one of ${MTUS.join(', ')}, not '${mtuText}'`, EXIT.USAGE);
  const cc = v['cc'] as string;
  if (cc !== 'dcqcn' && cc !== 'none') throw new CliError(`--cc must be dcqcn or none, not '${cc}'`, EXIT.USAGE);
  const out: EndpointCli = {
    mtu, cc, port: intArg(v['port'], '--port', 0, 65535), seed: 1, trace: v['trace'] === true,
    timeoutMs: 0,
  };
  const t = Number(v['timeout']);
  if (!Number.isFinite(t) || t <= 0 || t > 3600) throw new CliError(`--timeout must be seconds in (0, 3600], not '${String(v['timeout'])}'`, EXIT.USAGE);
  out.timeoutMs = Math.round(t * 1000);
  if (v['loss'] !== undefined) {
    const l = Number(v['loss']);
    if (typeof v['loss'] !== 'string' || v['loss'].trim() === '' || !Number.isFinite(l) || l < 0 || l >= 100) {
      throw new CliError(`--loss must be a percentage in [0, 100), not '${String(v['loss'])}'`, EXIT.USAGE);
    }
    out.lossPct = l;
  }
  if (v['seed'] !== undefined) {
    if (out.lossPct === undefined) throw new CliError('--seed only makes sense with --loss', EXIT.USAGE);
    out.seed = intArg(v['seed'], '--seed', 0, 0xffffffff);
  }
  if (typeof v['capture'] === 'string') out.capture = v['capture'];
  if (v['snaplen'] !== undefined) out.snapLength = intArg(v['snaplen'], '--snaplen', 64, 262144);
  return out;
}

export function parseClientArgs(v: Values, hostFlag: '--to' | '--from', host: string | undefined): ClientCli {
  if (host === undefined || host === '') throw new CliError(`${hostFlag} HOST is required`, EXIT.USAGE);
  const cm = v['cm'] === true;
  const e = parseEndpointArgs({ ...v, port: v['port'] ?? (cm ? '4791' : '0') });
  const c: ClientCli = { ...e, host, oobPort: intArg(v['oob-port'], '--oob-port', 1, 65535) };
  if (typeof v['bind'] === 'string') c.bind = v['bind'];
  if (v['peer-port'] !== undefined && !cm) throw new CliError('--peer-port only makes sense with --cm', EXIT.USAGE);
  if (cm) c.cm = v['peer-port'] !== undefined ? { peerRocePort: intArg(v['peer-port'], '--peer-port', 1, 65535) } : {};
  return c;
}

/** Opens the endpoint, mapping bind failures to their exit codes. */
export async function openCliEndpoint(address: string, e: EndpointCli, p: Printer): Promise<Endpoint> {
  try {
    return await openEndpoint({
      address, port: e.port, mtu: e.mtu, cc: e.cc,
      ...(e.lossPct !== undefined ? { lossPct: e.lossPct, seed: e.seed } : {}),
      ...(e.trace ? { trace: (l: string) => p.line(l) } : {}),
      ...(e.capture !== undefined ? { capture: e.capture } : {}),
      ...(e.snapLength !== undefined ? { snapLength: e.snapLength } : {}),
    });
  } catch (err) {
    if (err instanceof EndpointError) throw new CliError(err.message, EXIT.LOCAL);
    throw err;
  }
}

export function exitCodeOf(e: TransferError): number {
  switch (e.kind) {
    case 'input': return EXIT.USAGE;
    case 'peer': return EXIT.PEER;
    case 'local': return EXIT.LOCAL;
    case 'interrupted': return EXIT.INTERRUPTED;
    case 'integrity': return EXIT_INTEGRITY;
  }
}

/** Runs `fn` with Ctrl-C / SIGTERM turned into an abort signal. */
export async function withInterrupt<T>(fn: (signal: AbortSignal) => Promise<T>): Promise<T> {
  const ac = new AbortController();
  const onSignal = (): void => ac.abort();
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  try {
    return await fn(ac.signal);
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
  }
}

export interface ClientRun {
  verb: 'send' | 'get';
  cli: ClientCli;
  /** Describes the transfer for the first line. */
  what: string;
  run: (o: ClientOptions) => Promise<TransferResult>;
  /** The summary's first line, from the result. */
  done: (r: TransferResult, where: string) => string;
  opLabel: string;
}

/** The shared client flow: endpoint, signals, progress, summary, errors → exit codes. */
export async function runClient(c: ClientRun): Promise<number> {
  const p = linePrinter();
  let progress: Progress | undefined;
  let ep: Endpoint | undefined;
  try {
    const host = await resolveHost(c.cli.host).catch((e: Error) => {
      throw new CliError(e.message, EXIT.PEER);
    });
    const local = c.cli.bind ?? (await localAddressFor(host).catch(() => (host.includes(':') ? '::' : '0.0.0.0')));
    const endpoint = await openCliEndpoint(local, c.cli, p);
    ep = endpoint;
    const where = c.cli.cm !== undefined ? `${hostPort(host, c.cli.cm.peerRocePort ?? endpoint.ctx.port)} (RDMA CM, rdma_cm port ${c.cli.oobPort})` : hostPort(host, c.cli.oobPort);
    p.line(`${c.verb}: ${c.what} ${c.verb === 'send' ? 'to' : 'from'} ${where} (RoCEv2 from ${hostPort(endpoint.ctx.address, endpoint.ctx.port)})`);
    if (c.cli.lossPct !== undefined) p.line(`${c.verb}: dropping ${c.cli.lossPct}% of our outgoing datagrams (seed ${c.cli.seed})`);
    const tty = process.stdout.isTTY === true && !c.cli.trace;
    let mtu = 0;
    const result = await withInterrupt((signal) =>
      c.run({
        ctx: endpoint.ctx, host, oobPort: c.cli.oobPort, timeoutMs: c.cli.timeoutMs, signal,
        ...(c.cli.cm !== undefined ? { cm: c.cli.cm } : {}),
        onConnected: (info) => {
          mtu = info.mtu;
          p.line(`${c.verb}: connected: QP 0x${info.local.qpn.toString(16)} ↔ ${hostPort(info.remote.address, info.remote.port)} QP 0x${info.remote.qpn.toString(16)}, path MTU ${info.mtu}`);
        },
        onProgress: (done, total) => {
          if (progress === undefined) {
            p.flush();
            progress = new Progress(c.verb, total, {
              tty, write: (s) => process.stdout.write(s), line: (l) => p.line(l), columns: process.stdout.columns ?? 80,
            });
          }
          progress.update(done);
        },
      }));
    progress?.finish();
    summary(p, c, result, endpoint, where, mtu);
    return EXIT.OK;
  } catch (e) {
    progress?.abandon();
    p.flush();
    if (e instanceof TransferError) {
      if (e.kind === 'interrupted') {
        process.stderr.write(`roce ${c.verb}: interrupted; the transfer was abandoned and its partial file removed\n`);
        return EXIT.INTERRUPTED;
      }
      throw new CliError(e.message, exitCodeOf(e));
    }
    throw e;
  } finally {
    await ep?.close();
    p.flush();
  }
}

function summary(p: Printer, c: ClientRun, r: TransferResult, ep: Endpoint, where: string, mtu: number): void {
  const k = ep.ctx.counters;
  p.line(c.done(r, where));
  p.line(`  ${fmtBytes(r.bytes)} (${r.bytes} bytes) in ${r.seconds.toFixed(2)} s, goodput ${fmtRate(r.bytes, r.seconds)}`);
  p.line(`  sha256 ${r.sha256} (verified)`);
  p.line(`  ${c.opLabel} over RC, path MTU ${mtu}, congestion control ${c.cli.cc}; packets: ${k.sentPkts} sent, ${k.rcvdPkts} received`);
  p.line(`  retransmissions: ${k.retransPkts} packets (${k.ackTimeouts} timeouts, ${k.rcvSeqErr} sequence-error NAKs received)`);
  const drops = dropsByReason(k, ep.link.drops);
  p.line(`  drops by reason: ${drops.length === 0 ? 'none' : drops.map(([n, v]) => `${n} ${v}`).join(', ')}`);
  if (ep.capture !== undefined) p.line(`  capture: ${ep.capture.path}`);
}

export async function sendCommand(argv: string[], _out: (line: string) => void): Promise<number> {
  const { values, positionals } = parseCommandArgs(argv, {
    ...CLIENT_ARG_OPTIONS,
    to: { type: 'string' },
    op: { type: 'string', default: 'write' },
    as: { type: 'string' },
  }, SEND_USAGE);
  const file = positionals[0];
  if (file === undefined || positionals.length > 1) throw new CliError(`usage: ${SEND_USAGE}`, EXIT.USAGE);
  const op = values['op'] as string;
  if (op !== 'write' && op !== 'send') throw new CliError(`--op must be write or send, not '${op}'`, EXIT.USAGE);
  const cli = parseClientArgs(values, '--to', values['to'] as string | undefined);
  const as = values['as'] as string | undefined;
  return runClient({
    verb: 'send', cli, what: `${file}${as !== undefined ? ` as '${as}'` : ''}`,
    opLabel: op === 'write' ? 'RDMA WRITE_WITH_IMM' : 'SEND_WITH_IMM',
    run: (o) => sendFile({ ...o, file, op, ...(as !== undefined ? { name: as } : {}) }),
    done: (r, where) => `send: stored '${r.name}' on ${where}`,
  });
}

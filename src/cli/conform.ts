/**
 * `roce conform`: test a RoCEv2 peer against IBTA rules with scripted cases, fuzz it, or replay
 * a finding. Our own stack is tested through `roce serve` (`--exchange roce`).
 *
 * `--control stdio` is for harnesses that can restart the peer's tool (the rxe lab): before a
 * reconnect we print `@@restart <reason>` and wait for a line `ready` on stdin. With
 * `--exchange perftest-reader` the peer's tool is the client: the same request comes once we
 * listen, and asks for the client to be started.
 */

import { mkdir, readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { parseArgs } from 'node:util';
import { CliError, EXIT } from './errors.js';
import { Prober } from '../conform/prober.js';
import { perftestExchange, perftestReaderExchange, pingpongExchange, roceExchange, type Exchange } from '../conform/exchange.js';
import { runConformance, type RunReport } from '../conform/runner.js';
import { toHtml, toJson } from '../conform/report.js';
import { fuzzPeer, replayFile, type ReplayFile } from '../conform/fuzz.js';
import { SUITES } from '../conform/cases.js';

export const CONFORM_USAGE =
  'roce conform --peer HOST [--exchange pingpong|perftest|perftest-reader|roce] [--verb write|read|atomic] [--suite NAME] [--case ID,…] ' +
  '[--report FILE.json] [--html FILE.html] [--seed N] [--bind ADDR] [--port OOB-PORT] | --fuzz --peer HOST --count N --time-limit S --seed N [--out DIR] ' +
  '[--max-findings N] [--minimize-s S] [--report FILE.json] | ' +
  '--replay FILE --peer HOST';

export async function conformCommand(argv: string[], out: (line: string) => void): Promise<number> {
  const { values: v } = parseArgs({
    args: argv,
    options: {
      peer: { type: 'string' },
      exchange: { type: 'string', default: 'pingpong' },
      verb: { type: 'string', default: 'write' },
      suite: { type: 'string', default: 'all' },
      case: { type: 'string' },
      report: { type: 'string' },
      html: { type: 'string' },
      seed: { type: 'string', default: '1' },
      bind: { type: 'string' },
      port: { type: 'string' },
      'udp-port': { type: 'string', default: '4791' },
      'peer-udp-port': { type: 'string', default: '4791' },
      'response-ms': { type: 'string', default: '1000' },
      'quiet-ms': { type: 'string', default: '400' },
      'peer-retry-cnt': { type: 'string' },
      'peer-timeout': { type: 'string' },
      control: { type: 'string' },
      fuzz: { type: 'boolean', default: false },
      count: { type: 'string', default: '1000' },
      'time-limit': { type: 'string', default: '60' },
      'max-findings': { type: 'string', default: '1' },
      'minimize-s': { type: 'string', default: '60' },
      out: { type: 'string', default: '.' },
      replay: { type: 'string' },
    },
    strict: true,
    allowPositionals: false,
  });
  const int = (name: string, s: string | undefined): number => {
    const n = Number(s);
    if (s === undefined || !Number.isInteger(n) || n < 0) throw new CliError(`--${name} needs a non-negative integer, not ${JSON.stringify(s)}`, EXIT.USAGE);
    return n;
  };
  const udpPort = int('udp-port', v['udp-port']);
  const peerUdpPort = int('peer-udp-port', v['peer-udp-port']);

  if (!v.peer) throw new CliError('--peer HOST is required', EXIT.USAGE);
  if (!SUITES[v.suite ?? 'all']) throw new CliError(`unknown suite ${v.suite}; suites: ${Object.keys(SUITES).join(', ')}`, EXIT.USAGE);
  const bind = v.bind ?? (v.peer.includes(':') ? '::' : '0.0.0.0');
  if (bind === '0.0.0.0' || bind === '::') throw new CliError('--bind ADDR is required: the peer checks our source address against the GID we give it', EXIT.USAGE);

  const stdin = v.control === 'stdio' ? createInterface({ input: process.stdin }) : undefined;
  const lines = stdin ? stdin[Symbol.asyncIterator]() : undefined;
  const restart = lines
    ? async (reason: string): Promise<void> => {
        process.stdout.write(`@@restart ${reason}\n`);
        for (;;) {
          const l = await lines.next();
          if (l.done || l.value.trim() === 'ready') return;
        }
      }
    : undefined;
  const oobPort = v.port !== undefined ? int('port', v.port) : undefined;
  const prober = await Prober.open({ bind, port: udpPort, peer: { address: v.peer, port: peerUdpPort } });
  let exchange: Exchange;
  switch (v.exchange) {
    case 'pingpong': {
      const o: Parameters<typeof pingpongExchange>[0] = { host: v.peer };
      if (oobPort !== undefined) o.port = oobPort;
      if (restart) o.restart = restart;
      if (v['peer-retry-cnt'] !== undefined) o.retryCnt = int('peer-retry-cnt', v['peer-retry-cnt']);
      if (v['peer-timeout'] !== undefined) o.timeout = int('peer-timeout', v['peer-timeout']);
      exchange = pingpongExchange(o);
      break;
    }
    case 'perftest': {
      if (v.verb !== 'write' && v.verb !== 'read' && v.verb !== 'atomic') throw new CliError('--verb is write, read or atomic', EXIT.USAGE);
      const o: Parameters<typeof perftestExchange>[0] = { host: v.peer, verb: v.verb };
      if (oobPort !== undefined) o.port = oobPort;
      if (restart) o.restart = restart;
      exchange = perftestExchange(o);
      break;
    }
    case 'perftest-reader': {
      // The peer runs `ib_read_bw … BIND` against us: we listen, then ask for it to be started.
      const o: Parameters<typeof perftestReaderExchange>[0] = { listen: bind };
      if (oobPort !== undefined) o.port = oobPort;
      o.startPeer = restart ?? (async () => out(`listening for the perftest client on ${bind}: start ib_read_bw -s 8 … ${bind}`));
      exchange = perftestReaderExchange(o);
      break;
    }
    case 'roce': {
      // `roce serve`: the probe QP gets retry_cnt/timeout from us (--peer-retry-cnt, --peer-timeout).
      const o: Parameters<typeof roceExchange>[0] = { host: v.peer, udpPort: () => prober.link.local.port };
      if (oobPort !== undefined) o.port = oobPort;
      if (v['peer-retry-cnt'] !== undefined) o.retryCnt = int('peer-retry-cnt', v['peer-retry-cnt']);
      if (v['peer-timeout'] !== undefined) o.timeout = int('peer-timeout', v['peer-timeout']);
      exchange = roceExchange(o);
      break;
    }
    default:
      throw new CliError(`unknown exchange ${v.exchange} (pingpong, perftest, perftest-reader, roce)`, EXIT.USAGE);
  }
  const timing = { responseMs: int('response-ms', v['response-ms']), quietMs: int('quiet-ms', v['quiet-ms']) };
  const log = (l: string): void => out(l);
  try {
    if (v.replay) {
      const file = JSON.parse(await readFile(v.replay, 'utf8')) as ReplayFile;
      const r = await replayFile({ prober, exchange, file, timing, log });
      out(`replay ${v.replay}: ${r.reproduced ? 'REPRODUCED' : 'not reproduced'} (${r.detail})`);
      return r.reproduced ? EXIT.OK : 1;
    }
    if (v.fuzz) {
      await mkdir(v.out ?? '.', { recursive: true });
      const maxFindings = int('max-findings', v['max-findings']);
      const r = await fuzzPeer({
        prober, exchange, seed: int('seed', v.seed), count: int('count', v.count), timeLimitS: int('time-limit', v['time-limit']), timing,
        outDir: v.out ?? '.', writeFile: (f, d) => writeFile(f, d), log, maxFindings,
        minimizeS: int('minimize-s', v['minimize-s']),
      });
      const l = r.liveness;
      out(`fuzz: ${r.tried} inputs in ${r.batches} batches, ${(r.durationMs / 1000).toFixed(1)} s (${r.inputsPerSecond}/s), ` +
        `${l.checks} liveness checks (${l.ok} answered, ${l.explainedFailures} QP errors after a fatal NAK, ${l.unexplainedFailures} unexplained), ` +
        `${r.reconnects} reconnects, ${r.findings.length} finding(s)`);
      for (const f of r.findings) out(`  ${f.kind}: ${f.detail}; ${f.datagrams} datagram(s): ${f.replay ?? ''} ${f.pcap ?? ''}`);
      if (v.report) await writeFile(v.report, JSON.stringify(r, null, 2) + '\n');
      return r.findings.length ? 1 : EXIT.OK;
    }
    const reportPath = v.report;
    const pcapDir = reportPath ? reportPath.replace(/\.json$/, '') + '.pcaps' : undefined;
    if (pcapDir) await mkdir(pcapDir, { recursive: true });
    const report: RunReport = await runConformance({
      prober, exchange, suite: v.suite ?? 'all', timing, log,
      ...(v.case ? { only: v.case.split(',') } : {}),
      ...(pcapDir ? { pcapDir, pcapPrefix: '', writeFile: (f: string, d: Uint8Array) => writeFile(f, d) } : {}),
    });
    if (pcapDir) for (const c of report.cases) if (c.pcap) c.pcap = path.join(path.basename(pcapDir), c.pcap);
    for (const c of report.cases) out(`${c.verdict.padEnd(15)} ${c.id.padEnd(26)} ${c.observed}`);
    out(Object.entries(report.counts).map(([k, n]) => `${k} ${n}`).join(', '));
    if (reportPath) await writeFile(reportPath, toJson(report));
    if (v.html) await writeFile(v.html, toHtml([report]));
    return report.counts.error > 0 ? 1 : EXIT.OK;
  } finally {
    stdin?.close();
    await prober.close();
  }
}

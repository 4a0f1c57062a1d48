/**
 * `roce serve --bind ADDR [--port 4791] [--dir DIR] [--oob-port 18515] [--mtu 256..4096]
 *  [--trace] [--capture FILE.pcap] [--snaplen BYTES] [--loss PCT --seed N] [--cc dcqcn|none]
 *  [--reserve BYTES] [--timeout SEC] [--cm [--peer-port N]]`
 *
 * --cm: clients connect through RDMA CM (cm-channel.ts) instead of TCP: the server listens on
 * rdma_cm port --oob-port (service ID 0x0000000001060000 + port) of its RoCE device, and answers
 * peers' CM MADs on their RoCE UDP port (--peer-port, default its own --port: 4791 on a network).
 *
 * Stores files that `roce send` uploads into DIR and serves DIR's files to `roce get`, for any
 * number of clients at once: one device on ADDR:PORT (UDP), one RC QP per client connection
 * on the out-of-band TCP port. Uploads land as DIR/.NAME.partial and are renamed to DIR/NAME
 * only once their sha256 verifies; a failed or abandoned upload leaves nothing behind.
 * `--reserve` refuses uploads that would leave less than BYTES free on the disk (the client is
 * told the server is full). Runs until Ctrl-C / SIGTERM, then prints a summary and exits 0.
 * Exit codes otherwise: see send.ts (2 usage, 4 address not local / port in use).
 */

import { EndpointError, dropsByReason, hostPort } from '../app/endpoint.js';
import { DEFAULT_OOB_PORT } from '../app/protocol.js';
import { fmtBytes, TransferError, TransferServer } from '../app/transfer.js';
import { gidToString } from '../oob/common.js';
import { CliError, EXIT } from './errors.js';
import { linePrinter } from './progress.js';
import { exitCodeOf, openCliEndpoint, parseCommandArgs, parseEndpointArgs } from './send.js';

export const SERVE_USAGE =
  'roce serve --bind ADDR [--port 4791] [--dir DIR] [--oob-port 18515] [--mtu 256..4096] [--trace] [--capture FILE.pcap] ' +
  '[--snaplen BYTES] [--loss PCT --seed N] [--cc dcqcn|none] [--reserve BYTES] [--timeout SEC] [--cm [--peer-port N]]';

export async function serveCommand(argv: string[], _out: (line: string) => void): Promise<number> {
  const { values, positionals } = parseCommandArgs(argv, {
    bind: { type: 'string' },
    port: { type: 'string', default: '4791' },
    dir: { type: 'string', default: '.' },
    'oob-port': { type: 'string', default: String(DEFAULT_OOB_PORT) },
    mtu: { type: 'string', default: '4096' },
    trace: { type: 'boolean', default: false },
    capture: { type: 'string' },
    snaplen: { type: 'string' },
    loss: { type: 'string' },
    seed: { type: 'string' },
    cc: { type: 'string', default: 'none' },
    reserve: { type: 'string', default: '0' },
    timeout: { type: 'string', default: '30' },
    cm: { type: 'boolean', default: false },
    'peer-port': { type: 'string' },
  }, SERVE_USAGE);
  if (positionals.length > 0) throw new CliError(`unexpected argument '${positionals[0]}'; usage: ${SERVE_USAGE}`, EXIT.USAGE);
  const bind = values['bind'];
  if (typeof bind !== 'string' || bind === '') throw new CliError('--bind ADDR is required (the local address to serve on)', EXIT.USAGE);
  const e = parseEndpointArgs(values);
  const oobPort = Number(values['oob-port']);
  if (!Number.isInteger(oobPort) || oobPort < 0 || oobPort > 65535) throw new CliError(`--oob-port must be a TCP port, not '${String(values['oob-port'])}'`, EXIT.USAGE);
  const reserve = Number(values['reserve']);
  if (!Number.isSafeInteger(reserve) || reserve < 0) throw new CliError(`--reserve must be a byte count, not '${String(values['reserve'])}'`, EXIT.USAGE);
  const dir = values['dir'] as string;
  const cm = values['cm'] === true;
  if (cm && oobPort === 0) throw new CliError('--cm needs a fixed --oob-port (the rdma_cm port clients connect to)', EXIT.USAGE);
  let peerPort: number | undefined;
  if (values['peer-port'] !== undefined) {
    if (!cm) throw new CliError('--peer-port only makes sense with --cm', EXIT.USAGE);
    peerPort = Number(values['peer-port']);
    if (!Number.isInteger(peerPort) || peerPort < 1 || peerPort > 65535) throw new CliError(`--peer-port must be a UDP port, not '${String(values['peer-port'])}'`, EXIT.USAGE);
  }

  const p = linePrinter();
  const ep = await openCliEndpoint(bind, e, p);
  let server: TransferServer;
  try {
    server = await TransferServer.start({
      ctx: ep.ctx, dir, oobAddress: bind, oobPort, reserveBytes: reserve, timeoutMs: e.timeoutMs,
      log: (l) => p.line(`serve: ${l}`),
      ...(cm ? { cm: peerPort !== undefined ? { peerPort } : {} } : {}),
    });
  } catch (err) {
    await ep.close();
    if (err instanceof EndpointError) throw new CliError(err.message, EXIT.LOCAL);
    if (err instanceof TransferError) throw new CliError(err.message, exitCodeOf(err));
    throw err;
  }
  p.line(`serve: listening: RoCEv2 UDP ${hostPort(ep.ctx.address, ep.ctx.port)} (GID ${gidToString(ep.ctx.gid)}, MTU ${ep.ctx.queryPort().activeMtu}), ` +
    (cm ? `RDMA CM on rdma_cm port ${server.oobPort}` : `out-of-band TCP ${hostPort(bind, server.oobPort)}`) + `, directory ${dir}`);
  if (e.lossPct !== undefined) p.line(`serve: dropping ${e.lossPct}% of our outgoing datagrams (seed ${e.seed})`);
  p.line('serve: Ctrl-C to stop');
  p.flush();

  await new Promise<void>((resolve) => {
    process.once('SIGINT', resolve);
    process.once('SIGTERM', resolve);
  });
  await server.close();
  const s = server.stats;
  const k = ep.ctx.counters;
  p.line(`serve: stopped: ${s.clients} connections, ${s.stored} files stored (${fmtBytes(s.bytesIn)}), ${s.served} served (${fmtBytes(s.bytesOut)}), ${s.failed} failed`);
  p.line(`serve: packets ${k.sentPkts} sent, ${k.rcvdPkts} received; retransmissions ${k.retransPkts}; duplicate requests ${k.dupReq}, out-of-sequence ${k.outOfSeqReq}`);
  const drops = dropsByReason(k, ep.link.drops);
  p.line(`serve: drops by reason: ${drops.length === 0 ? 'none' : drops.map(([n, v]) => `${n} ${v}`).join(', ')}`);
  if (ep.capture !== undefined) p.line(`serve: capture: ${ep.capture.path}`);
  await ep.close();
  p.flush();
  return EXIT.OK;
}

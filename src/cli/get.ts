/**
 * `roce get REMOTE_NAME --from HOST --out FILE [--mtu 256..4096] [--capture FILE.pcap]
 *  [--cc dcqcn|none] [--loss PCT --seed N] [--trace] [--oob-port 18515] [--cm [--peer-port 4791]]
 *  [--bind ADDR] [--port N] [--timeout SEC] [--snaplen BYTES]`
 *
 * Downloads REMOTE_NAME from a `roce serve` on HOST by RDMA READ: the server stages the file
 * chunk by chunk in a registered window and the client reads each chunk when told it is there.
 * The file lands as .FILE.partial next to FILE and is renamed only once its sha256 matches the
 * server's. --cm: rendezvous over RDMA CM instead of TCP, as for send. Exit codes: see send.ts.
 */

import { getFile } from '../app/transfer.js';
import { CliError, EXIT } from './errors.js';
import { CLIENT_ARG_OPTIONS, parseClientArgs, parseCommandArgs, runClient } from './send.js';

export const GET_USAGE =
  'roce get REMOTE_NAME --from HOST --out FILE [--mtu 256..4096] [--capture FILE.pcap] [--cc dcqcn|none] ' +
  '[--loss PCT --seed N] [--trace] [--oob-port 18515] [--cm [--peer-port 4791]] [--bind ADDR] [--port N] [--timeout SEC] [--snaplen BYTES]';

export async function getCommand(argv: string[], _out: (line: string) => void): Promise<number> {
  const { values, positionals } = parseCommandArgs(argv, {
    ...CLIENT_ARG_OPTIONS,
    from: { type: 'string' },
    out: { type: 'string' },
  }, GET_USAGE);
  const name = positionals[0];
  if (name === undefined || positionals.length > 1) throw new CliError(`usage: ${GET_USAGE}`, EXIT.USAGE);
  const out = values['out'];
  if (typeof out !== 'string' || out === '') throw new CliError('--out FILE is required', EXIT.USAGE);
  const cli = parseClientArgs(values, '--from', values['from'] as string | undefined);
  return runClient({
    verb: 'get', cli, what: `'${name}' → ${out}`,
    opLabel: 'RDMA READ',
    run: (o) => getFile({ ...o, name, out }),
    done: (r, where) => `get: wrote '${r.name}' from ${where} to ${out}`,
  });
}

/**
 * `roce decode FILE [--json] [--icrc strict|recover|off] [--port 4791]`
 *
 * One line per RoCEv2 packet (the printer traces use too), or one JSON object per line.
 * Exit 0 when every RoCEv2 packet is well formed with a good ICRC, 1 when any is not, 2 when
 * the file cannot be read as a capture.
 */

import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { decodeCapture, isGood, toJsonRecord, type DecodedFrame } from '../analyze/decode.js';
import { CaptureError } from '../pcap/format.js';
import { formatPacket } from '../wire/pretty.js';
import type { IcrcMode } from '../wire/icrc.js';
import { CliError, EXIT } from './errors.js';

export const DECODE_USAGE = 'roce decode FILE [--json] [--icrc strict|recover|off] [--port 4791]';

export function decodeCommand(argv: string[], out: (line: string) => void): number {
  const { values, positionals } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      json: { type: 'boolean', default: false },
      icrc: { type: 'string', default: 'strict' },
      port: { type: 'string', default: '4791' },
    },
  });
  const file = positionals[0];
  if (!file || positionals.length > 1) throw new CliError(`usage: ${DECODE_USAGE}`);
  const mode = values.icrc as string;
  if (mode !== 'strict' && mode !== 'recover' && mode !== 'off') throw new CliError(`--icrc must be strict, recover or off, not '${mode}'`);
  const port = Number(values.port);
  if (!Number.isInteger(port) || port < 1 || port > 65535) throw new CliError(`--port must be a UDP port number, not '${values.port}'`);

  let bytes: Uint8Array;
  try {
    bytes = readFileSync(file);
  } catch (e) {
    throw new CliError(`cannot read ${file}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
  }

  let bad = 0;
  try {
    for (const d of decodeCapture(bytes, { icrc: mode as IcrcMode, port })) {
      if (!isGood(d)) bad++;
      out(values.json ? JSON.stringify(toJsonRecord(d)) : formatLine(d));
    }
  } catch (e) {
    if (e instanceof CaptureError) throw new CliError(`${file}: not a readable capture: ${e.message}`);
    throw e;
  }
  return bad > 0 ? EXIT.FINDINGS : EXIT.OK;
}

/** `12 10.77.0.3:49441 > 10.77.0.2 RC_SEND_FIRST qp=… psn=… icrc=ok` */
export function formatLine(d: DecodedFrame): string {
  const head = `${String(d.frame).padStart(5)} ${fmtAddr(d.src)}:${d.sport} > ${fmtAddr(d.dst)}`;
  const body = d.packet ? formatPacket(d.packet) : `MALFORMED ${d.error?.code}: ${d.error?.detail}`;
  const icrc = d.icrc.status === 'ok-recovered' ? `icrc=ok-recovered(id=0x${(d.icrc.ipId ?? 0).toString(16)})` : `icrc=${d.icrc.status}`;
  return `${head} ${body} ${icrc}`;
}

const fmtAddr = (a: string): string => (a.includes(':') ? `[${a}]` : a);

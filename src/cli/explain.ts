/**
 * `roce explain FILE [--frames 1-20] [--icrc strict|recover|off] [--port 4791]`
 *
 * Walks a capture packet by packet in plain words: what each opcode does, what its header
 * fields mean, how it relates to earlier packets of its connection; then a summary.
 * `--frames` chooses which frames are printed (every frame is still tracked). Exit 0 when
 * every printed packet is well formed with a good ICRC, 1 when any is not, 2 when the input
 * or the arguments are unusable.
 */

import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { decodeCapture } from '../analyze/decode.js';
import { explainCapture, parseFrameSelection, renderExplanation, type ExplainOptions } from '../analyze/explain.js';
import { CaptureError } from '../pcap/format.js';
import type { IcrcMode } from '../wire/icrc.js';
import { CliError, EXIT } from './errors.js';

export const EXPLAIN_USAGE = 'roce explain FILE [--frames 1-20] [--icrc strict|recover|off] [--port 4791]';

export function explainCommand(argv: string[], out: (line: string) => void): number {
  let parsed;
  try {
    parsed = parseArgs({
      args: argv,
      allowPositionals: true,
      options: {
        frames: { type: 'string' },
        icrc: { type: 'string', default: 'strict' },
        port: { type: 'string', default: '4791' },
      },
    });
  } catch (e) {
    throw new CliError(`${(e as Error).message}; usage: ${EXPLAIN_USAGE}`);
  }
  const { values, positionals } = parsed;
  const file = positionals[0];
  if (!file || positionals.length > 1) throw new CliError(`usage: ${EXPLAIN_USAGE}`);
  const mode = values.icrc;
  if (mode !== 'strict' && mode !== 'recover' && mode !== 'off') throw new CliError(`--icrc must be strict, recover or off, not '${mode}'`);
  const port = Number(values.port);
  if (!Number.isInteger(port) || port < 1 || port > 65535) throw new CliError(`--port must be a UDP port number, not '${values.port}'`);
  const opts: ExplainOptions = {};
  if (values.frames !== undefined) {
    try {
      opts.select = parseFrameSelection(values.frames);
    } catch (e) {
      throw new CliError((e as Error).message);
    }
  }

  let bytes: Uint8Array;
  try {
    bytes = readFileSync(file);
  } catch (e) {
    throw new CliError(`cannot read ${file}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
  }
  let result;
  try {
    result = explainCapture(decodeCapture(bytes, { icrc: mode as IcrcMode, port }), opts);
  } catch (e) {
    if (e instanceof CaptureError) throw new CliError(`${file}: not a readable capture: ${e.message}`);
    throw e;
  }
  for (const line of renderExplanation(result)) out(line);
  return result.badSelected > 0 ? EXIT.FINDINGS : EXIT.OK;
}

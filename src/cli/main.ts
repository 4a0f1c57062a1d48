#!/usr/bin/env node
/**
 * The `roce` command: subcommand dispatch, and the single place where errors become one
 * line on stderr and an exit code (see errors.ts). No stack trace reaches a user unless
 * ROCE_DEBUG is set.
 */

import { CliError, EXIT } from './errors.js';
import { decodeCommand, DECODE_USAGE } from './decode.js';
import { explainCommand, EXPLAIN_USAGE } from './explain.js';
import { simCommand, SIM_USAGE } from './sim.js';

type Command = (argv: string[], out: (line: string) => void) => number | Promise<number>;

const COMMANDS: Record<string, { run: Command; usage: string; summary: string }> = {
  decode: { run: decodeCommand, usage: DECODE_USAGE, summary: 'print every RoCEv2 packet of a pcap/pcapng capture, with its ICRC verdict' },
  explain: { run: explainCommand, usage: EXPLAIN_USAGE, summary: 'walk a capture packet by packet in plain words: opcodes, fields, ACKs, NAKs, retransmissions' },
  sim: { run: simCommand, usage: SIM_USAGE, summary: 'simulate DCQCN flows into an ECN-marking bottleneck; write CSV and SVG' },
};

function usage(): string {
  const lines = ['usage: roce COMMAND [ARGS]', '', 'commands:'];
  for (const [name, c] of Object.entries(COMMANDS)) lines.push(`  ${name.padEnd(10)} ${c.summary}`, `             ${c.usage}`);
  return lines.join('\n');
}

export async function main(argv: string[]): Promise<number> {
  const [name, ...rest] = argv;
  if (!name || name === '-h' || name === '--help' || name === 'help') {
    process.stdout.write(usage() + '\n');
    return name ? EXIT.OK : EXIT.USAGE;
  }
  const cmd = COMMANDS[name];
  if (!cmd) {
    process.stderr.write(`roce: unknown command '${name}' (try 'roce --help')\n`);
    return EXIT.USAGE;
  }
  // Lines go through one buffered writer: a capture of 100k packets must not make 100k writes.
  let buf = '';
  const out = (line: string): void => {
    buf += line + '\n';
    if (buf.length > 1 << 16) {
      process.stdout.write(buf);
      buf = '';
    }
  };
  try {
    return await cmd.run(rest, out);
  } catch (e) {
    if (e instanceof CliError) {
      process.stderr.write(`roce ${name}: ${e.message}\n`);
      return e.exitCode;
    }
    if (e instanceof TypeError && (e as NodeJS.ErrnoException).code?.startsWith('ERR_PARSE_ARGS')) {
      process.stderr.write(`roce ${name}: ${e.message}\nusage: ${cmd.usage}\n`);
      return EXIT.USAGE;
    }
    if (process.env['ROCE_DEBUG']) throw e;
    process.stderr.write(`roce ${name}: internal error: ${(e as Error).message} (set ROCE_DEBUG=1 for details)\n`);
    return EXIT.INTERNAL;
  } finally {
    if (buf) process.stdout.write(buf);
  }
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (e) => {
    process.stderr.write(`roce: ${(e as Error).stack ?? e}\n`);
    process.exitCode = EXIT.INTERNAL;
  },
);

#!/usr/bin/env node
/**
 * The `roce` command: subcommand dispatch, and the single place where errors become one
 * line on stderr and an exit code (see errors.ts). No stack trace reaches a user unless
 * ROCE_DEBUG is set.
 */

import { CliError, EXIT } from './errors.js';
import { bottleneckCommand, BOTTLENECK_USAGE } from './bottleneck.js';
import { decodeCommand, DECODE_USAGE } from './decode.js';
import { explainCommand, EXPLAIN_USAGE } from './explain.js';
import { perfCommand, PERF_CLI_USAGE } from './perf.js';
import { pingpongCommand, PINGPONG_CLI_USAGE } from './pingpong.js';
import { simCommand, SIM_USAGE } from './sim.js';
import { conformCommand, CONFORM_USAGE } from './conform.js';
import { serveCommand, SERVE_USAGE } from './serve.js';
import { sendCommand, SEND_USAGE } from './send.js';
import { getCommand, GET_USAGE } from './get.js';
import { demoCommand, DEMO_USAGE } from './demo.js';
import { rpingCommand, RPING_USAGE } from './rping.js';

type Command = (argv: string[], out: (line: string) => void) => number | Promise<number>;

const COMMANDS: Record<string, { run: Command; usage: string; summary: string }> = {
  decode: { run: decodeCommand, usage: DECODE_USAGE, summary: 'print every RoCEv2 packet of a pcap/pcapng capture, with its ICRC verdict' },
  explain: { run: explainCommand, usage: EXPLAIN_USAGE, summary: 'walk a capture packet by packet in plain words: opcodes, fields, ACKs, NAKs, retransmissions' },
  perf: { run: perfCommand, usage: PERF_CLI_USAGE, summary: 'ib_write/read/send/atomic_bw on our engine, wire-compatible with perftest 4.5, client or server' },
  pingpong: { run: pingpongCommand, usage: PINGPONG_CLI_USAGE, summary: 'ibv_rc/uc/ud_pingpong on our engine, wire-compatible with rdma-core 44, client or server' },
  bottleneck: { run: bottleneckCommand, usage: BOTTLENECK_USAGE, summary: 'relay UDP between stack processes through a rate-limited FIFO that marks FECN (RED) and tail-drops' },
  sim: { run: simCommand, usage: SIM_USAGE, summary: 'simulate DCQCN flows into an ECN-marking bottleneck; write CSV and SVG' },
  conform: { run: conformCommand, usage: CONFORM_USAGE, summary: 'test a RoCEv2 peer against IBTA rules (scripted cases, fuzzing, replay) and report deviations' },
  serve: { run: serveCommand, usage: SERVE_USAGE, summary: 'store and serve files over RDMA for many clients at once (RC, sha256-verified)' },
  send: { run: sendCommand, usage: SEND_USAGE, summary: 'upload a file to a roce serve by RDMA WRITE (or SEND), with progress and a summary' },
  get: { run: getCommand, usage: GET_USAGE, summary: 'download a file from a roce serve by RDMA READ' },
  demo: { run: demoCommand, usage: DEMO_USAGE, summary: 'server and client on loopback: 64 MiB by RDMA WRITE, verified, with a capture to open in Wireshark' },
  rping: { run: rpingCommand, usage: RPING_USAGE, summary: 'librdmacm rping over the RDMA CM, either role, interoperating with rping' },
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

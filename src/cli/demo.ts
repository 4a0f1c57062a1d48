/**
 * `roce demo [--size 64M] [--op write|send] [--dir DIR] [--snaplen BYTES] [--keep]`
 *
 * The first five minutes: on this machine, a `roce serve` and a `roce send` as two processes
 * over loopback UDP (server 127.0.0.1, client 127.0.0.2, both on UDP 4791 when free so that
 * Wireshark recognises RoCEv2 without help), a generated file moved by RDMA WRITE, its sha256
 * checked on the server and again here, and a capture of the client's side of it.
 *
 * The capture holds whole packets, so it is about as large as the file (~66 MiB for 64 MiB):
 * every ICRC in it can be checked, and `roce explain` can follow every message. `--snaplen 128`
 * keeps only the first 128 bytes of each packet, as `tcpdump -s 128` does (~2.5 MiB: every
 * header, enough for Wireshark, but `roce explain` then skips the cut-off data packets).
 *
 * Exit codes: 0 when the file arrived intact, otherwise the failing child's code (see send.ts)
 * or 1 when the received copy does not match.
 */

import { spawn, type ChildProcess } from 'node:child_process';
import { createHash, randomFillSync } from 'node:crypto';
import dgram from 'node:dgram';
import { createReadStream } from 'node:fs';
import { mkdir, mkdtemp, open, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { fmtBytes, MiB } from '../app/transfer.js';
import { CliError, EXIT } from './errors.js';
import { fmtRate, linePrinter } from './progress.js';
import { parseCommandArgs } from './send.js';

export const DEMO_USAGE = 'roce demo [--size 64M] [--op write|send] [--dir DIR] [--snaplen BYTES] [--keep]';
const ROCE_PORT = 4791;

function parseSize(text: string): number {
  const m = /^(\d+(?:\.\d+)?)\s*([kmg]?)(i?b)?$/i.exec(text.trim());
  if (!m) throw new CliError(`--size must be a size like 64M, 512K or 1G, not '${text}'`, EXIT.USAGE);
  const mult = { '': 1, k: 1024, m: MiB, g: 1024 * MiB }[m[2]!.toLowerCase() as '' | 'k' | 'm' | 'g'];
  const n = Math.round(Number(m[1]) * mult);
  if (n < 0 || n > 4 * 1024 * MiB) throw new CliError(`--size ${text} is outside 0..4G`, EXIT.USAGE);
  return n;
}

/** Whether UDP address:port can be bound right now (another stack may hold 4791). */
async function udpFree(address: string, port: number): Promise<boolean> {
  const s = dgram.createSocket('udp4');
  return new Promise<boolean>((resolve) => {
    s.once('error', () => {
      s.close();
      resolve(false);
    });
    s.bind({ address, port, exclusive: true }, () => s.close(() => resolve(true)));
  });
}

async function sha256File(path: string): Promise<string> {
  const h = createHash('sha256');
  for await (const chunk of createReadStream(path, { highWaterMark: 4 * MiB })) h.update(chunk as Buffer);
  return h.digest('hex');
}

function exited(child: ChildProcess): Promise<number> {
  return new Promise((resolve) => {
    if (child.exitCode !== null) resolve(child.exitCode);
    else child.once('exit', (code, sig) => resolve(code ?? (sig === 'SIGINT' ? EXIT.INTERRUPTED : EXIT.INTERNAL)));
  });
}

export async function demoCommand(argv: string[], _out: (line: string) => void): Promise<number> {
  const { values, positionals } = parseCommandArgs(argv, {
    size: { type: 'string', default: '64M' },
    op: { type: 'string', default: 'write' },
    dir: { type: 'string' },
    snaplen: { type: 'string' },
    keep: { type: 'boolean', default: false },
  }, DEMO_USAGE);
  if (positionals.length > 0) throw new CliError(`unexpected argument '${positionals[0]}'; usage: ${DEMO_USAGE}`, EXIT.USAGE);
  const size = parseSize(values['size'] as string);
  const op = values['op'] as string;
  if (op !== 'write' && op !== 'send') throw new CliError(`--op must be write or send, not '${op}'`, EXIT.USAGE);
  const snapText = values['snaplen'];
  const snap = snapText === undefined ? undefined : Number(snapText);
  if (snap !== undefined && (!Number.isInteger(snap) || snap < 64 || snap > 262144)) {
    throw new CliError(`--snaplen must be an integer in 64..262144, not '${String(snapText)}'`, EXIT.USAGE);
  }
  const p = linePrinter();
  const t0 = Date.now();
  const main = fileURLToPath(new URL('./main.js', import.meta.url));
  const work = typeof values['dir'] === 'string' ? values['dir'] : await mkdtemp(join(tmpdir(), 'roce-demo-'));
  const recvDir = join(work, 'received');
  await mkdir(recvDir, { recursive: true });
  const name = `demo-${fmtBytes(size).replace(/\s+|\.0\b/g, '')}.bin`;
  const src = join(work, name);
  const pcap = join(work, 'demo.pcap');

  // A random file: a pattern would compress in transit nowhere, but random data shows in a
  // capture that nothing is faked.
  p.line(`demo: generating ${fmtBytes(size)} of random data in ${src}`);
  p.flush();
  const h = createHash('sha256');
  const fh = await open(src, 'w');
  try {
    const block = Buffer.allocUnsafe(Math.min(size, 4 * MiB) || 1);
    for (let off = 0; off < size; off += block.length) {
      const b = block.subarray(0, Math.min(block.length, size - off));
      randomFillSync(b);
      h.update(b);
      await fh.write(b, 0, b.length, off);
    }
  } finally {
    await fh.close();
  }
  const want = h.digest('hex');

  // Two loopback addresses, both on 4791 when free (Wireshark decodes RoCEv2 on UDP 4791).
  const serverAddr = '127.0.0.1';
  let clientAddr = '127.0.0.2';
  if (!(await udpFree(clientAddr, 0))) clientAddr = '127.0.0.1';
  const serverPort = (await udpFree(serverAddr, ROCE_PORT)) ? ROCE_PORT : 0;
  const clientPort = clientAddr !== serverAddr && (await udpFree(clientAddr, ROCE_PORT)) ? ROCE_PORT : 0;

  const children: ChildProcess[] = [];
  const kill = (): void => {
    for (const c of children) if (c.exitCode === null) c.kill('SIGINT');
  };
  process.once('SIGINT', kill);
  process.once('SIGTERM', kill);
  try {
    const env = { ...process.env, NODE_NO_WARNINGS: '1' };
    const server = spawn(process.execPath, [main, 'serve', '--bind', serverAddr, '--port', String(serverPort), '--oob-port', '0', '--dir', recvDir], {
      stdio: ['ignore', 'pipe', 'pipe'], env,
    });
    children.push(server);
    const serverExit = exited(server);
    server.stderr!.on('data', (d: Buffer) => process.stderr.write(d));
    const lines = createInterface({ input: server.stdout! });
    const listening = new Promise<string>((resolve, reject) => {
      lines.on('line', (l) => {
        p.line(`  [server] ${l}`);
        if (l.includes('listening:')) resolve(l);
      });
      void serverExit.then((code) => reject(new CliError(`the server exited with code ${code} before listening`, code || EXIT.INTERNAL)));
    });
    const hello = await listening;
    const oob = /out-of-band TCP [^ ]*:(\d+),/.exec(hello);
    const udp = /RoCEv2 UDP [^ ]*:(\d+) /.exec(hello);
    if (!oob || !udp) throw new CliError(`cannot parse the server's listening line: ${hello}`, EXIT.INTERNAL);
    p.line(`demo: client: roce send ${src} --to ${serverAddr} --bind ${clientAddr} --op ${op}`);
    p.flush();

    const client = spawn(process.execPath, [
      main, 'send', src, '--to', serverAddr, '--oob-port', oob[1]!, '--bind', clientAddr, '--port', String(clientPort), '--op', op,
      '--capture', pcap, ...(snap === undefined ? [] : ['--snaplen', String(snap)]),
    ], { stdio: ['ignore', 'inherit', 'inherit'], env });
    children.push(client);
    const sent = Date.now();
    const code = await exited(client);
    const secs = (Date.now() - sent) / 1000;
    if (code !== 0) {
      kill();
      await serverExit;
      p.line(`demo: the client failed (exit ${code}); files are in ${work}`);
      return code;
    }
    const got = await sha256File(join(recvDir, name));
    const ok = got === want;
    p.line(ok
      ? `demo: verified: ${join(recvDir, name)} has sha256 ${got}, identical to the source`
      : `demo: MISMATCH: received sha256 ${got}, source ${want}`);
    p.line(`demo: client process wall time ${secs.toFixed(2)} s (start-up, hashing, connect and transfer): ${fmtRate(size, secs)}`);
    server.kill('SIGINT');
    await serverExit;
    p.flush();
    const capSize = (await stat(pcap)).size;
    p.line('');
    p.line(`demo: capture: ${pcap} (${fmtBytes(capSize)}, ${snap === undefined ? 'whole packets' : `the first ${snap} bytes of each packet`})`);
    p.line('demo: look at it with');
    p.line(`  wireshark ${pcap}`);
    p.line(`  tshark -r ${pcap} -c 20`);
    p.line(`  roce explain ${pcap} --frames 1-20        (from a checkout: node ${relative(process.cwd(), main) || main} explain …)`);
    if (serverPort !== ROCE_PORT || clientPort !== ROCE_PORT) {
      p.line(`  (UDP 4791 was busy here, so one side used another port: in Wireshark use Decode As… UDP port → InfiniBand)`);
    }
    if (values['keep'] !== true) {
      await rm(src, { force: true });
      await rm(join(recvDir, name), { force: true });
      p.line(`demo: removed the ${fmtBytes(size)} source and its copy (--keep keeps them)`);
    }
    p.line(`demo: done in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
    return ok ? EXIT.OK : EXIT.FINDINGS;
  } finally {
    kill();
    process.off('SIGINT', kill);
    process.off('SIGTERM', kill);
    p.flush();
  }
}

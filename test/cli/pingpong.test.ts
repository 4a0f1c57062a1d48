/**
 * `roce pingpong` against itself, as a user runs it: two processes on 127.0.0.1 (server) and
 * 127.0.0.2 (client) sharing a RoCEv2 UDP port the test picks (the exchange carries no UDP port, so
 * both sides use the same one, as RoCE peers share 4791), RC, UC and UD; then the ways it fails:
 * one line on stderr, the exit codes of errors.ts, and never a hang.
 */
import t, { type Test } from 'tap';
import { spawn } from 'node:child_process';
import dgram from 'node:dgram';
import net from 'node:net';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { decodeCapture, isGood } from '../../src/analyze/decode.js';

const ROOT = join(import.meta.dirname, '../../..');
const CLI = join(ROOT, 'dist/src/cli/main.js');

interface Run {
  code: number | null;
  out: string;
  err: string;
  ms: number;
}

function roce(args: string[], timeoutMs = 30_000): Promise<Run> {
  const start = Date.now();
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [CLI, 'pingpong', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => { out += d; });
    child.stderr.setEncoding('utf8').on('data', (d: string) => { err += d; });
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, out, err, ms: Date.now() - start });
    });
  });
}

/** A TCP port nothing listens on now. */
function freeTcpPort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const p = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(p));
    });
  });
}

/** A UDP port free on both 127.0.0.1 and 127.0.0.2. */
async function freeUdpPort(): Promise<number> {
  for (;;) {
    const a = dgram.createSocket('udp4');
    const port = await new Promise<number>((r) => a.bind(0, '127.0.0.1', () => r(a.address().port)));
    const b = dgram.createSocket('udp4');
    const ok = await new Promise<boolean>((r) => {
      b.once('error', () => r(false));
      b.bind(port, '127.0.0.2', () => r(true));
    });
    await new Promise<void>((r) => a.close(() => r()));
    if (ok) {
      await new Promise<void>((r) => b.close(() => r()));
      return port;
    }
  }
}

const ADDR = (side: 'local' | 'remote'): RegExp =>
  new RegExp(`^  ${side} address: {1,2}LID 0x0000, QPN 0x([0-9a-f]{6}), PSN 0x([0-9a-f]{6})[,:] GID (\\S+)$`, 'm');

function addr(text: string, side: 'local' | 'remote'): string | undefined {
  const m = ADDR(side).exec(text);
  return m ? m.slice(1).join('/') : undefined;
}

/** Our server, then our client once the server listens. */
async function pair(serverArgs: string[], clientArgs: string[]): Promise<{ server: Run; client: Run }> {
  const port = await freeTcpPort();
  const udp = await freeUdpPort();
  const p = ['-p', String(port), '--udp-port', String(udp)];
  const server = roce([...p, ...serverArgs]);
  // The client retries its connection for 5 s while the server comes up.
  const client = await roce(['127.0.0.1', ...p, '--bind', '127.0.0.2', ...clientArgs]);
  return { server: await server, client };
}

const cases = [
  { tr: 'rc', args: ['-s', '4097', '-n', '20', '-m', '1024'], bytes: 4097 * 20 * 2, iters: 20 },
  { tr: 'uc', args: ['-s', '65536', '-n', '10', '-m', '256'], bytes: 65536 * 10 * 2, iters: 10 },
  { tr: 'ud', args: ['-s', '1024', '-n', '20'], bytes: 1024 * 20 * 2, iters: 20 },
  { tr: 'ud', args: ['-s', '0', '-n', '5'], bytes: 0, iters: 5 },
] as const;

for (const c of cases) {
  t.test(`${c.tr}: our server and our client (${c.args.join(' ')})`, async (t) => {
    const args = ['--transport', c.tr, ...c.args];
    const { server, client } = await pair(['--bind', '127.0.0.1', ...args], args);
    t.equal(server.code, 0, `server: ${server.err}`);
    t.equal(client.code, 0, `client: ${client.err}`);
    for (const [who, r] of [['server', server], ['client', client]] as const) {
      const lines = r.out.trimEnd().split('\n');
      t.equal(lines.length, 4, `${who}: local, remote, and the two summary lines`);
      t.match(lines[2], new RegExp(`^${c.bytes} bytes in \\d+\\.\\d\\d seconds = (\\d+\\.\\d\\d|nan|inf) Mbit/sec$`), `${who}: bytes line`);
      t.match(lines[3], new RegExp(`^${c.iters} iters in \\d+\\.\\d\\d seconds = \\d+\\.\\d\\d usec/iter$`), `${who}: iters line`);
      // A loaded machine may delay UdpLink's start-up probe into a (harmless here) warning.
      const errors = r.err.split('\n').filter((l) => l.startsWith('roce'));
      t.same(errors, [], `${who}: no error on stderr`);
    }
    t.equal(addr(server.out, 'remote'), addr(client.out, 'local'), 'the server got the client\'s QPN, PSN and GID');
    t.equal(addr(client.out, 'remote'), addr(server.out, 'local'), 'the client got the server\'s');
    t.match(addr(client.out, 'local'), /\/::ffff:127\.0\.0\.2$/);
    t.match(addr(server.out, 'local'), /\/::ffff:127\.0\.0\.1$/);
    if (c.tr === 'ud') t.match(client.out, /PSN 0x[0-9a-f]{6}: GID/, 'ud_pingpong\'s ":" in the local line');
  });
}

t.test('the server picks the address of the family the client announces', async (t) => {
  // No --bind: the client's GID is IPv4-mapped and its connection came in on 127.0.0.1.
  const { server, client } = await pair(['--transport', 'rc', '-n', '5', '-s', '64'], ['--transport', 'rc', '-n', '5', '-s', '64']);
  t.equal(server.code, 0, server.err);
  t.equal(client.code, 0, client.err);
  t.match(addr(server.out, 'local'), /\/::ffff:127\.0\.0\.1$/);
});

t.test('--capture writes both directions with good ICRCs; --trace prints every packet', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'roce-pingpong-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const file = join(dir, 'client.pcap');
  const args = ['--transport', 'rc', '-n', '3', '-s', '2000', '-m', '1024'];
  const { server, client } = await pair(['--bind', '127.0.0.1', ...args], [...args, '--capture', file, '--trace']);
  t.equal(server.code, 0, server.err);
  t.equal(client.code, 0, client.err);
  const udp = Number(/(?:^|\n)tx 127\.0\.0\.1:(\d+) /.exec(client.err)?.[1]);
  const frames = [...decodeCapture(readFileSync(file), { icrc: 'strict', port: udp })];
  // 3 SENDs of 2 packets each way, and the ACKs. A loaded machine may hold an ACK past the ACK
  // timeout (timeout 14: 67 ms), and the message is then sent again: every copy beyond the 6 must be
  // a retransmission the client counted (retransPkts), and the 6 PSNs each side sends are distinct.
  const counters = /^counters: (.*)$/m.exec(client.err)?.[1] ?? '';
  t.match(counters, /rcvdPkts=\d+/, 'trace: the counters at the end');
  const retrans = Number(/retransPkts=(\d+)/.exec(counters)?.[1] ?? 0);
  if (retrans > 0) t.comment(`the client retransmitted: ${counters}`);
  const sends = frames.filter((d) => (d.packet?.bth.opcode ?? 0xff) <= 5);
  const ours = sends.filter((d) => d.src === '127.0.0.2');
  const theirs = sends.filter((d) => d.src === '127.0.0.1');
  t.equal(new Set(ours.map((d) => d.packet!.bth.psn)).size, 6, 'our 6 SEND packets');
  t.equal(ours.length, 6 + retrans, 'and the copies the client counted as retransmitted');
  t.equal(new Set(theirs.map((d) => d.packet!.bth.psn)).size, 6, 'the server\'s 6 SEND packets');
  t.ok(frames.every(isGood), 'every frame parses with a good ICRC');
  const trace = client.err.split('\n');
  t.equal(trace.filter((l) => /^tx .* RC_SEND_(FIRST|LAST)/.test(l)).length, 6 + retrans, 'trace: 6 SEND packets out, and the copies');
  t.equal(trace.filter((l) => /^rx .* RC_SEND_(FIRST|LAST)/.test(l)).length, theirs.length, 'trace: the SEND packets in, as captured');
  t.ok(theirs.length >= 6, 'trace: at least the server\'s 6 SEND packets in');
});

function oneLine(t: Test, r: Run, code: number, re: RegExp): void {
  t.equal(r.code, code, `exit ${code}`);
  t.equal(r.err.trimEnd().split('\n').length, 1, `one line: ${r.err}`);
  t.match(r.err, re);
}

t.test('a HOST that does not resolve: one line, exit 3', async (t) => {
  const r = await roce(['no-such-host.invalid', '--bind', '127.0.0.2']);
  oneLine(t, r, 3, /^roce pingpong: cannot resolve no-such-host\.invalid: /);
});

t.test('no server: a bounded wait, one line, exit 3', async (t) => {
  const port = await freeTcpPort();
  const udp = await freeUdpPort();
  const r = await roce(['127.0.0.1', '-p', String(port), '--bind', '127.0.0.2', '--udp-port', String(udp)]);
  oneLine(t, r, 3, new RegExp(`^roce pingpong: no pingpong server at 127\\.0\\.0\\.1:${port} after 5 s \\(ECONNREFUSED\\)`));
  t.ok(r.ms < 15_000, `gave up after ${r.ms} ms`);
});

t.test('usage errors: one line, exit 2', async (t) => {
  oneLine(t, await roce(['--transport', 'xx']), 2, /--transport must be rc, uc or ud/);
  oneLine(t, await roce(['127.0.0.1', '-s', '0']), 2, /-s 0: ibv_rc_pingpong cannot run 0-byte messages/);
  oneLine(t, await roce(['127.0.0.1', '--bind', 'not-an-address']), 2, /--bind: not an IP address/);
  oneLine(t, await roce(['127.0.0.1', '-i', '2']), 2, /-i 2: the device has one port/);
  oneLine(t, await roce(['--transport', 'ud', '-s', '8192']), 2, /does not fit a UD message/);
});

t.test('an address that is not ours: one line, exit 4', async (t) => {
  const udp = await freeUdpPort();
  const r = await roce(['127.0.0.1', '--bind', '192.0.2.1', '--udp-port', String(udp), '-p', String(await freeTcpPort())]);
  oneLine(t, r, 4, /cannot bind 192\.0\.2\.1:\d+ for RoCEv2: EADDRNOTAVAIL/);
});

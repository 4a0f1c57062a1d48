/**
 * `roce perf` against itself: the server and the client as two processes of the real CLI, on
 * 127.0.0.2 and 127.0.0.1 (RoCEv2 over the loopback's UDP, the perftest exchange over TCP),
 * for every test and transport; then bad inputs: one line on stderr and the documented exit code.
 */
import t from 'tap';
import { spawn } from 'node:child_process';
import dgram from 'node:dgram';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { fillPerfPattern, perfLayout, perfSlot } from '../../src/cli/perf.js';

const CLI = fileURLToPath(new URL('../../src/cli/main.js', import.meta.url));
const work = mkdtempSync(path.join(tmpdir(), 'roce-perf-'));
t.teardown(() => rmSync(work, { recursive: true, force: true }));

interface Run { code: number | null; stdout: string; stderr: string }

function roce(args: string[], timeoutMs = 60_000): Promise<Run> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [CLI, ...args], { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, NODE_NO_WARNINGS: '1' } });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => { stdout += d; });
    child.stderr.setEncoding('utf8').on('data', (d: string) => { stderr += d; });
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

/** A TCP port free on the loopback, and a UDP port free on both loopback addresses. */
async function freePorts(): Promise<{ tcp: number; udp: number }> {
  const tcp = await new Promise<number>((resolve) => {
    const s = net.createServer().listen(0, '0.0.0.0', () => {
      const p = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(p));
    });
  });
  for (;;) {
    const a = dgram.createSocket('udp4');
    const port = await new Promise<number>((resolve) => a.bind(0, '127.0.0.1', () => resolve(a.address().port)));
    const b = dgram.createSocket('udp4');
    const ok = await new Promise<boolean>((resolve) => {
      b.once('error', () => resolve(false));
      b.bind(port, '127.0.0.2', () => resolve(true));
    });
    a.close();
    b.close();
    if (ok) return { tcp, udp: port };
  }
}

const REPORT = /^ (\d+)\s+(\d+)\s+(\d+\.\d+)\s+(\d+\.\d+)\s+(\d+\.\d+)$/m;

async function pair(serverArgs: string[], clientArgs: string[]): Promise<{ server: Run; client: Run }> {
  const { tcp, udp } = await freePorts();
  const common = ['-p', String(tcp), '--udp-port', String(udp)];
  const server = roce(['perf', ...serverArgs, '--bind', '127.0.0.2', ...common]);
  // The client retries while the server is not listening yet.
  const client = roce(['perf', ...clientArgs.slice(0, 1), '127.0.0.2', ...clientArgs.slice(1), '--bind', '127.0.0.1', ...common]);
  return { server: await server, client: await client };
}

const CASES: { name: string; args: string[] }[] = [
  { name: 'RC write 64 KiB', args: ['write', '-s', '65536', '-n', '20', '-m', '1024'] },
  { name: 'RC read 4097 B', args: ['read', '-s', '4097', '-n', '20', '-m', '1024'] },
  { name: 'RC send 1 B', args: ['send', '-s', '1', '-n', '50'] },
  { name: 'RC send 64 KiB, TX depth 4', args: ['send', '-s', '65536', '-n', '10', '-t', '4', '-m', '4096'] },
  { name: 'UC write', args: ['write', '-c', 'UC', '-s', '8192', '-n', '10', '-m', '2048'] },
  { name: 'UC send', args: ['send', '-c', 'UC', '-s', '3000', '-n', '10', '-m', '1024'] },
  { name: 'UD send', args: ['send', '-c', 'UD', '-s', '1024', '-n', '10', '-m', '1024'] },
  { name: 'atomic FETCH_AND_ADD', args: ['atomic', '-A', 'FETCH_AND_ADD', '-n', '20'] },
  { name: 'atomic CMP_AND_SWAP', args: ['atomic', '-A', 'CMP_AND_SWAP', '-n', '20'] },
];

for (const c of CASES) {
  t.test(`our server, our client: ${c.name}`, async (t) => {
    const dumpS = path.join(work, `${c.name.replace(/\W+/g, '_')}.server`);
    const dumpC = path.join(work, `${c.name.replace(/\W+/g, '_')}.client`);
    const { server, client } = await pair([...c.args, '--dump', dumpS], [...c.args, '--dump', dumpC]);
    t.equal(server.code, 0, `server exits 0: ${server.stderr}`);
    t.equal(client.code, 0, `client exits 0: ${client.stderr}`);
    for (const [who, r] of [['server', server], ['client', client]] as const) {
      t.match(r.stdout, / #bytes {5}#iterations {4}BW peak\[MB\/sec\]/, `${who} prints the report header`);
      t.match(r.stdout, REPORT, `${who} prints a report line`);
      t.match(r.stdout, /^ local address: LID 0000 QPN 0x[0-9a-f]{4,6} PSN/m);
      t.match(r.stdout, /^ remote address: LID 0000 QPN/m);
    }
    const iters = c.args[c.args.indexOf('-n') + 1];
    const size = c.args.includes('-s') ? c.args[c.args.indexOf('-s') + 1] : '8';
    const line = REPORT.exec(client.stdout);
    t.equal(line?.[1], size, 'the client reports its message size');
    t.equal(line?.[2], iters, 'and its iterations');
    if (!c.args.includes('send')) {
      // write/read/atomic: the server prints the report the client sent it.
      t.equal(REPORT.exec(server.stdout)?.[0], line?.[0], 'the server prints the client\'s report');
    }
    if (c.args[0] === 'atomic' && c.args.includes('FETCH_AND_ADD')) {
      // 20 fetch-and-adds of 1 on 20 words 64 bytes apart: each word of the server's buffer is one more.
      const buf = readFileSync(dumpS);
      const before = Buffer.from(fillPerfPattern(new Uint8Array(buf.length)));
      const layout = perfLayout(8, 4096, 64, false);
      let ok = 0;
      for (let k = 0; k < 20; k++) {
        const off = perfSlot(layout, k);
        if (buf.readBigUInt64LE(off) === BigInt.asUintN(64, before.readBigUInt64LE(off) + 1n)) ok++;
      }
      t.equal(ok, 20, 'every word the client added to is one more');
    }
    if (c.args[0] === 'read') {
      // The client's buffer holds what it read: the server's pattern, at the same offsets.
      const got = readFileSync(dumpC);
      const want = fillPerfPattern(new Uint8Array(got.length));
      t.same(got.subarray(0, 4097), Buffer.from(want.subarray(0, 4097)), 'the client read the server\'s bytes');
    }
  });
}

t.test('--rate_limit paces the sender: a UC send stream at 2 MB/s', async (t) => {
  // Unpaced, the loopback carries this at tens of MB/s; paced, the average stays near the rate
  // (a little above it: the pacer's bucket lets the first 64 KiB go at once).
  const args = ['send', '-c', 'UC', '-s', '262144', '-n', '5', '-m', '1024'];
  const { server, client } = await pair(args, [...args, '--rate_limit=2', '--rate_units=M']);
  t.equal(server.code, 0, `server exits 0: ${server.stderr}`);
  t.equal(client.code, 0, `client exits 0: ${client.stderr}`);
  const avg = Number(REPORT.exec(client.stdout)?.[4]);
  t.ok(avg > 0 && avg < 2 * 1.3, `the client's average, ${avg} MB/s, is about the 2 MB/s asked for`);
});

t.test('--counters: the responder counts the gaps a lossy requester leaves, the requester the NAKs', async (t) => {
  const args = ['write', '-s', '16384', '-n', '10', '-m', '1024', '-t', '4'];
  const { server, client } = await pair([...args, '--counters'], [...args, '--loss', '5', '--seed', '3']);
  t.equal(server.code, 0, `server exits 0: ${server.stderr}`);
  t.equal(client.code, 0, `client exits 0: ${client.stderr}`);
  const counters = /^ counters: retransmitted (\d+), sequence-error NAKs received (\d+), out-of-sequence requests (\d+), duplicates (\d+)$/m;
  const s = counters.exec(server.stdout);
  t.ok(s && Number(s[3]) > 0, `the server saw out-of-sequence requests: ${s?.[0]}`);
  t.equal(s?.[2], '0', 'and received no NAK (it sent the ACKs)');
  const c = /^ loss: --loss 5% --seed 3: dropped (\d+) of our datagrams; retransmitted (\d+), sequence-error NAKs received (\d+)/m.exec(client.stdout);
  t.ok(c && Number(c[1]) > 0 && Number(c[2]) >= Number(c[1]) && Number(c[3]) > 0, `the client dropped, resent and was NAKed: ${c?.[0]}`);
  t.notMatch(client.stdout, counters, 'the loss line carries the client\'s counters: no second line');
});

t.test('a write client against a read server: both refuse, exit 3', async (t) => {
  const { server, client } = await pair(['read', '-n', '5'], ['write', '-n', '5']);
  t.equal(client.code, 3);
  t.match(client.stderr, /^roce perf: .*outstanding reads: it runs ib_read_bw or ib_atomic_bw, not ib_write_bw\n$/);
  t.equal(server.code, 3);
  t.equal(server.stderr.split('\n').filter(Boolean).length, 1, `one line: ${server.stderr}`);
});

const BAD: { args: string[]; code: number; re: RegExp }[] = [
  { args: ['perf'], code: 2, re: /the test must be write, read, send or atomic/ },
  { args: ['perf', 'bogus'], code: 2, re: /not 'bogus'/ },
  { args: ['perf', 'write', '-s', 'abc'], code: 2, re: /-s\/--size needs a number/ },
  { args: ['perf', 'read', '-c', 'UC'], code: 2, re: /UC connection not possible in READ\/ATOMIC verbs/ },
  { args: ['perf', 'write', '-c', 'UD'], code: 2, re: /UD connection only possible in SEND verb/ },
  { args: ['perf', 'send', '-c', 'UD', '-s', '5000'], code: 2, re: /Max message size in UD/ },
  { args: ['perf', 'write', '-q', '2'], code: 2, re: /one QP/ },
  { args: ['perf', 'write', '--loss', '200'], code: 2, re: /--loss needs a percentage/ },
  { args: ['perf', 'write', '--seed', '3'], code: 2, re: /--seed goes with --loss/ },
  { args: ['perf', 'write', '--bind', 'nowhere'], code: 2, re: /--bind needs an IPv4 or IPv6 address/ },
  { args: ['perf', 'write', '--frobnicate'], code: 2, re: /Unknown option '--frobnicate'/ },
  { args: ['perf', 'write', '--rate_limit=fast'], code: 2, re: /--rate_limit must be a positive number, not 'fast'/ },
  { args: ['perf', 'write', '--rate_limit=1', '--rate_limit_type=SW'], code: 2, re: /--rate_limit_type=SW is not implemented/ },
  { args: ['perf', 'write', '--rate_limit=1', '--rate_units=p'], code: 2, re: /packets per second are not supported with the HW rate limit/ },
  { args: ['perf', 'write', '--rate_units=M'], code: 2, re: /go with --rate_limit/ },
  { args: ['perf', 'write', '127.0.0.1', '--bind', '192.0.2.1', '--udp-port', '45678'], code: 4, re: /cannot bind RoCEv2 UDP 192\.0\.2\.1:45678: EADDRNOTAVAIL/ },
];

for (const b of BAD) {
  t.test(`roce ${b.args.join(' ')} → exit ${b.code}`, async (t) => {
    const r = await roce(b.args, 20_000);
    t.equal(r.code, b.code);
    t.match(r.stderr, b.re);
    t.ok(r.stderr.startsWith('roce perf: '), 'names the command');
    const lines = r.stderr.split('\n').filter(Boolean);
    // parseArgs errors add the usage as a second line, as every roce command does.
    t.ok(lines.length === 1 || (lines.length === 2 && lines[1]!.startsWith('usage: ')), `one line: ${r.stderr}`);
    t.equal(r.stdout, '', 'nothing on stdout');
  });
}

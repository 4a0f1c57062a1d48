/**
 * `roce serve` / `send` / `get` / `demo` as a user runs them: real processes over loopback UDP
 * and TCP, real files, sha256 checked here independently, exit codes and one-line messages.
 */

import t, { type Test } from 'tap';
import { spawn, type ChildProcess } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { createSocket } from 'node:dgram';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { Xorshift32 } from '../../src/link/fault.js';

const ROOT = join(import.meta.dirname, '../../..');
const CLI = join(ROOT, 'dist/src/cli/main.js');
const work = mkdtempSync(join(tmpdir(), 'roce-transfer-'));
t.teardown(() => rmSync(work, { recursive: true, force: true }));
const MiB = 1 << 20;

interface Run {
  code: number | null;
  out: string;
  err: string;
  ms: number;
}

const children = new Set<ChildProcess>();
t.teardown(() => {
  for (const c of children) if (c.exitCode === null) c.kill('SIGKILL');
});

function start(args: string[]): { child: ChildProcess; done: Promise<Run> } {
  const t0 = Date.now();
  const child = spawn(process.execPath, [CLI, ...args], { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, NODE_NO_WARNINGS: '1' } });
  children.add(child);
  let out = '';
  let err = '';
  child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (err += d.toString()));
  const done = new Promise<Run>((resolve) => child.on('close', (code) => {
    children.delete(child);
    resolve({ code, out, err, ms: Date.now() - t0 });
  }));
  return { child, done };
}

function roce(...args: string[]): Promise<Run> {
  return start(args).done;
}

interface Server {
  oobPort: number;
  dir: string;
  child: ChildProcess;
  log: () => string;
  stop: () => Promise<Run>;
}

async function serve(dir: string, ...extra: string[]): Promise<Server> {
  mkdirSync(dir, { recursive: true });
  const bind = extra.includes('--bind') ? [] : ['--bind', '127.0.0.1'];
  const { child, done } = start(['serve', ...bind, '--port', '0', '--oob-port', '0', '--dir', dir, ...extra]);
  let log = '';
  const lines = createInterface({ input: child.stdout! });
  const line = await new Promise<string>((resolve, reject) => {
    lines.on('line', (l) => {
      log += l + '\n';
      if (l.includes('listening:')) resolve(l);
    });
    void done.then((r) => reject(new Error(`serve exited ${r.code}: ${r.err}`)));
  });
  const port = /out-of-band TCP \S*:(\d+),/.exec(line);
  return {
    oobPort: Number(port![1]), dir, child, log: () => log,
    stop: async () => {
      child.kill('SIGINT');
      const r = await done;
      return { ...r, out: log + r.out };
    },
  };
}

function makeFile(name: string, size: number): { path: string; sha: string } {
  const path = join(work, name);
  const data = randomBytes(size);
  writeFileSync(path, data);
  return { path, sha: createHash('sha256').update(data).digest('hex') };
}

const sha = (p: string): string => createHash('sha256').update(readFileSync(p)).digest('hex');

function retransmissions(out: string): number {
  const m = /retransmissions: (\d+) packets/.exec(out);
  return m ? Number(m[1]) : -1;
}

/** One line on stderr, prefixed with the command, and no stack trace. */
function oneLine(t: Test, r: Run, cmd: string): void {
  const lines = r.err.trimEnd().split('\n');
  t.equal(lines.length, 1, `one line on stderr: ${JSON.stringify(r.err)}`);
  t.match(lines[0] ?? '', new RegExp(`^roce ${cmd}: `));
  t.notMatch(r.err, /\n\s+at |Error:/, 'no stack trace');
}

/** A seed whose first `n` transmitted datagrams include a drop at `pct` % (FaultyLink's draws). */
function seedDroppingEarly(pct: number, n: number): number {
  for (let seed = 1; ; seed++) {
    const rng = new Xorshift32(seed);
    for (let i = 0; i < n; i++) {
      const drop = rng.next() < (pct / 100) * 2 ** 32;
      for (let k = 0; k < 5; k++) rng.next();
      if (drop) return seed;
    }
  }
}

t.test('demo: a small run end to end, then roce explain on its capture', async (t) => {
  const dir = join(work, 'demo-small');
  const r = await roce('demo', '--size', '6M', '--dir', dir);
  t.equal(r.code, 0, r.err);
  t.match(r.out, /demo: verified: .* identical to the source/);
  t.match(r.out, /send: stored 'demo-6MiB\.bin'/);
  t.match(r.out, /goodput [\d.]+ MiB\/s/);
  t.match(r.out, /wireshark .*demo\.pcap/);
  t.match(r.out, /tshark -r .*demo\.pcap/);
  t.match(r.out, /roce explain .*demo\.pcap --frames 1-20/);
  const pcap = join(dir, 'demo.pcap');
  t.ok(statSync(pcap).size > 6 * MiB, 'whole packets captured');
  const ex = await roce('explain', pcap, '--frames', '1-20');
  t.equal(ex.code, 0, ex.err);
  t.match(ex.out, /RDMA WRITE First/);
  t.match(ex.out, /ICRC ok/);
  t.match(ex.out, /RC_RDMA_WRITE_LAST_WITH_IMMEDIATE/);
});

t.test('npm run demo, end to end: build, 64 MiB WRITE between two processes, sha256, pcap, how to open it', async (t) => {
  // `npm run demo` is `npm run build && node dist/src/cli/main.js demo`. Its build must not
  // rewrite the dist/ that the tests running beside this one import, so it runs in a copy of
  // the package (node_modules linked), where it builds a dist/ of its own. Only src/ is copied:
  // the demo needs nothing else, and tsc has a third less to compile.
  const tree = join(work, 'npm-demo');
  mkdirSync(tree);
  cpSync(join(ROOT, 'src'), join(tree, 'src'), { recursive: true });
  for (const f of ['package.json', 'tsconfig.json']) cpSync(join(ROOT, f), join(tree, f));
  symlinkSync(join(ROOT, 'node_modules'), join(tree, 'node_modules'));
  const dir = join(work, 'npm-demo-out');
  const t0 = Date.now();
  const npm = spawn('npm', ['run', '--silent', 'demo', '--', '--dir', dir], { cwd: tree, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, NODE_NO_WARNINGS: '1' } });
  children.add(npm);
  let out = '';
  let err = '';
  npm.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  npm.stderr!.on('data', (d: Buffer) => (err += d.toString()));
  const code = await new Promise<number | null>((resolve) => npm.on('close', resolve));
  children.delete(npm);
  const ms = Date.now() - t0;
  t.equal(code, 0, err);
  t.ok(existsSync(join(tree, 'dist/src/cli/main.js')), 'npm run demo built the project first');
  t.match(out, /64\.0 MiB \(67108864 bytes\) in [\d.]+ s, goodput/, 'a 64 MiB transfer');
  t.match(out, /RDMA WRITE_WITH_IMM over RC/);
  t.match(out, /send: stored 'demo-64MiB\.bin'/);
  t.match(out, /\[server\] serve: listening:/, 'a separate server process');
  t.match(out, /demo: verified: .* has sha256 [0-9a-f]{64}, identical to the source/, 'sha256 checked on the received copy');
  const pcap = join(dir, 'demo.pcap');
  t.match(out, new RegExp(`demo: capture: ${pcap.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')} \\([\\d.]+ MiB, whole packets\\)`));
  t.match(out, /look at it with\n {2}wireshark \S*demo\.pcap\n {2}tshark -r \S*demo\.pcap/, 'how to open it in Wireshark');
  t.ok(statSync(pcap).size > 64 * MiB, `the capture holds whole packets (${statSync(pcap).size} bytes)`);
  t.ok(ms < 180_000, `build and demo in ${ms} ms`);
  t.comment(out.split('\n').filter((l) => /goodput|retransmissions|done in/.test(l)).join('\n'));
  rmSync(dir, { recursive: true, force: true });
  rmSync(tree, { recursive: true, force: true });
});

t.test('--loss 5 both ways: send (WRITE and SEND) and get (READ) recover, sha256 intact', async (t) => {
  const srv = await serve(join(work, 'loss-srv'));
  const f = makeFile('loss.bin', 6 * MiB);
  for (const op of ['write', 'send']) {
    const r = await roce('send', f.path, '--to', '127.0.0.1', '--oob-port', String(srv.oobPort), '--op', op, '--as', `loss-${op}.bin`, '--loss', '5', '--seed', '3');
    t.equal(r.code, 0, `${op}: ${r.err}`);
    t.match(r.out, /dropping 5% of our outgoing datagrams \(seed 3\)/);
    t.ok(retransmissions(r.out) > 0, `${op}: retransmissions reported (${retransmissions(r.out)})`);
    t.match(r.out, /drops by reason: injected loss \(--loss\) \d+/);
    t.equal(sha(join(srv.dir, `loss-${op}.bin`)), f.sha, `${op}: the server's copy is intact`);
  }
  // A READ of 6 MiB is six 1 MiB requests: pick a seed that drops one of the first of them.
  const seed = seedDroppingEarly(5, 6);
  const out = join(work, 'loss-back.bin');
  const g = await roce('get', 'loss-write.bin', '--from', '127.0.0.1', '--oob-port', String(srv.oobPort), '--out', out, '--loss', '5', '--seed', String(seed));
  t.equal(g.code, 0, g.err);
  t.ok(retransmissions(g.out) > 0, `get: retransmissions reported (${retransmissions(g.out)}, seed ${seed})`);
  t.equal(sha(out), f.sha, 'get: the downloaded copy is intact');
  const s = await srv.stop();
  t.equal(s.code, 0);
  t.match(s.out, /3 files stored|2 files stored \(.*\), 1 served/);
});

t.test('several clients at once on one server', async (t) => {
  const srv = await serve(join(work, 'many-srv'));
  const files = [0, 1, 2, 3].map((i) => makeFile(`many-${i}.bin`, (2 + i) * MiB + i * 777));
  writeFileSync(join(srv.dir, 'shared.bin'), readFileSync(files[0]!.path));
  const port = String(srv.oobPort);
  const runs = await Promise.all([
    ...files.map((f, i) => roce('send', f.path, '--to', '127.0.0.1', '--oob-port', port, '--op', i % 2 ? 'send' : 'write')),
    roce('get', 'shared.bin', '--from', '127.0.0.1', '--oob-port', port, '--out', join(work, 'many-get.bin')),
  ]);
  runs.forEach((r, i) => t.equal(r.code, 0, `client ${i}: ${r.err}`));
  files.forEach((f, i) => t.equal(sha(join(srv.dir, `many-${i}.bin`)), f.sha, `file ${i} intact`));
  t.equal(sha(join(work, 'many-get.bin')), files[0]!.sha, 'the concurrent get is intact');
  const s = await srv.stop();
  t.match(s.out, /5 connections, 4 files stored .* 1 served .* 0 failed/);
  t.same(readdirSync(srv.dir).filter((n) => n.startsWith('.')), [], 'no partial files left');
});

t.test('bad input: one clear line, a documented exit code, no stack trace', async (t) => {
  const srv = await serve(join(work, 'err-srv'), '--reserve', String(2 ** 52));
  const f = makeFile('err.bin', 64 * 1024);
  const port = String(srv.oobPort);
  // A TCP listener that accepts and never answers: the client must give up by itself.
  const silent = net.createServer(() => {});
  await new Promise<void>((r) => silent.listen(0, '127.0.0.1', () => r()));
  t.teardown(() => silent.close());
  const silentPort = String((silent.address() as net.AddressInfo).port);
  // A UDP port that is taken.
  const udp = createSocket('udp4');
  await new Promise<void>((r) => udp.bind(0, '127.0.0.1', () => r()));
  t.teardown(() => udp.close());
  const busyUdp = String(udp.address().port);
  const unused = await new Promise<string>((resolve) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const p = String((s.address() as net.AddressInfo).port);
      s.close(() => resolve(p));
    });
  });

  const cases: Array<[string, string[], number, RegExp]> = [
    ['missing file', ['send', join(work, 'nope.bin'), '--to', '127.0.0.1', '--oob-port', port], 2, /cannot read .*nope\.bin: no such file/],
    ['unreadable file (a directory)', ['send', work, '--to', '127.0.0.1', '--oob-port', port], 2, /cannot read .*: is a directory/],
    ['bad MTU', ['send', f.path, '--to', '127.0.0.1', '--mtu', '1000'], 2, /--mtu must be one of 256, 512, 1024, 2048, 4096, not '1000'/],
    ['bad op', ['send', f.path, '--to', '127.0.0.1', '--op', 'read'], 2, /--op must be write or send/],
    ['bad cc', ['send', f.path, '--to', '127.0.0.1', '--cc', 'bbr'], 2, /--cc must be dcqcn or none/],
    ['bad loss', ['send', f.path, '--to', '127.0.0.1', '--loss', '120'], 2, /--loss must be a percentage/],
    ['no --to', ['send', f.path], 2, /--to HOST is required/],
    ['unknown option', ['send', f.path, '--to', '127.0.0.1', '--bogus'], 2, /Unknown option '--bogus'/],
    ['bad remote name', ['get', '../etc/passwd', '--from', '127.0.0.1', '--oob-port', port, '--out', join(work, 'x')], 2, /bad remote name/],
    ['unreachable peer (refused)', ['send', f.path, '--to', '127.0.0.1', '--oob-port', unused], 3, /cannot reach 127\.0\.0\.1:\d+: connection refused/],
    ['unreachable peer (silent)', ['send', f.path, '--to', '127.0.0.1', '--oob-port', silentPort, '--timeout', '1'], 3, /did not answer within 1 s/],
    ['peer refuses (no such file)', ['get', 'nothere.bin', '--from', '127.0.0.1', '--oob-port', port, '--out', join(work, 'x')], 3, /the server refused: the server has no file 'nothere\.bin'/],
    ['disk full on the server', ['send', f.path, '--to', '127.0.0.1', '--oob-port', port], 3, /the server refused: no space on the server for 'err\.bin'/],
    ['--out not writable', ['get', 'x.bin', '--from', '127.0.0.1', '--oob-port', port, '--out', join(work, 'no/such/dir/x')], 4, /cannot write .*: no such file/],
    ['address not local (client)', ['send', f.path, '--to', '127.0.0.1', '--bind', '192.0.2.1'], 4, /192\.0\.2\.1 is not an address of this host/],
    ['address not local (server)', ['serve', '--bind', '192.0.2.1', '--dir', work], 4, /192\.0\.2\.1 is not an address of this host/],
    ['UDP port in use', ['serve', '--bind', '127.0.0.1', '--port', busyUdp, '--dir', work], 4, /UDP port 127\.0\.0\.1:\d+ is already in use/],
    ['TCP port in use', ['serve', '--bind', '127.0.0.1', '--port', '0', '--oob-port', port, '--dir', work], 4, /TCP port 127\.0\.0\.1:\d+ is already in use/],
    ['serve without --bind', ['serve'], 2, /--bind ADDR is required/],
  ];
  // Independent processes: run a few at a time (each pays node's start-up).
  const results: Run[] = [];
  for (let i = 0; i < cases.length; i += 4) results.push(...(await Promise.all(cases.slice(i, i + 4).map((c) => roce(...c[1])))));
  for (const [k, [name, args, code, msg]] of cases.entries()) {
    const r = results[k]!;
    t.equal(r.code, code, `${name}: exit ${code}`);
    t.match(r.err, msg, `${name}: message`);
    oneLine(t, r, args[0]!);
    // --timeout 1: the bound covers node's start-up on a loaded 2-core machine, not the protocol.
    if (name === 'unreachable peer (silent)') t.ok(r.ms < 20_000, `bounded: gave up after ${r.ms} ms`);
  }
  await srv.stop();
  t.same(readdirSync(srv.dir), [], 'the refused upload left nothing behind');
});

t.test('Ctrl-C mid-transfer: the client exits 130, the server cleans up and keeps serving', async (t) => {
  const srv = await serve(join(work, 'int-srv'));
  // Loss slows the transfer down enough to interrupt it in the middle.
  const big = makeFile('int.bin', 24 * MiB);
  const { child, done } = start(['send', big.path, '--to', '127.0.0.1', '--oob-port', String(srv.oobPort), '--loss', '5']);
  await new Promise<void>((resolve) => {
    const lines = createInterface({ input: child.stdout! });
    lines.on('line', (l) => {
      if (l.includes('connected:')) resolve();
    });
  });
  // Wait until the partial file exists: the transfer is under way.
  const partial = join(srv.dir, '.int.bin.partial');
  for (let i = 0; i < 100 && !existsSync(partial); i++) await new Promise((r) => setTimeout(r, 20));
  t.ok(existsSync(partial), 'the upload is in progress as a partial file');
  await new Promise((r) => setTimeout(r, 300));
  child.kill('SIGINT');
  const r = await done;
  t.equal(r.code, 130, `exit 130 (${r.err})`);
  t.match(r.err, /^roce send: interrupted; the transfer was abandoned/);
  t.notMatch(r.err, /\n\s+at /);
  let names: string[] = [];
  for (let i = 0; i < 100; i++) {
    names = readdirSync(srv.dir);
    if (names.length === 0) break;
    await new Promise((res) => setTimeout(res, 30));
  }
  t.same(names, [], 'no file under the final name and no partial left');
  const small = makeFile('after.bin', MiB);
  const ok = await roce('send', small.path, '--to', '127.0.0.1', '--oob-port', String(srv.oobPort));
  t.equal(ok.code, 0, `the server still serves: ${ok.err}`);
  t.equal(sha(join(srv.dir, 'after.bin')), small.sha);
  const s = await srv.stop();
  t.match(s.out, /'int\.bin' abandoned/);
});

/** Whether this host can bind ::1 (a container without IPv6 cannot). */
async function hasIpv6Loopback(): Promise<boolean> {
  const probe = createSocket('udp6');
  const ok = await new Promise<boolean>((resolve) => {
    probe.once('error', () => resolve(false));
    probe.bind(0, '::1', () => resolve(true));
  });
  probe.close();
  return ok;
}

t.test('IPv6 over ::1: send and get', async (t) => {
  if (!t.ok(await hasIpv6Loopback(), '::1 is usable (IPv6 is part of what this proves)')) return;
  const srv = await serve(join(work, 'v6-srv'), '--bind', '::1');
  const f = makeFile('v6.bin', 3 * MiB + 5);
  const r = await roce('send', f.path, '--to', '::1', '--oob-port', String(srv.oobPort), '--mtu', '1024');
  t.equal(r.code, 0, r.err);
  t.match(r.out, /RoCEv2 from \[::1\]:\d+/);
  t.match(r.out, /path MTU 1024/);
  t.equal(sha(join(srv.dir, 'v6.bin')), f.sha);
  const out = join(work, 'v6-back.bin');
  const g = await roce('get', 'v6.bin', '--from', '[::1]', '--oob-port', String(srv.oobPort), '--out', out);
  t.equal(g.code, 0, g.err);
  t.equal(sha(out), f.sha);
  const s = await srv.stop();
  t.match(s.out, /GID ::1/);
});

// ---------------------------------------------------------------------------------------------
// --cm: the rendezvous over RDMA CM (QP1 MADs on the RoCE port), no TCP at all.

/** A UDP port free on each of `addrs` now (the kernel picks it on the first). */
async function freeUdpPort(family: 4 | 6, ...addrs: string[]): Promise<number> {
  for (;;) {
    const socks = [];
    let port = 0;
    let ok = true;
    for (const a of addrs) {
      const s = createSocket(family === 4 ? 'udp4' : 'udp6');
      socks.push(s);
      const got = await new Promise<number>((resolve) => {
        s.once('error', () => resolve(-1));
        s.bind(port, a, () => resolve(s.address().port));
      });
      if (got < 0) {
        ok = false;
        break;
      }
      port = got;
    }
    for (const s of socks) s.close();
    if (ok) return port;
  }
}

let cmPortSeq = 7400;

/** `roce serve --cm` on ADDR:PORT, listening on a fresh rdma_cm port. */
async function serveCm(dir: string, bind: string, port: number, ...extra: string[]): Promise<Server> {
  mkdirSync(dir, { recursive: true });
  const cmPort = cmPortSeq++;
  const { child, done } = start(['serve', '--cm', '--bind', bind, '--port', String(port), '--oob-port', String(cmPort), '--dir', dir, ...extra]);
  let log = '';
  const lines = createInterface({ input: child.stdout! });
  const line = await new Promise<string>((resolve, reject) => {
    lines.on('line', (l) => {
      log += l + '\n';
      if (l.includes('listening:')) resolve(l);
    });
    void done.then((r) => reject(new Error(`serve --cm exited ${r.code}: ${r.err}`)));
  });
  t.match(line, new RegExp(`RDMA CM on rdma_cm port ${cmPort}, directory`));
  return {
    oobPort: cmPort, dir, child, log: () => log,
    stop: async () => {
      child.kill('SIGINT');
      const r = await done;
      return { ...r, out: log + r.out };
    },
  };
}

t.test('--cm over IPv4: send by WRITE and SEND and get by READ, --loss 5 both ways, sha256 intact', async (t) => {
  // Server on 127.0.0.2, clients on 127.0.0.1, both on one UDP port: CM MADs go to the port
  // the sender itself uses, as on a network where every RoCE stack is on 4791.
  const port = await freeUdpPort(4, '127.0.0.2', '127.0.0.1');
  const srv = await serveCm(join(work, 'cm-srv'), '127.0.0.2', port, '--loss', '5', '--seed', '7');
  const f = makeFile('cm.bin', 5 * MiB + 123);
  // --timeout 4: a REQ or REP lost to the server's --loss costs one REQ try (≈1 s), not ≈2.5 s.
  const client = ['--cm', '--oob-port', String(srv.oobPort), '--bind', '127.0.0.1', '--port', String(port), '--timeout', '4'];
  const w = await roce('send', f.path, '--to', '127.0.0.2', ...client, '--as', 'cm-write.bin');
  t.equal(w.code, 0, `write: ${w.err}`);
  t.match(w.out, /send: stored 'cm-write\.bin' on 127\.0\.0\.2:\d+ \(RDMA CM, rdma_cm port \d+\)/);
  t.match(w.out, /RDMA WRITE_WITH_IMM over RC/);
  t.equal(sha(join(srv.dir, 'cm-write.bin')), f.sha, 'write: the server\'s copy is intact');
  const s = await roce('send', f.path, '--to', '127.0.0.2', ...client, '--op', 'send', '--as', 'cm-send.bin', '--loss', '5', '--seed', '3');
  t.equal(s.code, 0, `send: ${s.err}`);
  t.match(s.out, /SEND_WITH_IMM over RC/);
  t.ok(retransmissions(s.out) > 0, `send: retransmissions reported (${retransmissions(s.out)})`);
  t.equal(sha(join(srv.dir, 'cm-send.bin')), f.sha, 'send: the server\'s copy is intact');
  const out = join(work, 'cm-back.bin');
  const g = await roce('get', 'cm-write.bin', '--from', '127.0.0.2', ...client, '--out', out, '--loss', '5', '--seed', String(seedDroppingEarly(5, 5)));
  t.equal(g.code, 0, `get: ${g.err}`);
  t.match(g.out, /RDMA READ over RC/);
  t.equal(sha(out), f.sha, 'get: the downloaded copy is intact');
  const st = await srv.stop();
  t.equal(st.code, 0);
  t.match(st.out, /3 connections, 2 files stored .* 1 served .* 0 failed/);
  t.match(st.out, /drops by reason: injected loss \(--loss\) \d+/, 'the server dropped some of its own datagrams');
  t.same(readdirSync(srv.dir).filter((n) => n.startsWith('.')), [], 'no partial files left');
});

t.test('--cm over IPv6 on ::1: send and get (each side told the other\'s RoCE port)', async (t) => {
  if (!t.ok(await hasIpv6Loopback(), '::1 is usable (IPv6 is part of what this proves)')) return;
  const sp = await freeUdpPort(6, '::1');
  let cp = await freeUdpPort(6, '::1');
  while (cp === sp) cp = await freeUdpPort(6, '::1');
  const srv = await serveCm(join(work, 'cm6-srv'), '::1', sp, '--peer-port', String(cp));
  const client = ['--cm', '--oob-port', String(srv.oobPort), '--bind', '::1', '--port', String(cp), '--peer-port', String(sp)];
  const f = makeFile('cm6.bin', 3 * MiB + 5);
  const r = await roce('send', f.path, '--to', '::1', ...client, '--mtu', '1024');
  t.equal(r.code, 0, r.err);
  t.match(r.out, /path MTU 1024/);
  t.equal(sha(join(srv.dir, 'cm6.bin')), f.sha);
  const out = join(work, 'cm6-back.bin');
  const g = await roce('get', 'cm6.bin', '--from', '[::1]', ...client, '--out', out);
  t.equal(g.code, 0, g.err);
  t.equal(sha(out), f.sha);
  const s = await srv.stop();
  t.equal(s.code, 0);
  t.match(s.out, /2 connections, 1 files stored .* 1 served/);
});

t.test('--cm errors: no listener is a REJ (exit 3 at once); a silent peer times out in bounded time (exit 3)', async (t) => {
  const port = await freeUdpPort(4, '127.0.0.2', '127.0.0.1', '127.0.0.3');
  const srv = await serveCm(join(work, 'cmerr-srv'), '127.0.0.2', port);
  const f = makeFile('cmerr.bin', 64 * 1024);
  // Something bound on 127.0.0.3's RoCE port that never answers a MAD.
  const silent = createSocket('udp4');
  await new Promise<void>((r) => silent.bind(port, '127.0.0.3', () => r()));
  t.teardown(() => silent.close());
  const client = ['--cm', '--bind', '127.0.0.1', '--port', String(port)];
  const noListener = await roce('send', f.path, '--to', '127.0.0.2', ...client, '--oob-port', String(srv.oobPort + 1000));
  t.equal(noListener.code, 3, `no listener: exit 3 (${noListener.err})`);
  t.match(noListener.err, new RegExp(`cannot reach 127\\.0\\.0\\.2 rdma_cm port ${srv.oobPort + 1000}: no rdma_cm listener there \\(REJ reason 8, Invalid Service ID`));
  oneLine(t, noListener, 'send');
  t.ok(noListener.ms < 15_000, `the REJ ends it without waiting for REQ timeouts (${noListener.ms} ms)`);
  const quiet = await roce('get', 'x.bin', '--from', '127.0.0.3', ...client, '--oob-port', String(srv.oobPort), '--out', join(work, 'x'), '--timeout', '2');
  t.equal(quiet.code, 3, `silent peer: exit 3 (${quiet.err})`);
  t.match(quiet.err, /cannot reach 127\.0\.0\.3 rdma_cm port \d+: no answer from its RDMA CM within 2 s \(REQ sent 4 times\)/);
  oneLine(t, quiet, 'get');
  // The REQ's four tries take about 2 s; the upper bound also covers node's start-up under load.
  t.ok(quiet.ms >= 1000 && quiet.ms < 20_000, `gave up after the REQ's retries, in bounded time (${quiet.ms} ms)`);
  const usage = await roce('send', f.path, '--to', '127.0.0.2', '--peer-port', '4791');
  t.equal(usage.code, 2);
  t.match(usage.err, /--peer-port only makes sense with --cm/);
  await srv.stop();
  t.same(readdirSync(srv.dir), [], 'nothing was stored');
});

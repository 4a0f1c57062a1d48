/**
 * `--trace` on the tools that talk RoCEv2: every packet sent and received, one line each, with
 * the shared printer, on stderr (stdout keeps the tool's own output, as the C tools print it).
 */

import t from 'tap';
import { spawn, spawnSync } from 'node:child_process';
import { join } from 'node:path';

const CLI = join(import.meta.dirname, '../../src/cli/main.js');
// Ports from the test's PID, so parallel runs on one host do not collide.
const base = 20000 + (process.pid % 20000);

function server(args: string[]): { done: Promise<{ code: number | null; err: string }> } {
  const p = spawn(process.execPath, [CLI, ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
  let err = '';
  p.stderr.on('data', (d: Buffer) => { err += d.toString(); });
  const timer = setTimeout(() => p.kill('SIGKILL'), 60_000);
  return { done: new Promise((r) => p.on('exit', (code) => { clearTimeout(timer); r({ code, err }); })) };
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
const LINE = /^(tx|rx) \S+ (sport=\d+ |icrc=\S+ )[A-Z]{2}_[A-Z_]+ qp=0x[0-9a-f]{6} psn=0x[0-9a-f]{6}/;

t.test('roce perf write --trace', async (t) => {
  const udp = String(base), tcp = String(base + 1);
  const s = server(['perf', 'write', '--bind', '127.0.0.1', '--udp-port', udp, '-p', tcp, '-n', '5', '-s', '4096', '--trace']);
  await sleep(1000);
  const c = spawnSync(process.execPath, [CLI, 'perf', 'write', '127.0.0.1', '--bind', '127.0.0.2', '--udp-port', udp, '-p', tcp, '-n', '5', '-s', '4096', '--trace'], { encoding: 'utf8', timeout: 60_000 });
  t.equal(c.status, 0, c.stderr);
  const lines = c.stderr.trim().split('\n');
  t.equal(lines.filter((l) => /^tx .*RC_RDMA_WRITE_ONLY .*payload=4096/.test(l)).length, 5, 'five WRITEs sent, one line each');
  t.ok(lines.some((l) => /^rx .*RC_ACKNOWLEDGE/.test(l)), 'their ACKs received');
  t.ok(lines.every((l) => LINE.test(l)), 'every stderr line is a packet line');
  const sr = await s.done;
  t.equal(sr.code, 0);
  t.ok(sr.err.split('\n').some((l) => /^rx .*RC_RDMA_WRITE_ONLY/.test(l)), 'the server traces what it receives');
});

t.test('roce rping --trace', async (t) => {
  const roce = String(base + 2), cm = String(base + 3);
  const s = server(['rping', '-s', '-a', '127.0.0.1', '-p', cm, '-C', '2', '--roce-port', roce, '--trace']);
  await sleep(1000);
  const c = spawnSync(process.execPath, [CLI, 'rping', '-c', '-a', '127.0.0.1', '-I', '127.0.0.2', '-p', cm, '-C', '2', '--roce-port', roce, '--trace'], { encoding: 'utf8', timeout: 60_000 });
  t.equal(c.status, 0, c.stderr);
  t.match(c.stderr, /^tx \S+ sport=55410 UD_SEND_ONLY qp=0x000001 .*deth\(qkey=0x80010000 src=0x000001\) payload=256/m, 'the CM REQ to QP1, from rxe\'s QP1 source port');
  t.match(c.stderr, /RC_RDMA_READ_REQUEST/, 'the server reads the client\'s buffer');
  const sr = await s.done;
  t.equal(sr.code, 0);
});

// ucmatose against our rdma_cm API: librdmacm's connection test (cmatose.c) in an rxe guest and
// its exchange played on our side (ucmatose-peer.ts), each in both roles, over IPv4 and IPv6.
// Several connections at once, each with COUNT SENDs of SIZE bytes both ways; the server side
// disconnects them all and the client answers every DREQ. ucmatose must print "return status 0"
// and exit 0, and our side must reap every completion with the byte counts ucmatose sends.
// Needs root (see interop/README.md). If the lab cannot start, every test here fails with why.
import t from 'tap';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startLab, type Guest, type Lab } from '../../interop/lab.js';
import { recordCell, type Direction } from '../../interop/matrix.js';

const t0 = Date.now();
const here = path.dirname(fileURLToPath(import.meta.url));
const PEER = path.join(here, 'ucmatose-peer.js');
const PORT = 7471;
const CONNECTIONS = 3;
const COUNT = 10;
const SIZE = 1000;
let lab: Lab | undefined;
let startError: Error | undefined;
const secs = (since: number): string => `${((Date.now() - since) / 1000).toFixed(1)} s`;

function need(): Lab {
  if (lab) return lab;
  throw new Error(`the rxe lab did not start: ${startError?.message ?? 'unknown reason'}`);
}

t.teardown(async () => {
  await lab?.stop();
  t.comment(`total wall time ${secs(t0)}`);
});

interface PeerResult {
  ok: boolean;
  sends?: number;
  recvs?: number;
  bytes?: number;
  message?: string;
  stderr: string;
}

/** Runs our ucmatose peer in the host namespace; `onListening` fires once our server listens. */
async function ourPeer(role: 'server' | 'client', local: string, peer: string, onListening?: () => void): Promise<PeerResult> {
  const child = need().execHost([process.execPath, PEER, role, local, peer, String(CONNECTIONS), String(COUNT), String(SIZE)], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  let stdout = '';
  child.stderr?.setEncoding('utf8').on('data', (d: string) => (stderr += d));
  child.stdout?.setEncoding('utf8').on('data', (d: string) => {
    stdout += d;
    if (stdout.includes('"listening"')) onListening?.();
  });
  const timer = setTimeout(() => child.kill('SIGKILL'), 90_000);
  await new Promise((r) => child.on('close', r));
  clearTimeout(timer);
  const last = stdout.trim().split('\n').filter((l) => l.startsWith('{"ok"')).pop();
  return last ? { ...(JSON.parse(last) as { ok: boolean }), stderr } : { ok: false, message: 'no result', stderr };
}

/** Waits (in the guest) for ucmatose's listening cm_id. */
async function waitCmListen(g: Guest, port: number): Promise<void> {
  const r = await g.run(
    `i=0; until rdma resource show cm_id 2>/dev/null | grep LISTEN | grep -q ':${port} '; do ` +
    `i=$((i+1)); [ $i -lt 100 ] || exit 1; sleep 0.1; done`, { timeoutMs: 30_000 });
  if (r.code !== 0) t.comment(`no LISTEN cm_id seen on port ${port}; relying on REJ retries`);
}

function record(direction: Direction, family: 4 | 6, pass: boolean, ms: number, note: string): void {
  recordCell({ suite: 'ucmatose', transport: 'RC', op: 'SEND', mtu: 1024, size: SIZE, direction, family, pass, ms, tool: 'ucmatose', note });
}

t.test('lab boots one rxe guest', async (t) => {
  const start = Date.now();
  try {
    lab = await startLab({ guests: 1, ipv6: true });
  } catch (e) {
    startError = e as Error;
    throw e;
  }
  t.comment(`boot: ${secs(start)} (${lab.accel})`);
  t.equal(lab.guests.length, 1);
});

const total = CONNECTIONS * COUNT;
const flags = `-c ${CONNECTIONS} -C ${COUNT} -S ${SIZE}`;

for (const family of [4, 6] as const) {
  t.test(`IPv${family}: our client against ucmatose in the guest`, async (t) => {
    const lab = need();
    const g = lab.guests[0]!;
    const hostIp = family === 4 ? lab.hostIpv4 : lab.hostIpv6;
    const guestIp = family === 4 ? g.ipv4 : g.ipv6;
    const start = Date.now();
    // Bound to the guest's address: ucmatose's default bind is IPv4 any, whose listener
    // rdma_cm does not match with an IPv6 REQ (it answers REJ 28, consumer reject).
    const server = await g.spawn(`ucmatose -b ${guestIp} ${flags}`, { timeoutMs: 60_000 });
    await waitCmListen(g, PORT);
    const ours = await ourPeer('client', hostIp, guestIp);
    const srv = await server.wait();
    const pass = ours.ok && srv.code === 0;
    t.ok(ours.ok, `our client: ${ours.message ?? 'ok'}`, { stderr: ours.stderr });
    t.same([ours.recvs, ours.sends, ours.bytes], [total, total, total * SIZE], `${CONNECTIONS} connections × ${COUNT} messages of ${SIZE} bytes each way`);
    t.equal(srv.code, 0, 'ucmatose exits 0', { output: srv.stdout });
    t.match(srv.stdout, /data transfers complete/);
    t.match(srv.stdout, /return status 0/);
    record('ours→rxe', family, pass, Date.now() - start, `our client, ucmatose -b ADDR ${flags} in the guest`);
    t.comment(`cell: ${secs(start)}`);
  });

  t.test(`IPv${family}: ucmatose in the guest against our server`, async (t) => {
    const lab = need();
    const g = lab.guests[0]!;
    const hostIp = family === 4 ? lab.hostIpv4 : lab.hostIpv6;
    const guestIp = family === 4 ? g.ipv4 : g.ipv6;
    const start = Date.now();
    let listening!: () => void;
    const up = new Promise<void>((r) => (listening = r));
    const ours = ourPeer('server', hostIp, guestIp, listening);
    await Promise.race([up, ours]);
    const cli = await g.run(`ucmatose -s ${hostIp} ${flags}`, { timeoutMs: 60_000 });
    const r = await ours;
    const pass = r.ok && cli.code === 0;
    t.ok(r.ok, `our server: ${r.message ?? 'ok'}`, { stderr: r.stderr });
    t.same([r.recvs, r.sends, r.bytes], [total, total, total * SIZE], `${CONNECTIONS} connections × ${COUNT} messages of ${SIZE} bytes each way`);
    t.equal(cli.code, 0, 'ucmatose -s exits 0', { output: cli.stdout });
    t.match(cli.stdout, /data transfers complete/);
    t.match(cli.stdout, /return status 0/);
    record('rxe→ours', family, pass, Date.now() - start, `ucmatose -s ${flags} in the guest, our server`);
    t.comment(`cell: ${secs(start)}`);
  });
}

// The rxe lab itself: two guests with real Soft-RoCE, traffic between them, a capture of the
// bridge, and a host-side node process in the lab's namespace receiving a guest's RoCEv2 packet.
// Needs root (see interop/README.md). If the lab cannot start, every test here fails with why.
import t from 'tap';
import { spawnSync, type ChildProcess } from 'node:child_process';
import { rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { startLab, type Guest, type Lab } from '../../interop/lab.js';

const t0 = Date.now();
const pcap = path.join(tmpdir(), `roce-lab-test-${process.pid}.pcap`);
let lab: Lab | undefined;
let startError: Error | undefined;

function need(): Lab {
  if (lab) return lab;
  throw new Error(`the rxe lab did not start: ${startError?.message ?? 'unknown reason'}`);
}
const secs = (since: number): string => `${((Date.now() - since) / 1000).toFixed(1)} s`;

t.teardown(async () => {
  await lab?.stop();
  if (!process.env["ROCE_LAB_KEEP"]) rmSync(pcap, { force: true });
  t.comment(`total wall time ${secs(t0)}`);
});

/** Wait (inside the guest) until something listens on TCP `port`. */
async function waitListening(g: Guest, port: number): Promise<void> {
  const hex = port.toString(16).toUpperCase().padStart(4, '0');
  const r = await g.run(
    `i=0; until grep -q ':${hex} 00000000:0000 0A' /proc/net/tcp; do ` +
    `i=$((i+1)); [ $i -lt 150 ] || exit 1; sleep 0.1; done`, { timeoutMs: 30_000 });
  if (r.code !== 0) throw new Error(`nothing listens on ${g.ipv4}:${port}`);
}

/** A server in `server`, a client in `client` (it connects over IPv4 for the out-of-band exchange). */
async function serverClient(server: Guest, client: Guest, cmd: string, timeoutMs = 90_000) {
  const srv = await server.spawn(cmd, { timeoutMs });
  try {
    await waitListening(server, 18515);
  } catch (e) {
    await srv.kill();
    const s = await srv.wait();
    throw new Error(`${(e as Error).message}; server output: ${s.stdout}`);
  }
  const c = await client.run(`${cmd} ${server.ipv4}`, { timeoutMs });
  const s = await srv.wait();
  return { server: s, client: c };
}

t.test('lab boots two rxe guests', async (t) => {
  const start = Date.now();
  try {
    lab = await startLab({ guests: 2, capture: pcap, ipv6: true });
  } catch (e) {
    startError = e as Error;
    throw e;
  }
  t.comment(`boot: ${secs(start)} (${lab.accel})`);
  t.equal(lab.guests.length, 2);
});

t.test('both rxe0 devices are ACTIVE with the expected RoCEv2 GIDs', async (t) => {
  const lab = need();
  for (const g of lab.guests) {
    t.equal(g.gidIndexV4, 1, `${g.name} IPv4-mapped GID index`);
    t.equal(g.gidIndexV6, 2, `${g.name} IPv6 GID index`);
    const d = '/sys/class/infiniband/rxe0/ports/1';
    const r = await g.run(`cat ${d}/state ${d}/gids/1 ${d}/gid_attrs/types/1 ${d}/gids/2 ${d}/gid_attrs/types/2`);
    t.equal(r.code, 0, `${g.name} sysfs readable`);
    const last = Number(g.ipv4.split('.')[3]);
    const hex = last.toString(16).padStart(4, '0');
    t.same(r.stdout.trim().split('\n'), [
      '4: ACTIVE',
      `0000:0000:0000:0000:0000:ffff:0a4d:${hex}`, 'RoCE v2',
      `fd77:0000:0000:0000:0000:0000:0000:${hex}`, 'RoCE v2',
    ], `${g.name} port state and GIDs`);
  }
});

t.test('ibv_rc_pingpong between the guests over the IPv4 GID', async (t) => {
  const [a, b] = need().guests;
  if (!a || !b) throw new Error('two guests expected');
  const start = Date.now();
  const r = await serverClient(a, b, `ibv_rc_pingpong -d rxe0 -g ${a.gidIndexV4} -n 20`);
  t.equal(r.server.code, 0, 'server exit 0', { output: r.server.stdout });
  t.equal(r.client.code, 0, 'client exit 0', { output: r.client.stdout });
  t.match(r.client.stdout, /20 iters in/);
  t.comment(`rc_pingpong v4: ${secs(start)}`);
});

t.test('ibv_rc_pingpong between the guests over the IPv6 GID', async (t) => {
  const [a, b] = need().guests;
  if (!a || !b) throw new Error('two guests expected');
  const start = Date.now();
  const r = await serverClient(a, b, `ibv_rc_pingpong -d rxe0 -g ${a.gidIndexV6} -n 20`);
  t.equal(r.server.code, 0, 'server exit 0', { output: r.server.stdout });
  t.equal(r.client.code, 0, 'client exit 0', { output: r.client.stdout });
  t.match(r.client.stdout, /remote address: .*GID fd77::/);
  t.comment(`rc_pingpong v6: ${secs(start)}`);
});

t.test('ib_write_bw between the guests', async (t) => {
  const [a, b] = need().guests;
  if (!a || !b) throw new Error('two guests expected');
  const start = Date.now();
  const r = await serverClient(a, b, `ib_write_bw -d rxe0 -x ${a.gidIndexV4} -s 65536 -n 20 -F`);
  t.equal(r.server.code, 0, 'server exit 0', { output: r.server.stdout });
  t.equal(r.client.code, 0, 'client exit 0', { output: r.client.stdout });
  t.match(r.client.stdout, /65536\s+20\s/);
  t.comment(`ib_write_bw: ${secs(start)}`);
});

t.test('a guest booted again comes back as it was, its NIC working and its stall lines counted over both boots', async (t) => {
  const [a, b] = need().guests;
  if (!a || !b) throw new Error('two guests expected');
  const start = Date.now();
  const gids = [a.gidIndexV4, a.gidIndexV6];
  const before = a.txStallLines();
  // What NicGuard restarts a guest for: a watchdog line on its console, and a NIC that sends nothing.
  const w = await a.run('echo "<3>lab.test: NETDEV WATCHDOG: written by the test" > /dev/kmsg && ip link set eth0 down');
  t.equal(w.code, 0, `stall planted: ${w.stdout.trim()}`);
  for (let i = 0; a.txStallLines() === before && i < 100; i++) await new Promise((r) => setTimeout(r, 100));
  t.equal(a.txStallLines(), before + 1, 'the line is counted');
  const job = await a.spawn('sleep 120', { timeoutMs: 150_000 });
  const ms = await a.restart();
  t.same([a.gidIndexV4, a.gidIndexV6], gids, 'the same GID indices');
  t.equal(a.txStallLines(), before + 1, "the first boot's line still counted, none on the new console");
  await t.rejects(job.wait(), /restarted/, 'a job of the old boot fails, naming the restart');
  const s = await a.run('read -r up _ < /proc/uptime; echo $up; cat /sys/class/infiniband/rxe0/ports/1/state; ip -o link show eth0');
  const [up, state, link] = s.stdout.trim().split('\n');
  t.ok(Number(up) * 1000 < ms + 5_000, `a kernel booted by the restart (uptime ${up} s, restart ${(ms / 1000).toFixed(1)} s)`);
  t.match(state, /ACTIVE/, 'rxe0 ACTIVE');
  t.match(link, /state UP/, 'eth0 up');
  const r = await serverClient(a, b, `ibv_rc_pingpong -d rxe0 -g ${a.gidIndexV4} -n 20`);
  t.equal(r.server.code, 0, 'server (the restarted guest) exit 0', { output: r.server.stdout });
  t.equal(r.client.code, 0, 'client exit 0', { output: r.client.stdout });
  t.comment(`restart: ${(ms / 1000).toFixed(1)} s in ${a.restartBoots} boot${a.restartBoots === 1 ? '' : 's'}, test ${secs(start)}`);
});


// A host-side peer in the namespace, standing in for our stack: answers ibv_rc_pingpong's
// out-of-band exchange on TCP 18515 (52 bytes "%04x:%06x:%06x:%s\0": LID:QPN:PSN:GID) with a
// made-up QPN 0xabc, and reports the first datagram that arrives on UDP 4791.
const hostPeer = `
import dgram from 'node:dgram';
import net from 'node:net';
const say = (o) => process.stdout.write(JSON.stringify(o) + '\\n');
const gid = '00000000000000000000ffff0a4d0001'; // ::ffff:10.77.0.1
let ready = 0;
const up = () => { if (++ready === 2) say({ listening: true }); };
const tcp = net.createServer((sock) => {
  let buf = Buffer.alloc(0);
  let answered = false;
  sock.on('error', () => {});
  sock.on('data', (d) => {
    buf = Buffer.concat([buf, d]);
    if (!answered && buf.length >= 52) {
      answered = true;
      say({ oob: buf.subarray(0, 51).toString('latin1') });
      sock.write(Buffer.from('0000:000abc:00beef:' + gid + '\\0', 'latin1'));
    }
  });
});
tcp.listen(18515, '10.77.0.1', up);
const udp = dgram.createSocket('udp4');
udp.on('message', (m, rinfo) => {
  say({ rx: { from: rinfo.address, len: m.length, opcode: m[0], pkey: m.readUInt16BE(2), dqpn: m.readUIntBE(5, 3), psn: m.readUIntBE(9, 3) } });
  process.exit(0);
});
udp.bind(4791, '10.77.0.1', up);
`;

function lines(child: ChildProcess, timeoutMs: number): { next: (what: string) => Promise<Record<string, unknown>> } {
  const queue: Record<string, unknown>[] = [];
  const waiters: ((v: Record<string, unknown> | undefined) => void)[] = [];
  let ended = false;
  let stderr = '';
  child.stderr?.setEncoding('utf8').on('data', (d: string) => { stderr += d; });
  const rl = createInterface({ input: child.stdout! });
  rl.on('line', (l) => {
    let v: Record<string, unknown>;
    try { v = JSON.parse(l) as Record<string, unknown>; } catch { return; }
    const w = waiters.shift();
    if (w) w(v); else queue.push(v);
  });
  rl.on('close', () => { ended = true; for (const w of waiters.splice(0)) w(undefined); });
  return {
    next: (what) => new Promise((resolve, reject) => {
      const v = queue.shift();
      if (v) { resolve(v); return; }
      if (ended) { reject(new Error(`host peer ended before ${what}: ${stderr}`)); return; }
      const timer = setTimeout(() => reject(new Error(`host peer: no ${what} within ${timeoutMs / 1000} s: ${stderr}`)), timeoutMs);
      waiters.push((x) => {
        clearTimeout(timer);
        if (x) resolve(x); else reject(new Error(`host peer ended before ${what}: ${stderr}`));
      });
    }),
  };
}

t.test('a node process in the namespace receives a guest RoCEv2 packet on UDP 4791', async (t) => {
  const lab = need();
  const g = lab.guests[0];
  if (!g) throw new Error('no guest');
  const start = Date.now();
  const peer = lab.execHost([process.execPath, '--input-type=module', '-e', hostPeer], { stdio: ['ignore', 'pipe', 'pipe'] });
  try {
    const out = lines(peer, 30_000);
    await out.next('listening');
    // rxe retries forever (retry_cnt 7) since nobody ACKs: the job's time bound ends it.
    const client = await g.spawn(`ibv_rc_pingpong -d rxe0 -g ${g.gidIndexV4} -n 1 ${lab.hostIpv4}`, { timeoutMs: 20_000 });
    const oob = await out.next('out-of-band message');
    const rx = (await out.next('RoCEv2 datagram'))['rx'] as Record<string, number | string>;
    await client.kill();
    const c = await client.wait();
    t.match(String(oob['oob']), /^0000:[0-9a-f]{6}:[0-9a-f]{6}:00000000000000000000ffff0a4d0002$/, 'client sent its LID:QPN:PSN:GID');
    t.equal(rx['from'], g.ipv4, 'from the guest');
    t.equal(rx['dqpn'], 0xabc, 'addressed to the QPN we gave it');
    t.equal(rx['pkey'], 0xffff, 'default P_Key');
    t.ok([0, 4].includes(Number(rx['opcode'])), 'an RC SEND (FIRST or ONLY)');
    t.not(c.code, 0, `client did not complete (no ACKs), exit ${c.code}`);
  } finally {
    peer.kill('SIGKILL');
  }
  t.comment(`host receive: ${secs(start)}`);
});

t.test('the bridge capture opens in tshark with RoCEv2 frames', async (t) => {
  const lab = need();
  const file = await lab.stopCapture();
  if (!file) throw new Error('no capture');
  const count = (filter: string): number => {
    const r = spawnSync('tshark', ['-r', file, '-Y', filter, '-T', 'fields', '-e', 'frame.number'], { encoding: 'utf8', timeout: 60_000 });
    if (r.status !== 0) throw new Error(`tshark failed (${r.status}): ${r.stderr}`);
    return r.stdout.split('\n').filter((l) => l.trim() !== '').length;
  };
  const all = count('infiniband');
  const v6 = count('infiniband && ipv6');
  const toHost = count('infiniband && ip.dst == 10.77.0.1');
  t.ok(all > 0, `${all} RoCEv2 frames`);
  t.ok(v6 > 0, `${v6} RoCEv2 frames over IPv6`);
  t.ok(toHost > 0, `${toHost} RoCEv2 frames to the host side`);
});

// The out-of-band exchanges against the real tools in an rxe guest: ibv_rc/uc/ud_pingpong and
// ib_write/read/send/atomic_bw, each with the tool as server and as client, our side in the
// lab's namespace on 10.77.0.1. Only the exchange is tested: no RDMA traffic follows.
//  - pingpong runs with -n 0, so the tool ends by itself right after the exchange;
//  - perftest: our side closes the connection after the hand shake that makes the tool print
//    the remote address, so the tool fails its next read and exits (its stdout is flushed).
// Needs root (see interop/README.md). If the lab cannot start, every test here fails with why.
import t from 'tap';
import { createInterface } from 'node:readline';
import { fileURLToPath, pathToFileURL } from 'node:url';
import path from 'node:path';
import { startLab, type Guest, type Lab } from '../../interop/lab.js';
import { cAltHex } from '../../src/oob/common.js';

const t0 = Date.now();
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

const here = path.dirname(fileURLToPath(import.meta.url));
const distSrc = path.resolve(here, '../../src/oob');
const PP_URL = pathToFileURL(path.join(distSrc, 'pingpong.js')).href;
const PF_URL = pathToFileURL(path.join(distSrc, 'perftest.js')).href;

const HOST_GID = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 1];
const OUR_QPN = 0xabc;
const OUR_PSN = 0xbeef;

interface PeerConfig {
  tool: 'pingpong' | 'perftest';
  role: 'client' | 'server';
  host?: string;
  verb?: 'write' | 'read' | 'send' | 'atomic';
  /** perftest: hand shakes after the first one, before we close. */
  extra?: number;
}

interface PeerResult {
  ok: boolean;
  code?: string;
  message?: string;
  remote?: { qpn: number; psn: number; gid: string; lid: number; outReads?: number; rkey?: number } | { qpn: number; psn: number; gid: string }[];
  mtu?: number;
  remoteVersion?: string;
}

/** Our side, as a node process inside the namespace: prints {listening}, then its result, as JSON lines. */
function peerScript(cfg: PeerConfig): string {
  return `
const cfg = ${JSON.stringify({ ...cfg, gid: HOST_GID, qpn: OUR_QPN, psn: OUR_PSN })};
const pp = await import(${JSON.stringify(PP_URL)});
const pf = await import(${JSON.stringify(PF_URL)});
const gid = Uint8Array.from(cfg.gid);
const out = (o) => process.stdout.write(JSON.stringify(o, (k, v) =>
  typeof v === 'bigint' ? '0x' + v.toString(16) : v instanceof Uint8Array ? Buffer.from(v).toString('hex') : v) + '\\n');
const listening = () => out({ listening: true });
try {
  if (cfg.tool === 'pingpong') {
    const local = { lid: 0, qpn: cfg.qpn, psn: cfg.psn, gid };
    const r = cfg.role === 'client'
      ? await pp.pingpongClientExchange(cfg.host, 18515, local, { connectTimeoutMs: 10000 })
      : await pp.pingpongServerExchange(18515, local, { onListening: listening, acceptTimeoutMs: 30000 });
    out({ ok: true, remote: r.remote });
  } else {
    const rd = cfg.verb === 'read' || cfg.verb === 'atomic';
    const key = { lid: 0, outReads: rd ? 128 : 1, qpn: cfg.qpn, psn: cfg.psn, rkey: cfg.verb === 'send' ? 0 : 0x1234,
      vaddr: 0x7f0000001000n, gid, srqn: 0 };
    const opts = { verb: cfg.verb, local: key, mtu: 3 };
    const s = cfg.role === 'client'
      ? await pf.perftestClientExchange(cfg.host, 18515, { ...opts, connectTimeoutMs: 10000 })
      : await pf.perftestServerExchange(18515, { ...opts, onListening: listening, acceptTimeoutMs: 30000 });
    for (let i = 0; i < cfg.extra; i++) await s.handShake(0);
    s.close();
    out({ ok: true, remote: s.remote, mtu: s.mtu, remoteVersion: s.remoteVersion });
  }
} catch (e) {
  out({ ok: false, code: e.code, message: e.message });
}
`;
}

function runPeer(cfg: PeerConfig): { listening: Promise<void>; result: Promise<PeerResult> } {
  const child = need().execHost([process.execPath, '--input-type=module', '-e', peerScript(cfg)], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr?.setEncoding('utf8').on('data', (d: string) => { stderr += d; });
  const timer = setTimeout(() => child.kill('SIGKILL'), 60_000);
  let onListening: () => void = () => undefined;
  const listening = new Promise<void>((r) => { onListening = r; });
  const result = new Promise<PeerResult>((resolve, reject) => {
    let res: PeerResult | undefined;
    createInterface({ input: child.stdout! }).on('line', (line) => {
      const o = JSON.parse(line) as PeerResult & { listening?: boolean };
      if (o.listening) onListening();
      else res = o;
    });
    child.on('close', (code) => {
      clearTimeout(timer);
      if (res) resolve(res);
      else reject(new Error(`our peer process ended (${code}) without a result: ${stderr.trim()}`));
    });
  });
  result.catch(() => onListening());
  return { listening, result };
}

async function waitListening(g: Guest, port: number): Promise<void> {
  const hex = port.toString(16).toUpperCase().padStart(4, '0');
  const r = await g.run(
    `i=0; until grep -q ':${hex} 00000000:0000 0A' /proc/net/tcp; do ` +
    `i=$((i+1)); [ $i -lt 150 ] || exit 1; sleep 0.1; done`, { timeoutMs: 30_000 });
  if (r.code !== 0) throw new Error(`nothing listens on ${g.ipv4}:${port}`);
}

/** The tool as server in the guest, our client on the host. */
async function toolServer(cmd: string, cfg: PeerConfig): Promise<{ tool: { code: number; stdout: string }; ours: PeerResult }> {
  const g = need().guests[0] as Guest;
  const job = await g.spawn(cmd, { timeoutMs: 30_000 });
  try {
    await waitListening(g, 18515);
  } catch (e) {
    await job.kill();
    throw new Error(`${(e as Error).message}; tool output: ${(await job.wait()).stdout}`);
  }
  const ours = await runPeer({ ...cfg, role: 'client', host: g.ipv4 }).result;
  const tool = await job.wait();
  return { tool, ours };
}

/** Our server on the host, the tool as client in the guest. */
async function toolClient(cmd: string, cfg: PeerConfig): Promise<{ tool: { code: number; stdout: string }; ours: PeerResult }> {
  const g = need().guests[0] as Guest;
  const peer = runPeer({ ...cfg, role: 'server' });
  await peer.listening;
  const tool = await g.run(`${cmd} ${need().hostIpv4}`, { timeoutMs: 30_000 });
  const ours = await peer.result;
  return { tool, ours };
}

const hex6 = (v: number): string => v.toString(16).padStart(6, '0');

t.test('lab boots one rxe guest', async (t) => {
  const start = Date.now();
  try {
    lab = await startLab({ guests: 1, ipv6: false });
  } catch (e) {
    startError = e as Error;
    throw e;
  }
  t.comment(`boot: ${secs(start)} (${lab.accel})`);
  t.equal(lab.guests.length, 1);
});

for (const tr of ['rc', 'uc', 'ud'] as const) {
  const cmd = `ibv_${tr}_pingpong -d rxe0 -g 1 -n 0`;
  const localRe = new RegExp(`local address: {1,2}LID 0x0000, QPN 0x([0-9a-f]{6}), PSN 0x([0-9a-f]{6})[,:] GID ::ffff:10\\.77\\.0\\.2`);
  const remoteLine = `  remote address: LID 0x0000, QPN 0x${hex6(OUR_QPN)}, PSN 0x${hex6(OUR_PSN)}, GID ::ffff:10.77.0.1`;

  t.test(`ibv_${tr}_pingpong as server, our client`, async (t) => {
    const start = Date.now();
    const { tool, ours } = await toolServer(cmd, { tool: 'pingpong', role: 'client' });
    t.comment(`${secs(start)}`);
    t.equal(ours.ok, true, `our exchange: ${ours.message ?? 'ok'}`);
    t.equal(tool.code, 0, 'the tool ends well');
    t.ok(tool.stdout.includes(remoteLine), `the tool took our address:\n${tool.stdout}`);
    const m = localRe.exec(tool.stdout);
    t.ok(m, 'the tool printed its address');
    const r = ours.remote as { qpn: number; psn: number; gid: string };
    t.equal(hex6(r.qpn), m?.[1], 'we got the tool\'s QPN');
    t.equal(hex6(r.psn), m?.[2], 'we got the tool\'s PSN');
    t.equal(r.gid, '00000000000000000000ffff0a4d0002');
  });

  t.test(`ibv_${tr}_pingpong as client, our server`, async (t) => {
    const start = Date.now();
    const { tool, ours } = await toolClient(cmd, { tool: 'pingpong', role: 'server' });
    t.comment(`${secs(start)}`);
    t.equal(ours.ok, true, `our exchange: ${ours.message ?? 'ok'}`);
    t.equal(tool.code, 0, 'the tool ends well');
    t.ok(tool.stdout.includes(remoteLine), `the tool took our address:\n${tool.stdout}`);
    const m = localRe.exec(tool.stdout);
    const r = ours.remote as { qpn: number; psn: number; gid: string };
    t.equal(hex6(r.qpn), m?.[1]);
    t.equal(hex6(r.psn), m?.[2]);
  });
}

const PERF_EXTRA = { write: 1, read: 1, atomic: 1, send: 2 } as const;
for (const verb of ['write', 'read', 'send', 'atomic'] as const) {
  const cmd = `ib_${verb}_bw -d rxe0 -x 1 -n 5`;
  // " remote address: LID 0000 QPN 0x0abc PSN 0xbeef[ OUT 0x80][ RKey 0x001234 VAddr 0x007f0000001000]"
  // (BASIC_ADDR_FMT's "%#06x": four hex digits at least, after the 0x)
  let remoteLine = ` remote address: LID 0000 QPN ${cAltHex(OUR_QPN, 6)} PSN ${cAltHex(OUR_PSN, 6)}`;
  if (verb === 'read') remoteLine += ' OUT 0x80';
  if (verb === 'read' || verb === 'write') remoteLine += ' RKey 0x001234 VAddr 0x007f0000001000';
  const gidLine = ' GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:77:00:01';
  const localRe = / local address: LID 0000 QPN (0x[0-9a-f]{4,6}) PSN (0x[0-9a-f]{4,6}|0000)/;

  for (const side of ['server', 'client'] as const) {
    t.test(`ib_${verb}_bw as ${side}, our ${side === 'server' ? 'client' : 'server'}`, async (t) => {
      const start = Date.now();
      const cfg: PeerConfig = { tool: 'perftest', role: side === 'server' ? 'client' : 'server', verb, extra: PERF_EXTRA[verb] };
      const { tool, ours } = side === 'server' ? await toolServer(cmd, cfg) : await toolClient(cmd, cfg);
      t.comment(`${secs(start)}`);
      t.equal(ours.ok, true, `our exchange: ${ours.message ?? 'ok'}`);
      t.equal(ours.remoteVersion, '6.06');
      t.equal(ours.mtu, 3);
      t.ok(tool.stdout.includes(`${remoteLine}\n${gidLine}\n`), `the tool printed our address and GID:\n${tool.stdout}`);
      const m = localRe.exec(tool.stdout);
      const r = (ours.remote as { qpn: number; psn: number }[])[0];
      t.ok(m, 'the tool printed its address');
      t.equal(r && cAltHex(r.qpn, 6), m?.[1], 'we got the tool\'s QPN');
      t.equal(r && cAltHex(r.psn, 6), m?.[2], 'we got the tool\'s PSN');
      // We hang up after that hand shake: the tool's next read fails and it exits (1).
      t.match(tool.stdout, /Couldn't read remote address|Failed to exchange data/);
    });
  }
}

t.test('a mismatch is refused with a typed error: our write client, ib_read_bw server', async (t) => {
  const { tool, ours } = await toolServer('ib_read_bw -d rxe0 -x 1 -n 5', { tool: 'perftest', role: 'client', verb: 'write', extra: 0 });
  t.equal(ours.ok, false);
  t.equal(ours.code, 'ERR_OOB_MISMATCH');
  t.match(ours.message, /outstanding reads: it runs ib_read_bw or ib_atomic_bw/);
  t.not(tool.code, 0, 'the tool gives up too');
});

// Our stack against our own libibverbs peer (interop/lab/peer/verbs-peer.c) on rdma_rxe, for the
// cells the Debian tools cannot run: SEND_WITH_IMM and RDMA_WRITE_WITH_IMM (RC, UC; UD
// SEND_WITH_IMM), 0-byte RC/UC messages, and UD at path MTU 256 and 1024; and, with every byte
// checked, the rest of the RC/UC operations × sizes (perftest never looks at the data). Both
// directions (`ours→rxe`: our requester, the C peer responding; `rxe→ours`: the reverse), IPv4
// and IPv6 GIDs, one lab boot. Our side is test/interop/verbs-peer-node.ts on the public verbs
// API over real UDP on the lab's bridge.
//
// One connection (one C peer process, one node process, one QP each) runs every cell of one
// transport × path MTU × family × direction. Each message is a lockstep round (ready / sent / ok
// over the TCP connection), so a receive is always posted before its message and no RNR or UC
// loss can come from the test itself; the side that can see a message checks it (the receive
// completion's opcode, byte_len, IBV_WC_WITH_IMM and imm_data, the bytes, and 64 untouched bytes
// after them; READ: the requester checks what it read).
//
// A cell passes when both sides printed `ok` for each of its messages and exited 0, and the
// connection's frames in the bridge capture (both directions) all decode with a good ICRC
// (`strict`) and are dissected by tshark without a problem, the requester's request packets in
// the capture are at least one per path MTU of every message (one per READ), and every immediate
// of the cell was seen on the wire in a frame from the requester.
//
// UD and the MTU. A UD message is one packet: "UD at MTU N" means messages up to N bytes with both
// ports at active MTU N. rxe's port MTU follows its netdev (rxe_set_mtu: the netdev MTU less the
// RoCE headers, rounded down to an IB MTU), so the guest's eth0 MTU is lowered for those cells:
// 1500 gives rxe 1024, 576 gives 256. IPv6 needs a netdev MTU of 1280 at least (below it the
// kernel drops the interface's IPv6 addresses, and with them rxe's IPv6 GID), so rxe cannot have
// an IPv6 GID at port MTU 256: UD IPv6 at 256 runs with our port at 256 and rxe's at 1024 (noted
// in those cells). The cells check the active MTU each side reports.
//
// Needs root (see interop/README.md). If the lab cannot start, every test here fails with why.
import t from 'tap';
import type { ChildProcess } from 'node:child_process';
import { readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startLab, type Guest, type Lab } from '../../interop/lab.js';
import { recordCell, type Direction } from '../../interop/matrix.js';
import { decodeCapture, isGood } from '../../src/analyze/decode.js';
import { roceFrameCount, roceProblems } from './tshark.js';

const t0 = Date.now();
const here = path.dirname(fileURLToPath(import.meta.url));
const OURS = path.resolve(here, 'verbs-peer-node.js');
const pcap = path.join(tmpdir(), `roce-verbs-peer-${process.pid}.pcap`);
let lab: Lab | undefined;
let startError: Error | undefined;
const secs = (ms: number): string => `${(ms / 1000).toFixed(1)} s`;

function need(): Lab {
  if (lab) return lab;
  throw new Error(`the rxe lab did not start: ${startError?.message ?? 'unknown reason'}`);
}

t.teardown(async () => {
  await lab?.stop();
  if (!process.env['ROCE_LAB_KEEP']) rmSync(pcap, { force: true });
  t.comment(`total wall time ${secs(Date.now() - t0)}`);
});

type Tr = 'rc' | 'uc' | 'ud';
type Op = 'send' | 'send_imm' | 'write' | 'write_imm' | 'read';
const MIB = 1 << 20;
const SIZES = [0, 1, 4095, 4096, 4097, 65536, MIB];
const OP_NAME: Record<Op, string> = {
  send: 'SEND', send_imm: 'SEND_WITH_IMM', write: 'RDMA_WRITE', write_imm: 'RDMA_WRITE_WITH_IMM', read: 'RDMA_READ',
};
/**
 * Messages per cell: two, so that a cell's consecutive immediates and patterns differ; one of
 * 1 MiB (4096 packets at MTU 256: the bulk of the file's time and capture).
 */
const itersOf = (size: number): number => (size >= MIB ? 1 : 2);
const immOf = (k: number, i: number): number => (0x5a000000 | (k << 8) | i) >>> 0;

/** The guest netdev MTU of each phase, and the rxe port MTU it gives. */
const PHASES = [
  { netdev: 9000, rxeMtu: 4096 },
  { netdev: 1500, rxeMtu: 1024 },
  { netdev: 576, rxeMtu: 256 },
] as const;

interface Conn {
  tr: Tr;
  mtu: 256 | 1024 | 4096;
  family: 4 | 6;
  dir: Direction;
  phase: number;
  cells: { op: Op; size: number }[];
  /** Our port's active MTU (UD: the path MTU; RC/UC: 4096, the path MTU is per QP). */
  ourPortMtu: number;
  note: string[];
  /**
   * Why these cells run alone after the phase's two lanes (as perftest.test.ts does). They pass or
   * fail like every other cell; running alone only keeps the other lane's traffic out of them.
   */
  alone?: string;
}

interface Outcome {
  conn: Conn;
  start: number;
  end: number;
  peer?: { code: number; stdout: string };
  ours?: { code: number | null; stdout: string; stderr: string };
  error?: string;
}

function cellsFor(tr: Tr, mtu: number): { op: Op; size: number }[] {
  if (tr === 'ud') {
    // Up to the MTU: the sizes of the list that fit, and the MTU itself.
    const sizes = [...new Set([...SIZES.filter((s) => s <= mtu), mtu])];
    return [...sizes.map((size) => ({ op: 'send' as const, size })), ...sizes.map((size) => ({ op: 'send_imm' as const, size }))];
  }
  // Every operation at every size: what the tools cannot run (the immediates, 0-byte messages)
  // and, with the data checked, what they run unchecked (perftest never looks at the bytes) or
  // trim for time (1 MiB at MTU 256).
  const ops: Op[] = tr === 'rc' ? ['send', 'send_imm', 'write', 'write_imm', 'read'] : ['send', 'send_imm', 'write', 'write_imm'];
  return ops.flatMap((op) => SIZES.map((size) => ({ op, size })));
}

const conns: Conn[] = [];
for (const family of [4, 6] as const) {
  for (const tr of ['rc', 'uc', 'ud'] as const) {
    for (const mtu of [256, 1024, 4096] as const) {
      for (const dir of ['ours→rxe', 'rxe→ours'] as const) {
        const note: string[] = [];
        let phase = 0;
        if (tr === 'ud' && mtu !== 4096) {
          phase = mtu === 1024 || family === 6 ? 1 : 2;
          if (family === 6 && mtu === 256) {
            note.push('rxe port MTU 1024 (an IPv6 GID needs netdev MTU ≥ 1280), our port MTU 256, messages ≤ 256');
          } else {
            note.push(`both ports at active MTU ${mtu} (guest eth0 MTU ${PHASES[phase]!.netdev})`);
          }
        }
        const base = { tr, mtu, family, dir, phase, ourPortMtu: tr === 'ud' ? mtu : 4096, note };
        const cells = cellsFor(tr, mtu);
        // A 1 MiB READ from us is answered by rxe at kernel speed; with the other lane's traffic
        // in the same guest a burst can overrun our UDP receive buffer, and each lost response
        // costs a replay of the rest of the message (rxe answers a re-request in order). Alone it
        // completes in seconds.
        const big = tr === 'rc' && dir === 'ours→rxe' && mtu <= 1024;
        conns.push({ ...base, cells: big ? cells.filter((x) => !(x.op === 'read' && x.size === MIB)) : cells });
        if (big) {
          conns.push({ ...base, cells: [{ op: 'read', size: MIB }], alone: 'a 1 MiB READ from us, after the lanes' });
        }
      }
    }
  }
}

let nextPort = 21_000;

/** Our side in the namespace; resolves when it ends (killed after `timeoutMs`). */
function runOurs(args: string[], timeoutMs: number): { child: ChildProcess; done: Promise<{ code: number | null; stdout: string; stderr: string }> } {
  const child = need().execHost([process.execPath, OURS, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout?.setEncoding('utf8').on('data', (d: string) => { stdout += d; });
  child.stderr?.setEncoding('utf8').on('data', (d: string) => { stderr += d; });
  const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
  const done = new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) => {
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
    child.on('error', (e) => {
      clearTimeout(timer);
      resolve({ code: null, stdout, stderr: stderr + e.message });
    });
  });
  return { child, done };
}

/** Time bound of a connection: generous for the MiB messages at MTU 256 under TCG. */
function boundMs(c: Conn): number {
  const bytes = c.cells.reduce((a, x) => a + x.size * itersOf(x.size), 0);
  return 30_000 + Math.ceil(bytes / MIB) * (c.mtu === 256 ? 40_000 : 15_000);
}

async function runConn(c: Conn): Promise<Outcome> {
  const lab = need();
  const g = lab.guests[0] as Guest;
  const port = nextPort++;
  const gidx = c.family === 4 ? g.gidIndexV4 : g.gidIndexV6;
  const cells = c.cells.map((x) => `${x.op}:${x.size}:${itersOf(x.size)}`).join(',');
  const o: Outcome = { conn: c, start: Date.now(), end: 0 };
  const bound = boundMs(c);
  const peerRole = c.dir === 'ours→rxe' ? 'responder' : 'requester';
  const ourRole = c.dir === 'ours→rxe' ? 'requester' : 'responder';
  try {
    const job = await g.spawn(
      `verbs-peer -d rxe0 -g ${gidx} -t ${c.tr} -m ${c.mtu} -r ${peerRole} -p ${port} -T ${Math.ceil(bound / 1000)} -c ${cells}`,
      { timeoutMs: bound + 5_000 },
    );
    const ours = runOurs([
      '--bind', c.family === 4 ? lab.hostIpv4 : lab.hostIpv6, g.ipv4, '-p', String(port), '-t', c.tr, '-m', String(c.mtu),
      '-r', ourRole, '--port-mtu', String(c.ourPortMtu), '-c', cells,
    ], bound + 5_000);
    o.ours = await ours.done;
    if (o.ours.code !== 0) await job.kill();
    o.peer = await job.wait();
  } catch (e) {
    o.error = (e as Error).message;
  }
  o.end = Date.now();
  return o;
}

function name(c: Conn): string {
  return `${c.tr.toUpperCase()} ${c.dir} IPv${c.family} mtu ${c.mtu}`;
}

t.test('lab boots one rxe guest (netdev MTU 9000: active MTU 4096)', async (t) => {
  const start = Date.now();
  try {
    lab = await startLab({ guests: 1, mtu: 9000, ipv6: true, capture: pcap });
  } catch (e) {
    startError = e as Error;
    throw e;
  }
  const g = lab.guests[0] as Guest;
  // As in pingpong.test.ts: a long tap queue (a 1 MiB UC message at MTU 256 is 4096 back-to-back
  // packets, and UC never recovers a message) and permanent neighbours.
  const setup = await lab.runHost(['sh', '-c', [
    'ip link set dev tap2 txqueuelen 20000',
    `ip neigh replace ${g.ipv4} lladdr ${g.mac} dev ${lab.bridge} nud permanent`,
    `ip -6 neigh replace ${g.ipv6} lladdr ${g.mac} dev ${lab.bridge} nud permanent`,
  ].join(' && ')]);
  t.equal(setup.code, 0, `tap queue and neighbours: ${setup.stderr.trim()}`);
  const peer = await g.run('verbs-peer -t xx 2>&1; echo "rc=$?"');
  t.match(peer.stdout, /need -t rc\|uc\|ud[\s\S]*rc=1/, 'verbs-peer is in the guest and refuses a bad transport');
  t.comment(`boot: ${secs(Date.now() - start)} (${lab.accel})`);
});

const outcomes: Outcome[] = [];

t.test(`${conns.length} connections, ${conns.reduce((a, c) => a + c.cells.length, 0)} cells`, async (t) => {
  const lab = need();
  const g = lab.guests[0] as Guest;
  for (const [p, phase] of PHASES.entries()) {
    const start = Date.now();
    if (p > 0) {
      // rxe follows at once (a netdev notifier); verbs-peer prints the port's active MTU, and the
      // verdicts check it.
      const r = await g.run(`/usr/sbin/ip link set dev eth0 mtu ${phase.netdev} && /usr/sbin/ip -br addr show dev eth0`);
      t.equal(r.code, 0, `guest eth0 MTU ${phase.netdev}: ${r.stdout.trim()}`);
      // Why UD IPv6 at 256 runs against rxe at 1024: below 1280 the interface loses its IPv6
      // addresses (and rxe its IPv6 GID).
      if (phase.netdev < 1280) t.notMatch(r.stdout, g.ipv6, `no ${g.ipv6} at netdev MTU ${phase.netdev}`);
    }
    // Two lanes, IPv4 and IPv6, at once: they bind different addresses, and a connection's
    // frames are told apart by family and time. Within a lane connections run one after another.
    const run = async (c: Conn): Promise<void> => {
      const o = await runConn(c);
      outcomes.push(o);
      if (o.error !== undefined || o.peer?.code !== 0 || o.ours?.code !== 0) {
        t.comment(`${name(c)}: peer ${o.peer?.code} ours ${o.ours?.code} ${o.error ?? ''} ${(o.ours?.stderr ?? '').trim()}`);
      }
    };
    const lane = async (family: 4 | 6): Promise<void> => {
      for (const c of conns.filter((x) => x.family === family && x.phase === p && x.alone === undefined)) await run(c);
    };
    await Promise.all([lane(4), lane(6)]);
    for (const c of conns.filter((x) => x.phase === p && x.alone !== undefined)) await run(c);
    t.comment(`phase ${p} (guest eth0 MTU ${phase.netdev}): ${secs(Date.now() - start)}`);
  }
  t.equal(outcomes.length, conns.length);
});

// ---------------------------------------------------------------------------------------------
// The capture, frame by frame, attributed to connections by family and time

interface FrameStats {
  frames: number;
  fromOurs: number;
  fromRxe: number;
  /** ImmDt values in the frames each side sent. */
  immOurs: Set<number>;
  immRxe: Set<number>;
  /** Request packets (SEND, WRITE, READ request: opcode & 0x1f ≤ 0x0c) each side sent, retransmissions included. */
  requestsOurs: number;
  requestsRxe: number;
  bad: string[];
  tsharkProblems: string[];
}

const emptyStats = (): FrameStats => ({
  frames: 0, fromOurs: 0, fromRxe: 0, immOurs: new Set(), immRxe: new Set(), requestsOurs: 0, requestsRxe: 0, bad: [], tsharkProblems: [],
});

function connAt(tsNs: bigint, family: 4 | 6): Outcome | undefined {
  const ms = Number(tsNs / 1_000_000n);
  return outcomes.find((o) => o.conn.family === family && ms >= o.start - 20 && ms <= o.end + 20);
}

const stats = new Map<Outcome, FrameStats>();
const stray = emptyStats();

t.test('the capture: our decoder (strict ICRC) and tshark', async (t) => {
  const lab = need();
  const start = Date.now();
  await lab.stopCapture();
  const bytes = readFileSync(pcap);
  const ours = new Set([lab.hostIpv4, lab.hostIpv6]);
  let decoded = 0;
  for (const d of decodeCapture(bytes, { icrc: 'strict', port: 4791 })) {
    decoded++;
    const o = connAt(d.timestampNs, d.family);
    let s = stray;
    if (o) {
      s = stats.get(o) ?? emptyStats();
      stats.set(o, s);
    }
    s.frames++;
    const mine = ours.has(d.src);
    if (mine) s.fromOurs++;
    else s.fromRxe++;
    const imm = d.packet?.immDt?.data;
    if (imm !== undefined) (mine ? s.immOurs : s.immRxe).add(imm >>> 0);
    const op = d.packet?.bth.opcode;
    if (op !== undefined && (op & 0x1f) <= 0x0c) {
      if (mine) s.requestsOurs++;
      else s.requestsRxe++;
    }
    if (!isGood(d)) s.bad.push(`frame ${d.frame}: ${d.error ? `${d.error.code} ${d.error.detail}` : `ICRC ${d.icrc.status}`}`);
  }
  t.comment(`our decoder: ${decoded} RoCEv2 frames in ${secs(Date.now() - start)}`);
  const ts = Date.now();
  const problems = await roceProblems(pcap);
  for (const p of problems) {
    const o = connAt(p.timeNs, p.family);
    const s = o ? stats.get(o) ?? emptyStats() : stray;
    if (o) stats.set(o, s);
    s.tsharkProblems.push(p.text);
  }
  const counted = await roceFrameCount(pcap);
  t.comment(`tshark: ${problems.length} problem frame(s), ${counted} RoCEv2 frames, ${secs(Date.now() - ts)}`);
  t.equal(counted, decoded, 'tshark and our decoder see the same RoCEv2 frames');
  t.same(stray.bad, [], 'frames outside any connection: all good');
  t.same(stray.tsharkProblems, [], 'frames outside any connection: tshark finds nothing wrong');
});

// ---------------------------------------------------------------------------------------------
// Verdicts

/** "cell OP SIZE ITER ok|fail WHY" lines → key "op:size" → iterations ok, or the failure. */
function cellLines(text: string): Map<string, { ok: number; fail?: string }> {
  const r = new Map<string, { ok: number; fail?: string }>();
  for (const m of text.matchAll(/^cell (\S+) (\d+) (\d+) (ok|fail)(?: (.*))?$/gm)) {
    const key = `${m[1]}:${m[2]}`;
    const e = r.get(key) ?? { ok: 0 };
    if (m[4] === 'ok') e.ok++;
    else e.fail = `message ${m[3]}: ${m[5] ?? ''}`;
    r.set(key, e);
  }
  return r;
}

t.test('verdicts per cell', async (t) => {
  let pass = 0;
  let total = 0;
  const failures: string[] = [];
  for (const o of outcomes) {
    const c = o.conn;
    const s = stats.get(o) ?? emptyStats();
    const peerOut = o.peer?.stdout ?? '';
    const oursOut = o.ours?.stdout ?? '';
    const peerCells = cellLines(peerOut);
    const ourCells = cellLines(oursOut);
    // What fails the whole connection.
    const connWhy: string[] = [];
    if (o.error !== undefined) connWhy.push(o.error);
    if (o.peer?.code !== 0) connWhy.push(`verbs-peer exit ${o.peer?.code ?? 'none'}: ${peerOut.trim().split('\n').slice(-2).join(' | ')}`);
    if (o.ours?.code !== 0) connWhy.push(`ours exit ${o.ours?.code ?? 'none'}: ${(o.ours?.stderr ?? '').trim().split('\n').slice(-2).join(' | ')}`);
    const rxeMtu = /port active_mtu (\d+)/.exec(peerOut)?.[1];
    const wantRxeMtu = c.tr === 'ud' && c.family === 6 && c.mtu === 256 ? 1024 : PHASES[c.phase]!.rxeMtu;
    if (o.peer?.code === 0 && Number(rxeMtu) !== wantRxeMtu) connWhy.push(`rxe's port active MTU ${rxeMtu}, expected ${wantRxeMtu}`);
    if (o.ours?.code === 0 && !new RegExp(`^port active_mtu ${c.ourPortMtu}$`, 'm').test(oursOut)) connWhy.push(`our port MTU is not ${c.ourPortMtu}`);
    if (s.bad.length) connWhy.push(`decoder: ${s.bad.length} bad frame(s), e.g. ${s.bad[0]}`);
    if (s.tsharkProblems.length) connWhy.push(`tshark: ${s.tsharkProblems.length} problem frame(s), e.g. ${s.tsharkProblems[0]}`);
    const requesterImm = c.dir === 'ours→rxe' ? s.immOurs : s.immRxe;
    // The requester sent each message whole (a READ: its request), retransmissions aside.
    const requests = c.dir === 'ours→rxe' ? s.requestsOurs : s.requestsRxe;
    const wantRequests = c.cells.reduce((a, x) => a + itersOf(x.size) * (x.op === 'read' ? 1 : Math.max(1, Math.ceil(x.size / c.mtu))), 0);
    if (requests < wantRequests) connWhy.push(`capture: ${requests} request packets from the requester, expected ≥ ${wantRequests}`);
    // Go-back-N after an ACK timeout (14: 67 ms) that a TCG guest outlasts now and then.
    if (requests > wantRequests) t.comment(`${name(c)}: ${requests - wantRequests} request packets sent again`);
    for (const [k, cell] of c.cells.entries()) {
      total++;
      const key = `${cell.op}:${cell.size}`;
      const n = itersOf(cell.size);
      const why = [...connWhy];
      for (const [side, lines] of [['verbs-peer', peerCells], ['ours', ourCells]] as const) {
        const e = lines.get(key);
        if (e?.fail !== undefined) why.unshift(`${side}: ${e.fail}`);
        else if ((e?.ok ?? 0) !== n) why.push(`${side}: ${e?.ok ?? 0} of ${n} messages verified`);
      }
      if (cell.op.endsWith('_imm')) {
        const missing = Array.from({ length: n }, (_, i) => immOf(k, i)).filter((v) => !requesterImm.has(v));
        if (missing.length) why.push(`capture: immediate(s) ${missing.map((v) => `0x${v.toString(16)}`).join(', ')} not seen from the requester`);
      }
      const ok = why.length === 0;
      // The same note for every passing cell of a kind keeps the report's table notes short;
      // retransmissions are the connection's, not a cell's: they go into the test output.
      const note = [...c.note];
      if (ok) {
        pass++;
        note.push(cell.op.endsWith('_imm') ? 'data and immediate verified' : 'data verified');
      } else {
        note.push(...why);
        failures.push(`${name(c)} ${OP_NAME[cell.op]} ${cell.size}: ${why.join('; ')}`);
      }
      // The cells of a connection run back to back in one process pair: a cell's time is its share.
      recordCell({
        suite: 'verbs-peer', transport: c.tr.toUpperCase() as 'RC' | 'UC' | 'UD', op: OP_NAME[cell.op], mtu: c.mtu, size: cell.size,
        direction: c.dir, family: c.family, pass: ok, ms: Math.round((o.end - o.start) / c.cells.length), tool: 'verbs-peer', note: note.join('; '),
      });
      t.ok(ok, `${name(c)} ${OP_NAME[cell.op]} ${cell.size}${ok ? '' : `: ${why.join('; ')}`}`);
    }
  }
  t.comment(`${pass} of ${total} cells pass${failures.length ? `; failures:\n${failures.slice(0, 40).join('\n')}` : ''}`);
});

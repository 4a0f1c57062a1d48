// `roce pingpong` against ibv_rc_pingpong / ibv_uc_pingpong / ibv_ud_pingpong in an rxe guest:
// RC, UC, UD × path MTU 256, 1024, 4096 × message size × both roles × IPv4 and IPv6 GIDs, one
// lab boot for all of it. Our side is the real CLI (`node dist/src/cli/main.js pingpong`) run
// inside the lab's namespace on 10.77.0.1 / fd77::1. Direction names who starts the SENDs:
// `ours→rxe` has our side as the client, `rxe→ours` the tool.
//
// A cell passes when the tool exits 0 and prints its summary for the right byte count, our side
// exits 0 (it checks every completion, every receive's length and every received byte against
// the tools' 0x7b fill, and exits 1 on a mismatch), the two sides printed each other's QPN, PSN
// and GID, and the cell's frames in the bridge capture (both directions, attributed to the cell
// by time) all decode with a good ICRC (`strict`: the capture has the real IP headers) and are
// dissected by tshark as RoCEv2 without a malformed frame.
//
// What is not run, and why (also in each cell's note):
//  - RC/UC -s 0: the tools refuse it ("Couldn't register MR": rxe cannot register 0 bytes); UD
//    accepts it (its buffer is size + 40).
//  - UD at path MTU 256 and 1024: ibv_ud_pingpong has no -m, a UD message is one packet, and the
//    guest's port MTU is 4096; UD runs at 4096 with the sizes up to it.
// Both are covered with our own libibverbs peer instead, in verbs-peer.test.ts (0-byte RC/UC
// messages, UD with rxe's port at MTU 256 and 1024), with the immediates the tools never send.
//
// The lab's tap towards the guest gets a long queue (a TCG guest drains ~10 MB/s, and a 1 MiB UC
// message at MTU 256 is 4096 back-to-back packets: the default 1000-packet queue drops, and UC
// never recovers a message), and the guest's neighbour entries are made permanent on the host
// side (the first RoCE packets to an address still being resolved wait in a short queue).
//
// Needs root (see interop/README.md). If the lab cannot start, every test here fails with why.
import t from 'tap';
import type { ChildProcess } from 'node:child_process';
import { readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { NicGuard, startLab, type Guest, type Lab } from '../../interop/lab.js';
import { recordCell, type Direction } from '../../interop/matrix.js';
import { decodeCapture, isGood } from '../../src/analyze/decode.js';
import { roceFrameCount, roceProblems } from './tshark.js';

const t0 = Date.now();
const here = path.dirname(fileURLToPath(import.meta.url));
const CLI = path.resolve(here, '../../src/cli/main.js');
const pcap = path.join(tmpdir(), `roce-pingpong-${process.pid}.pcap`);
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
const MIB = 1 << 20;
const SIZES = [0, 1, 4095, 4096, 4097, 65536, MIB];

interface Cell {
  tr: Tr;
  mtu: 256 | 1024 | 4096;
  size: number;
  dir: Direction;
  family: 4 | 6;
  iters: number;
  note: string[];
}

interface Outcome {
  cell: Cell;
  start: number;
  end: number;
  tool?: { code: number; stdout: string };
  ours?: { code: number | null; stdout: string; stderr: string };
  error?: string;
}

const cells: Cell[] = [];
for (const family of [4, 6] as const) {
  for (const tr of ['rc', 'uc', 'ud'] as const) {
    for (const mtu of [256, 1024, 4096] as const) {
      if (tr === 'ud' && mtu !== 4096) continue;
      for (const size of SIZES) {
        if (tr !== 'ud' && size === 0) continue;
        if (tr === 'ud' && size > mtu) continue;
        for (const dir of ['ours→rxe', 'rxe→ours'] as const) {
          const note: string[] = [];
          if (tr === 'ud') note.push('UD: one packet per message, port MTU 4096 (ibv_ud_pingpong has no -m)');
          cells.push({ tr, mtu, size, dir, family, iters: size >= 65536 ? 3 : 5, note });
        }
      }
    }
  }
}

let nextPort = 20_000;

/** Our CLI in the namespace; resolves when it ends (killed after `timeoutMs`). */
function runOurs(args: string[], timeoutMs: number): { child: ChildProcess; done: Promise<{ code: number | null; stdout: string; stderr: string }> } {
  const child = need().execHost([process.execPath, CLI, 'pingpong', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
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

/** Until our server listens on TCP `port` (its /proc/PID/net/tcp shows its namespace). */
async function listening(child: ChildProcess, port: number, ms = 10_000): Promise<boolean> {
  const want = `:${port.toString(16).toUpperCase().padStart(4, '0')} 00000000:0000 0A`;
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (child.exitCode !== null || child.signalCode !== null) return false;
    try {
      if (readFileSync(`/proc/${child.pid}/net/tcp`, 'utf8').includes(want)) return true;
    } catch {
      // not there yet (or gone: checked above)
    }
    await new Promise((r) => setTimeout(r, 20));
  }
  return false;
}

async function runCell(c: Cell): Promise<Outcome> {
  const lab = need();
  const g = lab.guests[0] as Guest;
  const port = nextPort++;
  const gidx = c.family === 4 ? g.gidIndexV4 : g.gidIndexV6;
  const common = ['-s', String(c.size), '-n', String(c.iters), '-p', String(port), ...(c.tr === 'ud' ? [] : ['-m', String(c.mtu)])];
  const toolCmd = `ibv_${c.tr}_pingpong -d rxe0 -g ${gidx} ${common.join(' ')}`;
  const bound = c.size >= 65536 ? 60_000 : 20_000;
  const o: Outcome = { cell: c, start: Date.now(), end: 0 };
  try {
    // Guest commands run as jobs, never as blocking `run`s: the IPv4 and IPv6 lanes share the guest.
    if (c.dir === 'ours→rxe') {
      // Our client retries its connection while the tool's server comes up.
      const job = await g.spawn(toolCmd, { timeoutMs: bound });
      const ours = runOurs([g.ipv4, '--transport', c.tr, '-g', String(gidx), ...common], bound + 5_000);
      o.ours = await ours.done;
      if (o.ours.code !== 0) await job.kill();
      o.tool = await job.wait();
    } else {
      // Our server without -g or --bind: it answers with the address of the family the tool announces.
      const ours = runOurs(['--transport', c.tr, ...common], bound + 5_000);
      if (!(await listening(ours.child, port))) {
        ours.child.kill('SIGKILL');
        o.ours = await ours.done;
        throw new Error(`our server did not listen on ${port}`);
      }
      const job = await g.spawn(`${toolCmd} ${lab.hostIpv4}`, { timeoutMs: bound });
      o.tool = await job.wait();
      if (o.tool.code !== 0) ours.child.kill('SIGTERM');
      o.ours = await ours.done;
    }
  } catch (e) {
    o.error = (e as Error).message;
  }
  o.end = Date.now();
  return o;
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
  const setup = await lab.runHost(['sh', '-c', [
    'ip link set dev tap2 txqueuelen 20000',
    `ip neigh replace ${g.ipv4} lladdr ${g.mac} dev ${lab.bridge} nud permanent`,
    `ip -6 neigh replace ${g.ipv6} lladdr ${g.mac} dev ${lab.bridge} nud permanent`,
  ].join(' && ')]);
  t.equal(setup.code, 0, `tap queue and neighbours: ${setup.stderr.trim()}`);
  t.comment(`boot: ${secs(Date.now() - start)} (${lab.accel})`);
  t.equal(lab.guests.length, 1);
});

const outcomes: Outcome[] = [];

t.test(`${cells.length} cells against the tools`, async (t) => {
  need();
  const start = Date.now();
  // Two lanes, IPv4 and IPv6, at once: they bind different addresses, and a cell's frames are
  // told apart by family and time. Within a lane cells run one after another.
  // A cell that failed while the guest's NIC had stopped transmitting runs again once the guest was booted again.
  const guard = new NicGuard(need().guests[0] as Guest);
  const say = (line: string): void => t.comment(line);
  const failed = (o: Outcome): boolean => o.error !== undefined || o.tool?.code !== 0 || o.ours?.code !== 0;
  const lane = async (family: 4 | 6): Promise<void> => {
    for (const c of cells.filter((x) => x.family === family)) {
      await guard.before(name(c), say);
      let o = await runCell(c);
      const first = o;
      const note = (why: string): void => { first.error = first.error === undefined ? why : `${first.error}; ${why}`; };
      if (failed(o) && (await guard.again(name(c), o.start, `tool ${o.tool?.code} ours ${o.ours?.code} ${o.error ?? ''}`, say, note))) {
        t.comment(`${name(c)}: run again after the guest was booted again`);
        o = await runCell(c);
      }
      outcomes.push(o);
      if (failed(o)) {
        t.comment(`${name(c)}: tool ${o.tool?.code} ours ${o.ours?.code} ${o.error ?? ''} ${(o.ours?.stderr ?? '').trim()}`);
      }
    }
  };
  await Promise.all([lane(4), lane(6)]);
  t.comment(`cells: ${secs(Date.now() - start)}`);
  t.equal(outcomes.length, cells.length);
});

function name(c: Cell): string {
  return `${c.tr.toUpperCase()} ${c.dir} IPv${c.family} mtu ${c.mtu} size ${c.size}`;
}

// ---------------------------------------------------------------------------------------------
// The capture, frame by frame, attributed to cells by time

interface FrameStats {
  frames: number;
  fromOurs: number;
  fromRxe: number;
  /** SEND packets (first/middle/last/only) each side sent, retransmissions included. */
  sendsOurs: number;
  sendsRxe: number;
  bad: string[];
  tsharkProblems: string[];
}

const emptyStats = (): FrameStats => ({ frames: 0, fromOurs: 0, fromRxe: 0, sendsOurs: 0, sendsRxe: 0, bad: [], tsharkProblems: [] });

function cellAt(tsNs: bigint, family: 4 | 6): Outcome | undefined {
  const ms = Number(tsNs / 1_000_000n);
  // A lane runs its cells one after another: a frame belongs to the cell of its family whose run covers its time.
  return outcomes.find((o) => o.cell.family === family && ms >= o.start - 20 && ms <= o.end + 20);
}

const stats = new Map<Outcome, FrameStats>();
const stray = emptyStats();
let tsharkTotal = -1;
let decodedTotal = 0;

t.test('the capture: our decoder (strict ICRC) and tshark', async (t) => {
  const lab = need();
  const start = Date.now();
  await lab.stopCapture();
  const bytes = readFileSync(pcap);
  const ours = new Set([lab.hostIpv4, lab.hostIpv6]);
  for (const d of decodeCapture(bytes, { icrc: 'strict', port: 4791 })) {
    decodedTotal++;
    const o = cellAt(d.timestampNs, d.family);
    let s = stray;
    if (o) {
      s = stats.get(o) ?? emptyStats();
      stats.set(o, s);
    }
    s.frames++;
    const mine = ours.has(d.src);
    if (mine) s.fromOurs++;
    else s.fromRxe++;
    const op = d.packet?.bth.opcode;
    if (op !== undefined && (op & 0x1f) <= 5) {
      if (mine) s.sendsOurs++;
      else s.sendsRxe++;
    }
    if (!isGood(d)) {
      s.bad.push(`frame ${d.frame}: ${d.error ? `${d.error.code} ${d.error.detail}` : `ICRC ${d.icrc.status}`}`);
    }
  }
  t.comment(`our decoder: ${decodedTotal} RoCEv2 frames in ${secs(Date.now() - start)}`);
  const ts = Date.now();
  const problems = await roceProblems(pcap);
  for (const p of problems) {
    const o = cellAt(p.timeNs, p.family);
    const s = o ? stats.get(o) ?? emptyStats() : stray;
    if (o) stats.set(o, s);
    s.tsharkProblems.push(p.text);
  }
  tsharkTotal = await roceFrameCount(pcap);
  t.comment(`tshark: ${problems.length} problem frame(s), ${tsharkTotal} RoCEv2 frames, ${secs(Date.now() - ts)}`);
  t.equal(tsharkTotal, decodedTotal, 'tshark and our decoder see the same RoCEv2 frames');
  t.same(stray.bad, [], 'frames outside any cell: all good');
  t.same(stray.tsharkProblems, [], 'frames outside any cell: tshark finds nothing wrong');
});

// ---------------------------------------------------------------------------------------------
// Verdicts

const ADDR_RE = (side: 'local' | 'remote'): RegExp =>
  new RegExp(`${side} address: {1,2}LID 0x([0-9a-f]{4}), QPN 0x([0-9a-f]{6}), PSN 0x([0-9a-f]{6})[,:] GID (\\S+)`);

function addr(text: string, side: 'local' | 'remote'): string | undefined {
  const m = ADDR_RE(side).exec(text);
  return m ? `${m[2]}/${m[3]}/${m[4]}` : undefined;
}

function summaryOk(text: string, c: Cell): boolean {
  const bytes = c.size * c.iters * 2;
  return new RegExp(`(^|\\n)${bytes} bytes in \\d+\\.\\d\\d seconds = [\\d.inf]+ Mbit/sec\\r?\\n${c.iters} iters in \\d+\\.\\d\\d seconds = [\\d.]+ usec/iter`).test(text);
}

t.test('verdicts per cell', async (t) => {
  let pass = 0;
  const failures: string[] = [];
  for (const o of outcomes) {
    const c = o.cell;
    const s = stats.get(o) ?? emptyStats();
    const why: string[] = [];
    if (o.error !== undefined) why.push(o.error);
    if (o.tool?.code !== 0) why.push(`tool exit ${o.tool?.code ?? 'none'}: ${(o.tool?.stdout ?? '').trim().split('\n').slice(-3).join(' | ')}`);
    if (o.ours?.code !== 0) why.push(`ours exit ${o.ours?.code ?? 'none'}: ${(o.ours?.stderr ?? '').trim().split('\n').slice(-2).join(' | ')}`);
    const toolOut = o.tool?.stdout ?? '';
    const oursOut = o.ours?.stdout ?? '';
    if (o.tool?.code === 0 && !summaryOk(toolOut, c)) why.push('tool summary missing or wrong byte count');
    if (o.ours?.code === 0 && !summaryOk(oursOut, c)) why.push('our summary missing or wrong byte count');
    if (o.tool?.code === 0 && o.ours?.code === 0) {
      if (addr(toolOut, 'remote') !== addr(oursOut, 'local')) why.push(`the tool saw ${addr(toolOut, 'remote')}, we announced ${addr(oursOut, 'local')}`);
      if (addr(oursOut, 'remote') !== addr(toolOut, 'local')) why.push(`we saw ${addr(oursOut, 'remote')}, the tool announced ${addr(toolOut, 'local')}`);
      const gid = c.family === 4 ? `::ffff:${need().hostIpv4}` : need().hostIpv6;
      if (!addr(oursOut, 'local')?.endsWith(`/${gid}`)) why.push(`we announced ${addr(oursOut, 'local')}, not GID ${gid}`);
    }
    // Each side sent `iters` messages of this many packets at least (retransmissions add more).
    const perMsg = c.tr === 'ud' ? 1 : Math.max(1, Math.ceil(c.size / c.mtu));
    if (s.sendsOurs < c.iters * perMsg) why.push(`capture: ${s.sendsOurs} SEND packets from us, expected ≥ ${c.iters * perMsg}`);
    if (s.sendsRxe < c.iters * perMsg) why.push(`capture: ${s.sendsRxe} SEND packets from rxe, expected ≥ ${c.iters * perMsg}`);
    if (s.bad.length) why.push(`decoder: ${s.bad.length} bad frame(s), e.g. ${s.bad[0]}`);
    if (s.tsharkProblems.length) why.push(`tshark: ${s.tsharkProblems.length} problem frame(s), e.g. ${s.tsharkProblems[0]}`);
    const ok = why.length === 0;
    const note = [...c.note, `n=${c.iters}`, `frames ours ${s.fromOurs} / rxe ${s.fromRxe}`];
    if (ok) {
      pass++;
      note.push('data verified (0x7b)');
      // Go-back-N after an ACK timeout (14: 67 ms, as the tools set it) that a TCG guest outlasts.
      const again = [s.sendsOurs - c.iters * perMsg, s.sendsRxe - c.iters * perMsg];
      if (again[0]! > 0 || again[1]! > 0) note.push(`SEND packets sent again: ours ${again[0]}, rxe ${again[1]}`);
    } else {
      note.push(...why);
      failures.push(`${name(c)}: ${why.join('; ')}`);
    }
    recordCell({
      suite: 'pingpong', transport: c.tr.toUpperCase() as 'RC' | 'UC' | 'UD', op: 'SEND', mtu: c.mtu, size: c.size,
      direction: c.dir, family: c.family, pass: ok, ms: o.end - o.start, tool: `ibv_${c.tr}_pingpong`, note: note.join('; '),
    });
    t.ok(ok, `${name(c)} (${secs(o.end - o.start)})${ok ? '' : `: ${why.join('; ')}`}`);
  }
  t.comment(`${pass} of ${outcomes.length} cells pass${failures.length ? `; failures:\n${failures.join('\n')}` : ''}`);
});

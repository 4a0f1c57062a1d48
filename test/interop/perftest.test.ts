// `roce perf` against perftest 4.5 (ib_write_bw, ib_read_bw, ib_send_bw, ib_atomic_bw) in an rxe
// guest, every cell in both directions and both GID families, then loss recovery against rxe.
//
// One lab boot (one guest, netdev MTU 9000 so that path MTU 4096 works; -m picks smaller ones).
// Our side is one long-lived node process in the lab's namespace that runs `perfCommand` (the
// `roce perf` command itself, without the process start per cell) for each request; the first
// cell runs the real CLI binary instead. IPv4 and IPv6 cells run side by side, each family on
// its own host address and TCP port, so that the guest's idle time (ib_write_bw sleeps 1 s
// after connecting) overlaps; the loss runs come last, one at a time.
//
// Per cell: the tool exits 0, our side exits 0, and afterwards the bridge capture, cut into the
// cell's frames (by our address and the cell's time window), is checked: every frame decoded by
// our decoder with a good ICRC (strict, the capture has the real IP headers) and known to
// tshark as InfiniBand without a malformed frame; the data as far as the protocol shows it
// (see `verifyData`): what the tool wrote or sent into our buffer is in our buffer at the end
// (`--dump`), what the tool read from us carries our pattern, what we wrote, sent, read or got
// back from atomics matches the wire.
//
// Under TCG the guest's virtio-net transmit queue has been seen to stop for good in mid-run
// (NETDEV WATCHDOG on its console), after which every cell fails: a cell that fails then runs again
// after the guest was booted again (`NicGuard`, interop/lab.ts), each restart in a comment.
//
// PERF_CELLS=regex runs only the cells whose name matches (development); the matrix records
// whatever ran. Needs root (see interop/README.md).
import t from 'tap';
import { createInterface } from 'node:readline';
import { mkdtempSync, readFileSync, rmSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import type { ChildProcess } from 'node:child_process';
import { NicGuard, startLab, type Guest, type Lab } from '../../interop/lab.js';
import { recordCell, type Direction } from '../../interop/matrix.js';
import { decodeCapture, isGood, type DecodedFrame } from '../../src/analyze/decode.js';
import { opcodeInfo } from '../../src/wire/opcode.js';
import { aethKind } from '../../src/wire/aeth.js';
import { perfLayout, perfPatternByte, perfRecvOffset, perfSlot, PERF_UD_ADDITION } from '../../src/cli/perf.js';
import { tshark, tsharkJson } from './tshark.js';

const t0 = Date.now();
const secs = (since: number): string => `${((Date.now() - since) / 1000).toFixed(1)} s`;
const here = path.dirname(fileURLToPath(import.meta.url));
const DIST = path.resolve(here, '../..');
const CLI = path.join(DIST, 'src/cli/main.js');
const work = mkdtempSync(path.join(tmpdir(), 'roce-perftest-'));
const capture = path.join(work, 'bridge.pcap');
const FILTER = process.env['PERF_CELLS'] ? new RegExp(process.env['PERF_CELLS']) : undefined;

/** Iterations per cell: perftest's minimum is 5. */
const ITERS = 5;
const MTUS = [256, 1024, 4096] as const;
const SIZES = [1, 4095, 4096, 4097, 65536, 1 << 20] as const;
/** Packets/s for our UC SENDs of 64 KiB and more to rxe (see perftestCells). */
const UC_SEND_PPS = Number(process.env['PERF_UC_PPS'] ?? 1500);

let lab: Lab | undefined;
let startError: Error | undefined;
let driver: Driver | undefined;

function need(): Lab {
  if (lab) return lab;
  throw new Error(`the rxe lab did not start: ${startError?.message ?? 'unknown reason'}`);
}

t.teardown(async () => {
  driver?.close();
  await lab?.stop();
  if (!process.env['ROCE_LAB_KEEP']) rmSync(work, { recursive: true, force: true });
  t.comment(`total wall time ${secs(t0)}`);
});

// ---------------------------------------------------------------------------------------------
// Our side: a node process in the namespace that runs `perfCommand` per request.

interface PerfRun {
  code: number;
  out: string[];
  err: string;
}

const DRIVER = `
const { perfCommand } = await import(${JSON.stringify(pathToFileURL(path.join(DIST, 'src/cli/perf.js')).href)});
const { CliError } = await import(${JSON.stringify(pathToFileURL(path.join(DIST, 'src/cli/errors.js')).href)});
const { readFileSync } = await import('node:fs');
const { createInterface } = await import('node:readline');
const send = (o) => process.stdout.write(JSON.stringify(o) + '\\n');
const listening = (port) => {
  const hex = ':' + port.toString(16).toUpperCase().padStart(4, '0') + ' 00000000:0000 0A';
  return readFileSync('/proc/net/tcp', 'latin1').includes(hex);
};
createInterface({ input: process.stdin }).on('line', async (line) => {
  const req = JSON.parse(line);
  const out = [];
  let settled = false;
  const run = perfCommand(req.argv, (l) => out.push(l)).then(
    (code) => ({ code, err: '' }),
    (e) => e instanceof CliError ? { code: e.exitCode, err: e.message }
      : String(e && e.code).startsWith('ERR_PARSE_ARGS') ? { code: 2, err: e.message }
      : { code: 70, err: String(e && e.stack || e) });
  run.finally(() => { settled = true; });
  if (req.listenPort) {
    (async () => {
      while (!settled && !listening(req.listenPort)) await new Promise((r) => setTimeout(r, 20));
      send({ id: req.id, listening: true });
    })();
  }
  const r = await run;
  send({ id: req.id, code: r.code, out, err: r.err });
});
`;

class Driver {
  private readonly child: ChildProcess;
  private next = 1;
  private readonly waiting = new Map<number, { listening?: () => void; done: (r: PerfRun) => void }>();
  stderr = '';

  constructor(l: Lab) {
    this.child = l.execHost([process.execPath, '--input-type=module', '-e', DRIVER], { stdio: ['pipe', 'pipe', 'pipe'] });
    this.child.stderr?.setEncoding('utf8').on('data', (d: string) => { this.stderr = (this.stderr + d).slice(-20_000); });
    createInterface({ input: this.child.stdout! }).on('line', (line) => {
      const o = JSON.parse(line) as PerfRun & { id: number; listening?: boolean };
      const w = this.waiting.get(o.id);
      if (!w) return;
      if (o.listening) { w.listening?.(); return; }
      this.waiting.delete(o.id);
      w.done({ code: o.code, out: o.out, err: o.err });
    });
    this.child.on('exit', (code) => {
      for (const w of this.waiting.values()) w.done({ code: 70, out: [], err: `driver exited (${code}): ${this.stderr.slice(-2000)}` });
      this.waiting.clear();
    });
  }

  /** Runs `roce perf argv…`; for a server, `listening` resolves once its TCP port listens. */
  run(argv: string[], listenPort?: number): { listening: Promise<void>; result: Promise<PerfRun> } {
    const id = this.next++;
    let onListen: () => void = () => undefined;
    const listening = new Promise<void>((r) => { onListen = r; });
    const result = new Promise<PerfRun>((resolve) => {
      this.waiting.set(id, { listening: onListen, done: (r) => { onListen(); resolve(r); } });
    });
    this.child.stdin!.write(JSON.stringify({ id, argv, ...(listenPort ? { listenPort } : {}) }) + '\n');
    return { listening, result };
  }

  close(): void {
    this.child.stdin?.end();
  }
}

/** The real binary, for one cell: main.ts, its buffered output and exit code. */
function runCli(argv: string[]): { result: Promise<PerfRun> } {
  const child = need().execHost([process.execPath, CLI, 'perf', ...argv], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout?.setEncoding('utf8').on('data', (d: string) => { stdout += d; });
  child.stderr?.setEncoding('utf8').on('data', (d: string) => { stderr += d; });
  return {
    result: new Promise((resolve) => child.on('close', (code) => resolve({ code: code ?? 70, out: stdout.split('\n'), err: stderr.trim() }))),
  };
}

// ---------------------------------------------------------------------------------------------
// Cells

type Op = 'RDMA_WRITE' | 'RDMA_READ' | 'SEND' | 'CMP_SWAP' | 'FETCH_ADD';
type Transport = 'RC' | 'UC' | 'UD';

interface Cell {
  name: string;
  transport: Transport;
  op: Op;
  mtu: number;
  size: number;
  direction: Direction;
  family: 4 | 6;
  suite: 'perftest' | 'loss';
  iters: number;
  /** Extra tool/our flags (loss runs: -t). */
  extra?: string[];
  /** Extra flags for our side only. */
  ourExtra?: string[];
  loss?: 'netem' | 'ours';
  seed?: number;
  note?: string;
  /** Why the cell runs after the others, beside its twin of the other family only. */
  solo?: string;
}

interface CellResult {
  cell: Cell;
  pass: boolean;
  ms: number;
  startMs: number;
  endMs: number;
  ours?: PerfRun;
  tool?: { code: number; stdout: string };
  problems: string[];
  ourAddress: string;
  dump?: string;
}

const VERB: Record<Op, 'write' | 'read' | 'send' | 'atomic'> = {
  RDMA_WRITE: 'write', RDMA_READ: 'read', SEND: 'send', CMP_SWAP: 'atomic', FETCH_ADD: 'atomic',
};

function cellName(c: Omit<Cell, 'name'>): string {
  const loss = c.loss ? ` loss:${c.loss}` : '';
  return `${c.suite} ${c.transport} ${c.op} mtu${c.mtu} s${c.size} ${c.direction} v${c.family}${loss}`;
}

/** The perftest matrix. Trimmed cells are listed in TRIMMED with the reason, never dropped silently. */
function perftestCells(): { cells: Cell[]; trimmed: Cell[] } {
  const cells: Cell[] = [];
  const trimmed: Cell[] = [];
  const add = (c: Omit<Cell, 'name' | 'suite' | 'iters'>): void => {
    const cell: Cell = { ...c, suite: 'perftest', iters: ITERS, name: '' };
    cell.name = cellName(cell);
    // UC has no flow control and no recovery: five 1 MiB SENDs back to back at our full speed
    // overrun the guest under TCG (the bridge capture has every packet, rxe never sees some: a
    // lost packet loses its whole message), and ib_send_bw's server then waits for messages
    // that never come. A sender that knows its receiver is slow limits its rate, as perftest's
    // --rate_limit does: ours paces per packet, at a rate this guest's rxe keeps up with. The
    // way into the guest (the host's tap queue, QEMU, the guest's one vCPU) is shared by all
    // lanes, though, and the full-speed RC streams of the others overflow it however slowly
    // this one sends; RC recovers, UC cannot. So these run after the others. Since datagrams
    // leave by sendmmsg (src/link/mmsg.ts) our bursts are denser: a 64 KiB message (256 packets at
    // MTU 256) has been seen to lose a packet too, so UC SENDs from 64 KiB on go this way.
    if (c.size >= 65536 && c.transport === 'UC' && c.op === 'SEND' && c.direction === 'ours→rxe') {
      // rxe's cost is per packet: the same packet rate at every MTU.
      cell.ourExtra = ['--rate_limit', (UC_SEND_PPS * c.mtu / 0x100000).toFixed(3), '--rate_units', 'M'];
      cell.solo = 'UC cannot recover a loss: not beside full-speed RC streams into the same guest';
    }
    // A 1 MiB READ that rxe answers at kernel speed is 1024–4096 responses at once; when our
    // driver process is busy with three other lanes its socket overflows, and every lost
    // response costs a re-request of the rest of the message (go-back-N), which rxe answers
    // after the stream it is on. Beside the others that multiplies the READ's traffic by ten
    // and more, enough to make the bridge capture drop frames of every cell then running.
    if (c.op === 'RDMA_READ' && c.direction === 'ours→rxe' && c.size === 1 << 20 && c.mtu <= 1024) {
      cell.solo = 'a 1 MiB READ burst from rxe: not beside other lanes in our driver process';
    }
    cells.push(cell);
  };
  for (const family of [4, 6] as const) {
    for (const direction of ['ours→rxe', 'rxe→ours'] as const) {
      for (const [transport, op] of [['RC', 'RDMA_WRITE'], ['RC', 'RDMA_READ'], ['RC', 'SEND'], ['UC', 'RDMA_WRITE'], ['UC', 'SEND']] as const) {
        for (const mtu of MTUS) for (const size of SIZES) add({ transport, op, mtu, size, direction, family });
      }
      for (const op of ['CMP_SWAP', 'FETCH_ADD'] as const) for (const mtu of MTUS) add({ transport: 'RC', op, mtu, size: 8, direction, family });
      // perftest's UD send: one packet per message, so at most the path MTU.
      for (const mtu of MTUS) {
        for (const size of [...new Set([1, ...SIZES.filter((s) => s <= mtu), mtu])]) add({ transport: 'UD', op: 'SEND', mtu, size, direction, family });
      }
    }
  }
  return { cells, trimmed };
}

function lossCells(): Cell[] {
  const cells: Cell[] = [];
  let seed = 11;
  for (const loss of ['netem', 'ours'] as const) {
    for (const direction of ['ours→rxe', 'rxe→ours'] as const) {
      for (const op of ['RDMA_WRITE', 'RDMA_READ', 'SEND'] as const) {
        // 10 × 16 KiB at MTU 1024 = 160 data packets; TX depth 4 keeps go-back-N short (rxe-lab.md).
        const c: Cell = {
          name: '', suite: 'loss', transport: 'RC', op, mtu: 1024, size: 16384, direction, family: 4, iters: 10,
          extra: ['-t', '4'], loss, ...(loss === 'ours' ? { seed: seed++ } : { ourExtra: ['--counters'] }),
        };
        c.name = cellName(c);
        cells.push(c);
      }
    }
  }
  return cells;
}

interface Lane {
  family: 4 | 6;
  /** Our RoCE address (the GID we offer). */
  address: string;
  /** The guest's GID index for this family. */
  gidIndex: number;
  tcpPort: number;
}

function toolCommand(c: Cell, lane: Lane, g: Guest, server: boolean): string {
  const verb = VERB[c.op];
  const a = [`ib_${verb}_bw`, '-d', 'rxe0', '-x', String(lane.gidIndex), '-p', String(lane.tcpPort), '-n', String(c.iters), '-m', String(c.mtu), '-F'];
  if (c.op === 'CMP_SWAP') a.push('-A', 'CMP_AND_SWAP');
  else if (c.op === 'FETCH_ADD') a.push('-A', 'FETCH_AND_ADD');
  else a.push('-s', String(c.size));
  if (c.transport !== 'RC') a.push('-c', c.transport);
  a.push(...(c.extra ?? []));
  if (!server) a.push(need().hostIpv4);
  void g;
  return a.join(' ');
}

function ourArgs(c: Cell, lane: Lane, host: string | undefined, dump: string): string[] {
  const verb = VERB[c.op];
  const a: string[] = [verb];
  if (host) a.push(host);
  a.push('--bind', lane.address, '-p', String(lane.tcpPort), '-n', String(c.iters), '-m', String(c.mtu), '-x', '0', '--dump', dump);
  if (c.op === 'CMP_SWAP') a.push('-A', 'CMP_AND_SWAP');
  else if (c.op === 'FETCH_ADD') a.push('-A', 'FETCH_AND_ADD');
  else a.push('-s', String(c.size));
  if (c.transport !== 'RC') a.push('-c', c.transport);
  a.push(...(c.extra ?? []), ...(c.ourExtra ?? []));
  if (c.loss === 'ours') a.push('--loss', '5', '--seed', String(c.seed ?? 1));
  return a;
}

/** Time bound for one cell's tool: generous for the big ones under TCG. */
function toolTimeoutMs(c: Cell): number {
  const packets = Math.ceil(c.size / c.mtu) * c.iters;
  return 30_000 + packets * 3;
}

let cellNo = 0;
let useCliNext = true;

async function runCell(c: Cell, lane: Lane): Promise<CellResult> {
  const g = need().guests[0] as Guest;
  const dump = path.join(work, `dump-${++cellNo}.bin`);
  const startMs = Date.now();
  const problems: string[] = [];
  const useCli = useCliNext;
  useCliNext = false;
  let ours: PerfRun | undefined;
  let tool: { code: number; stdout: string } | undefined;
  try {
    if (c.direction === 'ours→rxe') {
      const job = await g.spawn(toolCommand(c, lane, g, true), { timeoutMs: toolTimeoutMs(c) });
      const argv = ourArgs(c, lane, g.ipv4, dump);
      const run = useCli ? runCli(argv) : (driver as Driver).run(argv);
      ours = await run.result;
      if (ours.code !== 0) await job.kill().catch(() => undefined);
      tool = await job.wait();
    } else {
      const argv = ourArgs(c, lane, undefined, dump);
      const run = (driver as Driver).run(argv, lane.tcpPort);
      await run.listening;
      const job = await g.spawn(toolCommand(c, lane, g, false), { timeoutMs: toolTimeoutMs(c) });
      tool = await job.wait();
      ours = await run.result;
    }
  } catch (e) {
    problems.push(`harness: ${(e as Error).message}`);
  }
  const endMs = Date.now();
  if (tool && tool.code !== 0) problems.push(`the tool exited ${tool.code}:\n${tool.stdout.trim().split('\n').slice(-12).join('\n')}`);
  if (ours && ours.code !== 0) problems.push(`roce perf exited ${ours.code}: ${ours.err}\n${ours.out.slice(-6).join('\n')}`);
  if (ours && ours.code === 0 && !ours.out.some((l) => /^ #bytes {5}#iterations/.test(l))) problems.push('roce perf printed no report header');
  const r: CellResult = { cell: c, pass: problems.length === 0, ms: endMs - startMs, startMs, endMs, problems, ourAddress: lane.address };
  if (ours) r.ours = ours;
  if (tool) r.tool = tool;
  if (existsSync(dump)) r.dump = dump;
  return r;
}

// ---------------------------------------------------------------------------------------------
// The guest's NIC stopping

let guard: NicGuard | undefined;

/** One cell, run again once if it failed while the guest's NIC had stopped (`NicGuard`). */
async function runGuarded(c: Cell, lane: Lane, say: (line: string) => void, prepare?: () => Promise<void>): Promise<CellResult> {
  guard ??= new NicGuard(need().guests[0] as Guest);
  await guard.before(c.name, say);
  await prepare?.();
  const r = await runCell(c, lane);
  if (r.pass || !(await guard.again(c.name, r.startMs, r.problems[0] ?? '', say, (why) => r.problems.push(why)))) return r;
  say(`${c.name}: run again after the guest was booted again`);
  await prepare?.();
  return runCell(c, lane);
}

function verdictExtra(pass: boolean, problems: string[]): Record<string, unknown> {
  return pass ? {} : { diagnostic: true, problems };
}

// ---------------------------------------------------------------------------------------------
// The capture, per cell

interface Analysis {
  frames: number;
  badIcrc: number;
  malformedOurs: number;
  notInfiniband: number;
  malformedTshark: number;
  naks: number;
  retransmitted: number;
  problems: string[];
}

const u24 = (v: number): number => v & 0xffffff;
const psnDelta = (a: number, b: number): number => u24(a - b);

/** Request packets of the requester, one per PSN (first copy), in PSN order from the first. */
function uniqueRequests(frames: DecodedFrame[], from: string): DecodedFrame[] {
  const reqs = frames.filter((f) => f.src === from && f.packet && isRequest(f.packet.bth.opcode));
  if (reqs.length === 0) return [];
  // The first frame on the wire need not carry the first PSN (it may have been dropped and
  // resent later): order from a point half the PSN space before it, where no PSN of the cell is.
  const ref = u24(reqs[0]!.packet!.bth.psn - 0x800000);
  const seen = new Map<number, DecodedFrame>();
  for (const f of reqs) if (!seen.has(f.packet!.bth.psn)) seen.set(f.packet!.bth.psn, f);
  return [...seen.values()].sort((a, b) => psnDelta(a.packet!.bth.psn, ref) - psnDelta(b.packet!.bth.psn, ref));
}

function isRequest(opcode: number): boolean {
  const k = opcodeInfo(opcode)?.kind;
  return k === 'send' || k === 'write' || k === 'readRequest' || k === 'atomic';
}

/** Messages from request packets in PSN order: first PSN, RETH/AtomicETH, payloads. */
interface Message { psn: number; frames: DecodedFrame[]; data: Uint8Array }
function messages(reqs: DecodedFrame[], pmtu: number): Message[] {
  const out: Message[] = [];
  let cur: Message | undefined;
  let readEnd: { from: number; n: number } | undefined;
  for (const f of reqs) {
    const info = opcodeInfo(f.packet!.bth.opcode)!;
    if (info.kind === 'readRequest') {
      // A READ re-requested from the middle (after a lost response) has a PSN inside the
      // original request's range: the same message, not a new one.
      const psn = f.packet!.bth.psn;
      if (readEnd && psnDelta(psn, readEnd.from) < readEnd.n) continue;
      readEnd = { from: psn, n: Math.max(1, Math.ceil(f.packet!.reth!.dmaLength / pmtu)) };
    }
    if (info.position === 'first' || info.position === 'only') {
      cur = { psn: f.packet!.bth.psn, frames: [], data: new Uint8Array(0) };
      out.push(cur);
    }
    if (!cur) continue;
    cur.frames.push(f);
    if (info.position === 'only' || info.position === 'last') cur = undefined;
  }
  for (const m of out) m.data = Buffer.concat(m.frames.map((f) => f.packet!.payload));
  return out;
}

const pattern = (off: number, len: number): Buffer => {
  const b = Buffer.alloc(len);
  for (let i = 0; i < len; i++) b[i] = perfPatternByte(off + i);
  return b;
};

function firstDiff(a: Uint8Array, b: Uint8Array, mask?: Uint8Array): number {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) if (a[i] !== b[i] && !(mask && mask[i])) return i;
  return a.length === b.length ? -1 : n;
}

/** What the protocol lets us check of the data, from the cell's frames and our buffer at the end. */
function verifyData(r: CellResult, frames: DecodedFrame[], tool: string): string[] {
  const c = r.cell;
  const problems: string[] = [];
  const dumpLine = r.ours?.out.find((l) => l.startsWith(' dump:'));
  const m = dumpLine && / at VAddr 0x([0-9a-f]+) .* cycle buffer (\d+), cache line (\d+)/.exec(dumpLine);
  if (!r.dump || !m) return ['no buffer dump from roce perf'];
  const buf = readFileSync(r.dump);
  const base = BigInt('0x' + m[1]);
  const cycle = Number(m[2]);
  const line = Number(m[3]);
  const ud = c.transport === 'UD';
  const layout = perfLayout(c.size, cycle, line, ud);
  if (buf.length !== layout.buffSize) problems.push(`dump has ${buf.length} bytes, the layout ${layout.buffSize}`);
  const requester = c.direction === 'ours→rxe' ? r.ourAddress : tool;
  const responder = c.direction === 'ours→rxe' ? tool : r.ourAddress;
  const msgs = messages(uniqueRequests(frames, requester), c.mtu);
  if (msgs.length !== c.iters) problems.push(`${msgs.length} ${c.op} messages on the wire, not ${c.iters}`);
  const model = Buffer.from(pattern(0, layout.buffSize));
  const unknown = new Uint8Array(layout.buffSize);
  const responses = frames.filter((f) => f.src === responder && f.packet);
  const byPsn = new Map<number, DecodedFrame>();
  for (const f of responses) {
    // Only data-carrying responses: a NAK carries the PSN it expects, which may be a READ's.
    const kind = opcodeInfo(f.packet!.bth.opcode)?.kind;
    if ((kind === 'readResponse' || kind === 'atomicAck') && !byPsn.has(f.packet!.bth.psn)) byPsn.set(f.packet!.bth.psn, f);
  }
  const pmtu = c.mtu;

  msgs.forEach((msg, k) => {
    const head = msg.frames[0]!.packet!;
    if (c.op === 'RDMA_WRITE' || c.op === 'SEND') {
      if (msg.data.length !== c.size) problems.push(`message ${k}: ${msg.data.length} bytes, not ${c.size}`);
      if (c.direction === 'ours→rxe') {
        const d = firstDiff(msg.data, pattern(perfSlot(layout, k), c.size));
        if (d >= 0) problems.push(`message ${k} we sent differs from our buffer at byte ${d}`);
      } else if (c.op === 'RDMA_WRITE') {
        const off = Number(head.reth!.va - base);
        if (off < 0 || off + msg.data.length > model.length) problems.push(`message ${k}: WRITE at VA 0x${head.reth!.va.toString(16)} outside our buffer`);
        else model.set(msg.data, off);
      } else {
        let off = perfRecvOffset(layout, k, line, ud);
        if (ud) {
          unknown.fill(1, off, off + PERF_UD_ADDITION);
          off += PERF_UD_ADDITION;
        }
        model.set(msg.data, off);
        unknown.fill(0, off, off + msg.data.length);
      }
    } else if (c.op === 'RDMA_READ') {
      const len = head.reth!.dmaLength;
      const packets = Math.max(1, Math.ceil(len / pmtu));
      const data = Buffer.concat(Array.from({ length: packets }, (_, i) => byPsn.get(u24(msg.psn + i))?.packet?.payload ?? new Uint8Array(0)));
      if (data.length !== c.size) problems.push(`READ ${k}: ${data.length} response bytes on the wire, not ${c.size}`);
      if (c.direction === 'rxe→ours') {
        const d = firstDiff(data, pattern(Number(head.reth!.va - base), len));
        if (d >= 0) problems.push(`READ ${k}: response byte ${d} is not our pattern`);
      } else {
        model.set(data.subarray(0, c.size), perfSlot(layout, k));
      }
    } else {
      const a = head.atomicEth!;
      const ack = byPsn.get(msg.psn)?.packet?.atomicAckEth;
      if (!ack) { problems.push(`atomic ${k}: no ATOMIC_ACKNOWLEDGE`); return; }
      const want = c.op === 'FETCH_ADD' ? { add: 1n } : { compare: 0n, swap: 0n };
      if (c.op === 'FETCH_ADD' ? a.swapAdd !== 1n : a.swapAdd !== 0n || a.compare !== 0n) {
        problems.push(`atomic ${k}: operands ${a.swapAdd}/${a.compare}, perftest's are ${JSON.stringify(want, (_, v) => typeof v === 'bigint' ? String(v) : v)}`);
      }
      if (c.direction === 'rxe→ours') {
        const off = Number(a.va - base);
        const orig = model.readBigUInt64LE(off);
        if (ack.originalData !== orig) problems.push(`atomic ${k}: acknowledged 0x${ack.originalData.toString(16)}, our buffer held 0x${orig.toString(16)}`);
        const next = c.op === 'FETCH_ADD' ? BigInt.asUintN(64, orig + a.swapAdd) : orig === a.compare ? a.swapAdd : orig;
        model.writeBigUInt64LE(next, off);
      } else {
        model.writeBigUInt64LE(ack.originalData, perfSlot(layout, k));
      }
    }
  });
  const d = firstDiff(buf, model, unknown);
  if (d >= 0) problems.push(`our buffer differs from the replay of the wire at byte ${d} (0x${(buf[d] ?? 0).toString(16)} vs 0x${(model[d] ?? 0).toString(16)})`);
  return problems;
}

function analyse(r: CellResult, all: DecodedFrame[], infiniband: Set<number>, malformed: Set<number>, tool: string): Analysis {
  const from = BigInt(r.startMs - 20) * 1_000_000n;
  const to = BigInt(r.endMs + 20) * 1_000_000n;
  const frames = all.filter((f) => f.timestampNs >= from && f.timestampNs <= to && (f.src === r.ourAddress || f.dst === r.ourAddress));
  const a: Analysis = { frames: frames.length, badIcrc: 0, malformedOurs: 0, notInfiniband: 0, malformedTshark: 0, naks: 0, retransmitted: 0, problems: [] };
  const seen = new Set<string>();
  const reads: { src: string; from: number; n: number }[] = [];
  for (const f of frames) {
    if (!f.packet) a.malformedOurs++;
    else if (!isGood(f)) a.badIcrc++;
    if (!infiniband.has(f.frame)) a.notInfiniband++;
    if (malformed.has(f.frame)) a.malformedTshark++;
    const p = f.packet;
    if (!p) continue;
    if (p.aeth && aethKind(p.aeth.syndrome) === 'NAK' && (p.aeth.syndrome & 0x1f) === 0) a.naks++;
    if (isRequest(p.bth.opcode)) {
      const k = `${f.src}/${p.bth.destQp}/${p.bth.psn}`;
      // A READ re-requested from the middle repeats PSNs its first request already covered.
      const reread = p.reth && opcodeInfo(p.bth.opcode)?.kind === 'readRequest' &&
        reads.some((x) => x.src === f.src && psnDelta(p.bth.psn, x.from) < x.n);
      if (seen.has(k) || reread) a.retransmitted++;
      seen.add(k);
      if (p.reth && opcodeInfo(p.bth.opcode)?.kind === 'readRequest' && !reread) {
        reads.push({ src: f.src, from: p.bth.psn, n: Math.max(1, Math.ceil(p.reth.dmaLength / r.cell.mtu)) });
      }
    }
  }
  if (a.frames === 0) a.problems.push('no RoCEv2 frames of this cell in the capture');
  if (a.malformedOurs) a.problems.push(`${a.malformedOurs} frames our decoder could not parse`);
  if (a.badIcrc) a.problems.push(`${a.badIcrc} frames with a bad ICRC`);
  if (a.notInfiniband) a.problems.push(`${a.notInfiniband} frames tshark does not decode as InfiniBand`);
  if (a.malformedTshark) a.problems.push(`${a.malformedTshark} frames tshark marks malformed`);
  if (a.frames > 0 && r.ours?.code === 0) a.problems.push(...verifyData(r, frames, tool));
  return a;
}

// ---------------------------------------------------------------------------------------------

/**
 * The protocols behind `tshark -G heuristic-decodes`' infiniband.payload entries (Wireshark 4.0);
 * the ethertype one is the heuristic eth_over_ib (it reads a payload's first two bytes, e.g. one
 * data byte and a pad byte, as an EtherType and hands the rest to IPv4, loop, …).
 */
const PAYLOAD_PROTOCOLS = ['smc', 'smb_direct', 'rpcordma', 'nvme-rdma', 'lnet', 'iser', 'infiniband.eoib', 'infiniband_sdp', 'fcoib'];

/** The second host address of each family, for the extra lanes. */
const EXTRA_V4 = '10.77.0.21';
const EXTRA_V6 = 'fd77::21';

const results: CellResult[] = [];
const { cells, trimmed } = perftestCells();
const selected = cells.filter((c) => !FILTER || FILTER.test(c.name));
const loss = lossCells().filter((c) => !FILTER || FILTER.test(c.name));

t.test('lab boots one rxe guest (MTU 9000, IPv4 + IPv6, bridge capture)', async (t) => {
  const start = Date.now();
  try {
    lab = await startLab({ guests: 1, mtu: 9000, ipv6: true, capture });
  } catch (e) {
    startError = e as Error;
    throw e;
  }
  driver = new Driver(lab);
  t.comment(`boot: ${secs(start)} (${lab.accel})`);
  t.equal(lab.guests.length, 1);
});

t.test(`perftest cells: ${selected.length} run, ${trimmed.length} trimmed`, async (t) => {
  const l = need();
  const g = l.guests[0] as Guest;
  // Four lanes, two per family, each on its own host address and TCP port: a cell spends most
  // of its time waiting (process starts, ib_write_bw's sleep(1), the guest agent's polls), so
  // lanes overlap well even though the guest has one vCPU. Frames are told apart by address.
  for (const [fam, addr] of [['-4', `${EXTRA_V4}/24`], ['-6', `${EXTRA_V6}/64`]] as const) {
    const r = await l.runHost(['ip', fam, 'addr', 'add', addr, 'dev', l.bridge, ...(fam === '-6' ? ['nodad'] : [])]);
    t.equal(r.code, 0, `extra host address ${addr}: ${r.stderr.trim()}`);
  }
  const lanes: Lane[] = [
    { family: 4, address: l.hostIpv4, gidIndex: g.gidIndexV4, tcpPort: 18515 },
    { family: 6, address: l.hostIpv6, gidIndex: g.gidIndexV6, tcpPort: 18516 },
    { family: 4, address: EXTRA_V4, gidIndex: g.gidIndexV4, tcpPort: 18518 },
    { family: 6, address: EXTRA_V6, gidIndex: g.gidIndexV6, tcpPort: 18519 },
  ];
  // Solo cells run last, beside their twin of the other family only (see Cell.solo).
  const last = (x: Cell): boolean => x.solo !== undefined;
  const regular = selected.filter((x) => !last(x));
  const queues = { 4: regular.filter((x) => x.family === 4), 6: regular.filter((x) => x.family === 6) };
  const start = Date.now();
  const one = async (c: Cell, lane: Lane): Promise<void> => {
    const r = await runGuarded(c, lane, (line) => t.comment(line));
    results.push(r);
    t.ok(r.pass, `${c.name} (${(r.ms / 1000).toFixed(1)} s)`, verdictExtra(r.pass, r.problems));
  };
  await Promise.all(lanes.map(async (lane) => {
    for (let c = queues[lane.family].shift(); c; c = queues[lane.family].shift()) await one(c, lane);
  }));
  await Promise.all(([4, 6] as const).map(async (fam) => {
    for (const c of selected.filter((x) => last(x) && x.family === fam)) await one(c, lanes[fam === 4 ? 0 : 1] as Lane);
  }));
  t.comment(`cells: ${secs(start)}`);
});

t.test(`loss recovery against rxe: ${loss.length} runs`, async (t) => {
  const l = need();
  const g = l.guests[0] as Guest;
  const lane: Lane = { family: 4, address: l.hostIpv4, gidIndex: g.gidIndexV4, tcpPort: 18517 };
  for (const c of loss) {
    // Again before a second run: a guest booted again has no qdisc of ours.
    const netem = c.loss !== 'netem' ? undefined : async (): Promise<void> => {
      const q = await g.run('tc qdisc replace dev eth0 root netem loss 5%');
      t.equal(q.code, 0, `netem on: ${q.stdout.trim()}`);
    };
    // netem drops at random: rxe's 160 requests at 5 % all get through about once in 3,000 runs,
    // and then there is no recovery to judge. Our responder counts the gaps it saw (--counters);
    // without one, the cell runs again (at most twice), and the capture judges the last run.
    const mustRecover = c.loss === 'netem' && c.direction === 'rxe→ours' && c.op !== 'RDMA_READ';
    for (let attempt = 1; ; attempt++) {
      let r: CellResult;
      try {
        r = await runGuarded(c, lane, (line) => t.comment(line), netem);
      } finally {
        if (c.loss === 'netem') {
          const stats = /Sent \d+ bytes (\d+) pkt \(dropped (\d+)/.exec((await g.run('tc -s qdisc show dev eth0')).stdout);
          t.comment(`${c.name}: netem passed ${stats?.[1] ?? '?'} packets of the guest's and dropped ${stats?.[2] ?? '?'}`);
          await g.run('tc qdisc del dev eth0 root');
        }
      }
      const counters = r.ours?.out.find((x) => x.startsWith(' counters:') || x.startsWith(' loss:'));
      if (counters) t.comment(counters.trim());
      if (mustRecover && r.pass && /out-of-sequence requests 0,/.test(counters ?? '') && attempt < 3) {
        t.comment(`${c.name}: none of rxe's requests was lost: run again`);
        continue;
      }
      results.push(r);
      t.ok(r.pass, `${c.name} (${(r.ms / 1000).toFixed(1)} s)`, r.pass ? {} : { diagnostic: true, problems: r.problems });
      break;
    }
  }
});

t.test('the bridge capture, cell by cell: decoder (strict ICRC), tshark, data', async (t) => {
  const l = need();
  const start = Date.now();
  await l.stopCapture();
  const bytes = readFileSync(capture);
  const all = [...decodeCapture(bytes, { icrc: 'strict', port: 4791 })];
  // perftest's payloads are random bytes (ours a pattern), which Wireshark's heuristic payload
  // dissectors (RPC-over-RDMA, SMB Direct, …) sometimes take for their protocol and then call
  // malformed (rpcordma on 1-byte SENDs, from rxe as from us). The payload is opaque here: judge
  // the InfiniBand headers only.
  const noHeuristics = [...PAYLOAD_PROTOCOLS.flatMap((h) => ['--disable-protocol', h]), '--disable-heuristic', 'eth_over_ib'];
  const ib = new Set((await tshark(['-r', capture, ...noHeuristics, '-Y', 'infiniband', '-T', 'fields', '-e', 'frame.number'])).split('\n').filter(Boolean).map(Number));
  const bad = await tsharkJson(capture, [...noHeuristics, '-Y', '_ws.malformed']);
  // A malformed frame counts against the InfiniBand headers only when InfiniBand is the last
  // layer before the exception; a layer after it is another payload dissector guessing.
  const malformed = new Set<number>();
  const guesses = new Map<string, number>();
  for (const f of bad) {
    const layers = Object.keys(f._source?.layers ?? {}).filter((k) => k !== '_ws.malformed');
    const after = layers.slice(layers.indexOf('infiniband') + 1);
    if (layers.includes('infiniband') && after.length > 0) {
      for (const p of after) guesses.set(p, (guesses.get(p) ?? 0) + 1);
      continue;
    }
    malformed.add(Number(f._source?.layers?.frame?.['frame.number']));
  }
  if (guesses.size) t.comment(`payload dissectors that took perftest data for their protocol and failed: ${[...guesses].map(([p, n]) => `${p} ×${n}`).join(', ')}`);
  t.comment(`capture: ${(bytes.length / 1e6).toFixed(1)} MB, ${all.length} RoCEv2 frames, ${ib.size} InfiniBand to tshark, ${malformed.size} malformed; analysed in ${secs(start)}`);
  const g = l.guests[0] as Guest;
  for (const r of results) {
    const tool = r.cell.family === 4 ? g.ipv4 : g.ipv6;
    const a = analyse(r, all, ib, malformed, tool);
    const problems = [...r.problems, ...a.problems];
    if (r.cell.suite === 'loss') {
      // Where requests are lost (netem drops rxe's, --loss ours), the responder NAKs the gap
      // (PSN sequence error) and the requester resends. Where only responses are lost, a later
      // ACK covers a lost one (nothing to resend) and a lost READ response is re-requested: the
      // run must complete; the figures are recorded.
      const requestsLost = (r.cell.loss === 'netem') === (r.cell.direction === 'rxe→ours');
      // (A READ run has only ten request packets: at 5 % often none is lost, so READ runs must
      // complete with their data checked, and their figures are recorded.)
      if (requestsLost && r.cell.op !== 'RDMA_READ' && a.retransmitted === 0) problems.push('no retransmitted PSN in the capture');
      if (requestsLost && r.cell.op !== 'RDMA_READ' && a.naks === 0) problems.push('no NAK PSN sequence error in the capture');
      t.comment(`${r.cell.name}: ${a.frames} frames, ${a.naks} NAK PSN sequence errors, ${a.retransmitted} retransmitted PSNs`);
    }
    const pass = problems.length === 0;
    t.ok(pass, `${r.cell.name}: ${a.frames} frames`, verdictExtra(pass, problems));
    const note = r.cell.suite === 'loss' ? `${a.naks} NAK seq err, ${a.retransmitted} retransmitted PSNs`
      : r.cell.note;
    recordCell({
      suite: r.cell.suite, transport: r.cell.transport, op: r.cell.op, mtu: r.cell.mtu, size: r.cell.size,
      direction: r.cell.direction, family: r.cell.family, pass, ms: r.ms,
      tool: `ib_${VERB[r.cell.op]}_bw${r.cell.loss === 'netem' ? ' + netem 5% in the guest' : r.cell.loss === 'ours' ? ' + roce --loss 5%' : ''}`,
      ...(note ? { note } : {}),
    });
  }
  for (const c of trimmed) {
    if (FILTER && !FILTER.test(c.name)) continue;
    t.comment(`not run: ${c.name}: ${c.note}`);
    recordCell({
      suite: c.suite, transport: c.transport, op: c.op, mtu: c.mtu, size: c.size, direction: c.direction, family: c.family,
      pass: false, ms: 0, tool: `ib_${VERB[c.op]}_bw`, note: c.note ?? 'trimmed',
    });
  }
});

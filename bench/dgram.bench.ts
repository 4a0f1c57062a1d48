/**
 * The baselines every goodput and latency ratio uses: raw `node:dgram` between two processes over
 * 127.0.0.1, sender on CPU 0 and receiver on CPU 1 (see `procs.ts`).
 *
 * - Blast, at the datagram sizes of RoCE frames for path MTU 256/1024/2048/4096 (300, 1100, 2100,
 *   4150 bytes of UDP payload): the sender sends one reused Buffer flat out without a callback, from a
 *   connected socket (the fastest form) and from an unconnected one (what `UdpLink` must use for IPv4,
 *   docs/perf-ceilings.md); the receiver counts delivered datagrams over a fixed window after a warmup.
 *   Delivered Gbit/s counts UDP payload bytes. The sender outruns the node receiver, so the excess is
 *   dropped at the receiver's socket buffer; what counts is what arrives.
 * - Windowed: the receiver ACKs every 16 datagrams with its running count, the sender keeps at most 256
 *   unacknowledged: the practical no-loss ceiling, the shape of an RC flow without the protocol.
 * - Blast batched: the same blast through the batched datagram path of `UdpLink` (`src/link/mmsg.ts`),
 *   to show what the socket layer alone gains. The sender writes each datagram into a `TxRing` (as
 *   `UdpLink.send` does: `TxQueue.add`, then the bytes at the offset it returns) from an unconnected
 *   socket's descriptor and flushes every burst of 64 with one `sendmmsg`: one message per datagram
 *   (`batched`), or consecutive datagrams as UDP GSO trains (`batched GSO`, up to 64 segments and
 *   64 KiB a train; `batched GSO GRO`: the same trains to a receiver with UDP_GRO, which reads each
 *   one whole and cuts it, as `UdpLink` does on loopback). The receiver reads with `RxRing` (`recvmmsg` into fixed slots, polled by libuv
 *   on a dup of its socket's descriptor, `dgram`'s own reading stopped). No `IP_PMTUDISC_DO` and no
 *   ICRC: raw datagrams, as in the other blasts. The ratio is to the connected blast of the same size.
 *   Without the FFI (koffi) these rows are NaN and reported FAILED.
 * - Ping-pong: one datagram in flight, echoed back; median and p99 round trip.
 *
 * Run alone: `node dist/bench/dgram.bench.js [--quick]` (after `npm run build`).
 */

import dgram, { type Socket } from 'node:dgram';
import { once } from 'node:events';
import { performance } from 'node:perf_hooks';
import { setImmediate as yieldTurn, setTimeout as sleep } from 'node:timers/promises';
import { pathToFileURL } from 'node:url';
import { RxRing, TxQueue, TxRing, type TxDest } from '../src/link/mmsg.js';
import { batchIoFfi, ffiStatus, setsockoptInt, socketFd, SOL_UDP, stopDgramReading, UDP_GRO, type BatchIoFfi } from '../src/link/sockopt.js';
import { formatRows, type BenchRow } from './harness.js';
import { machineLine, ProcGroup, runCases, type ChildContext, type ProcCase, type Workload } from './procs.js';

/** UDP payload sizes of RoCE frames carrying a full path-MTU payload of 256, 1024, 2048, 4096 bytes. */
export const DGRAM_SIZES = [300, 1100, 2100, 4150] as const;
const HOST = '127.0.0.1';
/** SO_RCVBUF asked for, as `UdpLink` does by default (the kernel caps it at net.core.rmem_max). */
const RCVBUF = 8 << 20;
const ACK_EVERY = 16;
const WINDOW = 256;

/** Send ring of the batched blast, as `UdpLink`'s (a burst of 64 × 4150 bytes takes 266 KB of it). */
const TX_RING_BYTES = 2 << 20;

export type DgramVariant = 'connected' | 'unconnected' | 'windowed connected' | 'windowed unconnected' | 'batched' | 'batched GSO' | 'batched GSO GRO';
const VARIANTS: readonly DgramVariant[] = ['connected', 'unconnected', 'windowed connected', 'windowed unconnected'];
/** The blast through `mmsg.ts` (sendmmsg → recvmmsg), without and with GSO trains, and with trains read whole (UDP_GRO). */
const BATCHED_VARIANTS: readonly DgramVariant[] = ['batched', 'batched GSO', 'batched GSO GRO'];

function variantLabel(v: DgramVariant): string {
  if (v === 'batched') return 'blast batched (sendmmsg → recvmmsg)';
  if (v === 'batched GSO') return 'blast batched GSO (sendmmsg trains → recvmmsg)';
  if (v === 'batched GSO GRO') return 'blast batched GSO + GRO (sendmmsg trains → recvmmsg trains)';
  return v.startsWith('windowed') ? `windowed ${WINDOW}/${ACK_EVERY} ${v.slice('windowed '.length)}` : `blast ${v}`;
}

/**
 * The row name of the delivered-Gbit/s baseline at a datagram size; goodput rows of the stack at the
 * same datagram size report their ratio to it. Default: the connected blast, the fastest `dgram` form.
 */
export function dgramBaselineName(size: number, variant: DgramVariant = 'connected'): string {
  return `dgram ${size} B ${variantLabel(variant)}: delivered`;
}

/** The row name of the ping-pong round-trip baseline (median or p99) at a datagram size. */
export function dgramRttName(size: number, stat: 'median' | 'p99' = 'median'): string {
  return `dgram ping-pong ${size} B: RTT ${stat}`;
}

// ---------------------------------------------------------------------------------------------------
// Child workloads

function udp4(opts: { rcvbuf?: number } = {}): Socket {
  const s = dgram.createSocket({ type: 'udp4', ...(opts.rcvbuf !== undefined ? { recvBufferSize: opts.rcvbuf } : {}) });
  // ICMP port-unreachable reaches a connected sender when the receiver closes first; not a failure.
  s.on('error', () => {});
  return s;
}

async function bindLocal(s: Socket): Promise<number> {
  // The promise first: with a synchronous lookup 'listening' would fire inside bind().
  const listening = once(s, 'listening');
  s.bind(0, HOST);
  await listening;
  return s.address().port;
}

async function closeSocket(s: Socket): Promise<void> {
  await new Promise<void>((resolve) => s.close(() => resolve()));
}

function peerPort(peers: Record<string, unknown>, name: string): number {
  const p = (peers[name] as { port?: unknown } | undefined)?.port;
  if (typeof p !== 'number') throw new Error(`peer ${name} did not announce a port`);
  return p;
}

interface ReceiverArgs {
  size: number;
  warmupMs: number;
  windowMs: number;
  /** ACK every this many datagrams to the sender (windowed); 0: no ACKs. */
  ackEvery: number;
  /** Batched receiver: set UDP_GRO and read trains whole. */
  gro?: boolean;
}
export interface ReceiverResult {
  datagrams: number;
  bytes: number;
  seconds: number;
  wrongSize: number;
}

/**
 * What a receiver counted (`read`: datagrams and bytes so far) over `windowMs`, starting `warmupMs`
 * after the first datagram; fails when none comes within 5 s.
 */
async function countWindow(firstSeen: Promise<void>, args: { warmupMs: number; windowMs: number }, read: () => [number, number]): Promise<{ datagrams: number; bytes: number; seconds: number }> {
  const waited = await Promise.race([firstSeen.then(() => true), sleep(5000).then(() => false)]);
  if (!waited) throw new Error('no datagram from the sender within 5 s');
  await sleep(args.warmupMs);
  const [c0, b0] = read();
  const t0 = performance.now();
  await sleep(args.windowMs);
  const t1 = performance.now();
  const [c1, b1] = read();
  return { datagrams: c1 - c0, bytes: b1 - b0, seconds: (t1 - t0) / 1000 };
}

/** Counts delivered datagrams over `windowMs`, starting `warmupMs` after the first one. */
const blastReceiver: Workload = async (args: ReceiverArgs, ctx: ChildContext): Promise<ReceiverResult> => {
  const s = udp4({ rcvbuf: RCVBUF });
  try {
    const port = await bindLocal(s);
    const peers = await ctx.ready({ port });
    const txPort = peerPort(peers, 'tx');
    let count = 0;
    let bytes = 0;
    let wrongSize = 0;
    const ack = Buffer.alloc(8);
    let first: () => void = () => {};
    const firstSeen = new Promise<void>((resolve) => {
      first = resolve;
    });
    s.on('message', (msg) => {
      if (count === 0) first();
      count++;
      bytes += msg.length;
      if (msg.length !== args.size) wrongSize++;
      if (args.ackEvery > 0 && count % args.ackEvery === 0) {
        ack.writeUInt32LE(count >>> 0, 0);
        s.send(ack, txPort, HOST);
      }
    });
    return { ...(await countWindow(firstSeen, args, () => [count, bytes])), wrongSize };
  } finally {
    await closeSocket(s);
  }
};

interface SenderArgs {
  size: number;
  connected: boolean;
  /** Most unacknowledged datagrams (the receiver ACKs its running count); 0: flat out. */
  window: number;
  /** Datagrams per event-loop turn when flat out. */
  burst: number;
}
export interface SenderResult {
  sent: number;
  /** Windowed: how often the window was written off after a stall (lost datagrams or ACKs). */
  stalls: number;
}

/** Sends one reused Buffer, without a callback, until stopped: flat out, or within an ACK window. */
const blastSender: Workload = async (args: SenderArgs, ctx: ChildContext): Promise<SenderResult> => {
  const s = udp4();
  try {
    const port = await bindLocal(s);
    const peers = await ctx.ready({ port });
    const rxPort = peerPort(peers, 'rx');
    const buf = Buffer.alloc(args.size, 0xa5);
    if (args.connected) {
      s.connect(rxPort, HOST);
      await once(s, 'connect');
    }
    const sendOne = args.connected ? () => s.send(buf) : () => s.send(buf, rxPort, HOST);
    let sent = 0;
    if (args.window === 0) {
      while (!ctx.isStopped()) {
        for (let i = 0; i < args.burst; i++) sendOne();
        sent += args.burst;
        await yieldTurn();
      }
      return { sent, stalls: 0 };
    }
    // Windowed: in flight = sent − acked − written off. A window that makes no progress for 20 ms is
    // written off (a datagram or an ACK was lost), so a loss cannot stall the flow for good.
    let acked = 0;
    let writtenOff = 0;
    let stalls = 0;
    const pump = (): void => {
      let room = args.window - (sent - acked - writtenOff);
      while (room-- > 0) {
        sendOne();
        sent++;
      }
    };
    s.on('message', (msg) => {
      if (msg.length >= 4) {
        const n = msg.readUInt32LE(0);
        if (n > acked) acked = n;
        pump();
      }
    });
    let lastAcked = -1;
    const watchdog = setInterval(() => {
      if (acked === lastAcked && sent - acked - writtenOff >= args.window) {
        writtenOff = sent - acked;
        stalls++;
        pump();
      }
      lastAcked = acked;
    }, 20);
    pump();
    await ctx.stopped;
    clearInterval(watchdog);
    return { sent, stalls };
  } finally {
    await closeSocket(s);
  }
};

/** The batched path's calls, or an error saying why they are missing (the row then fails). */
function requireBatchIo(): BatchIoFfi {
  const ffi = batchIoFfi();
  if (ffi === undefined) {
    const st = ffiStatus();
    throw new Error(`batched I/O unavailable: ${st.ok ? 'FFI unavailable' : st.message}`);
  }
  return ffi;
}

/**
 * `blastReceiver` through `RxRing`: `recvmmsg` on a dup of the socket's descriptor, `dgram`'s own
 * reading stopped; counts delivered datagrams over `windowMs`, starting `warmupMs` after the first.
 */
const batchedReceiver: Workload = async (args: ReceiverArgs, ctx: ChildContext): Promise<ReceiverResult & { truncated: number }> => {
  const ffi = requireBatchIo();
  const s = udp4({ rcvbuf: RCVBUF });
  let rx: RxRing | undefined;
  try {
    const port = await bindLocal(s);
    const fd = socketFd(s);
    if (fd === undefined) throw new Error('receiver socket has no file descriptor');
    const dupFd = ffi.dup(fd);
    if (dupFd < 0) throw new Error(`dup(${fd}) failed: errno ${ffi.errno()}`);
    if (!stopDgramReading(s)) {
      ffi.close(dupFd);
      throw new Error("cannot stop dgram's reading of the receiver socket");
    }
    let count = 0;
    let bytes = 0;
    let wrongSize = 0;
    let truncated = 0;
    let first: () => void = () => {};
    const firstSeen = new Promise<void>((resolve) => {
      first = resolve;
    });
    if (args.gro === true && !setsockoptInt(dupFd, SOL_UDP, UDP_GRO, 1).ok) throw new Error(`UDP_GRO: errno ${ffi.errno()}`);
    rx = new RxRing(
      ffi,
      dupFd,
      4,
      (datagram, _addr, _port, trunc) => {
        if (count === 0) first();
        count++;
        bytes += datagram.length;
        if (trunc) truncated++;
        if (datagram.length !== args.size) wrongSize++;
      },
      () => {},
      () => {},
      args.gro === true,
    );
    await ctx.ready({ port });
    return { ...(await countWindow(firstSeen, args, () => [count, bytes])), wrongSize, truncated };
  } finally {
    rx?.close();
    await closeSocket(s);
  }
};

interface BatchedSenderArgs {
  size: number;
  /** Consecutive datagrams as UDP GSO trains. */
  gso: boolean;
  /** Datagrams per event-loop turn, flushed at its end. */
  burst: number;
}
export interface BatchedSenderResult extends SenderResult {
  /** Datagrams the kernel would not take at once (EAGAIN), dropped here (`UdpLink` hands them to dgram). */
  spilled: number;
  /** Datagrams for which neither the queue nor the ring had room. */
  noRoom: number;
}

/**
 * `blastSender` through `TxQueue`/`TxRing` on an unconnected socket's descriptor: writes each datagram
 * into the ring as `UdpLink.send` does and flushes every burst of `burst` with `sendmmsg`.
 */
const batchedSender: Workload = async (args: BatchedSenderArgs, ctx: ChildContext): Promise<BatchedSenderResult> => {
  const ffi = requireBatchIo();
  const s = udp4();
  let ring: TxRing | undefined;
  try {
    const port = await bindLocal(s);
    const fd = socketFd(s);
    if (fd === undefined) throw new Error('sender socket has no file descriptor');
    let refused = 0;
    let refusedErrno = 0;
    let spilled = 0;
    ring = new TxRing(ffi, TX_RING_BYTES, (n) => {
      refused += n;
      refusedErrno = ffi.errno();
    });
    const q = new TxQueue(ffi, fd, ring, args.gso, () => spilled++);
    const peers = await ctx.ready({ port });
    const dest: TxDest = { address: HOST, port: peerPort(peers, 'rx'), addr: new Uint8Array([127, 0, 0, 1]) };
    const payload = Buffer.alloc(args.size, 0xa5);
    const bytes = ring.bytes;
    let added = 0;
    let noRoom = 0;
    while (!ctx.isStopped()) {
      for (let i = 0; i < args.burst; i++) {
        const at = q.add(dest, args.size);
        if (at < 0) {
          noRoom++;
          continue;
        }
        bytes.set(payload, at);
        added++;
      }
      ring.flushAll();
      // A kernel without UDP GSO (or a refused message) loses every datagram: say so, do not just stall.
      if (refused > 0) throw new Error(`sendmmsg refused ${refused} datagrams, errno ${refusedErrno}${args.gso ? ' (UDP GSO unsupported?)' : ''}`);
      await yieldTurn();
    }
    return { sent: added - spilled, stalls: 0, spilled, noRoom };
  } finally {
    ring?.dispose();
    await closeSocket(s);
  }
};

interface PingArgs {
  size: number;
  warmup: number;
  windowMs: number;
  maxSamples: number;
}
export interface PingResult {
  /** Round trips measured (after the warmup). */
  n: number;
  medianUs: number;
  p99Us: number;
  timeouts: number;
}

/** Sends a datagram, waits for its echo, repeats: `warmup` round trips, then round trips for `windowMs`. */
const pingPinger: Workload = async (args: PingArgs, ctx: ChildContext): Promise<PingResult> => {
  const s = udp4();
  try {
    const port = await bindLocal(s);
    const peers = await ctx.ready({ port });
    const rxPort = peerPort(peers, 'rx');
    const buf = Buffer.alloc(args.size, 0x5a);
    const rtts = new Float64Array(args.maxSamples);
    let n = 0;
    let warm = args.warmup;
    let timeouts = 0;
    let tSend = 0;
    let tEnd = Infinity;
    let done: () => void = () => {};
    const finished = new Promise<void>((resolve) => {
      done = resolve;
    });
    const ping = (): void => {
      tSend = performance.now();
      s.send(buf, rxPort, HOST);
    };
    let lastSend = 0;
    s.on('message', () => {
      const now = performance.now();
      if (warm > 0) {
        if (--warm === 0) tEnd = now + args.windowMs;
      } else {
        rtts[n++] = (now - tSend) * 1000;
        if (now >= tEnd || n === args.maxSamples) return done();
      }
      lastSend++;
      ping();
    });
    // A lost datagram would stop the exchange: resend after 200 ms of silence (and drop that sample).
    let seen = -1;
    const watchdog = setInterval(() => {
      if (lastSend === seen) {
        timeouts++;
        ping();
        tSend = Infinity;
      }
      seen = lastSend;
    }, 200);
    ping();
    await finished;
    clearInterval(watchdog);
    const v = Array.from(rtts.subarray(0, n)).filter((x) => x >= 0).sort((a, b) => a - b);
    const q = (p: number): number => v[Math.min(v.length - 1, Math.floor(p * v.length))] ?? NaN;
    return { n: v.length, medianUs: q(0.5), p99Us: q(0.99), timeouts };
  } finally {
    await closeSocket(s);
  }
};

/** Echoes every datagram to where it came from until stopped. */
const pingPonger: Workload = async (_args: unknown, ctx: ChildContext): Promise<{ echoed: number }> => {
  const s = udp4();
  try {
    const port = await bindLocal(s);
    let echoed = 0;
    s.on('message', (msg, rinfo) => {
      echoed++;
      s.send(msg, rinfo.port, rinfo.address);
    });
    await ctx.ready({ port });
    await ctx.stopped;
    return { echoed };
  } finally {
    await closeSocket(s);
  }
};

/** Workloads the children of `procs.ts` run. */
export const workloads: Record<string, Workload> = { blastReceiver, blastSender, batchedReceiver, batchedSender, pingPinger, pingPonger };

// ---------------------------------------------------------------------------------------------------
// Suite

export interface DgramOptions {
  quick: boolean;
  /** Called with the pinning line once the children are up. */
  log?: (line: string) => void;
}

function spawnPair(): Promise<ProcGroup> {
  const module = new URL(import.meta.url);
  return ProcGroup.spawn([
    { name: 'tx', module, cpu: 0 },
    { name: 'rx', module, cpu: 1 },
  ]);
}

/** Entry point for the bench runner. */
export async function run(opts: DgramOptions): Promise<BenchRow[]> {
  const quick = opts.quick;
  const warmupMs = quick ? 100 : 250;
  const windowMs = quick ? 300 : 1000;
  const rounds = quick ? 3 : 5;
  const blastTimeout = 5000 + 3 * (warmupMs + windowMs);
  const cases: ProcCase[] = [];
  // The batched rows need the FFI; without it they are reported failed and not run.
  const batchIo = ffiStatus();
  const batchedError = batchIo.ok ? undefined : `batched I/O unavailable: ${batchIo.message}`;
  for (const size of DGRAM_SIZES) {
    for (const v of VARIANTS) {
      const windowed = v.startsWith('windowed');
      cases.push({
        name: dgramBaselineName(size, v),
        timeoutMs: blastTimeout,
        tasks: {
          rx: { workload: 'blastReceiver', args: { size, warmupMs, windowMs, ackEvery: windowed ? ACK_EVERY : 0 } satisfies ReceiverArgs },
          tx: { workload: 'blastSender', primary: false, args: { size, connected: v === 'connected' || v === 'windowed connected', window: windowed ? WINDOW : 0, burst: 64 } satisfies SenderArgs },
        },
        measure: (r) => {
          const rx = r['rx'] as ReceiverResult;
          const tx = r['tx'] as SenderResult;
          if (rx.wrongSize > 0) throw new Error(`${rx.wrongSize} datagrams of the wrong size`);
          return { pps: rx.datagrams / rx.seconds, gbps: (rx.bytes * 8) / rx.seconds / 1e9, sent: tx.sent, stalls: tx.stalls };
        },
      });
    }
    if (batchedError !== undefined) continue;
    for (const v of BATCHED_VARIANTS) {
      cases.push({
        name: dgramBaselineName(size, v),
        timeoutMs: blastTimeout,
        tasks: {
          rx: { workload: 'batchedReceiver', args: { size, warmupMs, windowMs, ackEvery: 0, gro: v === 'batched GSO GRO' } satisfies ReceiverArgs },
          tx: { workload: 'batchedSender', primary: false, args: { size, gso: v !== 'batched', burst: 64 } satisfies BatchedSenderArgs },
        },
        measure: (r) => {
          const rx = r['rx'] as ReceiverResult & { truncated: number };
          const tx = r['tx'] as BatchedSenderResult;
          if (rx.wrongSize > 0) throw new Error(`${rx.wrongSize} datagrams of the wrong size (${rx.truncated} truncated)`);
          return { pps: rx.datagrams / rx.seconds, gbps: (rx.bytes * 8) / rx.seconds / 1e9, sent: tx.sent, spilled: tx.spilled, noRoom: tx.noRoom };
        },
      });
    }
  }
  for (const size of [64, 1100]) {
    cases.push({
      name: dgramRttName(size),
      timeoutMs: 5000 + 3 * windowMs,
      tasks: {
        tx: { workload: 'pingPinger', args: { size, warmup: quick ? 500 : 2000, windowMs, maxSamples: 200_000 } satisfies PingArgs },
        rx: { workload: 'pingPonger', primary: false },
      },
      measure: (r) => {
        const p = r['tx'] as PingResult;
        return { median: p.medianUs, p99: p.p99Us, n: p.n };
      },
    });
  }
  let pinningNoted = false;
  const outcomes = await runCases(spawnPair, cases, rounds, (g) => {
    if (!pinningNoted) opts.log?.(`${g.pinning}; ${rounds} rounds, window ${windowMs} ms after ${warmupMs} ms warmup; medians`);
    pinningNoted = true;
  });
  const byName = new Map(outcomes.map((o) => [o.name, o]));
  const rows: BenchRow[] = [];
  const failed = (name: string, unit: string, error: string): BenchRow => {
    opts.log?.(`FAILED ${name}: ${error}`);
    return { name, value: NaN, unit };
  };
  for (const size of DGRAM_SIZES) {
    const base = byName.get(dgramBaselineName(size, 'connected'))!;
    for (const v of [...VARIANTS, ...BATCHED_VARIANTS]) {
      const name = dgramBaselineName(size, v);
      const o = byName.get(name) ?? { name, medians: {}, rounds: [], error: batchedError ?? 'not run' };
      if (o.error !== undefined || o.rounds.length === 0) {
        rows.push(failed(name, 'Gbit/s', o.error ?? 'no round'));
        continue;
      }
      const gbps = o.medians['gbps']!;
      const kpps = o.medians['pps']! / 1e3;
      const ok = v !== 'connected' && base.error === undefined && base.rounds.length > 0;
      const withRatio = (row: BenchRow, baseValue: number, baseName: string): BenchRow =>
        ok ? { ...row, baseline: baseName, ratio: row.value / baseValue } : row;
      rows.push(withRatio({ name, value: gbps, unit: 'Gbit/s' }, base.medians['gbps'] ?? NaN, dgramBaselineName(size)));
      rows.push(withRatio({ name: `${name} rate`, value: kpps, unit: 'kdgram/s' }, (base.medians['pps'] ?? NaN) / 1e3, `${dgramBaselineName(size)} rate`));
    }
  }
  for (const size of [64, 1100]) {
    const o = byName.get(dgramRttName(size))!;
    if (o.error !== undefined || o.rounds.length === 0) {
      rows.push(failed(dgramRttName(size), 'µs', o.error ?? 'no round'));
      continue;
    }
    rows.push({ name: dgramRttName(size, 'median'), value: o.medians['median']!, unit: 'µs' });
    rows.push({ name: dgramRttName(size, 'p99'), value: o.medians['p99']!, unit: 'µs' });
  }
  return rows;
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href && process.send === undefined) {
  console.log(machineLine());
  const rows = await run({ quick: process.argv.includes('--quick'), log: (l) => console.log(l) });
  console.log(formatRows(rows));
}

/**
 * `roce perf write|read|send|atomic [HOST] [perftest flags] [--bind ADDR] [--udp-port N]
 *      [--capture FILE] [--loss PCT [--seed N]] [--counters] [--dump FILE] [--trace]`
 *
 * ib_write_bw, ib_read_bw, ib_send_bw and ib_atomic_bw of perftest 6.06 (Debian 4.5+0.17) on
 * our engine, in both roles: with HOST we are the client (the requester), without it the
 * server. The TCP exchange is `oob/perftest.ts`; this file does what the tools do around it
 * and on the data path (perftest_resources.c):
 *
 * - One buffer of 2 × INC(max(size, cycle_buffer), cache_line) bytes (+ a cache line for UD),
 *   registered with local write plus the verb's remote right, filled with `perfPatternByte`
 *   (perftest fills it with rand(); a known pattern lets a peer's reads be checked). The
 *   first half is the send side, the second half the receive side; the key message offers the
 *   buffer's start (vaddr) and, except for send, its R_Key.
 * - Addresses walk the ring as increase_loc_addr/increase_rem_addr do: message k (from 0) is
 *   at k mod (cycle_buffer / INC(size, cache_line)) steps of INC(size, cache_line) from the
 *   start, when size ≤ cycle_buffer / 2; otherwise every message is at the start.
 * - QP attributes as ctx_connect: RC RTR with max_dest_rd_atomic = our outstanding reads and
 *   min_rnr_timer 12, RTS with -u as the ACK timeout, retry_cnt 7 and rnr_retry 7 (rxe: retry
 *   forever), max_rd_atomic = the peer's outstanding reads; UD with Q_Key 0x11111111.
 * - The client keeps at most -t WRs outstanding until -n have completed; atomics are
 *   CMP_AND_SWAP with compare 0 and swap 0, or FETCH_AND_ADD of 1, on 8 bytes. A send server
 *   posts min(-n, 512) receives (UC/UD: min(-n, 16000)) of -s bytes (UD: + 40 for the GRH)
 *   before the last hand shake and reposts until -n messages have arrived.
 * - The report: the client computes print_report_bw's numbers (the peak over every run of
 *   consecutive messages, the average from the first post to the last completion); a
 *   write/read/atomic server prints the client's report it receives; a send server its own
 *   (no peak, from the first receive to the last, as the tool).
 *
 * Our GID is the address we bind (`--bind`; default: the client's route to HOST, the server's
 * address the client connected to), IPv4-mapped or IPv6: `-x` is accepted for the tools'
 * command lines, but there is one GID per address here. The port MTU is `-m`, or what the
 * interface MTU carries (as rxe: 1500 gives 1024, 9000 gives 4096), at most 4096.
 *
 * Exit codes (errors.ts): 0 the test ran; 2 bad usage; 3 the peer could not be reached,
 * refused, went quiet or away, disagreed, or a completion failed; 4 a local resource failed
 * (address not local, port in use, file not writable).
 */

import dgram from 'node:dgram';
import { closeSync, openSync, readFileSync, writeFileSync, writeSync } from 'node:fs';
import net from 'node:net';
import { networkInterfaces } from 'node:os';
import { performance } from 'node:perf_hooks';
import {
  allocPd, closeDevice, createAh, createCq, createQp, modifyQp, openDevice, postRecv, postSend, regMr,
  type Context, type Qp,
} from '../api/verbs.js';
import { normalizeAddress } from '../core/address.js';
import { ACCESS, type AddressHandle, type RecvWr, type SendWr, type WorkCompletion } from '../core/types.js';
import { FaultyLink } from '../link/fault.js';
import { TraceLink } from '../link/trace.js';
import { PcapTap } from '../link/pcap-tap.js';
import type { Link } from '../link/link.js';
import { UdpLink } from '../link/udp.js';
import { acceptOne, gidToString } from '../oob/common.js';
import {
  mtuFromEnum, mtuToEnum, OobError, perftestClientExchange, perftestServerExchange,
  type IbvMtu, type PerftestBwReport, type PerftestKey, type PerftestNegotiated, type PerftestSession,
} from '../oob/perftest.js';
import { PcapWriter } from '../pcap/writer.js';
import { SystemClock } from '../runtime/clock.js';
import { CliError, EXIT } from './errors.js';
import {
  computePerfReport, formatPerfAddress, formatPerfReportHeader, formatPerfReportLine, formatPerfTitle, parsePerfArgs,
  PERF_RESULT_LINE, PERF_USAGE, type PerfOptions,
} from './perf-args.js';
import { parseCNumber } from './pingpong-args.js';

export const PERF_CLI_USAGE = `${PERF_USAGE} [--bind ADDR] [--udp-port N] [--capture FILE] [--loss PCT [--seed N]] [--counters] [--dump FILE] [--trace]`;

/** DEF_QKEY */
export const PERF_QKEY = 0x11111111;
/** UD_ADDITION: the GRH area in front of every UD receive. */
export const PERF_UD_ADDITION = 40;
/** MIN_RNR_TIMER (12: 0.64 ms). */
const MIN_RNR_TIMER = 12;
/** DEF_RX_SEND, UC_MAX_RX. */
const DEF_RX_SEND = 512;
const UC_MAX_RX = 16000;
/** rxe's max_qp_rd_atom, which perftest takes as its outstanding reads without -o. */
const DEVICE_MAX_READS = 128;
/** check_alive: the tools' server gives up after 60 s without progress; so do we, both roles. */
const STALL_MS = 60_000;
/** perftest's client fails at once when nobody listens; ours retries this long (peers started together, a busy peer). */
const CONNECT_RETRY_MS = 30_000;

/** Our buffer's content before the test: position-dependent, so any byte on the wire names its offset. */
export function perfPatternByte(offset: number): number {
  return (offset * 7 + (offset >>> 8) * 13 + (offset >>> 16) * 29 + 0x5a) & 0xff;
}

export function fillPerfPattern(buf: Uint8Array): Uint8Array {
  for (let i = 0; i < buf.length; i++) buf[i] = perfPatternByte(i);
  return buf;
}

/** Where perftest puts things in its buffer (alloc_ctx, ctx_set_send_reg_wqes, ctx_set_recv_wqes). */
export interface PerfLayout {
  /** Bytes of the whole buffer. */
  buffSize: number;
  /** Start of the receive half. */
  recvBase: number;
  /** INC(size, cache_line): the distance between consecutive messages. */
  step: number;
  /** Messages per turn of the ring (cycle_buffer / step); 1 when the messages do not walk. */
  ring: number;
}

const inc = (size: number, align: number): number => Math.ceil(size / align) * align;

export function perfLayout(size: number, cycleBuffer: number, cacheLine: number, ud: boolean): PerfLayout {
  const half = inc(Math.max(size, cycleBuffer), cacheLine);
  const step = inc(size, cacheLine);
  const walks = size <= cycleBuffer / 2;
  return { buffSize: half * 2 + (ud ? cacheLine : 0), recvBase: half, step, ring: walks ? Math.max(1, Math.floor(cycleBuffer / step)) : 1 };
}

/** Offset of message k (from 0) from the start of its half. */
export function perfSlot(layout: PerfLayout, k: number): number {
  return (k % layout.ring) * layout.step;
}

/** Offset in the buffer of the k-th receive's scatter entry (UD: where its GRH goes). */
export function perfRecvOffset(layout: PerfLayout, k: number, cacheLine: number, ud: boolean): number {
  return layout.recvBase + (ud ? cacheLine - PERF_UD_ADDITION : 0) + perfSlot(layout, k);
}

// ---------------------------------------------------------------------------------------------

interface Extras {
  bind?: string;
  udpPort: number;
  capture?: string;
  lossPct?: number;
  seed: number;
  dump?: string;
  /** Print every packet sent and received with the one-line printer (stderr). */
  trace: boolean;
  /** Print the recovery counters after the result (as `--loss` does): what a loss elsewhere cost. */
  counters: boolean;
}

/** Our options that perftest does not have, taken out before the perftest flags are parsed. */
function takeExtras(argv: string[]): { rest: string[]; extras: Extras } {
  const names = ['bind', 'udp-port', 'capture', 'loss', 'seed', 'dump'];
  const raw = new Map<string, string>();
  const rest: string[] = [];
  let trace = false;
  let counters = false;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] as string;
    if (a === '--trace') {
      trace = true;
      continue;
    }
    if (a === '--counters') {
      counters = true;
      continue;
    }
    const m = /^--([a-z-]+)(?:=(.*))?$/.exec(a);
    const name = m?.[1];
    if (!m || name === undefined || !names.includes(name)) {
      rest.push(a);
      continue;
    }
    let v = m[2];
    if (v === undefined) {
      v = argv[++i];
      if (v === undefined) throw new CliError(`--${name} needs a value; usage: ${PERF_CLI_USAGE}`);
    }
    if (raw.has(name)) throw new CliError(`--${name} given twice`);
    raw.set(name, v);
  }
  const extras: Extras = { udpPort: 4791, seed: 1, trace, counters };
  const bind = raw.get('bind');
  if (bind !== undefined) {
    const n = normalizeAddress(bind);
    if (n === undefined) throw new CliError(`--bind needs an IPv4 or IPv6 address, not '${bind}'`);
    extras.bind = n;
  }
  const udp = raw.get('udp-port');
  if (udp !== undefined) extras.udpPort = parseCNumber('--udp-port', udp, 1, 65535);
  const cap = raw.get('capture');
  if (cap !== undefined) extras.capture = cap;
  const dump = raw.get('dump');
  if (dump !== undefined) extras.dump = dump;
  const loss = raw.get('loss');
  if (loss !== undefined) {
    const p = Number(loss);
    if (loss.trim() === '' || !Number.isFinite(p) || p < 0 || p >= 100) throw new CliError(`--loss needs a percentage in [0, 100), not '${loss}'`);
    extras.lossPct = p;
  }
  const seed = raw.get('seed');
  if (seed !== undefined) {
    if (loss === undefined) throw new CliError('--seed goes with --loss');
    extras.seed = parseCNumber('--seed', seed, 0, 0xffffffff);
  }
  return { rest, extras };
}

/** The source address the kernel would use towards `host` (a UDP connect sends nothing). */
async function routeSource(host: string): Promise<string> {
  const family = net.isIP(host) === 6 ? 'udp6' : 'udp4';
  const s = dgram.createSocket(family);
  try {
    await new Promise<void>((resolve, reject) => {
      s.once('error', reject);
      s.connect(9, host, () => resolve());
    });
    return s.address().address;
  } catch (e) {
    throw new CliError(`no route to ${host} (${(e as NodeJS.ErrnoException).code ?? (e as Error).message}); give --bind ADDR`, EXIT.PEER);
  } finally {
    s.close();
  }
}

/** The port MTU rxe would derive from the interface MTU (headers: IP, UDP, BTH, RETH, ICRC and slack). */
function interfaceMtu(address: string): number {
  const v6 = address.includes(':');
  for (const [name, addrs] of Object.entries(networkInterfaces())) {
    if (!addrs?.some((a) => normalizeAddress(a.address) === address)) continue;
    try {
      const netdev = Number(readFileSync(`/sys/class/net/${name}/mtu`, 'utf8').trim());
      const room = netdev - (v6 ? 40 : 20) - 8 - 80;
      return [4096, 2048, 1024, 512, 256].find((m) => m <= room) ?? 256;
    } catch {
      break;
    }
  }
  return 4096;
}

function peerError(e: unknown): never {
  if (e instanceof OobError) throw new CliError(e.message, e.code === 'ERR_OOB_LISTEN' ? EXIT.LOCAL : EXIT.PEER);
  throw e;
}

async function openLink(address: string, ex: Extras, clock: SystemClock): Promise<{ link: Link; close: () => void; faults?: FaultyLink }> {
  let udp: UdpLink;
  try {
    udp = await UdpLink.open({ address, port: ex.udpPort, clock });
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code ?? (e as Error).message;
    throw new CliError(`cannot bind RoCEv2 UDP ${address.includes(':') ? `[${address}]` : address}:${ex.udpPort}: ${code}`, EXIT.LOCAL);
  }
  let link: UdpLink | PcapTap | FaultyLink | TraceLink = udp;
  let fd: number | undefined;
  if (ex.capture !== undefined) {
    try {
      fd = openSync(ex.capture, 'w');
    } catch (e) {
      await udp.close();
      throw new CliError(`cannot write the capture ${ex.capture}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`, EXIT.LOCAL);
    }
    const out = fd;
    // Under the fault layer: the capture shows what went on the wire, not what was dropped.
    link = new PcapTap(udp, new PcapWriter((chunk) => { writeSync(out, chunk); }), 'both', { clock });
  }
  let faults: FaultyLink | undefined;
  if (ex.lossPct !== undefined) {
    faults = new FaultyLink(link, clock, { seed: ex.seed, dropPct: ex.lossPct, direction: 'tx' });
    link = faults;
  }
  // Outermost: the trace shows what the engine sent and what reached it.
  if (ex.trace) link = new TraceLink(link, (line) => process.stderr.write(line + '\n'));
  const close = (): void => {
    if (fd !== undefined) closeSync(fd);
    fd = undefined;
  };
  return faults ? { link, close, faults } : { link, close };
}

interface Resources {
  buf: Uint8Array;
  layout: PerfLayout;
  qp: Qp;
  key: PerftestKey;
  mrLkey: number;
  mrVa: bigint;
}

const randomPsn = (): number => Math.floor(Math.random() * 0x1000000);

/**
 * The pacer's bucket for a rate limit: what the rate sends in 2 ms (timers fire on a ~1 ms grid,
 * and a wake-up can only hand out what the bucket holds), at least 8 KiB, at most 64 KiB: a
 * slow receiver is the reason to limit the rate, so the bucket is not to let big bursts through.
 */
function pacerBucket(bps: number): number {
  return Math.round(Math.min(65536, Math.max(8192, (bps / 8) * 0.002)));
}

/** perftest's ctx_init + set_up_connection, once the buffer geometry is negotiated. */
function makeResources(ctx: Context, o: PerfOptions, n: PerftestNegotiated, outReads: number): Resources {
  const ud = o.connection === 'UD';
  const layout = perfLayout(o.size, n.cycleBuffer, n.cacheLineSize, ud);
  const buf = fillPerfPattern(new Uint8Array(layout.buffSize));
  const remote = o.verb === 'write' ? ACCESS.REMOTE_WRITE : o.verb === 'read' ? ACCESS.REMOTE_READ : o.verb === 'atomic' ? ACCESS.REMOTE_ATOMIC : 0;
  const pd = allocPd(ctx);
  const mr = regMr(pd, buf, ACCESS.LOCAL_WRITE | remote);
  const server = o.host === undefined;
  const rxDepth = o.verb === 'send' && server ? recvDepth(o) : 1;
  const cq = createCq(ctx, { cqe: Math.max(o.txDepth, rxDepth) + 16 });
  const qp = createQp(pd, {
    type: o.connection, sendCq: cq, recvCq: cq, sqSigAll: true,
    cap: { maxSendWr: Math.max(o.txDepth, 1), maxRecvWr: rxDepth, maxSendSge: 1, maxRecvSge: 1, maxInlineData: 0 },
    // --rate_limit: a static rate in the QP's pacer, per packet (a long message is spread out,
    // not just the gaps between messages), as a NIC's QP rate limit.
    ...(o.rateLimitBps !== undefined ? { cc: { kind: 'fixed' as const, rateBps: o.rateLimitBps, pacerBurstBytes: pacerBucket(o.rateLimitBps) } } : {}),
  });
  if (ud) modifyQp(qp, { qpState: 'INIT', pkeyIndex: 0, portNum: 1, qkey: PERF_QKEY });
  else {
    // ctx_modify_qp_to_init: remote write always, plus read / atomic for those tests (RC).
    let access = ACCESS.REMOTE_WRITE | ACCESS.LOCAL_WRITE;
    if (o.connection === 'RC' && o.verb === 'read') access |= ACCESS.REMOTE_READ;
    if (o.connection === 'RC' && o.verb === 'atomic') access |= ACCESS.REMOTE_ATOMIC;
    modifyQp(qp, { qpState: 'INIT', pkeyIndex: 0, portNum: 1, qpAccessFlags: access });
  }
  const key: PerftestKey = {
    lid: 0, outReads, qpn: qp.qpNum, psn: randomPsn(),
    // rxe shows 0 for send: its MR has no remote access; a write/read/atomic peer refuses it.
    rkey: o.verb === 'send' ? 0 : mr.rkey,
    vaddr: mr.va(0), gid: ctx.gid, srqn: 0,
  };
  return { buf, layout, qp, key, mrLkey: mr.lkey, mrVa: mr.va(0) };
}

function recvDepth(o: PerfOptions): number {
  return o.connection === 'RC' ? Math.min(DEF_RX_SEND, o.iters) : Math.min(o.iters, UC_MAX_RX);
}

/** ctx_connect: RTR towards the peer's GID, then RTS. */
function connectQp(r: Resources, o: PerfOptions, mtu: IbvMtu, remote: PerftestKey, udpPort: number): AddressHandle | undefined {
  const gid = remote.gid;
  if (!gid) throw new CliError('the peer sent its keys without a GID (an InfiniBand run without -x); RoCE needs one', EXIT.PEER);
  const ah = { dgid: gid, port: udpPort };
  if (o.connection === 'UD') {
    modifyQp(r.qp, { qpState: 'RTR' });
    modifyQp(r.qp, { qpState: 'RTS', sqPsn: r.key.psn });
    return createAh(r.qp.pd, ah);
  }
  const pathMtu = mtuFromEnum(mtu) as 256 | 512 | 1024 | 2048 | 4096;
  if (o.connection === 'RC') {
    modifyQp(r.qp, {
      qpState: 'RTR', ahAttr: ah, pathMtu, destQpNum: remote.qpn, rqPsn: remote.psn,
      maxDestRdAtomic: Math.max(1, r.key.outReads), minRnrTimer: MIN_RNR_TIMER,
    });
    modifyQp(r.qp, {
      qpState: 'RTS', sqPsn: r.key.psn, timeout: o.qpTimeout, retryCnt: 7, rnrRetry: 7, maxRdAtomic: Math.max(1, remote.outReads),
    });
  } else {
    modifyQp(r.qp, { qpState: 'RTR', ahAttr: ah, pathMtu, destQpNum: remote.qpn, rqPsn: remote.psn });
    modifyQp(r.qp, { qpState: 'RTS', sqPsn: r.key.psn });
  }
  return undefined;
}

function wcError(wc: WorkCompletion, role: string, done: number, of: number): CliError {
  // NOTIFY_COMP_ERROR_SEND/RECV's content, on one line.
  return new CliError(
    `completion with error at ${role}: status ${wc.status}, vendor syndrome 0x${wc.vendorErr.toString(16)}, ` +
    `opcode ${wc.opcode}, after ${done} of ${of} completions`, EXIT.PEER);
}

async function nextWc(qp: Qp, what: string): Promise<WorkCompletion> {
  try {
    return await qp.sendCq.next({ timeoutMs: STALL_MS });
  } catch {
    throw new CliError(`no completion for ${STALL_MS / 1000} s while ${what}: the peer went quiet`, EXIT.PEER);
  }
}

/** run_iter_bw: at most -t outstanding, until -n have completed. Returns the post and completion times (s). */
async function runClient(r: Resources, o: PerfOptions, remote: PerftestKey, ah: AddressHandle | undefined): Promise<{ posted: number[]; completed: number[] }> {
  const posted: number[] = [];
  const completed: number[] = [];
  let scnt = 0;
  let ccnt = 0;
  const len = o.size;
  const post = (): void => {
    const off = perfSlot(r.layout, scnt);
    const sge = { addr: r.mrVa + BigInt(off), length: len, lkey: r.mrLkey };
    const remoteAddr = remote.vaddr + BigInt(off);
    let wr: SendWr;
    if (o.verb === 'write') wr = { wrId: scnt, opcode: 'RDMA_WRITE', sgList: [sge], rdma: { remoteAddr, rkey: remote.rkey } };
    else if (o.verb === 'read') wr = { wrId: scnt, opcode: 'RDMA_READ', sgList: [sge], rdma: { remoteAddr, rkey: remote.rkey } };
    else if (o.verb === 'atomic') {
      wr = o.atomicType === 'CMP_AND_SWAP'
        ? { wrId: scnt, opcode: 'ATOMIC_CMP_AND_SWP', sgList: [sge], atomic: { remoteAddr, compareAdd: 0n, swap: 0n, rkey: remote.rkey } }
        : { wrId: scnt, opcode: 'ATOMIC_FETCH_AND_ADD', sgList: [sge], atomic: { remoteAddr, compareAdd: 1n, rkey: remote.rkey } };
    } else {
      wr = { wrId: scnt, opcode: 'SEND', sgList: [sge] };
      if (ah) wr.ud = { ah, remoteQpn: remote.qpn, remoteQkey: PERF_QKEY };
    }
    posted.push(performance.now() / 1000);
    postSend(r.qp, wr);
    scnt++;
  };
  while (ccnt < o.iters) {
    while (scnt < o.iters && scnt - ccnt < o.txDepth) post();
    const wc = await nextWc(r.qp, `waiting for completion ${ccnt + 1} of ${o.iters}`);
    if (wc.status !== 'SUCCESS') throw wcError(wc, 'client', ccnt, o.iters);
    completed.push(performance.now() / 1000);
    ccnt++;
  }
  return { posted, completed };
}

/** print_report_bw's peak: the best average over every run of consecutive messages (every WR signaled). */
function peakSecPerMsg(posted: number[], completed: number[]): number {
  const n = completed.length;
  let best = Infinity;
  // Quadratic; above a few thousand messages, runs from every 16th start are as good an estimate.
  const stride = n > 4096 ? 16 : 1;
  for (let i = 0; i < n; i += stride) {
    const p = posted[i] as number;
    for (let j = i; j < n; j++) {
      const t = ((completed[j] as number) - p) / (j - i + 1);
      if (t < best) best = t;
    }
  }
  return best;
}

/** run_iter_bw_server: consume -n receives, reposting while more are due. Returns first and last receive times (s). */
async function runSendServer(r: Resources, o: PerfOptions, cacheLine: number, postedSoFar: { n: number }): Promise<[number, number]> {
  const ud = o.connection === 'UD';
  let rcnt = 0;
  let first = 0;
  while (rcnt < o.iters) {
    const wc = await nextWc(r.qp, `waiting for message ${rcnt + 1} of ${o.iters}`);
    if (wc.status !== 'SUCCESS') throw wcError(wc, 'server', rcnt, o.iters);
    if (rcnt === 0) first = performance.now() / 1000;
    rcnt++;
    if (postedSoFar.n < o.iters) postRecvAt(r, o, cacheLine, ud, postedSoFar);
  }
  return [first, performance.now() / 1000];
}

function postRecvAt(r: Resources, o: PerfOptions, cacheLine: number, ud: boolean, posted: { n: number }): void {
  const off = perfRecvOffset(r.layout, posted.n, cacheLine, ud);
  const wr: RecvWr = { wrId: posted.n, sgList: [{ addr: r.mrVa + BigInt(off), length: o.size + (ud ? PERF_UD_ADDITION : 0), lkey: r.mrLkey }] };
  postRecv(r.qp, wr);
  posted.n++;
}

/** ctx_print_test_info, for what applies to us. */
function testInfo(o: PerfOptions, mtu: number, server: boolean, outReads: number): string[] {
  const lines = [PERF_RESULT_LINE, formatPerfTitle(o.verb, o.atomicType)];
  lines.push(` Dual-port       : OFF\t\tDevice         : ${o.ibDev ?? 'roce0'}`);
  lines.push(` Number of qps   : ${o.qps}\t\tTransport type : IB`);
  lines.push(` Connection type : ${o.connection}\t\tUsing SRQ      : OFF`);
  lines.push(' PCIe relax order: Unsupported');
  lines.push(' ibv_wr* API     : OFF');
  if (!server) lines.push(` TX depth        : ${o.txDepth}`);
  if (o.verb === 'send' && server) lines.push(` RX depth        : ${recvDepth(o)}`);
  // cq_mod: 100, off (1) above 8 KiB except UD, at most the TX depth.
  const cqMod = Math.min(o.size > 8192 && o.connection !== 'UD' ? 1 : 100, o.txDepth);
  lines.push(` CQ Moderation   : ${cqMod}`);
  lines.push(` Mtu             : ${mtu}[B]`);
  lines.push(' Link type       : Ethernet');
  if (o.gidIndex >= 0) lines.push(` GID index       : ${o.gidIndex}`);
  if (o.verb === 'read' || o.verb === 'atomic') lines.push(` Outstand reads  : ${outReads}`);
  else lines.push(' Max inline data : 0[B]');
  lines.push(' rdma_cm QPs\t : OFF');
  lines.push(' Data ex. method : Ethernet');
  lines.push(PERF_RESULT_LINE);
  return lines;
}

export async function perfCommand(argv: string[], out: (line: string) => void): Promise<number> {
  const { rest, extras } = takeExtras(argv);
  const o = parsePerfArgs(rest);
  if (o.qps !== 1) throw new CliError(`-q ${o.qps}: this stack runs perftest with one QP`);
  if (o.ibPort !== 1) throw new CliError(`-i ${o.ibPort}: a roce-ts device has one port, 1`);
  const server = o.host === undefined;
  const outReads = o.verb === 'read' || o.verb === 'atomic' ? Math.min(o.outReads || DEVICE_MAX_READS, DEVICE_MAX_READS) : 1;

  const clock = new SystemClock();
  let ctx: Context | undefined;
  let linkClose: (() => void) | undefined;
  let faults: FaultyLink | undefined;
  let session: PerftestSession | undefined;
  let resources: Resources | undefined;
  let portMtu = 4096;
  const open = async (address: string): Promise<Context> => {
    const l = await openLink(address, extras, clock);
    linkClose = l.close;
    faults = l.faults;
    portMtu = o.mtu ?? interfaceMtu(address);
    ctx = await openDevice({ address, link: l.link, clock, mtu: portMtu });
    return ctx;
  };
  const exchangeOpts = (c: () => Context): Parameters<typeof perftestClientExchange>[2] => ({
    verb: o.verb,
    mtu: mtuToEnum(portMtu) ?? 5,
    local: (n: PerftestNegotiated) => {
      if (o.connection === 'UD' && o.size > mtuFromEnum(n.mtu)) {
        throw new CliError(`Max message size in UD cannot be greater than MTU (${mtuFromEnum(n.mtu)}, agreed with the peer)`, EXIT.PEER);
      }
      resources = makeResources(c(), o, n, outReads);
      return resources.key;
    },
  });

  try {
    if (server) {
      out('');
      out('************************************');
      out('* Waiting for client to connect... *');
      out('************************************');
      if (extras.bind !== undefined) await open(extras.bind);
      let sock: net.Socket;
      try {
        sock = await acceptOne(o.port, '0.0.0.0', { what: 'perftest client', acceptTimeoutMs: STALL_MS });
      } catch (e) {
        peerError(e);
      }
      if (!ctx) await open(normalizeAddress(sock.localAddress ?? '') ?? '0.0.0.0');
      try {
        session = await perftestServerExchange(sock, exchangeOpts(() => ctx as Context));
      } catch (e) {
        peerError(e);
      }
    } else {
      const host = o.host as string;
      await open(extras.bind ?? await routeSource(host));
      try {
        session = await perftestClientExchange(host, o.port, { ...exchangeOpts(() => ctx as Context), connectTimeoutMs: CONNECT_RETRY_MS });
      } catch (e) {
        peerError(e);
      }
    }
    const s = session;
    const r = resources as Resources;
    const remote = s.remote[0] as PerftestKey;
    const mtuBytes = mtuFromEnum(s.mtu);
    for (const line of testInfo(o, mtuBytes, server, outReads)) out(line);
    const ah = connectQp(r, o, s.mtu, remote, extras.udpPort);
    const posted = { n: 0 };
    if (o.verb === 'send' && server) {
      const depth = recvDepth(o);
      for (let i = 0; i < depth; i++) postRecvAt(r, o, s.cacheLineSize, o.connection === 'UD', posted);
    }
    for (const line of formatPerfAddress('local', o.verb, r.key)) out(line);
    try {
      await s.ready();
    } catch (e) {
      peerError(e);
    }
    for (const line of formatPerfAddress('remote', o.verb, remote)) out(line);
    const [rule, head] = formatPerfReportHeader(o.reportGbits);
    out(rule);
    out(head);

    let mine: PerftestBwReport | undefined;
    if (!server) {
      const t = await runClient(r, o, remote, ah);
      const start = t.posted[0] as number;
      const end = t.completed[t.completed.length - 1] as number;
      mine = computePerfReport(o.size, o.iters, Math.max(end - start, 1e-9), o.reportGbits, Math.max(peakSecPerMsg(t.posted, t.completed), 1e-12));
      out(formatPerfReportLine(mine, o.reportGbits));
    } else if (o.verb === 'send') {
      const [first, last] = await runSendServer(r, o, s.cacheLineSize, posted);
      const rep = computePerfReport(o.size, o.iters, Math.max(last - first, 1e-9), o.reportGbits);
      mine = { ...rep, bwPeak: 0 };
      out(formatPerfReportLine(mine, o.reportGbits));
    }
    let theirs: PerftestBwReport | undefined;
    try {
      theirs = await s.finish(server ? undefined : mine);
    } catch (e) {
      peerError(e);
    }
    if (server && o.verb !== 'send' && theirs) out(formatPerfReportLine(theirs, o.reportGbits));
    out(PERF_RESULT_LINE);

    const c = (ctx as Context).counters;
    const recovery = `retransmitted ${c.retransPkts}, sequence-error NAKs received ${c.rcvSeqErr}, out-of-sequence requests ${c.outOfSeqReq}, duplicates ${c.dupReq}`;
    if (faults) out(` loss: --loss ${extras.lossPct}% --seed ${extras.seed}: dropped ${faults.injected.dropped} of our datagrams; ${recovery}`);
    else if (extras.counters) out(` counters: ${recovery}`);
    if (extras.dump !== undefined) {
      try {
        writeFileSync(extras.dump, r.buf);
      } catch (e) {
        throw new CliError(`cannot write ${extras.dump}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`, EXIT.LOCAL);
      }
      out(` dump: ${r.buf.length} bytes of the buffer at VAddr 0x${r.mrVa.toString(16)} (GID ${gidToString((ctx as Context).gid)}, ` +
        `cycle buffer ${s.cycleBuffer}, cache line ${s.cacheLineSize}) in ${extras.dump}`);
    }
    return EXIT.OK;
  } finally {
    session?.close();
    if (ctx) await closeDevice(ctx);
    linkClose?.();
  }
}

/**
 * `roce pingpong [HOST] [-p port] [-d dev] [-i ibport] [-g gidx] [-s size] [-n iters] [-m mtu]
 *                [-r rx-depth] [-l sl] [-e] [--transport rc|uc|ud] [--bind ADDR] [--udp-port N]
 *                [--capture FILE.pcap] [--trace]`
 *
 * ibv_rc_pingpong / ibv_uc_pingpong / ibv_ud_pingpong (rdma-core 44) on our engine, wire-compatible
 * with the C tools in both roles: without HOST we are the server, with it the client. What the C
 * tools do, and so what this does:
 *
 * - One buffer of `size` bytes (UD: size + 40 for the GRH) filled with 0x7b ("FIXME memset(ctx->buf,
 *   0, size)" in the C source: the fill is what goes on the wire). rx-depth receives are posted
 *   before the exchange and topped up when at most one is left. The C tools receive into the
 *   buffer they send from; we receive into a second buffer so that what arrives can be checked
 *   against the peer's 0x7b fill (a mismatch ends with exit 1 after the run).
 * - The client posts the first SEND; afterwards each side posts its next SEND once its previous
 *   SEND and the peer's next message have both completed, until it has sent `iters` and received
 *   `iters` messages. The timer runs from the first post to the last completion, and the summary is
 *   the tools' two lines (bytes = size × iters × 2).
 * - RC: RTR with max_dest_rd_atomic 1 and min_rnr_timer 12, RTS with timeout 14, retry 7, RNR retry
 *   7. UC: RTR with the path, RTS with the PSN. UD: Q_Key 0x11111111, an address handle to the
 *   peer's GID, messages at most the port MTU.
 *
 * GIDs. The C tools announce GID `-g` of their port (all zeros without -g). Ours is the IP address we
 * bind for RoCEv2, so the GID table of an interface is modelled as rdma_rxe builds it: index 0 the
 * MAC-derived fe80:: GID (not usable here: a link-local address needs a scope), then the IPv4
 * addresses (as ::ffff:a.b.c.d), then the other IPv6 addresses. The interface is `-d`, else the one
 * the peer is reached through (client: the route to HOST; server: the interface the client's TCP
 * connection came in on). Without -g the client takes its route's source address and the server
 * the address of the family the client announced, so a plain `roce pingpong` answers an rxe client
 * that runs `-g 1` (IPv4) or `-g 2` (IPv6) alike. `--bind ADDR` overrides all of that.
 *
 * The exchange is not tied to the RoCE family: the C servers listen on 0.0.0.0 only, so an IPv6
 * run usually exchanges over IPv4 while its RoCE traffic uses the IPv6 GIDs.
 *
 * Every wait is bounded (rxe with retry count 7 retransmits forever, a C server waits forever):
 * the client tries to connect for 5 s, the server waits 60 s for a client, each exchange step 20 s,
 * and the run fails when no completion arrives for 15 s.
 */

import dgram from 'node:dgram';
import dns from 'node:dns/promises';
import type net from 'node:net';
import os from 'node:os';
import {
  allocPd, closeDevice, createAh, createCq, createQp, modifyQp, openDevice, postRecv, postSend, regMr,
  type Context, type Cq, type Qp,
} from '../api/verbs.js';
import type { MemoryRegion } from '../core/mr.js';
import { ACCESS, type AddressHandle, type WorkCompletion } from '../core/types.js';
import { DEVICE_LIMITS } from '../core/limits.js';
import { PcapTap } from '../link/pcap-tap.js';
import { TraceLink } from '../link/trace.js';
import { UdpLink } from '../link/udp.js';
import type { WireLink } from '../link/fault.js';
import { acceptOne, endpoint, isV4MappedGid, OobError, printable, SocketReader, writeAll } from '../oob/common.js';
import {
  formatPingpongAddress, formatPingpongMessage, parsePingpongMessage, pingpongClientExchange, PINGPONG_DONE,
  PINGPONG_MESSAGE_SIZE, type PingpongDest,
} from '../oob/pingpong.js';
import { openPcapFile, type CaptureFile } from '../pcap/file.js';
import type { PcapWriter } from '../pcap/writer.js';
import { ROCEV2_UDP_PORT } from '../wire/constants.js';
import { formatIpAddress, gidFromIp, parseIpAddress } from '../wire/frame.js';
import { CliError, EXIT } from './errors.js';
import { parseCNumber, parsePingpongArgs, PINGPONG_USAGE, formatPingpongSummary, type PingpongOptions } from './pingpong-args.js';

export const PINGPONG_CLI_USAGE = `${PINGPONG_USAGE} [--bind ADDR] [--udp-port N] [--capture FILE.pcap] [--trace]`;

/** The C tools' work request ids; a completion clears its bit from `pending`. */
const RECV_WRID = 1;
const SEND_WRID = 2;
/** What the C tools memset their buffer to, and so what every message carries. */
export const PINGPONG_FILL = 0x7b;
const UD_QKEY = 0x11111111;
const GRH_LEN = 40;

const CONNECT_TIMEOUT_MS = 5_000;
const ACCEPT_TIMEOUT_MS = 60_000;
const EXCHANGE_TIMEOUT_MS = 20_000;
const IDLE_TIMEOUT_MS = 15_000;
/**
 * After the last completion the device stays up briefly: the ACK of the peer's last message
 * leaves on the next turn of the event loop, and a peer whose ACK got lost retransmits.
 */
const LINGER_MS = 50;

interface Extras {
  bind?: string;
  udpPort: number;
  capture?: string;
  trace: boolean;
}

/** Takes our own options (not the C tools') out of argv. */
function splitExtras(argv: string[]): { rest: string[]; extras: Extras } {
  const extras: Extras = { udpPort: ROCEV2_UDP_PORT, trace: false };
  const rest: string[] = [];
  const valueOf = (i: number, flag: string): string => {
    const v = argv[i + 1];
    if (v === undefined) throw new CliError(`${flag} needs a value; usage: ${PINGPONG_CLI_USAGE}`);
    return v;
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    const eq = a.startsWith('--') ? a.indexOf('=') : -1;
    const name = eq > 0 ? a.slice(0, eq) : a;
    const inline = eq > 0 ? a.slice(eq + 1) : undefined;
    if (a === '--') {
      rest.push(...argv.slice(i));
      break;
    }
    if (name === '--bind' || name === '--capture' || name === '--udp-port') {
      const v = inline ?? valueOf(i++, name);
      if (name === '--bind') extras.bind = v;
      else if (name === '--capture') extras.capture = v;
      else extras.udpPort = parseCNumber('--udp-port', v, 1, 65535);
    } else if (a === '--trace') {
      extras.trace = true;
    } else {
      rest.push(a);
    }
  }
  return { rest, extras };
}

// ---------------------------------------------------------------------------------------------
// GIDs and local addresses

interface GidEntry {
  gid: Uint8Array;
  /** The address to bind for it; undefined for the link-local default GID. */
  address: string | undefined;
}

/** Index 0: fe80::/64 with the EUI-64 of the MAC (rxe's default GID). */
function defaultGid(mac: string): Uint8Array {
  const m = mac.split(':').map((x) => parseInt(x, 16));
  const g = new Uint8Array(16);
  g[0] = 0xfe;
  g[1] = 0x80;
  g.set([(m[0] ?? 0) ^ 2, m[1] ?? 0, m[2] ?? 0, 0xff, 0xfe, m[3] ?? 0, m[4] ?? 0, m[5] ?? 0], 8);
  return g;
}

const isLinkLocal = (b: Uint8Array): boolean => b.length === 16 && b[0] === 0xfe && ((b[1] ?? 0) & 0xc0) === 0x80;
const familyOf = (f: string | number): 4 | 6 => (f === 'IPv4' || f === 4 ? 4 : 6);

function gidTable(ifname: string): GidEntry[] {
  const addrs = os.networkInterfaces()[ifname];
  if (!addrs || addrs.length === 0) throw new CliError(`-d ${ifname}: no such network interface (or it has no addresses)`);
  const table: GidEntry[] = [{ gid: defaultGid(addrs[0]!.mac), address: undefined }];
  for (const want of [4, 6] as const) {
    for (const a of addrs) {
      if (familyOf(a.family) !== want) continue;
      const b = parseIpAddress(a.address);
      if (!b || isLinkLocal(b)) continue;
      table.push({ gid: gidFromIp(b), address: a.address });
    }
  }
  return table;
}

/** The interface that holds `address`, or undefined. */
function interfaceOf(address: string): string | undefined {
  const want = normalize(address);
  for (const [name, addrs] of Object.entries(os.networkInterfaces())) {
    if (addrs?.some((a) => normalize(a.address) === want)) return name;
  }
  return undefined;
}

/** Canonical text of an address; IPv4-mapped IPv6 becomes the dotted quad. */
function normalize(address: string): string {
  const b = parseIpAddress(address.replace(/%.*$/, ''));
  if (!b) return address;
  return formatIpAddress(b.length === 16 && isV4MappedGid(b) ? b.subarray(12) : b);
}

const gidText = (gid: Uint8Array): string => formatIpAddress(isV4MappedGid(gid) ? gid.subarray(12) : gid);
const describeTable = (t: GidEntry[]): string =>
  t.map((e, i) => `${i}=${e.address ?? `${formatIpAddress(e.gid)} (link-local)`}`).join(', ');

/** The local address for `-g index` on `ifname`. */
function addressForIndex(ifname: string, index: number): string {
  const table = gidTable(ifname);
  const e = table[index];
  if (!e) throw new CliError(`-g ${index}: ${ifname} has no GID index ${index} (its GIDs: ${describeTable(table)})`);
  if (e.address === undefined) {
    throw new CliError(`-g ${index}: GID ${index} of ${ifname} is the link-local ${formatIpAddress(e.gid)}, which needs a scope ` +
      `this stack cannot bind; use an IPv4 (-g 1) or a global IPv6 GID, or --bind ADDR`);
  }
  return e.address;
}

/** The source address the kernel picks to reach `host` (a connected UDP socket sends nothing). */
async function routeSource(host: string, family: 4 | 6): Promise<string> {
  const s = dgram.createSocket(family === 4 ? 'udp4' : 'udp6');
  try {
    await new Promise<void>((resolve, reject) => {
      s.once('error', reject);
      s.connect(9, host, () => resolve());
    });
    return s.address().address;
  } catch (e) {
    throw new CliError(`no route to ${host}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`, EXIT.PEER);
  } finally {
    s.close();
  }
}

/** Longest common prefix of two 16-byte GIDs, in bits. */
function commonBits(a: Uint8Array, b: Uint8Array): number {
  let n = 0;
  for (let i = 0; i < 16; i++) {
    const x = (a[i] ?? 0) ^ (b[i] ?? 0);
    if (x === 0) {
      n += 8;
      continue;
    }
    return n + Math.clz32(x) - 24;
  }
  return n;
}

/** The server's address for a client that announced `peerGid` over a connection to `tcpLocal`. */
function serverAddress(opts: PingpongOptions, ex: Extras, tcpLocal: string, peerGid: Uint8Array): string {
  if (ex.bind !== undefined) return ex.bind;
  const ifname = opts.ibDev ?? interfaceOf(tcpLocal);
  if (opts.gidIndex >= 0) {
    if (ifname === undefined) throw new CliError(`-g ${opts.gidIndex}: no interface holds ${tcpLocal}; name one with -d or use --bind`);
    return addressForIndex(ifname, opts.gidIndex);
  }
  const zero = peerGid.every((x) => x === 0);
  if (zero || ifname === undefined) return normalize(tcpLocal);
  const table = gidTable(ifname).filter((e) => e.address !== undefined);
  const want = isV4MappedGid(peerGid) ? 4 : 6;
  const same = table.filter((e) => (isV4MappedGid(e.gid) ? 4 : 6) === want);
  if (same.length === 0) {
    throw new CliError(`the client announced GID ${gidText(peerGid)} (IPv${want}), and ${ifname} has no IPv${want} address; ` +
      'use -g or --bind', EXIT.PEER);
  }
  const tcp = normalize(tcpLocal);
  const pick = same.find((e) => e.address !== undefined && normalize(e.address) === tcp) ??
    same.reduce((best, e) => (commonBits(e.gid, peerGid) > commonBits(best.gid, peerGid) ? e : best));
  return pick.address!;
}

/** The client's address, before it knows the server's GID. */
async function clientAddress(opts: PingpongOptions, ex: Extras, hostAddr: string, hostFamily: 4 | 6): Promise<string> {
  if (ex.bind !== undefined) return ex.bind;
  const src = await routeSource(hostAddr, hostFamily);
  if (opts.gidIndex < 0 && opts.ibDev === undefined) return src;
  const ifname = opts.ibDev ?? interfaceOf(src);
  if (ifname === undefined) throw new CliError(`no interface holds ${src} (the route to ${hostAddr}); name one with -d or use --bind`);
  if (opts.gidIndex < 0) {
    const e = gidTable(ifname).find((x) => x.address !== undefined && (x.address.includes(':') ? 6 : 4) === hostFamily);
    if (!e) throw new CliError(`-d ${ifname}: no IPv${hostFamily} address to reach ${hostAddr}`);
    return e.address!;
  }
  return addressForIndex(ifname, opts.gidIndex);
}

// ---------------------------------------------------------------------------------------------
// The device and the QP

interface Endpoint {
  ctx: Context;
  cq: Cq;
  qp: Qp;
  sendMr: MemoryRegion;
  recvMr: MemoryRegion;
  capture: CaptureFile<PcapWriter> | undefined;
  local: PingpongDest;
}

const errCode = (e: unknown): string => (e as NodeJS.ErrnoException).code ?? (e as Error).message;

async function openEndpoint(opts: PingpongOptions, ex: Extras, address: string, err: (line: string) => void): Promise<Endpoint> {
  if (!parseIpAddress(address)) throw new CliError(`--bind: not an IP address: ${address}`);
  let link: WireLink;
  try {
    link = await UdpLink.open({ address, port: ex.udpPort });
  } catch (e) {
    throw new CliError(`cannot bind ${endpoint(address, ex.udpPort)} for RoCEv2: ${errCode(e)}`, EXIT.LOCAL);
  }
  let capture: CaptureFile<PcapWriter> | undefined;
  if (ex.capture !== undefined) {
    try {
      capture = await openPcapFile(ex.capture);
    } catch (e) {
      await link.close();
      throw new CliError(`cannot write ${ex.capture}: ${errCode(e)}`, EXIT.LOCAL);
    }
    link = new PcapTap(link, capture.writer, 'both');
  }
  if (ex.trace) link = new TraceLink(link, err);
  const ctx = await openDevice({ address, link });
  try {
    const { size, transport } = opts;
    const ud = transport === 'ud';
    const portMtu = ctx.queryPort().activeMtu;
    if (ud && size > portMtu) throw new CliError(`Requested size larger than port MTU (${portMtu})`);
    if (!ud && opts.mtu > portMtu) throw new CliError(`-m ${opts.mtu}: larger than the port MTU (${portMtu})`);
    if (opts.rxDepth > DEVICE_LIMITS.maxQpWr) throw new CliError(`-r ${opts.rxDepth}: at most ${DEVICE_LIMITS.maxQpWr} receives`);
    const bufLen = ud ? size + GRH_LEN : size;
    const pd = allocPd(ctx);
    const sendMr = regMr(pd, new Uint8Array(bufLen).fill(PINGPONG_FILL), ACCESS.LOCAL_WRITE);
    const recvMr = regMr(pd, new Uint8Array(bufLen), ACCESS.LOCAL_WRITE);
    const cq = createCq(ctx, { cqe: opts.rxDepth + 1 });
    const qp = createQp(pd, {
      type: ud ? 'UD' : transport === 'uc' ? 'UC' : 'RC', sendCq: cq, recvCq: cq,
      cap: { maxSendWr: 1, maxRecvWr: opts.rxDepth, maxSendSge: 1, maxRecvSge: 1, maxInlineData: 0 },
    });
    if (ud) modifyQp(qp, { qpState: 'INIT', pkeyIndex: 0, portNum: opts.ibPort, qkey: UD_QKEY });
    else modifyQp(qp, { qpState: 'INIT', pkeyIndex: 0, portNum: opts.ibPort, qpAccessFlags: 0 });
    const wrs = Array.from({ length: opts.rxDepth }, () => ({ wrId: RECV_WRID, sgList: [recvMr.sge()] }));
    postRecv(qp, wrs);
    const local: PingpongDest = { lid: 0, qpn: qp.qpNum, psn: Math.floor(Math.random() * 0x1000000), gid: ctx.gid };
    return { ctx, cq, qp, sendMr, recvMr, capture, local };
  } catch (e) {
    await closeDevice(ctx);
    await capture?.close().catch(() => undefined);
    throw e;
  }
}

/** INIT → RTR → RTS towards `remote`, as pp_connect_ctx; UD returns the address handle. */
function connectQp(ep: Endpoint, opts: PingpongOptions, ex: Extras, remote: PingpongDest): AddressHandle | undefined {
  if (remote.gid.every((x) => x === 0)) {
    throw new CliError('the peer announced no GID (all zeros): RoCEv2 needs one; run it with -g (e.g. -g 1 for IPv4, -g 2 for IPv6 on rxe)', EXIT.PEER);
  }
  const localFamily = isV4MappedGid(ep.local.gid) ? 4 : 6;
  const peerFamily = isV4MappedGid(remote.gid) ? 4 : 6;
  if (localFamily !== peerFamily) {
    throw new CliError(`the peer's GID ${gidText(remote.gid)} is IPv${peerFamily}, ours (${gidText(ep.local.gid)}) is IPv${localFamily}: ` +
      'use the same family on both sides (-g or --bind)', EXIT.PEER);
  }
  const ahAttr = { dgid: remote.gid, port: ex.udpPort, sl: opts.sl, hopLimit: 1 };
  if (opts.transport === 'ud') {
    modifyQp(ep.qp, { qpState: 'RTR' });
    modifyQp(ep.qp, { qpState: 'RTS', sqPsn: ep.local.psn });
    return createAh(ep.qp.pd, ahAttr);
  }
  const rtr = { qpState: 'RTR' as const, ahAttr, pathMtu: opts.mtu, destQpNum: remote.qpn, rqPsn: remote.psn };
  if (opts.transport === 'rc') {
    modifyQp(ep.qp, { ...rtr, maxDestRdAtomic: 1, minRnrTimer: 12 });
    modifyQp(ep.qp, { qpState: 'RTS', timeout: 14, retryCnt: 7, rnrRetry: 7, sqPsn: ep.local.psn, maxRdAtomic: 1 });
  } else {
    modifyQp(ep.qp, rtr);
    modifyQp(ep.qp, { qpState: 'RTS', sqPsn: ep.local.psn });
  }
  return undefined;
}

// ---------------------------------------------------------------------------------------------
// The exchange, server side

/**
 * pp_server_exch_dest, with the device opened between reading the client's address and replying:
 * only then is it known which of our addresses the client's GID calls for.
 */
async function serverExchange(
  opts: PingpongOptions, ex: Extras, open: (address: string, remote: PingpongDest) => Promise<PingpongDest>,
): Promise<PingpongDest> {
  let socket: net.Socket;
  try {
    socket = await acceptOne(opts.port, '0.0.0.0', { what: 'pingpong client', acceptTimeoutMs: ACCEPT_TIMEOUT_MS });
  } catch (e) {
    throw oobToCli(e);
  }
  const peer = `pingpong client ${endpoint(socket.remoteAddress ?? '?', socket.remotePort ?? 0)}`;
  const reader = new SocketReader(socket, peer);
  try {
    const first = await reader.readExact(PINGPONG_MESSAGE_SIZE, EXCHANGE_TIMEOUT_MS, 'address message');
    const remote = parsePingpongMessage(first);
    if (remote instanceof OobError) throw new OobError(remote.code, `${peer}: ${remote.message}`);
    const local = await open(serverAddress(opts, ex, socket.localAddress ?? '0.0.0.0', remote.gid), remote);
    await writeAll(socket, formatPingpongMessage(local), peer, 'our address');
    const done = await reader.readCString(PINGPONG_DONE.length, EXCHANGE_TIMEOUT_MS, '"done"');
    if (!Buffer.from(done).equals(PINGPONG_DONE)) {
      throw new OobError('ERR_OOB_MALFORMED', `${peer}: expected "done\\0" after the addresses, got ${printable(done)}`);
    }
    return remote;
  } finally {
    socket.end();
    socket.destroySoon();
  }
}

function oobToCli(e: unknown): unknown {
  if (!(e instanceof OobError)) return e;
  return new CliError(e.message, e.code === 'ERR_OOB_LISTEN' ? EXIT.LOCAL : EXIT.PEER);
}

// ---------------------------------------------------------------------------------------------
// The run

interface RunResult {
  usec: number;
  /** First receive whose bytes differ from the peer's fill, if any. */
  mismatch: string | undefined;
}

async function pingpongLoop(ep: Endpoint, opts: PingpongOptions, remote: PingpongDest, ah: AddressHandle | undefined, client: boolean): Promise<RunResult> {
  const { qp, cq, sendMr, recvMr } = ep;
  const ud = opts.transport === 'ud';
  const size = opts.size;
  const expectLen = ud ? size + GRH_LEN : size;
  const expected = Buffer.alloc(size, PINGPONG_FILL);
  const received = Buffer.from(recvMr.buffer.buffer, recvMr.buffer.byteOffset, recvMr.buffer.byteLength);
  const payloadAt = ud ? GRH_LEN : 0;
  const sendSge = sendMr.sge(ud ? GRH_LEN : 0, size);
  const post = (): void => {
    postSend(qp, ud
      ? { wrId: SEND_WRID, opcode: 'SEND', sendFlags: 2, sgList: [sendSge], ud: { ah: ah!, remoteQpn: remote.qpn, remoteQkey: UD_QKEY } }
      : { wrId: SEND_WRID, opcode: 'SEND', sendFlags: 2, sgList: [sendSge] });
  };
  let routs = opts.rxDepth;
  let pending = RECV_WRID;
  let scnt = 0;
  let rcnt = 0;
  let mismatch: string | undefined;
  if (client) {
    post();
    pending |= SEND_WRID;
  }
  const start = process.hrtime.bigint();
  while (rcnt < opts.iters || scnt < opts.iters) {
    let wc: WorkCompletion;
    try {
      wc = await cq.next({ timeoutMs: IDLE_TIMEOUT_MS });
    } catch {
      throw new CliError(`no completion for ${IDLE_TIMEOUT_MS / 1000} s: the peer went quiet after ${scnt} of ${opts.iters} sends ` +
        `and ${rcnt} of ${opts.iters} receives (QP ${qp.state})`, EXIT.PEER);
    }
    if (wc.status !== 'SUCCESS') {
      throw new CliError(`Failed status ${wc.status} for wr_id ${String(wc.wrId)} after ${scnt} sends and ${rcnt} receives`, EXIT.PEER);
    }
    if (wc.wrId === SEND_WRID) {
      scnt++;
    } else if (wc.wrId === RECV_WRID) {
      if (mismatch === undefined) {
        if (wc.byteLen !== expectLen) {
          mismatch = `message ${rcnt + 1} has ${wc.byteLen} bytes, not ${expectLen}`;
        } else if (!received.subarray(payloadAt, payloadAt + size).equals(expected)) {
          const got = received.subarray(payloadAt, payloadAt + size);
          let at = 0;
          while (at < size && got[at] === PINGPONG_FILL) at++;
          mismatch = `message ${rcnt + 1} differs from the peer's fill 0x${PINGPONG_FILL.toString(16)} at byte ${at} (0x${(got[at] ?? 0).toString(16)})`;
        }
      }
      // The peer's next message can only follow our next SEND: clearing now cannot race it.
      received.fill(0);
      if (--routs <= 1) {
        postRecv(qp, Array.from({ length: opts.rxDepth - routs }, () => ({ wrId: RECV_WRID, sgList: [recvMr.sge()] })));
        routs = opts.rxDepth;
      }
      rcnt++;
    } else {
      throw new CliError(`Completion for unknown wr_id ${String(wc.wrId)}`, EXIT.INTERNAL);
    }
    pending &= ~Number(wc.wrId);
    if (scnt < opts.iters && pending === 0) {
      post();
      pending = RECV_WRID | SEND_WRID;
    }
  }
  const usec = Number(process.hrtime.bigint() - start) / 1000;
  return { usec, mismatch };
}

async function closeEndpoint(ep: Endpoint | undefined): Promise<void> {
  if (!ep) return;
  await closeDevice(ep.ctx).catch(() => undefined);
  await ep.capture?.close().catch(() => undefined);
}

export async function pingpongCommand(argv: string[], out: (line: string) => void): Promise<number> {
  const { rest, extras } = splitExtras(argv);
  const opts = parsePingpongArgs(rest);
  if (opts.ibPort !== 1) throw new CliError(`-i ${opts.ibPort}: the device has one port, 1`);
  if (extras.bind !== undefined && !parseIpAddress(extras.bind)) throw new CliError(`--bind: not an IP address (without zone): ${extras.bind}`);
  const err = (line: string): void => {
    process.stderr.write(line + '\n');
  };
  let ep: Endpoint | undefined;
  try {
    let remote: PingpongDest;
    let ah: AddressHandle | undefined;
    const client = opts.host !== undefined;
    if (opts.host !== undefined) {
      let host: { address: string; family: number };
      try {
        host = await dns.lookup(opts.host);
      } catch (e) {
        throw new CliError(`cannot resolve ${opts.host}: ${errCode(e)}`, EXIT.PEER);
      }
      const address = await clientAddress(opts, extras, host.address, host.family === 6 ? 6 : 4);
      ep = await openEndpoint(opts, extras, address, err);
      out(formatPingpongAddress('local', ep.local, opts.transport));
      try {
        remote = (await pingpongClientExchange(host.address, opts.port, ep.local, {
          connectTimeoutMs: CONNECT_TIMEOUT_MS, replyTimeoutMs: EXCHANGE_TIMEOUT_MS,
        })).remote;
      } catch (e) {
        throw oobToCli(e);
      }
      out(formatPingpongAddress('remote', remote, opts.transport));
      ah = connectQp(ep, opts, extras, remote);
    } else {
      try {
        remote = await serverExchange(opts, extras, async (address, peer) => {
          ep = await openEndpoint(opts, extras, address, err);
          out(formatPingpongAddress('local', ep.local, opts.transport));
          ah = connectQp(ep, opts, extras, peer);
          return ep.local;
        });
      } catch (e) {
        throw oobToCli(e);
      }
      out(formatPingpongAddress('remote', remote, opts.transport));
    }
    const r = await pingpongLoop(ep!, opts, remote, ah, client);
    await new Promise((resolve) => setTimeout(resolve, LINGER_MS));
    for (const line of formatPingpongSummary({ size: opts.size, iters: opts.iters, usec: r.usec })) out(line);
    if (extras.trace) {
      const c = Object.entries(ep!.ctx.counters).filter(([, v]) => v !== 0).map(([k, v]) => `${k}=${v}`).join(' ');
      err(`counters: ${c}`);
    }
    if (r.mismatch !== undefined) throw new CliError(`received data check failed: ${r.mismatch}`, EXIT.FINDINGS);
    return EXIT.OK;
  } finally {
    await closeEndpoint(ep);
  }
}

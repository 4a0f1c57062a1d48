/**
 * `roce rping -s|-c [-a ADDR] [-I ADDR] [-p PORT] [-C COUNT] [-S SIZE] [-v] [-V] [-d]
 *  [--roce-port N] [--peer-roce-port N]`: librdmacm's rping (librdmacm/examples/rping.c) over
 * our stack, interoperating with it in both roles.
 *
 * rping's loop, one iteration per ping, each message a 16-byte `struct rping_rdma_info`
 * { be64 buf; be32 rkey; be32 size } SENT over the RC QP the RDMA CM connected:
 *
 *   client: SEND (start buffer addr, rkey, size)          server: RDMA READ it into its buffer
 *           ← SEND "go ahead" (16 zero bytes)                     on the READ completion
 *   client: SEND (sink buffer addr, rkey, size)           server: RDMA WRITE strlen + 1 bytes there
 *           ← SEND "go ahead"                                     on the WRITE completion
 *
 * The client fills its start buffer with "rdma-ping-N: " and a rotating run of 'A'..'z', NUL at
 * the end, and with -v prints what the server wrote back ("ping data: …"); the server with -v
 * prints what it read ("server ping data: …"). After COUNT pings (0: forever) the client
 * disconnects; the server runs until the client does. States, their numbering and the
 * messages on stderr are rping's own, so that the two are told apart by nothing but the stack.
 *
 * Exit: 0 after a clean run, 3 when the peer rejected, could not be reached or broke the
 * protocol, 2 on bad usage, 4 when the local address cannot be bound.
 */

import dgram from 'node:dgram';
import { parseArgs } from 'node:util';
import { openDevice, postRecv, postSend, type Context, type Cq, type Qp } from '../api/verbs.js';
import { ACCESS, SEND_FLAGS, type SendWr, type WorkCompletion } from '../core/types.js';
import type { MemoryRegion } from '../core/mr.js';
import { normalizeAddress } from '../core/address.js';
import { createEventChannel, RdmaCmError, type ConnectOptions, type RdmaCmEvent, type RdmaCmId } from '../cm/rdmacm.js';
import { CliError, EXIT } from './errors.js';
import type { Link } from '../link/link.js';
import { TraceLink } from '../link/trace.js';
import { UdpLink } from '../link/udp.js';

export const RPING_USAGE =
  'roce rping -s|-c [-a ADDR] [-I ADDR] [-p PORT] [-C COUNT] [-S SIZE] [-v] [-V] [-d] [--roce-port N] [--peer-roce-port N] [--accept-delay MS] [--trace]';

/** rping's default rdma_cm port. */
export const RPING_PORT = 7174;
/** rping's ping buffer size limits: sizeof(stringify(INT_MAX)) + sizeof(RPING_MSG_FMT) .. RPING_BUFSIZE - 1. */
export const RPING_MIN_SIZE = 26;
export const RPING_MAX_SIZE = 64 * 1024 - 1;
const RPING_SQ_DEPTH = 16;
const INFO_LEN = 16;

/** rping's `enum test_state`, with its numbers (they appear in its error messages). */
const S = {
  IDLE: 1,
  CONNECT_REQUEST: 2,
  ADDR_RESOLVED: 3,
  ROUTE_RESOLVED: 4,
  CONNECTED: 5,
  RDMA_READ_ADV: 6,
  RDMA_READ_COMPLETE: 7,
  RDMA_WRITE_ADV: 8,
  RDMA_WRITE_COMPLETE: 9,
  DISCONNECTED: 10,
  ERROR: 11,
} as const;

export interface RpingOptions {
  server: boolean;
  /** Server: the address to listen on. Client: the server's address. */
  address: string;
  /** Client: our source address; default the one the kernel routes to `address` from. */
  source?: string;
  port?: number;
  /** Pings; 0 = until interrupted. Default 0 (rping's). */
  count?: number;
  size?: number;
  verbose?: boolean;
  validate?: boolean;
  debug?: boolean;
  /** UDP port of our RoCE stack. Default 4791. */
  rocePort?: number;
  /** Print every packet sent and received with the one-line printer (to `err`). */
  trace?: boolean;
  /** UDP port of the peer's RoCE stack. Default: ours. */
  peerRocePort?: number;
  /** An open device to use instead of opening one on `address`/`source` (tests). */
  ctx?: Context;
  /** CM knobs for the client's REQ (tests shorten the timeouts). */
  connect?: Partial<Pick<ConnectOptions, 'cmResponseTimeout' | 'maxCmRetries' | 'pathMtu'>>;
  /** How long to wait for the connection and for each step of a ping, ms. Default 30 s. */
  stepTimeoutMs?: number;
  out?: (line: string) => void;
  err?: (line: string) => void;
  /** Called once the server listens (after rdma_listen). */
  onListening?: () => void;
  /**
   * Server: wait this long before rdma_accept (a slow application). The listener answers the
   * REQ with an MRA after 1 s (IBTA 12.6.6), so the client keeps waiting. Default 0.
   */
  acceptDelayMs?: number;
}

export interface RpingResult {
  code: number;
  /** Pings completed (client) or served (server). */
  pings: number;
}

/** A counting semaphore: rping's `sem_t sem`, between its CQ and CM handlers and the main loop. */
class Sem {
  private count = 0;
  private waiters: (() => void)[] = [];

  post(): void {
    const w = this.waiters.shift();
    if (w) w();
    else this.count++;
  }

  wait(timeoutMs: number): Promise<boolean> {
    if (this.count > 0) {
      this.count--;
      return Promise.resolve(true);
    }
    return new Promise((resolve) => {
      const w = (): void => {
        clearTimeout(timer);
        resolve(true);
      };
      const timer = setTimeout(() => {
        this.waiters = this.waiters.filter((x) => x !== w);
        resolve(false);
      }, timeoutMs);
      this.waiters.push(w);
    });
  }
}

interface Cb {
  server: boolean;
  state: number;
  sem: Sem;
  qp: Qp;
  cq: Cq;
  recvMr: MemoryRegion;
  sendMr: MemoryRegion;
  rdmaMr: MemoryRegion;
  startMr: MemoryRegion | undefined;
  size: number;
  remote: { addr: bigint; rkey: number; len: number };
  debug: (line: string) => void;
  err: (line: string) => void;
}

/** Runs rping, either role, to the end; never throws for protocol or peer failures. */
export async function runRping(o: RpingOptions): Promise<RpingResult> {
  const out = o.out ?? ((l: string) => process.stdout.write(l + '\n'));
  const err = o.err ?? ((l: string) => process.stderr.write(l + '\n'));
  const debug = o.debug ? out : () => undefined;
  const size = o.size ?? 64;
  const port = o.port ?? RPING_PORT;
  const stepMs = o.stepTimeoutMs ?? 30_000;
  let ctx = o.ctx;
  const ownCtx = ctx === undefined;
  if (ctx === undefined) {
    const local = o.server ? o.address : (o.source ?? (await routeSource(o.address)));
    try {
      let link: Link | undefined;
      if (o.trace) {
        const udp = await UdpLink.open({ address: local, port: o.rocePort ?? 4791, sourcePorts: 'per-flow' });
        link = new TraceLink(udp, err);
      }
      ctx = await openDevice(link ? { address: local, link } : { address: local, port: o.rocePort ?? 4791 });
    } catch (e) {
      throw new CliError(`cannot open a device on ${local}: ${(e as Error).message}`, EXIT.LOCAL);
    }
  }
  const ch = createEventChannel(ctx, o.peerRocePort !== undefined ? { peerPort: o.peerRocePort } : {});
  const ac = new AbortController();
  const ids: RdmaCmId[] = [];
  try {
    if (o.server) return await server();
    return await client();
  } finally {
    ac.abort();
    for (const id of ids) id.destroy();
    await ctx.device.gsi.flush();
    if (ownCtx) await ctx.close();
  }

  function setup(id: RdmaCmId, server: boolean): Cb {
    const pd = ctx!.allocPd();
    const cq = ctx!.createCq({ cqe: RPING_SQ_DEPTH * 2 });
    debug(`created pd, cq`);
    const qp = id.createQp(pd, { sendCq: cq, recvCq: cq, cap: { maxSendWr: RPING_SQ_DEPTH, maxRecvWr: 2, maxSendSge: 1, maxRecvSge: 1 } });
    debug(`created qp 0x${qp.qpNum.toString(16)}`);
    const all = ACCESS.LOCAL_WRITE | ACCESS.REMOTE_READ | ACCESS.REMOTE_WRITE;
    const cb: Cb = {
      server,
      state: S.IDLE,
      sem: new Sem(),
      qp,
      cq,
      recvMr: pd.regMr(new Uint8Array(INFO_LEN), ACCESS.LOCAL_WRITE),
      sendMr: pd.regMr(new Uint8Array(INFO_LEN), 0),
      rdmaMr: pd.regMr(new Uint8Array(size), all),
      startMr: server ? undefined : pd.regMr(new Uint8Array(size), all),
      size,
      remote: { addr: 0n, rkey: 0, len: 0 },
      debug,
      err,
    };
    debug('allocated & registered buffers...');
    postRecv(qp, { wrId: 1, sgList: [cb.recvMr.sge()] });
    void cqLoop(cb, ac.signal);
    id.on('disconnected', () => {
      err(`${server ? 'server' : 'client'} DISCONNECT EVENT...`);
      cb.state = S.DISCONNECTED;
      cb.sem.post();
    });
    return cb;
  }

  async function server(): Promise<RpingResult> {
    const listener = ch.createId();
    ids.push(listener);
    listener.listen(port);
    debug('rdma_bind_addr successful');
    debug('rdma_listen');
    o.onListening?.();
    const req = await new Promise<RdmaCmEvent>((resolve) => listener.once('connect_request', resolve));
    const child = req.id;
    ids.push(child);
    debug(`child cma ${child.remoteAddress}:${child.remotePort}`);
    const cb = setup(child, true);
    cb.state = S.CONNECT_REQUEST;
    if ((o.acceptDelayMs ?? 0) > 0) {
      debug(`delaying rdma_accept by ${o.acceptDelayMs} ms`);
      await new Promise((r) => setTimeout(r, o.acceptDelayMs));
    }
    debug('accepting client connection request');
    const established = child.waitFor('established', stepMs + (o.acceptDelayMs ?? 0));
    child.accept();
    debug(`rdma_accept: qpn 0x${cb.qp.qpNum.toString(16)} psn 0x${child.startingPsn.toString(16)}`);
    try {
      await established;
    } catch (e) {
      err(`${cmEventText(e)}`);
      err(`wait for CONNECTED state ${cb.state}`);
      return { code: EXIT.PEER, pings: 0 };
    }
    debug('ESTABLISHED');
    let pings = 0;
    let ret = 0;
    const step = async (want: number, what: string): Promise<boolean> => {
      const ok = await cb.sem.wait(stepMs);
      if (ok && cb.state === want) return true;
      err(`wait for ${what} state ${ok ? cb.state : 'timeout'}`);
      ret = -1;
      return false;
    };
    for (;;) {
      // Wait for the client's start STAG/TO/Len.
      if (!(await step(S.RDMA_READ_ADV, 'RDMA_READ_ADV'))) break;
      debug('server received sink adv');
      // rping reads the length the client advertised into its own buffer, unchecked: a client
      // with a larger -S gets a local protection error here, as with rping.
      if (!post(cb, {
        wrId: 2, opcode: 'RDMA_READ', sendFlags: SEND_FLAGS.SIGNALED,
        sgList: [{ addr: cb.rdmaMr.va(), length: cb.remote.len, lkey: cb.rdmaMr.lkey }], rdma: { remoteAddr: cb.remote.addr, rkey: cb.remote.rkey },
      })) {
        ret = -1;
        break;
      }
      debug('server posted rdma read req ');
      if (!(await step(S.RDMA_READ_COMPLETE, 'RDMA_READ_COMPLETE'))) break;
      debug('server received read complete');
      if (o.verbose) out(`server ping data: ${cString(cb.rdmaMr.buffer)}`);
      // Tell the client to continue.
      if (!post(cb, { wrId: 3, opcode: 'SEND', sendFlags: SEND_FLAGS.SIGNALED, sgList: [cb.sendMr.sge()] })) {
        ret = -1;
        break;
      }
      debug('server posted go ahead');
      if (!(await step(S.RDMA_WRITE_ADV, 'RDMA_WRITE_ADV'))) break;
      debug('server received sink adv');
      const len = Math.min(cb.size, cStringLength(cb.rdmaMr.buffer) + 1);
      if (!post(cb, {
        wrId: 4, opcode: 'RDMA_WRITE', sendFlags: SEND_FLAGS.SIGNALED,
        sgList: [cb.rdmaMr.sge(0, len)], rdma: { remoteAddr: cb.remote.addr, rkey: cb.remote.rkey },
      })) {
        ret = -1;
        break;
      }
      debug(`rdma write from lkey ${cb.rdmaMr.lkey.toString(16)} laddr ${cb.rdmaMr.va().toString(16)} len ${len}`);
      if (!(await step(S.RDMA_WRITE_COMPLETE, 'RDMA_WRITE_COMPLETE'))) break;
      debug('server rdma write complete ');
      pings++;
      if (!post(cb, { wrId: 5, opcode: 'SEND', sendFlags: SEND_FLAGS.SIGNALED, sgList: [cb.sendMr.sge()] })) {
        ret = -1;
        break;
      }
      debug('server posted go ahead');
    }
    const code = cb.state === S.DISCONNECTED ? 0 : ret;
    if (code !== 0) err(`rping server failed: ${code}`);
    child.disconnect();
    return { code: code === 0 ? EXIT.OK : EXIT.PEER, pings };
  }

  async function client(): Promise<RpingResult> {
    const id = ch.createId();
    ids.push(id);
    const cb = setup(id, false);
    const established = id.waitFor('established', stepMs);
    try {
      id.connect({
        address: o.address,
        port,
        responderResources: 1,
        initiatorDepth: 1,
        retryCount: 7,
        rnrRetryCount: 7,
        ...(o.peerRocePort !== undefined ? { rocePort: o.peerRocePort } : {}),
        ...(o.connect ?? {}),
      });
    } catch (e) {
      throw new CliError(`rdma_connect: ${(e as Error).message}`, EXIT.USAGE);
    }
    debug(`rdma_connect: qpn 0x${cb.qp.qpNum.toString(16)} psn 0x${id.startingPsn.toString(16)} src_port ${id.localPort} port ${port}`);
    try {
      await established;
    } catch (e) {
      err(cmEventText(e));
      err(`connect error -1`);
      return { code: EXIT.PEER, pings: 0 };
    }
    cb.state = S.CONNECTED;
    debug('rdma_connect successful');
    let ret = 0;
    let pings = 0;
    const start = cb.startMr!;
    let startChar = 65;
    for (let ping = 0; !o.count || ping < o.count; ping++) {
      cb.state = S.RDMA_READ_ADV;
      fillPing(start.buffer, ping, startChar);
      startChar = startChar + 1 > 122 ? 65 : startChar + 1;
      formatInfo(cb, start);
      if (!post(cb, { wrId: 1, opcode: 'SEND', sendFlags: SEND_FLAGS.SIGNALED, sgList: [cb.sendMr.sge()] })) {
        ret = -1;
        break;
      }
      // Wait for the server to ACK.
      if (!(await cb.sem.wait(stepMs)) || stateOf(cb) !== S.RDMA_WRITE_ADV) {
        err(`wait for RDMA_WRITE_ADV state ${cb.state}`);
        ret = -1;
        break;
      }
      formatInfo(cb, cb.rdmaMr);
      if (!post(cb, { wrId: 2, opcode: 'SEND', sendFlags: SEND_FLAGS.SIGNALED, sgList: [cb.sendMr.sge()] })) {
        ret = -1;
        break;
      }
      // Wait for the server to say the RDMA WRITE is complete.
      if (!(await cb.sem.wait(stepMs)) || stateOf(cb) !== S.RDMA_WRITE_COMPLETE) {
        err(`wait for RDMA_WRITE_COMPLETE state ${cb.state}`);
        ret = -1;
        break;
      }
      if (o.validate && Buffer.compare(start.buffer, cb.rdmaMr.buffer) !== 0) {
        err('data mismatch!');
        ret = -1;
        break;
      }
      if (o.verbose) out(`ping data: ${cString(cb.rdmaMr.buffer)}`);
      pings++;
    }
    const code = stateOf(cb) === S.DISCONNECTED ? 0 : ret;
    if (code !== 0) err(`rping client failed: ${code}`);
    // rdma_disconnect, then give the DREP a moment: the peer's CM tears down sooner with it.
    const gone = stateOf(cb) === S.DISCONNECTED ? Promise.resolve() : id.waitFor('disconnected', 2000).then(() => undefined, () => undefined);
    id.disconnect();
    await gone;
    return { code: code === 0 ? EXIT.OK : EXIT.PEER, pings };
  }
}

/** ibv_post_send, reporting a refused WR as rping does. */
function post(cb: Cb, wr: SendWr): boolean {
  try {
    postSend(cb.qp, wr);
    return true;
  } catch (e) {
    cb.err(`post send error ${(e as Error).message}`);
    cb.state = S.ERROR;
    return false;
  }
}

/** rping_cq_event_handler: completions drive the state and post the semaphore. */
async function cqLoop(cb: Cb, signal: AbortSignal): Promise<void> {
  for (;;) {
    let wc: WorkCompletion;
    try {
      wc = await cb.cq.next({ signal });
    } catch {
      return;
    }
    if (wc.status !== 'SUCCESS') {
      if (wc.status === 'WR_FLUSH_ERR') continue;
      cb.err(`cq completion failed status ${wc.status}`);
      cb.state = S.ERROR;
      cb.sem.post();
      return;
    }
    switch (wc.opcode) {
      case 'SEND':
        cb.debug('send completion');
        break;
      case 'RDMA_WRITE':
        cb.debug('rdma write completion');
        cb.state = S.RDMA_WRITE_COMPLETE;
        cb.sem.post();
        break;
      case 'RDMA_READ':
        cb.debug('rdma read completion');
        cb.state = S.RDMA_READ_COMPLETE;
        cb.sem.post();
        break;
      case 'RECV': {
        cb.debug('recv completion');
        if (wc.byteLen !== INFO_LEN) {
          cb.err(`Received bogus data, size ${wc.byteLen}`);
          cb.err('recv wc error: -1');
          cb.state = S.ERROR;
          cb.sem.post();
          return;
        }
        if (cb.server) {
          const b = Buffer.from(cb.recvMr.buffer.buffer, cb.recvMr.buffer.byteOffset, INFO_LEN);
          cb.remote = { addr: b.readBigUInt64BE(0), rkey: b.readUInt32BE(8), len: b.readUInt32BE(12) };
          cb.debug(`Received rkey ${cb.remote.rkey.toString(16)} addr ${cb.remote.addr.toString(16)} len ${cb.remote.len} from peer`);
          cb.state = cb.state <= S.CONNECTED || cb.state === S.RDMA_WRITE_COMPLETE ? S.RDMA_READ_ADV : S.RDMA_WRITE_ADV;
        } else {
          cb.state = cb.state === S.RDMA_READ_ADV ? S.RDMA_WRITE_ADV : S.RDMA_WRITE_COMPLETE;
        }
        try {
          postRecv(cb.qp, { wrId: 1, sgList: [cb.recvMr.sge()] });
        } catch (e) {
          cb.err(`post recv error: ${(e as Error).message}`);
          cb.state = S.ERROR;
        }
        cb.sem.post();
        break;
      }
      default:
        cb.debug('unknown!!!!! completion');
        cb.state = S.ERROR;
        cb.sem.post();
        return;
    }
  }
}

/** The state as the CQ and CM handlers left it (read after an await, so never narrowed). */
function stateOf(cb: Cb): number {
  return cb.state;
}

/** rping_format_send: our buffer's (addr, rkey, size), big-endian, into the send buffer. */
function formatInfo(cb: Cb, mr: MemoryRegion): void {
  const b = Buffer.from(cb.sendMr.buffer.buffer, cb.sendMr.buffer.byteOffset, INFO_LEN);
  b.writeBigUInt64BE(mr.va(), 0);
  b.writeUInt32BE(mr.rkey >>> 0, 8);
  b.writeUInt32BE(cb.size, 12);
  cb.debug(`RDMA addr ${mr.va().toString(16)} rkey ${mr.rkey.toString(16)} len ${cb.size}`);
}

/** rping_test_client's ping text: "rdma-ping-N: " then 'A'..'z' from `start`, wrapping, NUL last. */
export function fillPing(buf: Uint8Array, ping: number, start: number): void {
  const head = Buffer.from(`rdma-ping-${ping}: `, 'latin1');
  const cc = Math.min(head.length, buf.length - 1);
  buf.set(head.subarray(0, cc));
  let c = start;
  for (let i = cc; i < buf.length; i++) {
    buf[i] = c;
    c = c + 1 > 122 ? 65 : c + 1;
  }
  buf[buf.length - 1] = 0;
}

function cStringLength(b: Uint8Array): number {
  const z = b.indexOf(0);
  return z < 0 ? b.length : z;
}

function cString(b: Uint8Array): string {
  return Buffer.from(b.buffer, b.byteOffset, cStringLength(b)).toString('latin1');
}

function cmEventText(e: unknown): string {
  if (e instanceof RdmaCmError) return `cma event RDMA_CM_EVENT_${e.event.type.toUpperCase()}, error ${e.event.status}`;
  return (e as Error).message;
}

/** The source address the kernel picks towards `dst` (a connected UDP socket sends nothing). */
export function routeSource(dst: string): Promise<string> {
  const v6 = dst.includes(':');
  return new Promise((resolve, reject) => {
    const s = dgram.createSocket(v6 ? 'udp6' : 'udp4');
    s.once('error', (e) => {
      s.close();
      reject(new CliError(`no route to ${dst}: ${e.message}`, EXIT.PEER));
    });
    s.connect(4791, dst, () => {
      const a = s.address().address;
      s.close();
      resolve(normalizeAddress(a) ?? a);
    });
  });
}

export async function rpingCommand(argv: string[]): Promise<number> {
  const { values, positionals } = parseArgs({
    args: argv,
    allowPositionals: false,
    options: {
      s: { type: 'boolean', short: 's' },
      c: { type: 'boolean', short: 'c' },
      a: { type: 'string', short: 'a' },
      I: { type: 'string', short: 'I' },
      p: { type: 'string', short: 'p' },
      C: { type: 'string', short: 'C' },
      S: { type: 'string', short: 'S' },
      v: { type: 'boolean', short: 'v' },
      V: { type: 'boolean', short: 'V' },
      d: { type: 'boolean', short: 'd' },
      'roce-port': { type: 'string' },
      'peer-roce-port': { type: 'string' },
      'accept-delay': { type: 'string' },
      trace: { type: 'boolean' },
    },
  });
  void positionals;
  if (values.s === values.c) throw new CliError(`exactly one of -s and -c\nusage: ${RPING_USAGE}`);
  const server = values.s === true;
  const address = values.a;
  if (address === undefined) {
    throw new CliError(server ? '-a ADDR: our device binds one address (rping -s binds any)' : '-a ADDR: the server address is required');
  }
  if (normalizeAddress(address) === undefined) throw new CliError(`-a ${address}: not an IP address`);
  if (values.I !== undefined && normalizeAddress(values.I) === undefined) throw new CliError(`-I ${values.I}: not an IP address`);
  const int = (flag: string, v: string | undefined, min: number, max: number): number | undefined => {
    if (v === undefined) return undefined;
    const n = Number(v);
    if (!/^\d+$/.test(v) || n < min || n > max) throw new CliError(`${flag} ${v}: must be an integer in ${min}..${max}`);
    return n;
  };
  const size = int('-S', values.S, RPING_MIN_SIZE, RPING_MAX_SIZE);
  const o: RpingOptions = {
    server,
    address: normalizeAddress(address)!,
    port: int('-p', values.p, 0, 65535) ?? RPING_PORT,
    count: int('-C', values.C, 0, 0x7fffffff) ?? 0,
    size: size ?? 64,
    verbose: values.v === true,
    validate: values.V === true,
    debug: values.d === true,
    rocePort: int('--roce-port', values['roce-port'], 1, 65535) ?? 4791,
    trace: values.trace === true,
  };
  if (values.I !== undefined) o.source = normalizeAddress(values.I)!;
  const peer = int('--peer-roce-port', values['peer-roce-port'], 1, 65535);
  if (peer !== undefined) o.peerRocePort = peer;
  const delay = int('--accept-delay', values['accept-delay'], 0, 600_000);
  if (delay !== undefined) {
    if (!server) throw new CliError('--accept-delay MS is for the server (-s)');
    o.acceptDelayMs = delay;
  }
  const r = await runRping(o);
  return r.code;
}

/**
 * File transfer over RDMA: a server that stores and serves files in one directory, and the two
 * client operations, `sendFile` (RDMA WRITE or SEND) and `getFile` (RDMA READ). The out-of-band
 * exchange is `protocol.ts`; the RoCEv2 endpoint is `endpoint.ts`.
 *
 * Memory: a file is never registered whole. Each side registers a window of `slots` chunks
 * (default 4 × 4 MiB) and the file streams through it: chunk i uses slot i % slots, and a slot is
 * reused only when both ends are done with it (the sender's work completion and the receiver's
 * credit), so disk reads, RDMA and disk writes overlap.
 *
 * Integrity: the sender announces the sha256 up front; the receiver hashes what lands, in order.
 * The server writes to DIR/.NAME.partial and renames it to DIR/NAME only after the hash matches
 * (and the data is synced); every failure path, including the client vanishing, removes the
 * partial. A `get` lands in OUT's directory as .OUT.partial the same way.
 *
 * One server device serves every client: one RC QP, one CQ and one window per connection.
 */

import { createHash } from 'node:crypto';
import { once } from 'node:events';
import { open, rename, stat, statfs, unlink, type FileHandle } from 'node:fs/promises';
import net from 'node:net';
import { basename, dirname, join } from 'node:path';
import {
  allocPd, createCq, createQp, deregMr, destroyCq, destroyQp, modifyQp, postRecv, postSend, regMr,
  type Context, type Cq, type Pd, type Qp,
} from '../api/verbs.js';
import type { MemoryRegion } from '../core/mr.js';
import { ACCESS, type MtuValue, type SendWr, type WorkCompletion } from '../core/types.js';
import { gidToString } from '../oob/common.js';
import { CmConnectError, connectCm, listenCm, type CmListener, type MessageChannel } from './cm-channel.js';
import { bindError, hostPort, MTUS } from './endpoint.js';
import { serveProbe } from './probe.js';
import {
  Channel, ChannelError, checkName, fmtSecs, PROTOCOL_VERSION, RefusedError, type Message, type QpInfo, type RefuseCode,
} from './protocol.js';

export const MiB = 1 << 20;
export const DEFAULT_CHUNK_BYTES = 4 * MiB;
export const DEFAULT_SLOTS = 4;
/** Each RDMA READ asks for at most this much, so a lost request costs one retry of 1 MiB, not a chunk. */
const READ_PIECE_BYTES = MiB;
/** QP timeout exponent: 4.096 µs × 2^15 ≈ 134 ms before a retransmission (long enough that a busy event loop on a
 * shared 2-core host does not look like loss), × retryCnt 7 ≈ 1 s to give up. */
const QP_TIMEOUT = 15;
const QP_RETRY = 7;
const MAX_RD_ATOMIC = 16;
const DEFAULT_TIMEOUT_MS = 10_000;

/** What went wrong, in the terms the CLI maps to exit codes. */
export type TransferErrorKind = 'input' | 'peer' | 'local' | 'interrupted' | 'integrity';

export class TransferError extends Error {
  constructor(readonly kind: TransferErrorKind, message: string, readonly refuse?: RefuseCode) {
    super(message);
  }
}

export interface TransferResult {
  name: string;
  bytes: number;
  seconds: number;
  sha256: string;
}

/** Progress: bytes the receiver has confirmed (on disk) so far, out of `total`. */
export type ProgressFn = (done: number, total: number) => void;

// ---------------------------------------------------------------------------------------------
// QPs

interface Rdma {
  ctx: Context;
  pd: Pd;
  cq: Cq;
  qp: Qp;
  psn: number;
}

const ALL_REMOTE = ACCESS.LOCAL_WRITE | ACCESS.REMOTE_WRITE | ACCESS.REMOTE_READ;

function createRdma(ctx: Context, pd: Pd, slots: number): Rdma {
  // Room for every slot's receive and every READ piece in flight, with margin.
  const depth = Math.max(64, slots * 16);
  const cq = createCq(ctx, { cqe: depth * 2 });
  const qp = createQp(pd, {
    type: 'RC', sendCq: cq, recvCq: cq, sqSigAll: true,
    cap: { maxSendWr: depth, maxRecvWr: depth, maxSendSge: 1, maxRecvSge: 1, maxInlineData: 0 },
  });
  return { ctx, pd, cq, qp, psn: randomPsn() };
}

function randomPsn(): number {
  return Math.floor(Math.random() * 0xffffff);
}

function qpInfo(r: Rdma): QpInfo {
  return {
    v: PROTOCOL_VERSION, qpn: r.qp.qpNum, psn: r.psn, gid: gidToString(r.ctx.gid), address: r.ctx.address, port: r.ctx.port,
    mtu: r.ctx.queryPort().activeMtu,
  };
}

/** RESET → INIT → RTR → RTS towards `peer`, at the smaller of the two MTUs. */
function connectRdma(r: Rdma, peer: QpInfo): number {
  const mtu = Math.min(r.ctx.queryPort().activeMtu, peer.mtu);
  if (!(MTUS as readonly number[]).includes(mtu)) throw new TransferError('peer', `the peer's MTU ${peer.mtu} is not 256..4096`);
  modifyQp(r.qp, { qpState: 'INIT', pkeyIndex: 0, portNum: 1, qpAccessFlags: ALL_REMOTE });
  modifyQp(r.qp, {
    qpState: 'RTR', ahAttr: { address: peer.address, port: peer.port }, pathMtu: mtu as MtuValue, destQpNum: peer.qpn,
    rqPsn: peer.psn, maxDestRdAtomic: MAX_RD_ATOMIC, minRnrTimer: 12,
  });
  modifyQp(r.qp, { qpState: 'RTS', sqPsn: r.psn, timeout: QP_TIMEOUT, retryCnt: QP_RETRY, rnrRetry: 7, maxRdAtomic: MAX_RD_ATOMIC });
  return mtu;
}

function releaseRdma(r: Rdma, mrs: Iterable<MemoryRegion | undefined>): void {
  try {
    destroyQp(r.qp);
  } catch {
    // already gone with the device
  }
  destroyCq(r.cq);
  for (const mr of mrs) {
    if (mr === undefined || mr.deregistered) continue;
    try {
      deregMr(mr);
    } catch {
      // already gone with the device
    }
  }
}

function wcError(wc: WorkCompletion, what: string): TransferError {
  const why = wc.status === 'RETRY_EXC_ERR' ? 'the peer stopped acknowledging (retries exhausted)'
    : wc.status === 'REM_ACCESS_ERR' ? 'the peer refused the memory access'
    : wc.status === 'WR_FLUSH_ERR' ? 'the connection was torn down'
    : `completion status ${wc.status}`;
  return new TransferError('peer', `${what} failed: ${why}`, 'TRANSFER_FAILED');
}

function chunkCount(length: number, chunk: number): number {
  return Math.ceil(length / chunk);
}

function chunkLen(i: number, length: number, chunk: number): number {
  return Math.min(chunk, length - i * chunk);
}

/** A slot window sized for the file: small files do not register 16 MiB. */
function windowFor(length: number, chunkSize: number, slots: number): { chunk: number; slots: number; n: number } {
  const chunk = Math.max(1, Math.min(chunkSize, length));
  const n = chunkCount(length, chunk);
  return { chunk, slots: Math.max(1, Math.min(slots, n)), n };
}

function ioMessage(e: unknown): string {
  const err = e as NodeJS.ErrnoException;
  switch (err.code) {
    case 'ENOENT': return 'no such file';
    case 'EACCES': case 'EPERM': return 'permission denied';
    case 'EISDIR': return 'is a directory';
    case 'ENOSPC': return 'no space left on device';
    case 'EDQUOT': return 'disk quota exceeded';
    case 'EROFS': return 'read-only file system';
    default: return err.code ?? err.message;
  }
}

const isDiskFull = (e: unknown): boolean => {
  const c = (e as NodeJS.ErrnoException).code;
  return c === 'ENOSPC' || c === 'EDQUOT';
};

export function fmtBytes(n: number): string {
  if (n >= 1 << 30) return `${(n / (1 << 30)).toFixed(2)} GiB`;
  if (n >= MiB) return `${(n / MiB).toFixed(1)} MiB`;
  if (n >= 1024) return `${(n / 1024).toFixed(1)} KiB`;
  return `${Math.round(n)} B`;
}

async function sha256OfFile(fh: FileHandle, length: number, signal?: AbortSignal): Promise<string> {
  const h = createHash('sha256');
  const buf = Buffer.allocUnsafe(Math.min(Math.max(length, 1), 4 * MiB));
  for (let pos = 0; pos < length;) {
    // Hashing a multi-GiB file takes seconds: Ctrl-C must not wait for it.
    if (signal?.aborted) throw new TransferError('interrupted', 'interrupted');
    const { bytesRead } = await fh.read(buf, 0, Math.min(buf.length, length - pos), pos);
    if (bytesRead === 0) throw Object.assign(new Error('the file shrank while being read'), { code: 'ESHRANK' });
    h.update(buf.subarray(0, bytesRead));
    pos += bytesRead;
  }
  return h.digest('hex');
}

async function readFully(fh: FileHandle, into: Uint8Array, pos: number): Promise<void> {
  for (let off = 0; off < into.length;) {
    const { bytesRead } = await fh.read(into, off, into.length - off, pos + off);
    if (bytesRead === 0) throw Object.assign(new Error('the file shrank while being read'), { code: 'ESHRANK' });
    off += bytesRead;
  }
}

async function writeFully(fh: FileHandle, data: Uint8Array, pos: number): Promise<void> {
  for (let off = 0; off < data.length;) {
    const { bytesWritten } = await fh.write(data, off, data.length - off, pos + off);
    off += bytesWritten;
  }
}

/**
 * State shared by a pipeline's pumps: waiters re-check their condition whenever anything moves,
 * the first failure wins and wakes everyone, and a watchdog fails the pipeline when nothing has
 * moved for `idleMs` (so a silent peer can never hang us).
 */
class Pipeline {
  failure: Error | undefined;
  /** Rejects with the failure: race it against a wait that knows nothing of the pipeline. */
  readonly failed: Promise<never>;
  private rejectFailed: (e: Error) => void = () => {};
  private waiters: Array<() => void> = [];
  private lastMove = Date.now();
  private readonly dog: ReturnType<typeof setInterval>;

  constructor(idleMs: number, what: string, signal?: AbortSignal) {
    this.failed = new Promise<never>((_, reject) => (this.rejectFailed = reject));
    this.failed.catch(() => undefined);
    this.dog = setInterval(() => {
      if (Date.now() - this.lastMove > idleMs) this.fail(new TransferError('peer', `${what}: no progress for ${fmtSecs(idleMs)}`));
    }, Math.min(1000, idleMs));
    this.dog.unref();
    if (signal !== undefined) {
      const onAbort = (): void => this.fail(new TransferError('interrupted', 'interrupted'));
      if (signal.aborted) onAbort();
      else signal.addEventListener('abort', onAbort, { once: true });
    }
  }

  moved(): void {
    this.lastMove = Date.now();
    this.wake();
  }

  fail(e: Error): void {
    if (this.failure !== undefined) return;
    this.failure = e;
    this.rejectFailed(e);
    this.wake();
  }

  async until(cond: () => boolean): Promise<void> {
    for (;;) {
      if (this.failure !== undefined) throw this.failure;
      if (cond()) return;
      await new Promise<void>((r) => this.waiters.push(r));
    }
  }

  stop(): void {
    clearInterval(this.dog);
  }

  private wake(): void {
    const w = this.waiters;
    this.waiters = [];
    for (const r of w) r();
  }
}

// ---------------------------------------------------------------------------------------------
// Server

export interface ServerOptions {
  ctx: Context;
  dir: string;
  /** TCP address and port of the out-of-band listener (port 0: any). */
  oobAddress: string;
  oobPort: number;
  chunkSize?: number;
  slots?: number;
  /** Refuse uploads that would leave less than this many bytes free on the server's disk. */
  reserveBytes?: number;
  /** How long a client may stay silent mid-exchange, ms. */
  timeoutMs?: number;
  log: (line: string) => void;
  /**
   * Rendezvous over RDMA CM instead of TCP (cm-channel.ts): `oobPort` is then the rdma_cm port
   * (0: 18515 is not chosen for you; pass one). `peerPort`: peers' RoCE UDP port, default ours.
   */
  cm?: { peerPort?: number };
}

export interface ServerStats {
  clients: number;
  stored: number;
  served: number;
  failed: number;
  bytesIn: number;
  bytesOut: number;
}

export class TransferServer {
  readonly stats: ServerStats = { clients: 0, stored: 0, served: 0, failed: 0, bytesIn: 0, bytesOut: 0 };
  private readonly sessions = new Set<ServerSession>();
  /** Names being received now: a second upload of the same name would share its partial file. */
  readonly busy = new Set<string>();
  readonly pd: Pd;
  private closing = false;

  private constructor(readonly opts: Required<Omit<ServerOptions, 'cm'>>, private readonly server: net.Server | CmListener) {
    this.pd = allocPd(opts.ctx);
    if (server instanceof net.Server) server.on('connection', (s) => this.accept(s));
  }

  static async start(o: ServerOptions): Promise<TransferServer> {
    const dirStat = await stat(o.dir).catch((e: unknown) => {
      throw new TransferError('input', `cannot use directory ${o.dir}: ${ioMessage(e)}`);
    });
    if (!dirStat.isDirectory()) throw new TransferError('input', `${o.dir} is not a directory`);
    const opts = { chunkSize: DEFAULT_CHUNK_BYTES, slots: DEFAULT_SLOTS, reserveBytes: 0, timeoutMs: 30_000, ...o };
    if (o.cm !== undefined) {
      let srv: TransferServer | undefined;
      let listener: CmListener;
      try {
        listener = listenCm(o.ctx, o.oobPort, (ch, peer) => srv?.acceptChannel(ch, peer), o.cm.peerPort);
      } catch (e) {
        throw new TransferError('input', `cannot listen on rdma_cm port ${o.oobPort}: ${(e as Error).message}`);
      }
      srv = new TransferServer(opts, listener);
      return srv;
    }
    const server = net.createServer();
    server.listen({ host: o.oobAddress, port: o.oobPort, exclusive: true });
    try {
      await once(server, 'listening');
    } catch (e) {
      throw bindError(e, o.oobAddress, o.oobPort, 'TCP');
    }
    return new TransferServer(opts, server);
  }

  /** The out-of-band TCP port, or the rdma_cm port with `cm`. */
  get oobPort(): number {
    return this.server instanceof net.Server ? (this.server.address() as net.AddressInfo).port : this.server.port;
  }

  get activeSessions(): number {
    return this.sessions.size;
  }

  private accept(socket: net.Socket): void {
    if (this.closing) {
      socket.destroy();
      return;
    }
    const peer = hostPort(socket.remoteAddress ?? '?', socket.remotePort ?? 0);
    this.acceptChannel(new Channel(socket, `client ${peer}`), peer);
  }

  /** A client whose control channel is up (TCP, or an RDMA CM connection). */
  acceptChannel(ch: MessageChannel, peer: string): void {
    if (this.closing) {
      ch.close();
      return;
    }
    const s = new ServerSession(this, ch, peer);
    this.sessions.add(s);
    this.stats.clients++;
    s.run().finally(() => this.sessions.delete(s));
  }

  /** Stops listening, aborts every session (their partial files are removed) and waits for them. */
  async close(): Promise<void> {
    this.closing = true;
    const server = this.server;
    const closed = server instanceof net.Server ? new Promise<void>((r) => server.close(() => r())) : server.close();
    await Promise.all([...this.sessions].map((s) => s.abort('the server is shutting down')));
    await closed;
  }
}

/** Ends a session whose failure has already been reported. */
class EndSession extends Error {}

class ServerSession {
  private rdma: Rdma | undefined;
  private mr: MemoryRegion | undefined;
  private partial: string | undefined;
  private pipe: Pipeline | undefined;
  /** A read of the channel started mid-transfer (to notice an abort) that the session loop takes over. */
  private pendingMsg: Promise<Message> | undefined;
  private finished: Promise<void> | undefined;

  constructor(private readonly srv: TransferServer, private readonly ch: MessageChannel, private readonly peer: string) {}

  private log(line: string): void {
    this.srv.opts.log(`${this.peer}: ${line}`);
  }

  run(): Promise<void> {
    this.finished = this.serve();
    return this.finished;
  }

  async abort(why: string): Promise<void> {
    this.ch.send({ type: 'refuse', code: 'SHUTTING_DOWN', message: why });
    this.pipe?.fail(new TransferError('interrupted', why));
    this.ch.close();
    await this.finished?.catch(() => undefined);
  }

  private refuse(code: RefuseCode, message: string): void {
    this.ch.send({ type: 'refuse', code, message });
    this.log(`refused: ${message}`);
  }

  private async serve(): Promise<void> {
    const o = this.srv.opts;
    try {
      const hello = await this.ch.expect('hello', o.timeoutMs);
      if (hello.v !== PROTOCOL_VERSION) {
        this.refuse('VERSION', `the server speaks protocol version ${PROTOCOL_VERSION}, not ${hello.v}`);
        return;
      }
      const r = createRdma(o.ctx, this.srv.pd, o.slots);
      this.rdma = r;
      const mtu = connectRdma(r, hello);
      this.ch.send({ type: 'hello', ...qpInfo(r) });
      this.log(`connected: QP 0x${r.qp.qpNum.toString(16)} ↔ ${hostPort(hello.address, hello.port)} QP 0x${hello.qpn.toString(16)}, MTU ${mtu}`);
      for (;;) {
        let m: Message;
        try {
          const pending = this.pendingMsg;
          this.pendingMsg = undefined;
          m = await (pending ?? this.ch.next());
        } catch (e) {
          if (e instanceof ChannelError && e.kind === 'closed') return;
          throw e;
        }
        if (m.type === 'put') await this.receive(m);
        else if (m.type === 'get') await this.serveGet(m);
        else if (m.type === 'abort') continue;
        else if (m.type === 'probe') await serveProbe(this.srv.pd, this.ch, m, (l) => this.log(l));
        else {
          this.refuse('BAD_REQUEST', `unexpected '${m.type}'`);
          return;
        }
      }
    } catch (e) {
      if (e instanceof EndSession) return;
      if (e instanceof RefusedError) this.log(`the client refused: ${e.message}`);
      else if (e instanceof ChannelError) this.log(e.message);
      else if (e instanceof TransferError) this.log(e.message);
      else this.log(`error: ${(e as Error).message}`);
    } finally {
      await this.discardPartial();
      if (this.rdma) releaseRdma(this.rdma, [this.mr]);
      this.ch.close();
    }
  }

  private async discardPartial(): Promise<void> {
    const p = this.partial;
    this.partial = undefined;
    if (p !== undefined) await unlink(p).catch(() => undefined);
  }

  /** put: the client moves the file into our window; we stream it to .NAME.partial. */
  private async receive(m: Extract<Message, { type: 'put' }>): Promise<void> {
    const o = this.srv.opts;
    const r = this.rdma!;
    const bad = checkName(m.name);
    if (bad !== undefined) return this.refuse('BAD_NAME', `bad file name: ${bad}`);
    if (this.srv.busy.has(m.name)) return this.refuse('BUSY', `another client is uploading '${m.name}' right now`);
    try {
      const fs = await statfs(o.dir);
      const free = Number(fs.bavail) * Number(fs.bsize);
      if (free - m.length < o.reserveBytes) {
        return this.refuse('DISK_FULL', `no space on the server for '${m.name}': it needs ${fmtBytes(m.length)}, ${fmtBytes(Math.max(0, free - o.reserveBytes))} is available`);
      }
    } catch {
      // No statfs here: the writes themselves will tell.
    }
    this.srv.busy.add(m.name);
    const started = Date.now();
    const { chunk, slots, n } = windowFor(m.length, o.chunkSize, o.slots);
    const partial = join(o.dir, `.${m.name}.partial`);
    let fh: FileHandle | undefined;
    let failed = true;
    const pipe = new Pipeline(o.timeoutMs, `receiving '${m.name}'`);
    this.pipe = pipe;
    try {
      try {
        fh = await open(partial, 'w');
      } catch (e) {
        return this.refuse(isDiskFull(e) ? 'DISK_FULL' : 'IO_ERROR', `the server cannot create '${m.name}': ${ioMessage(e)}`);
      }
      this.partial = partial;
      const mr = regMr(r.pd, new Uint8Array(slots * chunk), ALL_REMOTE);
      this.mr = mr;
      const sge = (slot: number): Array<ReturnType<MemoryRegion['sge']>> => (m.op === 'send' ? [mr.sge(slot * chunk, chunk)] : []);
      for (let s = 0; s < slots && s < n; s++) postRecv(r.qp, { wrId: s, sgList: sge(s) });
      this.ch.send({ type: 'ready', rkey: mr.rkey, va: mr.va(0).toString(16), chunkSize: chunk, slots });
      this.log(`receiving '${m.name}' (${fmtBytes(m.length)}, RDMA ${m.op.toUpperCase()}, ${n} chunks of ${fmtBytes(chunk)})`);

      // The client may give up or vanish at any point: watch the channel alongside the CQ.
      const watch = this.ch.next();
      this.pendingMsg = watch;
      watch.then(
        (c) => pipe.fail(new TransferError('interrupted', c.type === 'abort' ? `the client aborted: ${c.reason}` : `unexpected '${c.type}'`)),
        (e: Error) => pipe.fail(e instanceof RefusedError ? new TransferError('interrupted', e.message) : new TransferError('interrupted', `the client went away (${e.message})`)),
      );
      const hash = createHash('sha256');
      for (let i = 0; i < n; i++) {
        const wc = await Promise.race([r.cq.next(), pipe.failed]);
        pipe.moved();
        const len = chunkLen(i, m.length, chunk);
        if (wc.status !== 'SUCCESS') throw wcError(wc, `chunk ${i}`);
        const wantOp = m.op === 'write' ? 'RECV_RDMA_WITH_IMM' : 'RECV';
        if (wc.opcode !== wantOp || wc.immData !== i || wc.byteLen !== len) {
          throw new TransferError('peer', `chunk ${i}: expected ${wantOp} imm=${i} len=${len}, got ${wc.opcode} imm=${String(wc.immData)} len=${wc.byteLen}`);
        }
        const slot = i % slots;
        const data = mr.buffer.subarray(slot * chunk, slot * chunk + len);
        try {
          await writeFully(fh, data, i * chunk);
        } catch (e) {
          throw new TransferError('local', `writing '${m.name}': ${ioMessage(e)}`, isDiskFull(e) ? 'DISK_FULL' : 'IO_ERROR');
        }
        hash.update(data);
        if (i + slots < n) postRecv(r.qp, { wrId: slot, sgList: sge(slot) });
        this.ch.send({ type: 'credit', chunk: i });
      }
      try {
        await fh.datasync();
        await fh.close();
        fh = undefined;
      } catch (e) {
        throw new TransferError('local', `writing '${m.name}': ${ioMessage(e)}`, isDiskFull(e) ? 'DISK_FULL' : 'IO_ERROR');
      }
      const digest = hash.digest('hex');
      if (digest !== m.sha256) {
        throw new TransferError('integrity', `sha256 of '${m.name}' does not match: received ${digest}, announced ${m.sha256}`, 'HASH_MISMATCH');
      }
      await rename(partial, join(o.dir, m.name));
      this.partial = undefined;
      failed = false;
      const secs = (Date.now() - started) / 1000;
      this.srv.stats.stored++;
      this.srv.stats.bytesIn += m.length;
      this.ch.send({ type: 'stored', name: m.name, length: m.length, sha256: digest });
      this.log(`stored '${m.name}' (${fmtBytes(m.length)} in ${secs.toFixed(2)} s, sha256 ok)`);
    } catch (e) {
      if (e instanceof TransferError && e.refuse !== undefined) {
        const msg = e.refuse === 'DISK_FULL' ? `the server ran out of space for '${m.name}' (${e.message})` : e.message;
        this.refuse(e.refuse, msg);
      } else if (e instanceof TransferError && e.kind === 'interrupted') {
        this.log(`'${m.name}' abandoned: ${e.message}; partial file removed`);
      } else {
        this.refuse('IO_ERROR', (e as Error).message);
      }
      // The QP may hold data in flight for a slot we no longer watch: the connection ends here.
      throw new EndSession();
    } finally {
      pipe.stop();
      this.pipe = undefined;
      this.srv.busy.delete(m.name);
      if (failed) this.srv.stats.failed++;
      await fh?.close().catch(() => undefined);
      await this.discardPartial();
      if (this.mr) {
        deregMr(this.mr);
        this.mr = undefined;
      }
    }
  }

  /** get: we fill our window from the file; the client RDMA READs each chunk when told. */
  private async serveGet(m: Extract<Message, { type: 'get' }>): Promise<void> {
    const o = this.srv.opts;
    const r = this.rdma!;
    const bad = checkName(m.name);
    if (bad !== undefined) return this.refuse('BAD_NAME', `bad file name: ${bad}`);
    const path = join(o.dir, m.name);
    let fh: FileHandle;
    let length: number;
    try {
      const st = await stat(path);
      if (!st.isFile()) return this.refuse('NOT_FOUND', `the server has no file '${m.name}'`);
      fh = await open(path, 'r');
      length = st.size;
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      return this.refuse(code === 'ENOENT' ? 'NOT_FOUND' : 'IO_ERROR',
        code === 'ENOENT' ? `the server has no file '${m.name}'` : `the server cannot read '${m.name}': ${ioMessage(e)}`);
    }
    const started = Date.now();
    let ok = false;
    try {
      const sha256 = await sha256OfFile(fh, length);
      const { chunk, slots, n } = windowFor(length, o.chunkSize, o.slots);
      const mr = regMr(r.pd, new Uint8Array(slots * chunk), ACCESS.LOCAL_WRITE | ACCESS.REMOTE_READ);
      this.mr = mr;
      const load = async (i: number): Promise<void> => {
        const slot = i % slots;
        await readFully(fh, mr.buffer.subarray(slot * chunk, slot * chunk + chunkLen(i, length, chunk)), i * chunk);
      };
      for (let i = 0; i < slots && i < n; i++) await load(i);
      this.ch.send({ type: 'source', name: m.name, length, sha256, rkey: mr.rkey, va: mr.va(0).toString(16), chunkSize: chunk, slots });
      for (let i = 0; i < slots && i < n; i++) this.ch.send({ type: 'avail', chunk: i });
      this.log(`serving '${m.name}' (${fmtBytes(length)}, RDMA READ, ${n} chunks of ${fmtBytes(chunk)})`);
      for (;;) {
        const c = await this.ch.next(o.timeoutMs);
        if (c.type === 'credit') {
          const next = c.chunk + slots;
          if (next < n) {
            await load(next);
            this.ch.send({ type: 'avail', chunk: next });
          }
        } else if (c.type === 'done') {
          break;
        } else if (c.type === 'abort') {
          this.log(`'${m.name}' abandoned by the client: ${c.reason}`);
          return;
        } else {
          throw new ChannelError('malformed', `unexpected '${c.type}' during get`);
        }
      }
      ok = true;
      this.srv.stats.served++;
      this.srv.stats.bytesOut += length;
      this.log(`served '${m.name}' (${fmtBytes(length)} in ${((Date.now() - started) / 1000).toFixed(2)} s, the client verified sha256)`);
    } catch (e) {
      if (e instanceof ChannelError && e.kind === 'closed') this.log(`'${m.name}' abandoned: the client went away`);
      else throw e;
    } finally {
      if (!ok) this.srv.stats.failed++;
      await fh.close().catch(() => undefined);
      if (this.mr) {
        deregMr(this.mr);
        this.mr = undefined;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Client

export interface ClientOptions {
  ctx: Context;
  /** Server host (address) and out-of-band TCP port. */
  host: string;
  oobPort: number;
  /** Bound on connecting and on every silent wait, ms. Default 10 s. */
  timeoutMs?: number;
  slots?: number;
  chunkSize?: number;
  onProgress?: ProgressFn;
  /** Called once the QPs are connected, with the path MTU. */
  onConnected?: (info: { mtu: number; local: QpInfo; remote: QpInfo }) => void;
  signal?: AbortSignal;
  /**
   * Rendezvous over RDMA CM instead of TCP (cm-channel.ts): `oobPort` is the server's rdma_cm
   * port. `peerRocePort`: the server's RoCE UDP port, default ours (4791 on a network).
   */
  cm?: { peerRocePort?: number };
}

export interface SendOptions extends ClientOptions {
  file: string;
  /** Name on the server. Default the file's base name. */
  name?: string;
  op: 'write' | 'send';
}

export interface GetOptions extends ClientOptions {
  name: string;
  out: string;
}

async function connectTcp(host: string, port: number, timeoutMs: number, signal?: AbortSignal): Promise<net.Socket> {
  const where = hostPort(host, port);
  return new Promise<net.Socket>((resolve, reject) => {
    const s = net.connect({ host, port });
    const timer = setTimeout(() => {
      s.destroy();
      reject(new TransferError('peer', `cannot reach ${where}: no answer within ${fmtSecs(timeoutMs)}`));
    }, timeoutMs);
    const onAbort = (): void => {
      s.destroy();
      clearTimeout(timer);
      reject(new TransferError('interrupted', 'interrupted'));
    };
    signal?.addEventListener('abort', onAbort, { once: true });
    s.once('connect', () => {
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
      resolve(s);
    });
    s.once('error', (e: NodeJS.ErrnoException) => {
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
      const why = e.code === 'ECONNREFUSED' ? 'connection refused (is `roce serve` running there?)'
        : e.code === 'EHOSTUNREACH' || e.code === 'ENETUNREACH' ? 'no route to host'
        : e.code ?? e.message;
      reject(new TransferError('peer', `cannot reach ${where}: ${why}`));
    });
  });
}

/** Maps whatever a client step threw to a TransferError. */
function clientError(e: unknown, signal?: AbortSignal): TransferError {
  if (signal?.aborted) return new TransferError('interrupted', 'interrupted');
  if (e instanceof TransferError) return e;
  if (e instanceof RefusedError) {
    const kind: TransferErrorKind = e.code === 'HASH_MISMATCH' ? 'integrity' : 'peer';
    return new TransferError(kind, `the server refused: ${e.message}`, e.code);
  }
  if (e instanceof ChannelError) return new TransferError('peer', e.message);
  return new TransferError('local', (e as Error).message);
}

interface Session {
  ch: MessageChannel;
  rdma: Rdma;
  mtu: number;
}

async function openSession(o: ClientOptions, pd: Pd, slots: number): Promise<Session> {
  const timeout = o.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  const ch = o.cm !== undefined ? await openCmChannel(o, timeout) : new Channel(await connectTcp(o.host, o.oobPort, timeout, o.signal), `the server at ${hostPort(o.host, o.oobPort)}`);
  const rdma = createRdma(o.ctx, pd, slots);
  try {
    const local = qpInfo(rdma);
    ch.send({ type: 'hello', ...local });
    const remote = await ch.expect('hello', timeout);
    if (remote.v !== PROTOCOL_VERSION) throw new TransferError('peer', `the server speaks protocol version ${remote.v}, not ${PROTOCOL_VERSION}`);
    const mtu = connectRdma(rdma, remote);
    o.onConnected?.({ mtu, local, remote });
    return { ch, rdma, mtu };
  } catch (e) {
    ch.close();
    releaseRdma(rdma, []);
    throw e;
  }
}

async function openCmChannel(o: ClientOptions, timeoutMs: number): Promise<MessageChannel> {
  try {
    return await connectCm({
      ctx: o.ctx, host: o.host, port: o.oobPort, timeoutMs,
      ...(o.cm?.peerRocePort !== undefined ? { peerRocePort: o.cm.peerRocePort } : {}),
      ...(o.signal !== undefined ? { signal: o.signal } : {}),
    });
  } catch (e) {
    if (e instanceof CmConnectError) throw new TransferError(e.kind === 'interrupted' ? 'interrupted' : 'peer', e.message);
    throw e;
  }
}

/** Uploads `file` to the server by RDMA WRITE_WITH_IMM or SEND_WITH_IMM, chunk by chunk. */
export async function sendFile(o: SendOptions): Promise<TransferResult> {
  const timeout = o.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  let fh: FileHandle;
  let length: number;
  try {
    fh = await open(o.file, 'r');
    const st = await fh.stat();
    if (!st.isFile()) {
      await fh.close();
      throw Object.assign(new Error(), { code: st.isDirectory() ? 'EISDIR' : 'ENOTREG' });
    }
    length = st.size;
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    throw new TransferError('input', `cannot read ${o.file}: ${code === 'ENOTREG' ? 'not a regular file' : ioMessage(e)}`);
  }
  const name = o.name ?? basename(o.file);
  const bad = checkName(name);
  if (bad !== undefined) {
    await fh.close();
    throw new TransferError('input', `cannot send as '${name}': ${bad}`);
  }
  const pd = allocPd(o.ctx);
  let session: Session | undefined;
  let mr: MemoryRegion | undefined;
  let pipe: Pipeline | undefined;
  try {
    const sha256 = await sha256OfFile(fh, length, o.signal).catch((e: unknown) => {
      if (e instanceof TransferError) throw e;
      throw new TransferError('input', `cannot read ${o.file}: ${ioMessage(e)}`);
    });
    if (o.signal?.aborted) throw new TransferError('interrupted', 'interrupted');
    session = await openSession(o, pd, o.slots ?? DEFAULT_SLOTS);
    const { ch, rdma } = session;
    ch.send({ type: 'put', op: o.op, name, length, sha256 });
    const ready = await ch.expect('ready', timeout);
    const started = Date.now();
    const chunk = ready.chunkSize;
    const slots = ready.slots;
    const n = chunkCount(length, chunk);
    const va = BigInt('0x' + ready.va);
    const localMr = regMr(pd, new Uint8Array(slots * chunk), ACCESS.LOCAL_WRITE);
    mr = localMr;
    const p = new Pipeline(timeout, `sending '${name}'`, o.signal);
    pipe = p;
    let credited = 0;
    let completed = 0;
    let stored: Extract<Message, { type: 'stored' }> | undefined;

    const messages = (async () => {
      while (stored === undefined && p.failure === undefined) {
        const m = await ch.next();
        if (m.type === 'credit') {
          credited = Math.max(credited, m.chunk + 1);
          o.onProgress?.(Math.min(length, credited * chunk), length);
        } else if (m.type === 'stored') {
          stored = m;
        } else {
          throw new ChannelError('malformed', `the server sent '${m.type}' during the transfer`);
        }
        p.moved();
      }
    })().catch((e: unknown) => p.fail(clientError(e)));
    const wcs = (async () => {
      while (completed < n && p.failure === undefined) {
        const wc = await rdma.cq.next();
        if (wc.status !== 'SUCCESS') throw wcError(wc, `RDMA ${o.op.toUpperCase()} of chunk ${completed}`);
        completed++;
        p.moved();
      }
    })().catch((e: unknown) => p.fail(clientError(e)));

    for (let i = 0; i < n; i++) {
      const reuse = i - slots + 1;
      await p.until(() => credited >= reuse && completed >= reuse);
      const slot = i % slots;
      const len = chunkLen(i, length, chunk);
      try {
        await readFully(fh, localMr.buffer.subarray(slot * chunk, slot * chunk + len), i * chunk);
      } catch (e) {
        throw new TransferError('input', `cannot read ${o.file}: ${ioMessage(e)}`);
      }
      const wr: SendWr = o.op === 'write'
        ? { wrId: i, opcode: 'RDMA_WRITE_WITH_IMM', immData: i, sgList: [localMr.sge(slot * chunk, len)], rdma: { remoteAddr: va + BigInt(slot * chunk), rkey: ready.rkey } }
        : { wrId: i, opcode: 'SEND_WITH_IMM', immData: i, sgList: [localMr.sge(slot * chunk, len)] };
      postSend(rdma.qp, wr);
    }
    await p.until(() => stored !== undefined);
    const seconds = (Date.now() - started) / 1000;
    if (stored!.sha256 !== sha256) throw new TransferError('integrity', `the server stored sha256 ${stored!.sha256}, expected ${sha256}`);
    void messages;
    void wcs;
    return { name, bytes: length, seconds, sha256 };
  } catch (e) {
    const err = clientError(e, o.signal);
    if (err.kind === 'interrupted') session?.ch.send({ type: 'abort', reason: 'interrupted by the user' });
    throw err;
  } finally {
    pipe?.stop();
    await fh.close().catch(() => undefined);
    if (session) {
      await session.ch.close();
      releaseRdma(session.rdma, [mr]);
    } else if (mr) deregMr(mr);
  }
}

/** Downloads the server's file `name` to `out` by RDMA READ, through .OUT.partial. */
export async function getFile(o: GetOptions): Promise<TransferResult> {
  const timeout = o.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  const bad = checkName(o.name);
  if (bad !== undefined) throw new TransferError('input', `bad remote name: ${bad}`);
  const partial = join(dirname(o.out), `.${basename(o.out)}.partial`);
  let fh: FileHandle | undefined;
  try {
    const st = await stat(o.out).catch(() => undefined);
    if (st?.isDirectory()) throw Object.assign(new Error(), { code: 'EISDIR' });
    fh = await open(partial, 'w');
  } catch (e) {
    throw new TransferError('local', `cannot write ${o.out}: ${ioMessage(e)}`);
  }
  const pd = allocPd(o.ctx);
  let session: Session | undefined;
  let mr: MemoryRegion | undefined;
  let pipe: Pipeline | undefined;
  let kept = false;
  try {
    session = await openSession(o, pd, o.slots ?? DEFAULT_SLOTS);
    const { ch, rdma } = session;
    ch.send({ type: 'get', name: o.name });
    const src = await ch.expect('source', timeout);
    const started = Date.now();
    const { length, chunkSize: chunk, slots } = src;
    const n = chunkCount(length, chunk);
    const va = BigInt('0x' + src.va);
    const localMr = regMr(pd, new Uint8Array(Math.max(1, slots * chunk)), ACCESS.LOCAL_WRITE);
    mr = localMr;
    const p = new Pipeline(timeout, `getting '${o.name}'`, o.signal);
    pipe = p;
    let avail = 0;
    let written = 0;
    const hash = createHash('sha256');
    const pieces = (i: number): number => Math.ceil(chunkLen(i, length, chunk) / READ_PIECE_BYTES);

    const messages = (async () => {
      while (written < n && p.failure === undefined) {
        const m = await ch.next();
        if (m.type !== 'avail') throw new ChannelError('malformed', `the server sent '${m.type}' during the transfer`);
        avail = Math.max(avail, m.chunk + 1);
        p.moved();
      }
    })().catch((e: unknown) => p.fail(clientError(e)));

    // READ completions arrive in order; a chunk is whole when its last piece completes, and is
    // written and hashed in order, one at a time.
    const wcs = (async () => {
      let disk: Promise<void> = Promise.resolve();
      for (let i = 0; i < n && p.failure === undefined; i++) {
        for (let k = pieces(i); k > 0; k--) {
          const wc = await rdma.cq.next();
          if (wc.status !== 'SUCCESS') throw wcError(wc, `RDMA READ of chunk ${i}`);
          p.moved();
        }
        const slot = i % slots;
        const data = localMr.buffer.subarray(slot * chunk, slot * chunk + chunkLen(i, length, chunk));
        const idx = i;
        disk = disk.then(async () => {
          try {
            await writeFully(fh!, data, idx * chunk);
          } catch (e) {
            throw new TransferError('local', `writing ${o.out}: ${ioMessage(e)}`);
          }
          hash.update(data);
          written = idx + 1;
          ch.send({ type: 'credit', chunk: idx });
          o.onProgress?.(Math.min(length, written * chunk), length);
          p.moved();
        });
        disk.catch((e: unknown) => p.fail(clientError(e)));
      }
      await disk;
    })().catch((e: unknown) => p.fail(clientError(e)));

    for (let i = 0; i < n; i++) {
      const reuse = i - slots + 1;
      await p.until(() => avail > i && written >= reuse);
      const slot = i % slots;
      const len = chunkLen(i, length, chunk);
      const wrs: SendWr[] = [];
      for (let off = 0; off < len; off += READ_PIECE_BYTES) {
        const l = Math.min(READ_PIECE_BYTES, len - off);
        const at = slot * chunk + off;
        wrs.push({ wrId: i, opcode: 'RDMA_READ', sgList: [localMr.sge(at, l)], rdma: { remoteAddr: va + BigInt(at), rkey: src.rkey } });
      }
      postSend(rdma.qp, wrs);
    }
    await p.until(() => written >= n);
    void messages;
    void wcs;
    await fh.datasync();
    await fh.close();
    fh = undefined;
    const digest = hash.digest('hex');
    if (digest !== src.sha256) {
      throw new TransferError('integrity', `sha256 of '${o.name}' does not match: received ${digest}, the server announced ${src.sha256}`);
    }
    await rename(partial, o.out);
    kept = true;
    ch.send({ type: 'done' });
    return { name: o.name, bytes: length, seconds: (Date.now() - started) / 1000, sha256: digest };
  } catch (e) {
    const err = clientError(e, o.signal);
    if (err.kind === 'interrupted') session?.ch.send({ type: 'abort', reason: 'interrupted by the user' });
    throw err;
  } finally {
    pipe?.stop();
    await fh?.close().catch(() => undefined);
    if (!kept) await unlink(partial).catch(() => undefined);
    if (session) {
      await session.ch.close();
      releaseRdma(session.rdma, [mr]);
    } else if (mr) deregMr(mr);
  }
}

/**
 * The file-transfer out-of-band protocol: JSON lines over one TCP connection per client.
 *
 * RDMA moves the bytes; TCP carries what RDMA cannot know by itself: who the peer QP is, where
 * the target memory is (R_Key, VA), what the file is called, how long it is and what its sha256
 * must be, and flow control between the fixed registered windows and the disk. Version 1:
 *
 *   C→S hello   { v, qpn, psn, gid, address, port, mtu }
 *   S→C hello   { v, qpn, psn, gid, address, port, mtu }            (or refuse)
 *   C→S put     { op: write|send, name, length, sha256 }
 *   S→C ready   { rkey, va, chunkSize, slots }                       (or refuse)
 *       the client moves chunk i into slot i % slots with RDMA WRITE_WITH_IMM (imm = i) or
 *       SEND_WITH_IMM; the immediate both marks the chunk complete and names it
 *   S→C credit  { chunk }      chunk i is on disk; its slot may be reused
 *   S→C stored  { name, length, sha256 }   hash verified, file renamed into place (or refuse)
 *   C→S get     { name }
 *   S→C source  { name, length, sha256, rkey, va, chunkSize, slots }  (or refuse)
 *   S→C avail   { chunk }      chunk i sits in slot i % slots; the client RDMA READs it
 *   C→S credit  { chunk }      the client has chunk i; the server may refill the slot
 *   C→S done    {}             the client verified the hash
 *   C→S abort   { reason }     the client gives up (Ctrl-C); the server discards the transfer
 *   either      refuse { code, message }
 *
 * Conformance probing (`roce conform --exchange roce`, src/app/probe.ts), after the hello:
 *   C→S probe        { qpn, psn, address, port, mtu, recvs, access, retryCnt, timeout }
 *   S→C probed       { qpn, psn, address, port, mtu, retryCnt, timeout, access, recvs, mem, ro }
 *       a second RC QP towards the prober's QP with the access rights asked for, `recvs`
 *       receives posted (each received SEND answered by a SEND, as ibv_rc_pingpong does), a
 *       scratch region with every remote right (`mem`) and a read-only one (`ro`), both kept
 *       for the server's lifetime so that a later session can check what an earlier one left
 *   C→S probe-read   { rkey, va, length }   the probe QP RDMA READs that range, then SENDs
 *   S→C probe-posted {}
 *   the probe session lasts until the client closes the connection
 *
 * Lines are bounded (MAX_LINE) so a confused peer cannot make us buffer without end; VAs travel
 * as hex strings because JSON numbers lose bits above 2^53.
 */

import type net from 'node:net';

export const PROTOCOL_VERSION = 1;
/** perftest's and ibv_*_pingpong's default out-of-band port: familiar to RDMA users. */
export const DEFAULT_OOB_PORT = 18515;
const MAX_LINE = 64 * 1024;

export type TransferOp = 'write' | 'send' | 'read';

/** Why the server refused; the client maps these to exit codes. */
export type RefuseCode =
  | 'VERSION'
  | 'BAD_REQUEST'
  | 'BAD_NAME'
  | 'NOT_FOUND'
  | 'BUSY'
  | 'DISK_FULL'
  | 'IO_ERROR'
  | 'HASH_MISMATCH'
  | 'TRANSFER_FAILED'
  | 'SHUTTING_DOWN';

/** Remote rights a probe QP may be given. */
export type ProbeAccess = 'read' | 'write' | 'atomic';

/** A region of the probe's scratch memory. */
export interface ProbeRegion {
  rkey: number;
  va: string;
  length: number;
}

export interface QpInfo {
  v: number;
  qpn: number;
  psn: number;
  gid: string;
  address: string;
  port: number;
  mtu: number;
}

export type Message =
  | ({ type: 'hello' } & QpInfo)
  | { type: 'put'; op: 'write' | 'send'; name: string; length: number; sha256: string }
  | { type: 'ready'; rkey: number; va: string; chunkSize: number; slots: number }
  | { type: 'credit'; chunk: number }
  | { type: 'stored'; name: string; length: number; sha256: string }
  | { type: 'get'; name: string }
  | { type: 'source'; name: string; length: number; sha256: string; rkey: number; va: string; chunkSize: number; slots: number }
  | { type: 'avail'; chunk: number }
  | { type: 'done' }
  | { type: 'abort'; reason: string }
  | { type: 'refuse'; code: RefuseCode; message: string }
  | { type: 'probe'; qpn: number; psn: number; address: string; port: number; mtu: number; recvs: number; access: ProbeAccess[]; retryCnt: number; timeout: number }
  | {
    type: 'probed'; qpn: number; psn: number; address: string; port: number; mtu: number; retryCnt: number; timeout: number;
    access: ProbeAccess[]; recvs: number; mem: ProbeRegion; ro: ProbeRegion;
  }
  | { type: 'probe-read'; rkey: number; va: string; length: number }
  | { type: 'probe-posted' };

export type MessageType = Message['type'];
export type MessageOf<T extends MessageType> = Extract<Message, { type: T }>;

/** The connection failed: closed, timed out, or the peer spoke nonsense. */
export class ChannelError extends Error {
  constructor(readonly kind: 'closed' | 'timeout' | 'malformed', message: string) {
    super(message);
  }
}

/** The peer said no. */
export class RefusedError extends Error {
  constructor(readonly code: RefuseCode, message: string) {
    super(message);
  }
}

const isU32 = (x: unknown): x is number => Number.isInteger(x) && (x as number) >= 0 && (x as number) <= 0xffffffff;
const isLen = (x: unknown): x is number => Number.isSafeInteger(x) && (x as number) >= 0;
const isStr = (x: unknown, max = 4096): x is string => typeof x === 'string' && x.length <= max;
const isHex = (x: unknown, n?: number): x is string => isStr(x, 64) && /^[0-9a-f]+$/.test(x) && (n === undefined || x.length === n);
const isAccess = (x: unknown): x is ProbeAccess[] =>
  Array.isArray(x) && x.length <= 3 && x.every((a) => a === 'read' || a === 'write' || a === 'atomic');
const isRegion = (x: unknown): x is ProbeRegion => {
  if (typeof x !== 'object' || x === null) return false;
  const r = x as Record<string, unknown>;
  return isU32(r['rkey']) && isHex(r['va']) && isLen(r['length']);
};
/** The QP half shared by probe and probed. */
const isProbeQp = (o: Record<string, unknown>): boolean =>
  isU32(o['qpn']) && o['qpn'] <= 0xffffff && isU32(o['psn']) && o['psn'] <= 0xffffff && isStr(o['address'], 64) &&
  isU32(o['port']) && o['port'] <= 0xffff && isU32(o['mtu']) && isU32(o['recvs']) && isAccess(o['access']) &&
  isU32(o['retryCnt']) && o['retryCnt'] <= 7 && isU32(o['timeout']) && o['timeout'] <= 31;

/** Checks the shape of a decoded line; undefined when it is not a message of this protocol. */
export function validate(m: unknown): Message | undefined {
  if (typeof m !== 'object' || m === null) return undefined;
  const o = m as Record<string, unknown>;
  switch (o['type']) {
    case 'hello':
      return isU32(o['v']) && isU32(o['qpn']) && o['qpn'] <= 0xffffff && isU32(o['psn']) && o['psn'] <= 0xffffff &&
        isStr(o['gid'], 64) && isStr(o['address'], 64) && isU32(o['port']) && o['port'] <= 0xffff && isU32(o['mtu'])
        ? (o as Message) : undefined;
    case 'put':
      return (o['op'] === 'write' || o['op'] === 'send') && isStr(o['name'], 255) && isLen(o['length']) && isHex(o['sha256'], 64)
        ? (o as Message) : undefined;
    case 'ready':
      return isU32(o['rkey']) && isHex(o['va']) && isU32(o['chunkSize']) && isU32(o['slots']) ? (o as Message) : undefined;
    case 'credit':
    case 'avail':
      return isLen(o['chunk']) ? (o as Message) : undefined;
    case 'stored':
      return isStr(o['name'], 255) && isLen(o['length']) && isHex(o['sha256'], 64) ? (o as Message) : undefined;
    case 'get':
      return isStr(o['name'], 255) ? (o as Message) : undefined;
    case 'source':
      return isStr(o['name'], 255) && isLen(o['length']) && isHex(o['sha256'], 64) && isU32(o['rkey']) && isHex(o['va']) &&
        isU32(o['chunkSize']) && isU32(o['slots']) ? (o as Message) : undefined;
    case 'done':
      return o as Message;
    case 'abort':
      return isStr(o['reason']) ? (o as Message) : undefined;
    case 'refuse':
      return isStr(o['code'], 32) && isStr(o['message']) ? (o as Message) : undefined;
    case 'probe':
      return isProbeQp(o) ? (o as Message) : undefined;
    case 'probed':
      return isProbeQp(o) && isRegion(o['mem']) && isRegion(o['ro']) ? (o as Message) : undefined;
    case 'probe-read':
      return isU32(o['rkey']) && isHex(o['va']) && isU32(o['length']) ? (o as Message) : undefined;
    case 'probe-posted':
      return o as Message;
    default:
      return undefined;
  }
}

/**
 * The receiving half every message channel shares, whatever carries the bytes (a TCP stream, or
 * SENDs on a control QP): `next` awaits the next message (with a bound), a `refuse` from the peer
 * rejects the wait with a RefusedError, and messages that arrive while nobody waits are queued,
 * so the peer may pipeline. The first failure ends the channel; later messages are dropped.
 */
export abstract class MessageInbox {
  private readonly queue: Message[] = [];
  private failure: Error | undefined;
  private waiter: { resolve: (m: Message) => void; reject: (e: Error) => void } | undefined;

  /** Who is at the other end, for messages. */
  abstract readonly peer: string;

  get closed(): boolean {
    return this.failure !== undefined;
  }

  /** The next message; rejects on close, on a refuse, or after `timeoutMs`. */
  next(timeoutMs?: number): Promise<Message> {
    const m = this.queue.shift();
    if (m !== undefined) return m.type === 'refuse' ? Promise.reject(new RefusedError(m.code, m.message)) : Promise.resolve(m);
    if (this.failure !== undefined) return Promise.reject(this.failure);
    if (this.waiter !== undefined) return Promise.reject(new Error(`${this.constructor.name}.next: already waiting`));
    return new Promise<Message>((resolve, reject) => {
      let timer: ReturnType<typeof setTimeout> | undefined;
      const done = (): void => {
        this.waiter = undefined;
        if (timer !== undefined) clearTimeout(timer);
      };
      this.waiter = {
        resolve: (msg) => {
          done();
          resolve(msg);
        },
        reject: (e) => {
          done();
          reject(e);
        },
      };
      if (timeoutMs !== undefined) {
        timer = setTimeout(() => this.waiter?.reject(new ChannelError('timeout', `${this.peer} did not answer within ${fmtSecs(timeoutMs)}`)), timeoutMs);
      }
    });
  }

  /** The next message, which must be of `type`. */
  async expect<T extends MessageType>(type: T, timeoutMs?: number): Promise<MessageOf<T>> {
    const m = await this.next(timeoutMs);
    if (m.type !== type) throw new ChannelError('malformed', `${this.peer} sent '${m.type}' where '${type}' was expected`);
    return m as MessageOf<T>;
  }

  protected deliver(m: Message): void {
    if (this.failure !== undefined) return;
    const w = this.waiter;
    if (w === undefined) {
      this.queue.push(m);
      return;
    }
    if (m.type === 'refuse') w.reject(new RefusedError(m.code, m.message));
    else w.resolve(m);
  }

  protected fail(e: Error): void {
    if (this.failure !== undefined) return;
    this.failure = e;
    this.waiter?.reject(e);
  }
}

/** One peer's JSON-lines stream over TCP: `send` writes a message, one per line. */
export class Channel extends MessageInbox {
  private buf = '';

  constructor(readonly socket: net.Socket, readonly peer: string) {
    super();
    socket.setEncoding('utf8');
    socket.setNoDelay(true);
    socket.on('data', (d: string) => this.onData(d));
    socket.on('end', () => this.fail(new ChannelError('closed', `${peer} closed the connection`)));
    socket.on('close', () => this.fail(new ChannelError('closed', `${peer} closed the connection`)));
    socket.on('error', (e: NodeJS.ErrnoException) =>
      this.fail(new ChannelError('closed', `connection to ${peer} failed: ${e.code ?? e.message}`)));
  }

  send(m: Message): void {
    if (!this.closed && !this.socket.destroyed) this.socket.write(JSON.stringify(m) + '\n');
  }

  /** Sends what is queued, then closes (half-close first, so the last line is delivered). */
  close(): void {
    this.fail(new ChannelError('closed', 'connection closed'));
    if (!this.socket.destroyed) this.socket.end();
    // A peer that never reads must not keep us open.
    setTimeout(() => this.socket.destroy(), 2000).unref();
  }

  private onData(d: string): void {
    this.buf += d;
    let nl: number;
    while ((nl = this.buf.indexOf('\n')) >= 0) {
      const line = this.buf.slice(0, nl);
      this.buf = this.buf.slice(nl + 1);
      if (line.trim() === '') continue;
      let m: Message | undefined;
      try {
        m = validate(JSON.parse(line));
      } catch {
        m = undefined;
      }
      if (m === undefined) {
        this.fail(new ChannelError('malformed', `${this.peer} sent something that is not roce transfer protocol v${PROTOCOL_VERSION}`));
        this.socket.destroy();
        return;
      }
      this.deliver(m);
    }
    if (this.buf.length > MAX_LINE) {
      this.fail(new ChannelError('malformed', `${this.peer} sent a line longer than ${MAX_LINE} bytes`));
      this.socket.destroy();
    }
  }
}

export function fmtSecs(ms: number): string {
  return `${Number((ms / 1000).toFixed(1))} s`;
}

/** A remote file name: one path component, printable, not hidden (hidden names are our partials). */
export function checkName(name: string): string | undefined {
  if (name.length === 0) return 'the name is empty';
  if (name.length > 255) return 'the name is longer than 255 bytes';
  if (name.includes('/') || name.includes('\\')) return `'${name}' contains a path separator`;
  if (name.startsWith('.')) return `'${name}' starts with a dot`;
  // eslint-disable-next-line no-control-regex
  if (/[\u0000-\u001f\u007f]/.test(name)) return `'${name}' contains control characters`;
  return undefined;
}

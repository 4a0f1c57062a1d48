/**
 * The foreign calls the stack needs: `setsockopt`/`getsockopt` on a `node:dgram` socket, and the
 * batched datagram calls `sendmmsg`/`recvmmsg` (see `mmsg.ts` for why).
 *
 * Read first: `docs/rxe-lab.md`, "Step 7" and "What this means for the stack's design".
 * - IPv4 send: only `IP_MTU_DISCOVER = IP_PMTUDISC_DO` on an unconnected socket makes Linux send
 *   IP ID 0 with DF, the header the ICRC is computed for. Without it strict peers (rdma_rxe) drop
 *   every packet we send.
 * - IPv6 receive: rdma_rxe sends UDP checksum 0, which Linux drops (`Udp6InCsumErrors`) unless the
 *   socket has `UDP_NO_CHECK6_RX`.
 * Node offers neither option, so libc is called through koffi (prebuilt binaries). Both are loaded
 * lazily, once, inside try/catch: a machine without them still runs the stack, and the caller can
 * say exactly what will not work (`ffiStatus()`).
 *
 * Every function here returns a result value and never throws.
 */

import { createRequire } from 'node:module';
import type { Socket } from 'node:dgram';
import { icrcAddon, type IcrcAddon } from '../wire/addon.js';

// <netinet/in.h>, <linux/in.h>, <linux/udp.h>, <asm-generic/socket.h> (Linux, all architectures
// node runs on; the SOL_SOCKET values differ on MIPS/SPARC/PA-RISC, which koffi does not ship for).
export const IPPROTO_IP = 0;
export const IP_MTU_DISCOVER = 10;
export const IP_PMTUDISC_DONT = 0;
export const IP_PMTUDISC_WANT = 1;
export const IP_PMTUDISC_DO = 2;
export const SOL_UDP = 17;
export const UDP_NO_CHECK6_TX = 101;
export const UDP_NO_CHECK6_RX = 102;
/** Linux UDP_GRO (SOL_UDP): deliver coalesced trains whole, with their segment size in a control message. */
export const UDP_GRO = 104;
export const SOL_SOCKET = 1;
export const SO_SNDBUF = 7;
export const SO_RCVBUF = 8;

export type SockoptErrorCode =
  /** koffi or libc could not be loaded (not Linux, koffi not installed or without a prebuilt binary). */
  | 'ERR_FFI_UNAVAILABLE'
  /** The socket has no file descriptor (not bound yet, closed, or node's internals changed). */
  | 'ERR_NO_FD'
  /** The kernel refused the call; `errno` says why. */
  | 'ERR_SOCKOPT';

export type SockoptResult<T> =
  | { ok: true; value: T }
  | { ok: false; code: SockoptErrorCode; message: string; errno?: number };

const isLittleEndian = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

type IntFn = (fd: number, level: number, optname: number, optval: Buffer, optlen: number | number[]) => number;

/** What the batched datagram path (`mmsg.ts`) calls: libc's `sendmmsg`/`recvmmsg` and koffi's memory and poll. */
export interface BatchIoFfi {
  sendmmsg: (fd: number, msgvec: unknown, vlen: number, flags: number) => number;
  recvmmsg: (fd: number, msgvec: unknown, vlen: number, flags: number, timeout: null) => number;
  dup: (fd: number) => number;
  close: (fd: number) => number;
  errno: () => number;
  /**
   * Zeroed memory whose address the kernel may be handed: an ArrayBuffer's backing store, which V8
   * never moves, and which lives as long as any view of it (so a view kept too long stays valid).
   */
  alloc: (bytes: number) => { address: bigint; view: ArrayBuffer };
  /** libuv poll on a descriptor (koffi's `uv_poll_t`). */
  poll: (fd: number, opts: { readable?: boolean; writable?: boolean }, cb: (ev: { readable: boolean; writable: boolean }) => void) => PollHandle;
  /** Whose `sendmmsg` and `recvmmsg` these are: the addon's (`src/native/mmsg.c`) or koffi's calls into libc. */
  readonly calls: 'addon' | 'koffi';
}

export interface PollHandle {
  start(opts: { readable?: boolean; writable?: boolean }, cb: (ev: { readable: boolean; writable: boolean }) => void): void;
  stop(): void;
  close(): void;
  unref(): void;
}

interface Libc {
  batch: BatchIoFfi;
  batchKoffi: BatchIoFfi;
  setsockopt: IntFn;
  getsockopt: IntFn;
  socket: (domain: number, type: number, protocol: number) => number;
  bind: (fd: number, addr: Buffer, len: number) => number;
  recv: (fd: number, buf: Buffer, len: number, flags: number) => number | bigint;
  close: (fd: number) => number;
  errno: () => number;
  errnoName: (e: number) => string;
}

/**
 * `sendmmsg` and `recvmmsg` as the batched path calls them, with the `errno` that goes with their
 * failures: `addon`'s (`src/native/mmsg.c`, which return -errno) where it has them, else the given
 * ones (koffi's calls into libc). Through koffi a call cost about 0.27 µs more (bench/HISTORY.md,
 * "Since the full run at 20:17"), and a ping-pong makes two per message on each side.
 */
export function mmsgCalls(
  sendmmsg: BatchIoFfi['sendmmsg'],
  recvmmsg: BatchIoFfi['recvmmsg'],
  errno: () => number,
  addon: Pick<IcrcAddon, 'sendmmsg' | 'recvmmsg'> | undefined,
): Pick<BatchIoFfi, 'sendmmsg' | 'recvmmsg' | 'errno' | 'calls'> {
  const send = addon?.sendmmsg;
  const recv = addon?.recvmmsg;
  if (send === undefined || recv === undefined) return { sendmmsg, recvmmsg, errno, calls: 'koffi' };
  // The last failure's code, kept until the next: `errno` is read right after the call that failed.
  let last = 0;
  return {
    sendmmsg: (fd, msgvec, vlen, flags) => {
      const r = send(fd, msgvec as Uint8Array, vlen, flags);
      if (r >= 0) return r;
      last = -r;
      return -1;
    },
    recvmmsg: (fd, msgvec, vlen, flags) => {
      const r = recv(fd, msgvec as Uint8Array, vlen, flags);
      if (r >= 0) return r;
      last = -r;
      return -1;
    },
    errno: () => last,
    calls: 'addon',
  };
}

let libc: Libc | undefined;
let libcError: string | undefined;

function loadLibc(): Libc | undefined {
  if (libc !== undefined || libcError !== undefined) return libc;
  let stage = 'koffi';
  try {
    const require = createRequire(import.meta.url);
    const koffi = require('koffi') as typeof import('koffi');
    stage = 'libc.so.6';
    const lib = koffi.load('libc.so.6');
    stage = 'setsockopt/getsockopt in libc.so.6';
    const setsockopt = lib.func('int setsockopt(int fd, int level, int optname, const void *optval, uint32_t optlen)') as IntFn;
    const getsockopt = lib.func('int getsockopt(int fd, int level, int optname, _Out_ void *optval, _Inout_ uint32_t *optlen)') as IntFn;
    const socket = lib.func('int socket(int domain, int type, int protocol)') as Libc['socket'];
    const bind = lib.func('int bind(int fd, const void *addr, uint32_t addrlen)') as Libc['bind'];
    const recv = lib.func('intptr_t recv(int fd, _Out_ void *buf, size_t len, int flags)') as Libc['recv'];
    const close = lib.func('int close(int fd)') as Libc['close'];
    stage = 'sendmmsg/recvmmsg/dup in libc.so.6';
    const sendmmsg = lib.func('int sendmmsg(int fd, void *msgvec, unsigned int vlen, int flags)') as BatchIoFfi['sendmmsg'];
    const recvmmsg = lib.func('int recvmmsg(int fd, void *msgvec, unsigned int vlen, int flags, void *timeout)') as BatchIoFfi['recvmmsg'];
    const batchKoffi: BatchIoFfi = {
      sendmmsg,
      recvmmsg,
      errno: () => koffi.errno(),
      calls: 'koffi',
      dup: lib.func('int dup(int fd)') as BatchIoFfi['dup'],
      close,
      alloc: (bytes) => {
        const view = new ArrayBuffer(bytes);
        return { address: koffi.address(new Uint8Array(view)), view };
      },
      poll: (fd, opts, cb) => koffi.node.poll(fd, opts, cb) as PollHandle,
    };
    // The same, with the addon's two system calls where it has them.
    const batch: BatchIoFfi = { ...batchKoffi, ...mmsgCalls(sendmmsg, recvmmsg, batchKoffi.errno, icrcAddon) };
    const names = new Map<number, string>();
    for (const [name, n] of Object.entries(koffi.os.errno)) if (!names.has(n)) names.set(n, name);
    libc = {
      batch,
      batchKoffi,
      setsockopt,
      getsockopt,
      socket,
      bind,
      recv,
      close,
      errno: () => koffi.errno(),
      errnoName: (e) => names.get(e) ?? `errno ${e}`,
    };
  } catch (e) {
    libcError = `cannot load ${stage}: ${e instanceof Error ? e.message : String(e)}`;
  }
  return libc;
}

/**
 * The calls of the batched datagram path, or undefined where the FFI does not load: `sendmmsg` and
 * `recvmmsg` the addon's where it has them (`calls: 'addon'`), unless `calls` asks for koffi's.
 */
export function batchIoFfi(calls: 'addon' | 'koffi' = 'addon'): BatchIoFfi | undefined {
  const l = loadLibc();
  return calls === 'koffi' ? l?.batchKoffi : l?.batch;
}

/** Whether the FFI is usable on this machine; loads it on first call. */
export function ffiStatus(): { ok: true } | { ok: false; message: string } {
  return loadLibc() !== undefined ? { ok: true } : { ok: false, message: libcError ?? 'FFI unavailable' };
}

function unavailable<T>(): SockoptResult<T> {
  return { ok: false, code: 'ERR_FFI_UNAVAILABLE', message: libcError ?? 'FFI unavailable' };
}

function failed<T>(c: Libc, what: string): SockoptResult<T> {
  const errno = c.errno();
  return { ok: false, code: 'ERR_SOCKOPT', errno, message: `${what} failed: ${c.errnoName(errno)}` };
}

/** setsockopt(fd, level, optname, &value, sizeof(int)). */
export function setsockoptInt(fd: number, level: number, optname: number, value: number): SockoptResult<void> {
  const c = loadLibc();
  if (c === undefined) return unavailable();
  if (!Number.isInteger(fd) || fd < 0) return { ok: false, code: 'ERR_NO_FD', message: `invalid fd ${fd}` };
  const buf = Buffer.alloc(4); // an int in native byte order
  if (isLittleEndian) buf.writeInt32LE(value | 0);
  else buf.writeInt32BE(value | 0);
  return c.setsockopt(fd, level, optname, buf, 4) === 0 ? { ok: true, value: undefined } : failed(c, `setsockopt(${level}, ${optname})`);
}

/** getsockopt(fd, level, optname) for an int option. */
export function getsockoptInt(fd: number, level: number, optname: number): SockoptResult<number> {
  const c = loadLibc();
  if (c === undefined) return unavailable();
  if (!Number.isInteger(fd) || fd < 0) return { ok: false, code: 'ERR_NO_FD', message: `invalid fd ${fd}` };
  const buf = Buffer.alloc(4);
  const len = [4];
  if (c.getsockopt(fd, level, optname, buf, len) !== 0) return failed(c, `getsockopt(${level}, ${optname})`);
  return { ok: true, value: isLittleEndian ? buf.readInt32LE() : buf.readInt32BE() };
}

interface UdpHandleLike {
  fd?: unknown;
}

/**
 * The file descriptor of a bound `dgram` socket, or undefined.
 *
 * `socket._handle` is the documented-deprecated way (DEP0112, and reading it prints the warning).
 * The getter only returns `this[kStateSymbol].handle`, so the state object is read directly: it is
 * the own symbol property whose description is `state symbol` and which holds `handle`. If a node
 * version changes that, `_handle` is read with deprecation warnings suppressed for that one read.
 */
export function socketFd(socket: Socket): number | undefined {
  const handle = handleOf(socket);
  const fd = handle?.fd;
  return typeof fd === 'number' && fd >= 0 ? fd : undefined;
}

/** Stops `dgram`'s own reading of a bound socket (`mmsg.ts` reads it instead); false if it cannot. */
export function stopDgramReading(socket: Socket): boolean {
  const h = handleOf(socket) as { recvStop?: () => number } | undefined;
  if (typeof h?.recvStop !== 'function') return false;
  return h.recvStop() === 0;
}

function handleOf(socket: Socket): UdpHandleLike | undefined {
  const bag = socket as unknown as Record<symbol, unknown>;
  for (const sym of Object.getOwnPropertySymbols(socket)) {
    if (sym.description !== 'state symbol') continue;
    const state = bag[sym];
    if (typeof state === 'object' && state !== null && 'handle' in state) {
      const h = (state as { handle: unknown }).handle;
      return typeof h === 'object' && h !== null ? (h as UdpHandleLike) : undefined;
    }
  }
  const proc = process as { noDeprecation?: boolean };
  const saved = proc.noDeprecation;
  proc.noDeprecation = true;
  try {
    const h = (socket as unknown as { _handle?: unknown })._handle;
    return typeof h === 'object' && h !== null ? (h as UdpHandleLike) : undefined;
  } finally {
    proc.noDeprecation = saved ?? false;
    if (saved === undefined) delete proc.noDeprecation;
  }
}

/** Sets an int option on a dgram socket and reads it back; `value` is what the kernel reports. */
export function setAndReadBack(socket: Socket, level: number, optname: number, value: number): SockoptResult<number> {
  if (loadLibc() === undefined) return unavailable();
  const fd = socketFd(socket);
  if (fd === undefined) return { ok: false, code: 'ERR_NO_FD', message: 'socket has no file descriptor (not bound, or closed)' };
  const set = setsockoptInt(fd, level, optname, value);
  if (!set.ok) return set;
  return getsockoptInt(fd, level, optname);
}

/** Reads an int option of a dgram socket. */
export function readSocketOption(socket: Socket, level: number, optname: number): SockoptResult<number> {
  if (loadLibc() === undefined) return unavailable();
  const fd = socketFd(socket);
  if (fd === undefined) return { ok: false, code: 'ERR_NO_FD', message: 'socket has no file descriptor (not bound, or closed)' };
  return getsockoptInt(fd, level, optname);
}

// --- Observing real IPv4 headers ---------------------------------------------------------------
//
// A UDP socket never sees the IP header, and the ICRC of a datagram sent through one always
// implies the ID its sender *assumed*: a receiver recomputes it with the same assumption, so
// sending a probe to ourselves through UDP sockets proves nothing about the ID on the wire. Only
// the real header does. A raw socket (CAP_NET_RAW) receives a copy of every UDP datagram for its
// bound address, IP header included, and is the one unprivileged-if-allowed way to look.

const AF_INET = 2;
const SOCK_RAW = 3;
const SOCK_NONBLOCK = 0o4000;
const SOCK_CLOEXEC = 0o2000000;
const IPPROTO_UDP = 17;

/** A raw IPv4/UDP socket bound to one local address, polled without blocking. */
export interface Ipv4Observer {
  /** Whole IPv4 datagrams (header first) received since the last call; never blocks. */
  poll(): Uint8Array[];
  close(): void;
}

/**
 * Opens a raw socket that sees every IPv4 UDP datagram addressed to `localAddr` (4 bytes).
 * Fails with `ERR_SOCKOPT` / EPERM without CAP_NET_RAW.
 */
export function openIpv4Observer(localAddr: Uint8Array): SockoptResult<Ipv4Observer> {
  const c = loadLibc();
  if (c === undefined) return unavailable();
  if (localAddr.length !== 4) return { ok: false, code: 'ERR_SOCKOPT', message: 'an IPv4 observer needs a 4-byte address' };
  const fd = c.socket(AF_INET, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, IPPROTO_UDP);
  if (fd < 0) return failed(c, 'socket(AF_INET, SOCK_RAW, IPPROTO_UDP)');
  const sa = Buffer.alloc(16); // struct sockaddr_in
  sa.writeUInt16LE(AF_INET, 0); // sin_family, host order (little-endian on koffi's Linux targets)
  if (!isLittleEndian) sa.writeUInt16BE(AF_INET, 0);
  sa.set(localAddr, 4); // sin_port stays 0: raw sockets have no port
  if (c.bind(fd, sa, 16) !== 0) {
    const r = failed<Ipv4Observer>(c, 'bind(raw socket)');
    c.close(fd);
    return r;
  }
  const buf = Buffer.alloc(65536);
  let open = true;
  return {
    ok: true,
    value: {
      poll(): Uint8Array[] {
        const out: Uint8Array[] = [];
        while (open) {
          const n = Number(c.recv(fd, buf, buf.length, 0));
          if (n < 0) break; // EAGAIN: nothing more for now (any other error: nothing to read either)
          out.push(Uint8Array.prototype.slice.call(buf, 0, n));
        }
        return out;
      },
      close(): void {
        if (open) c.close(fd);
        open = false;
      },
    },
  };
}

/**
 * The out-of-band exchange of rdma-core's ibv_rc_pingpong, ibv_uc_pingpong and ibv_ud_pingpong
 * (libibverbs/examples, rdma-core 44), over TCP (default port 18515).
 *
 * Each side's address is one C string, sent with its terminating NUL (52 bytes):
 *
 *     sprintf(msg, "%04x:%06x:%06x:%s", lid, qpn, psn, gid)       e.g.
 *     "0000:000011:a8de97:00000000000000000000ffff0a4d0003\0"
 *
 * where gid is the 16 raw GID bytes as 32 lowercase hex digits (gid_to_wire_gid: four
 * big-endian 32-bit words, "%08x" each); the GID is all zeros when the tool runs without -g.
 * The UD tool sends the same message (its QPN is the UD QP, its PSN is random and unused).
 *
 * The order, as the tools do it (pp_client_exch_dest / pp_server_exch_dest):
 *   client: connect; write 52 bytes; read 52 bytes; write "done\0" (5 bytes); close.
 *   server: listen (first getaddrinfo(NULL) result: 0.0.0.0 for IPv4), accept one, stop
 *           listening; read 52 bytes; connect its QP (RTR/RTS); write 52 bytes; read "done\0";
 *           close.
 * The client sends "done" right after reading the server's reply, before it connects its own
 * QP: the server starts its run only once "done" has arrived. Each C side does single read()
 * calls and treats a short read as failure, so each message goes out in one write.
 */

import net from 'node:net';
import {
  OobError, SocketReader, acceptOne, connectWithRetry, endpoint, gidToString, printable, writeAll,
  type ConnectOptions,
} from './common.js';

export { OobError, type OobErrorCode } from './common.js';

export const PINGPONG_DEFAULT_PORT = 18515;
/** sizeof "0000:000000:000000:00000000000000000000000000000000" */
export const PINGPONG_MESSAGE_SIZE = 52;
/** What the client sends after reading the server's address: "done" with its NUL. */
export const PINGPONG_DONE: Readonly<Buffer> = Buffer.from('done\0', 'latin1');

export type PingpongTransport = 'rc' | 'uc' | 'ud';

export interface PingpongDest {
  /** 16 bits; 0 on RoCE. */
  lid: number;
  /** 24 bits. */
  qpn: number;
  /** 24 bits. */
  psn: number;
  /** 16 bytes; all zeros when no GID index is used. */
  gid: Uint8Array;
}

const hex = (v: number, w: number): string => v.toString(16).padStart(w, '0');

function checkField(name: string, v: number, bits: number): void {
  if (!Number.isInteger(v) || v < 0 || v >= 2 ** bits) throw new RangeError(`${name} must be a ${bits}-bit unsigned integer, not ${v}`);
}

/** The 52-byte message (with its NUL) for `dest`. */
export function formatPingpongMessage(dest: PingpongDest): Buffer {
  checkField('lid', dest.lid, 16);
  checkField('qpn', dest.qpn, 24);
  checkField('psn', dest.psn, 24);
  if (dest.gid.length !== 16) throw new RangeError(`gid must have 16 bytes, not ${dest.gid.length}`);
  const text = `${hex(dest.lid, 4)}:${hex(dest.qpn, 6)}:${hex(dest.psn, 6)}:${Buffer.from(dest.gid).toString('hex')}`;
  return Buffer.from(text + '\0', 'latin1');
}

const MESSAGE_RE = /^([0-9a-fA-F]{4}):([0-9a-fA-F]{6}):([0-9a-fA-F]{6}):([0-9a-fA-F]{32})\x00$/;

/**
 * Parse a peer's 52-byte message. Returns the address, or an OobError (ERR_OOB_MALFORMED)
 * saying what is wrong with it. Stricter than the tools' sscanf: the exact field widths the
 * tools print, and the NUL at the end.
 */
export function parsePingpongMessage(bytes: Uint8Array): PingpongDest | OobError {
  if (bytes.length !== PINGPONG_MESSAGE_SIZE) {
    return new OobError('ERR_OOB_MALFORMED', `a pingpong address message has ${PINGPONG_MESSAGE_SIZE} bytes, this one ${bytes.length}: ${printable(bytes)}`);
  }
  const text = Buffer.from(bytes).toString('latin1');
  const m = MESSAGE_RE.exec(text);
  if (!m) {
    return new OobError('ERR_OOB_MALFORMED', `not a pingpong address ("%04x:%06x:%06x:<32 hex digits>\\0"): ${printable(bytes)}`);
  }
  return {
    lid: parseInt(m[1] ?? '', 16),
    qpn: parseInt(m[2] ?? '', 16),
    psn: parseInt(m[3] ?? '', 16),
    gid: new Uint8Array(Buffer.from(m[4] ?? '', 'hex')),
  };
}

function parseOrThrow(bytes: Uint8Array, peer: string): PingpongDest {
  const r = parsePingpongMessage(bytes);
  if (r instanceof OobError) throw new OobError(r.code, `${peer}: ${r.message}`);
  return r;
}

export interface PingpongClientOptions {
  /** How long to keep retrying while the server does not listen yet. Default 5000 ms. */
  connectTimeoutMs?: number;
  /** Pause between connection attempts. Default 100 ms. */
  retryDelayMs?: number;
  /** Bound on waiting for the server's reply (it connects its QP first). Default 10000 ms. */
  replyTimeoutMs?: number;
}

export interface PingpongExchangeResult {
  remote: PingpongDest;
  /** The TCP peer (the server's address for the client, the client's for the server). */
  peerAddress: string;
  peerPort: number;
}

/**
 * The client side: connect to host:port (retrying while nothing listens, bounded), send our
 * address, read the server's, send "done", close. Resolves with the server's address.
 */
export async function pingpongClientExchange(
  host: string, port: number, local: PingpongDest, opts: PingpongClientOptions = {},
): Promise<PingpongExchangeResult> {
  const msg = formatPingpongMessage(local);
  const connectOpts: ConnectOptions = { timeoutMs: opts.connectTimeoutMs ?? 5000, what: 'pingpong server' };
  if (opts.retryDelayMs !== undefined) connectOpts.retryDelayMs = opts.retryDelayMs;
  const socket = await connectWithRetry(host, port, connectOpts);
  const peer = `pingpong server ${endpoint(host, port)}`;
  const reader = new SocketReader(socket, peer);
  try {
    await writeAll(socket, msg, peer, 'our address');
    const reply = await reader.readExact(PINGPONG_MESSAGE_SIZE, opts.replyTimeoutMs ?? 10_000, 'address reply');
    const remote = parseOrThrow(reply, peer);
    await writeAll(socket, PINGPONG_DONE, peer, '"done"');
    return { remote, peerAddress: socket.remoteAddress ?? host, peerPort: socket.remotePort ?? port };
  } finally {
    socket.end();
    socket.destroySoon();
  }
}

export interface PingpongServerOptions {
  /** Address to listen on when given a port. Default "0.0.0.0" (what the C servers bind). */
  host?: string;
  /** Bound on waiting for a client to connect. Default 60000 ms. */
  acceptTimeoutMs?: number;
  /** Bound on each read from the client (its address, then "done"). Default 10000 ms. */
  readTimeoutMs?: number;
  /** Called once listening (with the bound address; useful with port 0). */
  onListening?: (address: net.AddressInfo) => void;
  /**
   * Called with the client's address before we reply, as the C server connects its QP
   * (RTR/RTS) at that point: the client may send as soon as it has our reply.
   */
  onRemote?: (remote: PingpongDest) => void | Promise<void>;
}

/**
 * The server side: on a port (listen, accept one client, stop listening) or on an accepted
 * socket. Reads the client's address, calls `onRemote`, replies with ours, waits for the
 * client's "done". Resolves with the client's address.
 */
export async function pingpongServerExchange(
  socketOrPort: net.Socket | number, local: PingpongDest, opts: PingpongServerOptions = {},
): Promise<PingpongExchangeResult> {
  const msg = formatPingpongMessage(local);
  let socket: net.Socket;
  if (typeof socketOrPort === 'number') {
    const listenOpts: Parameters<typeof acceptOne>[2] = { what: 'pingpong client', acceptTimeoutMs: opts.acceptTimeoutMs ?? 60_000 };
    if (opts.onListening) listenOpts.onListening = opts.onListening;
    socket = await acceptOne(socketOrPort, opts.host ?? '0.0.0.0', listenOpts);
  } else {
    socket = socketOrPort;
  }
  const peerAddress = socket.remoteAddress ?? '?';
  const peerPort = socket.remotePort ?? 0;
  const peer = `pingpong client ${endpoint(peerAddress, peerPort)}`;
  const reader = new SocketReader(socket, peer);
  const readTimeout = opts.readTimeoutMs ?? 10_000;
  try {
    const first = await reader.readExact(PINGPONG_MESSAGE_SIZE, readTimeout, 'address message');
    const remote = parseOrThrow(first, peer);
    await opts.onRemote?.(remote);
    await writeAll(socket, msg, peer, 'our address');
    const done = await reader.readCString(PINGPONG_DONE.length, readTimeout, '"done"');
    if (!done.equals(PINGPONG_DONE)) {
      throw new OobError('ERR_OOB_MALFORMED', `${peer}: expected "done\\0" after the addresses, got ${printable(done)}`);
    }
    return { remote, peerAddress, peerPort };
  } finally {
    socket.end();
    socket.destroySoon();
  }
}

// ---------------------------------------------------------------------------------------------
// The lines the tools print

/**
 * "  local address:  LID 0x0000, QPN 0x000011, PSN 0x6e6042, GID ::ffff:10.77.0.2"
 * (rc/uc_pingpong.c; ud_pingpong.c prints "PSN 0x…: GID" in its local line, and the
 * same remote line as the others).
 */
export function formatPingpongAddress(side: 'local' | 'remote', dest: PingpongDest, transport: PingpongTransport = 'rc'): string {
  const head = side === 'local' ? '  local address:  ' : '  remote address: ';
  const sep = side === 'local' && transport === 'ud' ? ':' : ',';
  return `${head}LID 0x${hex(dest.lid, 4)}, QPN 0x${hex(dest.qpn, 6)}, PSN 0x${hex(dest.psn, 6)}${sep} GID ${gidToString(dest.gid)}`;
}

export { gidToString } from './common.js';

/**
 * Shared pieces of the out-of-band (TCP) exchanges that the rdma-core example tools
 * (ibv_*_pingpong) and perftest use to swap QP numbers, PSNs, keys and GIDs before any RDMA
 * traffic: the error type, a bounded reader over a socket, connect-with-retries, one-shot
 * listening, GID text forms and the two C printf conversions the tools' output needs.
 */

import net from 'node:net';

export type OobErrorCode =
  /** Nothing accepted the connection before the deadline. */
  | 'ERR_OOB_CONNECT'
  /** Could not listen (port in use, address not local). */
  | 'ERR_OOB_LISTEN'
  /** A bounded wait ran out (no peer connected, or the peer went quiet). */
  | 'ERR_OOB_TIMEOUT'
  /** The peer closed the connection (or reset it) before the exchange was complete. */
  | 'ERR_OOB_CLOSED'
  /** The peer sent bytes that are not the message the exchange expects at this point. */
  | 'ERR_OOB_MALFORMED'
  /** The peer speaks the exchange but runs with settings ours cannot match. */
  | 'ERR_OOB_MISMATCH';

export class OobError extends Error {
  override readonly name = 'OobError';
  constructor(readonly code: OobErrorCode, message: string) {
    super(message);
  }
}

const secs = (ms: number): string => `${Number((ms / 1000).toFixed(1))} s`;

export function endpoint(host: string, port: number): string {
  return host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`;
}

/**
 * Reads exact byte counts (or NUL-terminated strings) from a socket, each with a time bound.
 * Data that arrives before it is asked for is kept, so the peer's pipelining never loses bytes.
 */
export class SocketReader {
  private buf: Buffer = Buffer.alloc(0);
  private ended = false;
  private failure: Error | undefined;
  private wake: (() => void) | undefined;

  constructor(readonly socket: net.Socket, readonly peer: string) {
    socket.on('data', (d: Buffer) => {
      this.buf = this.buf.length ? Buffer.concat([this.buf, d]) : d;
      this.poke();
    });
    socket.on('end', () => {
      this.ended = true;
      this.poke();
    });
    socket.on('close', () => {
      this.ended = true;
      this.poke();
    });
    socket.on('error', (e) => {
      this.failure = e;
      this.poke();
    });
  }

  private poke(): void {
    const w = this.wake;
    this.wake = undefined;
    w?.();
  }

  /** Bytes received and not yet consumed. */
  get buffered(): number {
    return this.buf.length;
  }

  private async waitFor(ready: () => number | undefined, timeoutMs: number, what: string): Promise<Buffer> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const n = ready();
      if (n !== undefined) {
        const out = this.buf.subarray(0, n);
        this.buf = this.buf.subarray(n);
        return Buffer.from(out);
      }
      if (this.failure) {
        const code = (this.failure as NodeJS.ErrnoException).code ?? this.failure.message;
        throw new OobError('ERR_OOB_CLOSED', `connection to ${this.peer} failed (${code}) while waiting for ${what}`);
      }
      if (this.ended) {
        throw new OobError('ERR_OOB_CLOSED',
          `${this.peer} closed the connection while we waited for ${what}` +
          (this.buf.length ? ` (${this.buf.length} byte(s) of it arrived: ${printable(this.buf)})` : ''));
      }
      const left = deadline - Date.now();
      if (left <= 0) {
        throw new OobError('ERR_OOB_TIMEOUT',
          `no ${what} from ${this.peer} after ${secs(timeoutMs)}` +
          (this.buf.length ? ` (only ${this.buf.length} byte(s): ${printable(this.buf)})` : ''));
      }
      await new Promise<void>((resolve) => {
        const timer = setTimeout(() => {
          this.wake = undefined;
          resolve();
        }, left);
        this.wake = () => {
          clearTimeout(timer);
          resolve();
        };
      });
    }
  }

  /** Exactly `n` bytes. */
  readExact(n: number, timeoutMs: number, what: string): Promise<Buffer> {
    return this.waitFor(() => (this.buf.length >= n ? n : undefined), timeoutMs, what);
  }

  /**
   * Bytes up to and including the first NUL, at most `max` bytes (then the first `max` bytes,
   * NUL or not). The tools' text messages are C strings sent with their terminator.
   */
  readCString(max: number, timeoutMs: number, what: string): Promise<Buffer> {
    return this.waitFor(() => {
      const nul = this.buf.indexOf(0);
      if (nul >= 0 && nul < max) return nul + 1;
      return this.buf.length >= max ? max : undefined;
    }, timeoutMs, what);
  }
}

/** A short, safe rendering of received bytes for error messages. */
export function printable(b: Uint8Array, max = 64): string {
  const s = Buffer.from(b.subarray(0, max)).toString('latin1');
  const text = /^[\x20-\x7e]*\x00?$/.test(s);
  if (text) return JSON.stringify(s.replace(/\x00$/, '\\0')).replace(/\\\\0"$/, '\\0"');
  return `0x${Buffer.from(b.subarray(0, max)).toString('hex')}${b.length > max ? '…' : ''}`;
}

export function writeAll(socket: net.Socket, data: Uint8Array, peer: string, what: string): Promise<void> {
  return new Promise((resolve, reject) => {
    socket.write(data, (err) => {
      if (err) reject(new OobError('ERR_OOB_CLOSED', `could not send ${what} to ${peer}: ${(err as NodeJS.ErrnoException).code ?? err.message}`));
      else resolve();
    });
  });
}

export interface ConnectOptions {
  /** Keep retrying refused/unreachable connections this long. Default 5000 ms. */
  timeoutMs?: number;
  /** Pause between attempts. Default 100 ms. */
  retryDelayMs?: number;
  /** What we look for, for the error message ("pingpong server", "perftest server"). */
  what?: string;
  /** Address family for name lookup (perftest's client uses IPv4 only). */
  family?: 4 | 6;
}

/**
 * Connect to host:port, retrying while nothing listens yet (the C clients fail at once; a
 * peer started in parallel needs a moment to reach listen()). Bounded by `timeoutMs`.
 */
export async function connectWithRetry(host: string, port: number, opts: ConnectOptions = {}): Promise<net.Socket> {
  const timeoutMs = opts.timeoutMs ?? 5000;
  const delay = opts.retryDelayMs ?? 100;
  const what = opts.what ?? 'server';
  const deadline = Date.now() + timeoutMs;
  let last = '';
  for (;;) {
    const left = deadline - Date.now();
    if (left <= 0) break;
    try {
      return await new Promise<net.Socket>((resolve, reject) => {
        const s = net.connect({ host, port, ...(opts.family ? { family: opts.family } : {}) });
        const timer = setTimeout(() => {
          s.destroy();
          reject(Object.assign(new Error('connect timed out'), { code: 'ETIMEDOUT' }));
        }, left);
        s.once('connect', () => {
          clearTimeout(timer);
          s.removeAllListeners('error');
          s.setNoDelay(true);
          resolve(s);
        });
        s.once('error', (e) => {
          clearTimeout(timer);
          s.destroy();
          reject(e);
        });
      });
    } catch (e) {
      last = (e as NodeJS.ErrnoException).code ?? (e as Error).message;
      if (last === 'ENOTFOUND' || last === 'EAI_AGAIN') {
        throw new OobError('ERR_OOB_CONNECT', `cannot resolve ${host}: ${last}`);
      }
      const pause = Math.min(delay, deadline - Date.now());
      if (pause > 0) await new Promise((r) => setTimeout(r, pause));
    }
  }
  throw new OobError('ERR_OOB_CONNECT', `no ${what} at ${endpoint(host, port)} after ${secs(timeoutMs)}${last ? ` (${last})` : ''}`);
}

export interface ListenOptions {
  /** Bound on waiting for the peer to connect. Default 60000 ms. */
  acceptTimeoutMs?: number;
  /** Called once the socket listens (with the bound address: useful with port 0). */
  onListening?: (address: net.AddressInfo) => void;
  /** What we wait for, for the error message. */
  what?: string;
}

/**
 * Listen on host:port, accept one connection, stop listening (as the C servers do: they
 * close the listening socket right after accept()).
 */
export function acceptOne(port: number, host: string, opts: ListenOptions = {}): Promise<net.Socket> {
  const timeoutMs = opts.acceptTimeoutMs ?? 60_000;
  return new Promise((resolve, reject) => {
    const server = net.createServer({ pauseOnConnect: false });
    let timer: NodeJS.Timeout | undefined;
    let done = false;
    const finish = (err: Error | undefined, sock?: net.Socket): void => {
      if (done) {
        sock?.destroy();
        return;
      }
      done = true;
      if (timer) clearTimeout(timer);
      server.close();
      if (err) reject(err);
      else if (sock) resolve(sock);
    };
    server.on('connection', (sock) => {
      sock.setNoDelay(true);
      finish(undefined, sock);
    });
    server.on('error', (e) => {
      const code = (e as NodeJS.ErrnoException).code ?? e.message;
      finish(new OobError('ERR_OOB_LISTEN', `cannot listen on ${endpoint(host, port)}: ${code}`));
    });
    server.listen({ port, host, backlog: 1, exclusive: true }, () => {
      const addr = server.address() as net.AddressInfo;
      timer = setTimeout(() => {
        finish(new OobError('ERR_OOB_TIMEOUT', `no ${opts.what ?? 'client'} connected to ${endpoint(host, addr.port)} within ${secs(timeoutMs)}`));
      }, timeoutMs);
      opts.onListening?.(addr);
    });
  });
}

// ---------------------------------------------------------------------------------------------
// GIDs

/** True for ::ffff:a.b.c.d (an IPv4 RoCEv2 GID). */
export function isV4MappedGid(gid: Uint8Array): boolean {
  for (let i = 0; i < 10; i++) if (gid[i] !== 0) return false;
  return gid[10] === 0xff && gid[11] === 0xff;
}

/** The text form glibc's inet_ntop(AF_INET6) gives a GID ("::ffff:10.77.0.2", "fd77::2", "::"). */
export function gidToString(gid: Uint8Array): string {
  if (gid.length !== 16) throw new RangeError(`a GID has 16 bytes, not ${gid.length}`);
  const words: number[] = [];
  for (let i = 0; i < 16; i += 2) words.push(((gid[i] ?? 0) << 8) | (gid[i + 1] ?? 0));
  // The longest run of zero words (length >= 2, first one on ties) becomes "::".
  let best = -1;
  let bestLen = 0;
  for (let i = 0; i < 8;) {
    if (words[i] !== 0) {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && words[j] === 0) j++;
    if (j - i > bestLen) {
      best = i;
      bestLen = j - i;
    }
    i = j;
  }
  if (bestLen < 2) best = -1;
  let out = '';
  for (let i = 0; i < 8; i++) {
    if (best >= 0 && i >= best && i < best + bestLen) {
      if (i === best) out += ':';
      continue;
    }
    if (i !== 0) out += ':';
    // Embedded IPv4: ::a.b.c.d and ::ffff:a.b.c.d (glibc's rule).
    if (i === 6 && best === 0 && (bestLen === 6 || (bestLen === 5 && words[5] === 0xffff))) {
      out += `${gid[12]}.${gid[13]}.${gid[14]}.${gid[15]}`;
      break;
    }
    out += (words[i] ?? 0).toString(16);
  }
  if (best >= 0 && best + bestLen === 8) out += ':';
  return out;
}

// ---------------------------------------------------------------------------------------------
// C printf conversions the tools' output uses

/** printf("%.Nf", x) as glibc prints it (exact value, ties to even), for finite x. */
export function cFixed(x: number, digits: number): string {
  if (!Number.isFinite(x)) return x > 0 ? 'inf' : x < 0 ? '-inf' : (Number.isNaN(x) ? 'nan' : String(x));
  const s = x.toFixed(digits);
  // toFixed rounds exact ties away from zero; glibc rounds them to even. A tie's decimal
  // expansion stops right after a 5 in the first dropped place.
  if (digits + 30 <= 100) {
    const exact = Math.abs(x).toFixed(digits + 30);
    const cut = exact.length - 30;
    const tail = exact.slice(cut);
    if (/^50*$/.test(tail)) {
      const down = exact.slice(0, cut).replace(/\.$/, '');
      const lastDigit = Number(down.replace('.', '').slice(-1));
      if (lastDigit % 2 === 0) return (x < 0 ? '-' : '') + down;
    }
  }
  return s;
}

/** printf("%#0Nx", v): "0x" plus hex padded to N characters in all, or N zeros for 0. */
export function cAltHex(v: number | bigint, width: number): string {
  const hex = v.toString(16);
  if (v === 0 || v === 0n) return '0'.repeat(Math.max(width, 1));
  return '0x' + hex.padStart(width - 2, '0');
}

/** printf("%-Ns", s). */
export const cLeft = (s: string, width: number): string => s.padEnd(width, ' ');

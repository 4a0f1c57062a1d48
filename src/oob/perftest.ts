/**
 * The out-of-band exchange of perftest 6.06 (Debian package perftest 4.5+0.17):
 * ib_write_bw, ib_read_bw, ib_send_bw, ib_atomic_bw, over TCP (default port 18515, IPv4).
 *
 * Every step is ctx_xchg_data()-style: the client writes, then reads; the server reads, then
 * writes; each side does single read() calls of the exact size and fails on a short read.
 * In order (perftest_communication.c, write_bw.c / read_bw.c / atomic_bw.c / send_bw.c):
 *
 *  1. exchange_versions: 16 bytes, user_param.version ("6.06", NUL-padded: char[16]).
 *     check_version_compatibility: a peer older than 5.70 is refused.
 *  2. check_sys_data (remote >= 5.32): cycle_buffer (page size, 4096) and cache_line_size (64),
 *     each an int32 in network order; both sides take the maximum.
 *  3. check_mtu (remote >= 5.1): the port MTU as the ibv_mtu enum in decimal, sprintf "%d",
 *     sending sizeof(char[2]) = 2 bytes ("3\0" for 1024) since remote >= 5.31; both take the
 *     smaller one.
 *  4. ctx_hand_shake, once per QP: the key message (client first).
 *     With a GID (always on RoCE: the GID index is -x or the best RoCE one), 108 bytes:
 *       "%04x:%04x:%06x:%06x:%08x:%016llx:" lid, out_reads, qpn, psn, rkey, vaddr
 *       then the 16 GID bytes as "%02x:" each, then "%08x:" srqn, then the NUL.
 *     Without a GID (InfiniBand without -x), 59 bytes: "%04x:%04x:%06x:%06x:%08x:%016llx:%08x\0".
 *     out_reads is 1 for write/send and the outstanding-reads depth (device max, or -o) for
 *     read/atomic; rkey is 0 for send on rxe (its MR has no remote access).
 *  5. GID types must agree (both IPv4-mapped or both not), then each side connects its QPs.
 *  6. write/read/atomic: a hand shake per QP (the remote address is printed), one more.
 *     send: one hand shake, one per QP (printed), then (receives posted) one more.
 *  -- the test runs --
 *  7. write/read/atomic: a hand shake (the server waits here for the client to finish), then
 *     xchg_bw_reports: five 8-byte exchanges, size and iters as big-endian u64, bw_peak,
 *     bw_avg and msgRate_avg as big-endian IEEE doubles (the server prints the client's).
 *     send (send_bw.c, RUN_REGULAR): nothing; the closing hand shake is where its server waits.
 *  8. ctx_close_connection: a hand shake, then both sides write "done\0" (5 bytes) and close,
 *     neither reading the other's.
 *
 * Every hand shake resends the same key message, so a message that changes betrays a peer
 * with more QPs (-q) than ours; a key message where a report is due betrays a peer running
 * another test (send vs write/read/atomic).
 */

import net from 'node:net';
import {
  OobError, SocketReader, acceptOne, connectWithRetry, endpoint, isV4MappedGid, printable, writeAll,
  type ConnectOptions,
} from './common.js';

export { OobError, type OobErrorCode } from './common.js';

export const PERFTEST_DEFAULT_PORT = 18515;
/** The version perftest 4.5+0.17 sends (its configure.ac AC_INIT version). */
export const PERFTEST_VERSION = '6.06';
/** perftest refuses peers older than this (check_version_compatibility). */
export const PERFTEST_MIN_VERSION = 5.7;
export const PERFTEST_VERSION_SIZE = 16;
/** KEY_MSG_SIZE: the key message without a GID. */
export const PERFTEST_KEY_SIZE = 59;
/** KEY_MSG_SIZE_GID: the key message with a GID. */
export const PERFTEST_KEY_SIZE_GID = 108;
/** DEF_PAGE_SIZE, the cycle_buffer perftest sends on 4 KiB-page hosts. */
export const PERFTEST_DEFAULT_CYCLE_BUFFER = 4096;
/** DEF_CACHE_LINE_SIZE. */
export const PERFTEST_DEFAULT_CACHE_LINE = 64;
export const PERFTEST_DONE: Readonly<Buffer> = Buffer.from('done\0', 'latin1');

export type PerftestVerb = 'write' | 'read' | 'send' | 'atomic';

/** enum ibv_mtu: 1 = 256, 2 = 512, 3 = 1024, 4 = 2048, 5 = 4096. */
export type IbvMtu = 1 | 2 | 3 | 4 | 5;
export const mtuToEnum = (bytes: number): IbvMtu | undefined =>
  ({ 256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5 } as Record<number, IbvMtu>)[bytes];
export const mtuFromEnum = (e: IbvMtu): number => 128 << e;

/** One QP's key message (struct pingpong_dest as sent). */
export interface PerftestKey {
  lid: number;
  /** Outstanding reads: 1 for write/send, the read/atomic depth otherwise. */
  outReads: number;
  qpn: number;
  psn: number;
  rkey: number;
  vaddr: bigint;
  /** 16 bytes; omitted for the 59-byte form (InfiniBand without a GID). */
  gid?: Uint8Array;
  /** SRQ number (XRC/DC only); 0 otherwise. */
  srqn: number;
}

/** struct bw_report_data as exchanged by xchg_bw_reports. */
export interface PerftestBwReport {
  size: bigint;
  iters: bigint;
  /** MB/s (or Gb/s with --report_gbits). */
  bwPeak: number;
  bwAvg: number;
  /** Mpps. */
  msgRateAvg: number;
}

// ---------------------------------------------------------------------------------------------
// Codecs

const hx = (v: number | bigint, w: number): string => v.toString(16).padStart(w, '0');

function checkUint(name: string, v: number, bits: number): void {
  if (!Number.isInteger(v) || v < 0 || v >= 2 ** bits) throw new RangeError(`${name} must be a ${bits}-bit unsigned integer, not ${v}`);
}

/** The key message (108 bytes with a GID, 59 without), NUL included. */
export function formatPerftestKey(key: PerftestKey): Buffer {
  checkUint('lid', key.lid, 16);
  checkUint('outReads', key.outReads, 16);
  checkUint('qpn', key.qpn, 24);
  checkUint('psn', key.psn, 24);
  checkUint('rkey', key.rkey, 32);
  checkUint('srqn', key.srqn, 32);
  if (key.vaddr < 0n || key.vaddr >= 1n << 64n) throw new RangeError(`vaddr must be a 64-bit unsigned integer, not ${key.vaddr}`);
  const head = `${hx(key.lid, 4)}:${hx(key.outReads, 4)}:${hx(key.qpn, 6)}:${hx(key.psn, 6)}:${hx(key.rkey, 8)}:${hx(key.vaddr, 16)}`;
  if (!key.gid) return Buffer.from(`${head}:${hx(key.srqn, 8)}\0`, 'latin1');
  if (key.gid.length !== 16) throw new RangeError(`gid must have 16 bytes, not ${key.gid.length}`);
  const gid = Array.from(key.gid, (b) => hx(b, 2) + ':').join('');
  return Buffer.from(`${head}:${gid}${hx(key.srqn, 8)}:\0`, 'latin1');
}

const H = (n: number): string => `([0-9a-fA-F]{${n}})`;
const KEY_RE = new RegExp(`^${H(4)}:${H(4)}:${H(6)}:${H(6)}:${H(8)}:${H(16)}:${H(8)}\\x00$`);
const KEY_GID_RE = new RegExp(`^${H(4)}:${H(4)}:${H(6)}:${H(6)}:${H(8)}:${H(16)}:((?:[0-9a-fA-F]{2}:){16})${H(8)}:\\x00$`);

/**
 * Parse a key message: 108 bytes (with GID) or 59 bytes (without), by its length.
 * Returns the key, or an OobError (ERR_OOB_MALFORMED).
 */
export function parsePerftestKey(bytes: Uint8Array): PerftestKey | OobError {
  const text = Buffer.from(bytes).toString('latin1');
  if (bytes.length === PERFTEST_KEY_SIZE_GID) {
    const m = KEY_GID_RE.exec(text);
    if (!m) return new OobError('ERR_OOB_MALFORMED', `not a perftest key message with GID ("%04x:%04x:%06x:%06x:%08x:%016llx:" + 16 × "%02x:" + "%08x:\\0"): ${printable(bytes, 120)}`);
    return {
      lid: parseInt(m[1] ?? '', 16), outReads: parseInt(m[2] ?? '', 16), qpn: parseInt(m[3] ?? '', 16),
      psn: parseInt(m[4] ?? '', 16), rkey: parseInt(m[5] ?? '', 16), vaddr: BigInt('0x' + (m[6] ?? '0')),
      gid: new Uint8Array(Buffer.from((m[7] ?? '').replaceAll(':', ''), 'hex')), srqn: parseInt(m[8] ?? '', 16),
    };
  }
  if (bytes.length === PERFTEST_KEY_SIZE) {
    const m = KEY_RE.exec(text);
    if (!m) return new OobError('ERR_OOB_MALFORMED', `not a perftest key message ("%04x:%04x:%06x:%06x:%08x:%016llx:%08x\\0"): ${printable(bytes, 120)}`);
    return {
      lid: parseInt(m[1] ?? '', 16), outReads: parseInt(m[2] ?? '', 16), qpn: parseInt(m[3] ?? '', 16),
      psn: parseInt(m[4] ?? '', 16), rkey: parseInt(m[5] ?? '', 16), vaddr: BigInt('0x' + (m[6] ?? '0')),
      srqn: parseInt(m[7] ?? '', 16),
    };
  }
  return new OobError('ERR_OOB_MALFORMED', `a perftest key message has ${PERFTEST_KEY_SIZE_GID} bytes (with GID) or ${PERFTEST_KEY_SIZE} (without), this one ${bytes.length}: ${printable(bytes, 120)}`);
}

/** user_param.version: the version string in a NUL-padded char[16]. */
export function formatPerftestVersion(version: string = PERFTEST_VERSION): Buffer {
  const b = Buffer.alloc(PERFTEST_VERSION_SIZE);
  if (Buffer.byteLength(version, 'latin1') > PERFTEST_VERSION_SIZE - 1) throw new RangeError(`version '${version}' is longer than 15 bytes`);
  b.write(version, 'latin1');
  return b;
}

/** The peer's version string, and its value as atof() reads it. */
export function parsePerftestVersion(bytes: Uint8Array): { version: string; value: number } | OobError {
  if (bytes.length !== PERFTEST_VERSION_SIZE) return new OobError('ERR_OOB_MALFORMED', `a perftest version field has 16 bytes, this one ${bytes.length}`);
  const nul = bytes.indexOf(0);
  const version = Buffer.from(bytes.subarray(0, nul < 0 ? bytes.length : nul)).toString('latin1');
  const m = /^\s*[+-]?(\d+(\.\d*)?|\.\d+)/.exec(version);
  if (!m || !/^[\x20-\x7e]*$/.test(version)) return new OobError('ERR_OOB_MALFORMED', `not a perftest version string: ${printable(bytes)}`);
  return { version, value: Number(m[0]) };
}

/** check_mtu's field: the ibv_mtu enum as "%d", first 2 bytes of the char buffer. */
export function formatPerftestMtu(mtu: IbvMtu): Buffer {
  return Buffer.from(`${mtu}\0`, 'latin1');
}

export function parsePerftestMtu(bytes: Uint8Array): IbvMtu | OobError {
  const text = Buffer.from(bytes).toString('latin1');
  const m = /^([1-5])\x00$/.exec(text);
  if (!m) return new OobError('ERR_OOB_MALFORMED', `not a perftest MTU field ("%d" of ibv_mtu 1..5 in 2 bytes): ${printable(bytes)}`);
  return Number(m[1]) as IbvMtu;
}

export function formatInt32(v: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeInt32BE(v);
  return b;
}

/** The five 8-byte fields xchg_bw_reports sends, concatenated (40 bytes). */
export function formatPerftestBwReport(r: PerftestBwReport): Buffer {
  const b = Buffer.alloc(40);
  b.writeBigUInt64BE(BigInt.asUintN(64, r.size), 0);
  b.writeBigUInt64BE(BigInt.asUintN(64, r.iters), 8);
  b.writeDoubleBE(r.bwPeak, 16);
  b.writeDoubleBE(r.bwAvg, 24);
  b.writeDoubleBE(r.msgRateAvg, 32);
  return b;
}

export function parsePerftestBwReport(bytes: Uint8Array): PerftestBwReport | OobError {
  if (bytes.length !== 40) return new OobError('ERR_OOB_MALFORMED', `a perftest bw report has 40 bytes (5 × 8), this one ${bytes.length}`);
  const b = Buffer.from(bytes);
  return {
    size: b.readBigUInt64BE(0), iters: b.readBigUInt64BE(8),
    bwPeak: b.readDoubleBE(16), bwAvg: b.readDoubleBE(24), msgRateAvg: b.readDoubleBE(32),
  };
}

// ---------------------------------------------------------------------------------------------
// The exchange

export interface PerftestNegotiated {
  /** The peer's version string ("6.06"). */
  remoteVersion: string;
  /** max(ours, theirs): the ring size of the test buffer. */
  cycleBuffer: number;
  /** max(ours, theirs). */
  cacheLineSize: number;
  /** The peer's port MTU. */
  remoteMtu: IbvMtu;
  /** min(ours, theirs): the path MTU both sides use. */
  mtu: IbvMtu;
}

export type PerftestLocalKeys =
  | PerftestKey
  | PerftestKey[]
  | ((negotiated: PerftestNegotiated) => PerftestKey | PerftestKey[] | Promise<PerftestKey | PerftestKey[]>);

export interface PerftestExchangeOptions {
  verb: PerftestVerb;
  /**
   * Our key message(s), one per QP, or a function that makes them once the parameters are
   * negotiated (perftest creates its buffers and QPs at that point).
   */
  local: PerftestLocalKeys;
  /** Our port MTU (ibv_mtu enum) or the -m value. Default 3 (1024). */
  mtu?: IbvMtu;
  /** Default 4096. */
  cycleBuffer?: number;
  /** Default 64. */
  cacheLineSize?: number;
  /** Default "6.06". */
  version?: string;
  /** Bound on every read up to the start of the test. Default 10000 ms. */
  stepTimeoutMs?: number;
  /** Bound on the peer's first post-test message (it may still be running). Default 120000 ms. */
  runTimeoutMs?: number;
}

export interface PerftestClientOptions extends PerftestExchangeOptions {
  /** Keep retrying while the server does not listen yet. Default 5000 ms. */
  connectTimeoutMs?: number;
  retryDelayMs?: number;
}

export interface PerftestServerOptions extends PerftestExchangeOptions {
  /** Listen address when given a port. Default "0.0.0.0" (perftest's server: AF_INET, AI_PASSIVE). */
  host?: string;
  /** Bound on waiting for the client. Default 60000 ms. */
  acceptTimeoutMs?: number;
  onListening?: (address: net.AddressInfo) => void;
}

export interface PerftestSession extends PerftestNegotiated {
  readonly role: 'client' | 'server';
  readonly verb: PerftestVerb;
  readonly local: readonly PerftestKey[];
  /** The peer's key message per QP (from the first hand shake). */
  readonly remote: readonly PerftestKey[];
  readonly peerAddress: string;
  readonly peerPort: number;
  /**
   * The hand shakes between connecting the QPs and the test: call once our QPs are RTS
   * (and, for send, our receives are posted). When it resolves, the test may start.
   */
  ready(): Promise<void>;
  /**
   * After the test: for write/read/atomic a hand shake and the reports (ours is sent, zeros
   * when omitted), then the closing hand shake and our "done" (the peer's is not read, as
   * perftest reads none). Resolves with the peer's report (write/read/atomic).
   */
  finish(report?: PerftestBwReport): Promise<PerftestBwReport | undefined>;
  /**
   * One more key hand shake on QP `qp`, outside ready()/finish(): for callers that stop the
   * sequence part way (the peer then fails its next read and exits).
   */
  handShake(qp?: number): Promise<void>;
  /** Drop the connection (on error paths). */
  close(): void;
}

const ZERO_REPORT: PerftestBwReport = { size: 0n, iters: 0n, bwPeak: 0, bwAvg: 0, msgRateAvg: 0 };

class Session implements PerftestSession {
  readonly peerAddress: string;
  readonly peerPort: number;
  remoteVersion = '';
  cycleBuffer = 0;
  cacheLineSize = 0;
  remoteMtu: IbvMtu = 3;
  mtu: IbvMtu = 3;
  local: PerftestKey[] = [];
  remote: PerftestKey[] = [];
  private localMsgs: Buffer[] = [];
  private remoteMsgs: Buffer[] = [];
  private readonly reader: SocketReader;
  private readonly peer: string;
  private stage: 'new' | 'keys' | 'ready' | 'finished' | 'failed' = 'new';
  private handshakes = 0;

  constructor(readonly role: 'client' | 'server', private readonly socket: net.Socket, private readonly opts: PerftestExchangeOptions) {
    this.verb = opts.verb;
    this.peerAddress = socket.remoteAddress ?? '?';
    this.peerPort = socket.remotePort ?? 0;
    this.peer = `perftest ${role === 'client' ? 'server' : 'client'} ${endpoint(this.peerAddress, this.peerPort)}`;
    this.reader = new SocketReader(socket, this.peer);
  }

  readonly verb: PerftestVerb;

  private get stepTimeout(): number {
    return this.opts.stepTimeoutMs ?? 10_000;
  }

  /** One ctx_xchg_data step: client writes then reads, server reads then writes. */
  private async xchg(mine: Buffer, read: () => Promise<Buffer>, what: string): Promise<Buffer> {
    if (this.role === 'client') {
      await writeAll(this.socket, mine, this.peer, what);
      return read();
    }
    const theirs = await read();
    await writeAll(this.socket, mine, this.peer, what);
    return theirs;
  }

  private fixed(n: number, what: string, timeout = this.stepTimeout): () => Promise<Buffer> {
    return () => this.reader.readExact(n, timeout, what);
  }

  private fail(e: unknown): never {
    this.stage = 'failed';
    this.close();
    if (e instanceof OobError && !e.message.startsWith(this.peer)) throw new OobError(e.code, `${this.peer}: ${e.message}`);
    throw e;
  }

  async start(): Promise<void> {
    try {
      // 1. versions
      const v = parsePerftestVersion(await this.xchg(formatPerftestVersion(this.opts.version ?? PERFTEST_VERSION),
        this.fixed(PERFTEST_VERSION_SIZE, 'version (16 bytes)'), 'our version'));
      if (v instanceof OobError) throw v;
      this.remoteVersion = v.version;
      if (!(v.value >= PERFTEST_MIN_VERSION)) {
        throw new OobError('ERR_OOB_MISMATCH', `peer perftest version '${v.version}' is older than 5.70, which perftest 6.06 (and we) do not talk to`);
      }
      // 2. page size and cache line
      const ourCycle = this.opts.cycleBuffer ?? PERFTEST_DEFAULT_CYCLE_BUFFER;
      const ourLine = this.opts.cacheLineSize ?? PERFTEST_DEFAULT_CACHE_LINE;
      const cyc = (await this.xchg(formatInt32(ourCycle), this.fixed(4, 'cycle buffer size (4 bytes)'), 'our cycle buffer size')).readInt32BE(0);
      const line = (await this.xchg(formatInt32(ourLine), this.fixed(4, 'cache line size (4 bytes)'), 'our cache line size')).readInt32BE(0);
      if (cyc <= 0 || cyc > 1 << 30 || line <= 0 || line > 1 << 20) {
        throw new OobError('ERR_OOB_MALFORMED', `implausible page/cache line sizes from the peer: ${cyc}, ${line}`);
      }
      this.cycleBuffer = Math.max(ourCycle, cyc);
      this.cacheLineSize = Math.max(ourLine, line);
      // 3. MTU
      const ourMtu = this.opts.mtu ?? 3;
      const rm = parsePerftestMtu(await this.xchg(formatPerftestMtu(ourMtu), this.fixed(2, 'MTU (2 bytes)'), 'our MTU'));
      if (rm instanceof OobError) throw rm;
      this.remoteMtu = rm;
      this.mtu = Math.min(ourMtu, rm) as IbvMtu;
      // 4. keys, once per QP
      const local = typeof this.opts.local === 'function' ? await this.opts.local(this.negotiated()) : this.opts.local;
      this.local = Array.isArray(local) ? [...local] : [local];
      if (this.local.length === 0) throw new RangeError('at least one local key (one per QP) is needed');
      this.localMsgs = this.local.map(formatPerftestKey);
      const size = this.localMsgs[0]?.length ?? 0;
      if (this.localMsgs.some((m) => m.length !== size)) throw new RangeError('all local keys must have a GID, or none');
      for (let i = 0; i < this.local.length; i++) {
        const raw = await this.xchg(this.localMsgs[i] as Buffer, () => this.readKey(), 'our keys');
        const key = this.parseKey(raw);
        this.remoteMsgs.push(raw);
        this.remote.push(key);
      }
      this.checkPeer();
      this.stage = 'keys';
    } catch (e) {
      this.fail(e);
    }
  }

  private negotiated(): PerftestNegotiated {
    return { remoteVersion: this.remoteVersion, cycleBuffer: this.cycleBuffer, cacheLineSize: this.cacheLineSize, remoteMtu: this.remoteMtu, mtu: this.mtu };
  }

  /** A key message: a C string of 59 or 108 bytes; a different length is a GID mismatch. */
  private async readKey(timeout = this.stepTimeout): Promise<Buffer> {
    const want = this.localMsgs[0]?.length ?? PERFTEST_KEY_SIZE_GID;
    const raw = await this.reader.readCString(PERFTEST_KEY_SIZE_GID, timeout, `key message (${want} bytes)`);
    if (raw.length !== want && raw[raw.length - 1] === 0 && (raw.length === PERFTEST_KEY_SIZE || raw.length === PERFTEST_KEY_SIZE_GID)) {
      throw new OobError('ERR_OOB_MISMATCH', raw.length === PERFTEST_KEY_SIZE
        ? `peer sent its keys without a GID (${PERFTEST_KEY_SIZE}-byte message, an InfiniBand run without -x); ours carry a GID, as RoCE needs`
        : `peer sent its keys with a GID (${PERFTEST_KEY_SIZE_GID}-byte message); ours have none`);
    }
    if (raw.length !== want) {
      throw new OobError('ERR_OOB_MALFORMED', `expected a ${want}-byte key message, got ${raw.length} byte(s): ${printable(raw, 120)}`);
    }
    return raw;
  }

  private parseKey(raw: Buffer): PerftestKey {
    const k = parsePerftestKey(raw);
    if (k instanceof OobError) throw k;
    return k;
  }

  /** What can be told from the first keys about the peer's test. */
  private checkPeer(): void {
    const mine = this.local[0] as PerftestKey;
    const theirs = this.remote[0] as PerftestKey;
    if (mine.gid && theirs.gid && isV4MappedGid(mine.gid) !== isV4MappedGid(theirs.gid)) {
      throw new OobError('ERR_OOB_MISMATCH', `GID types differ (ours ${isV4MappedGid(mine.gid) ? 'IPv4' : 'IPv6'}, the peer's ${isV4MappedGid(theirs.gid) ? 'IPv4' : 'IPv6'}): "Found Incompatibility issue with GID types. Please Try to use a different IP version."`);
    }
    const rdma = this.verb !== 'send';
    if ((this.verb === 'write' || this.verb === 'send') && theirs.outReads !== 1) {
      throw new OobError('ERR_OOB_MISMATCH', `peer announces ${theirs.outReads} outstanding reads: it runs ib_read_bw or ib_atomic_bw, not ib_${this.verb}_bw`);
    }
    if (rdma && theirs.rkey === 0) {
      throw new OobError('ERR_OOB_MISMATCH', `peer offers no remote access (rkey 0): it runs ib_send_bw, not ib_${this.verb}_bw`);
    }
  }

  /** A later hand shake: the same key message again; anything else means the peers disagree. */
  async handShake(qp = 0, what = 'an extra hand shake', timeout = this.stepTimeout): Promise<void> {
    const raw = await this.xchg(this.localMsgs[qp] as Buffer, () => this.readKey(timeout), 'our keys');
    this.handshakes++;
    const first = this.remoteMsgs[qp] as Buffer;
    if (!raw.equals(first)) {
      const k = parsePerftestKey(raw);
      const f = this.remote[qp] as PerftestKey;
      if (!(k instanceof OobError) && k.qpn !== f.qpn) {
        throw new OobError('ERR_OOB_MISMATCH', `peer's key message changed between hand shakes (QPN 0x${f.qpn.toString(16)}, then 0x${k.qpn.toString(16)} at ${what}): it runs with a different number of QPs (-q) than our ${this.local.length}`);
      }
      throw new OobError('ERR_OOB_MALFORMED', `peer's key message at ${what} differs from its first one: ${printable(raw, 120)}`);
    }
  }

  async ready(): Promise<void> {
    if (this.stage !== 'keys') throw new Error(`ready() after the key exchange only (stage: ${this.stage})`);
    try {
      const n = this.local.length;
      if (this.verb === 'send') {
        await this.handShake(0, 'the hand shake after connecting');
        for (let i = 0; i < n; i++) await this.handShake(i, 'the remote-address hand shake');
        await this.handShake(0, 'the hand shake before the test');
      } else {
        for (let i = 0; i < n; i++) await this.handShake(i, 'the remote-address hand shake');
        await this.handShake(0, 'the hand shake after RTR');
      }
      this.stage = 'ready';
    } catch (e) {
      this.fail(e);
    }
  }

  async finish(report?: PerftestBwReport): Promise<PerftestBwReport | undefined> {
    if (this.stage !== 'ready') throw new Error(`finish() after ready() only (stage: ${this.stage})`);
    const runTimeout = this.opts.runTimeoutMs ?? 120_000;
    try {
      let remote: PerftestBwReport | undefined;
      if (this.verb !== 'send') {
        // The server waits here for the client to finish its test.
        await this.handShake(0, 'the hand shake after the test', runTimeout);
        const mine = formatPerftestBwReport(report ?? ZERO_REPORT);
        const got: Buffer[] = [];
        for (let i = 0; i < 5; i++) {
          const field = await this.xchg(mine.subarray(i * 8, i * 8 + 8), async () => {
            const b = await this.reader.readExact(8, this.stepTimeout, `report field ${i + 1} of 5 (8 bytes)`);
            if (i === 0 && /^[0-9a-f]{4}:[0-9a-f]{3}$/.test(b.toString('latin1'))) {
              throw new OobError('ERR_OOB_MISMATCH', 'peer sent a key message where its bandwidth report was due: it runs ib_send_bw, not ib_write/read/atomic_bw');
            }
            return b;
          }, 'our report');
          got.push(field);
        }
        const r = parsePerftestBwReport(Buffer.concat(got));
        if (r instanceof OobError) throw r;
        remote = r;
      }
      // ctx_close_connection: a hand shake (for send, the server waits in it for the client
      // to finish), then each side writes "done" and closes without reading the other's. The
      // hand shake is the last word: once it is through, the peer has ours, so a "done" that
      // cannot be sent (the peer closed first) fails nothing, as in perftest, and theirs is
      // not waited for (it may come late, or never).
      await this.sendSensitive(() => this.handShake(0, 'the closing hand shake', this.verb === 'send' ? runTimeout : this.stepTimeout));
      await writeAll(this.socket, PERFTEST_DONE, this.peer, '"done"').catch(() => undefined);
      this.stage = 'finished';
      this.close();
      return remote;
    } catch (e) {
      this.fail(e);
    }
  }

  /** For send, bytes other than keys after the test mean a write/read/atomic peer (its report). */
  private async sendSensitive(step: () => Promise<void>): Promise<void> {
    try {
      await step();
    } catch (e) {
      if (this.verb === 'send' && e instanceof OobError && e.code === 'ERR_OOB_MALFORMED') {
        throw new OobError('ERR_OOB_MISMATCH', `peer sent something other than its keys after the test, where ib_send_bw sends them (${e.message}): it runs ib_write/read/atomic_bw, not ib_send_bw`);
      }
      throw e;
    }
  }

  close(): void {
    this.socket.end();
    this.socket.destroySoon();
  }
}

/**
 * The client side (perftest's client connects over IPv4): connect (retrying while nothing
 * listens, bounded), versions, sizes, MTU, keys. The returned session carries the peer's
 * keys and the negotiated values; call ready() once the QPs are connected, finish() after
 * the test.
 */
export async function perftestClientExchange(host: string, port: number, opts: PerftestClientOptions): Promise<PerftestSession> {
  const c: ConnectOptions = { timeoutMs: opts.connectTimeoutMs ?? 5000, what: 'perftest server' };
  if (opts.retryDelayMs !== undefined) c.retryDelayMs = opts.retryDelayMs;
  const socket = await connectWithRetry(host, port, c);
  const s = new Session('client', socket, opts);
  await s.start();
  return s;
}

/** The server side, on a port (listen on 0.0.0.0, accept one client) or an accepted socket. */
export async function perftestServerExchange(socketOrPort: net.Socket | number, opts: PerftestServerOptions): Promise<PerftestSession> {
  let socket: net.Socket;
  if (typeof socketOrPort === 'number') {
    const l: Parameters<typeof acceptOne>[2] = { what: 'perftest client', acceptTimeoutMs: opts.acceptTimeoutMs ?? 60_000 };
    if (opts.onListening) l.onListening = opts.onListening;
    socket = await acceptOne(socketOrPort, opts.host ?? '0.0.0.0', l);
  } else {
    socket = socketOrPort;
  }
  const s = new Session('server', socket, opts);
  await s.start();
  return s;
}

/**
 * Exchanges: how the prober sets up a session with a peer and learns what it may do there.
 *
 * - `pingpong`: the peer is an `ibv_rc_pingpong` server. We learn its QPN and PSN and tell it
 *   ours; it has receives posted and answers each of our SENDs with one of its own. No memory.
 * - `perftest`: an `ib_write_bw` / `ib_read_bw` / `ib_atomic_bw` server. We learn QPN, PSN and
 *   the rkey/VA of its buffer; the QP allows exactly the tool's verb; no receives are posted.
 * - `perftest-reader`: the peer runs the `ib_read_bw` client against us (we play the server):
 *   it keeps RDMA READs of our pretend buffer outstanding, which the prober answers with zeros
 *   (the implied-NAK case needs a peer that reads); its own buffer allows READ.
 * - `roce`: our own `roce serve`, through the transfer protocol's `probe` request
 *   (src/app/probe.ts): memory with all rights plus a read-only region, receives, echo, and
 *   variants on request (no receives, restricted QP access, a READ from the server to us).
 *
 * A session says what it offers; a case whose precondition is missing is reported
 * `not-applicable` with the reason.
 */

import net from 'node:net';
import { Channel, DEFAULT_OOB_PORT, PROTOCOL_VERSION, RefusedError, type ProbeRegion } from '../app/protocol.js';
import { pingpongClientExchange, PINGPONG_DEFAULT_PORT } from '../oob/pingpong.js';
import { perftestClientExchange, perftestServerExchange, PERFTEST_DEFAULT_PORT, mtuFromEnum, type PerftestSession, type PerftestVerb } from '../oob/perftest.js';
import { gidFromIp, parseIpAddress } from '../wire/frame.js';
import { gidToString } from '../oob/common.js';

export type Access = 'read' | 'write' | 'atomic';

export interface MemoryInfo {
  rkey: number;
  va: bigint;
  /** Bytes known to be inside the region. */
  length: number;
  /** True when `length` is the exact region length (out-of-bounds cases can aim just past it). */
  exactLength: boolean;
}

export interface PeerSession {
  exchange: string;
  peerQpn: number;
  /** The peer's initial send PSN. */
  peerPsn: number;
  /** Our initial send PSN (the peer's rq_psn). */
  ourPsn: number;
  mtu: number;
  /** Operations the peer's QP allows (its qp_access_flags). */
  access: Access[];
  memory?: MemoryInfo;
  /** A region registered without remote write (roce exchange only). */
  readOnlyMemory?: MemoryInfo;
  /** The same memory is offered again after a reconnect (so a later READ can check it). */
  memoryPersists?: boolean;
  /** Receives are posted: SENDs are accepted. */
  recvPosted: boolean;
  /** The peer answers each received SEND with a SEND of its own. */
  echoes: boolean;
  /** The peer's retry_cnt and timeout attributes, when known. */
  retryCnt?: number;
  timeout?: number;
  /** The peer keeps RDMA READs of our (pretend) memory outstanding on its own (a perftest READ client). */
  readsOnItsOwn?: boolean;
  /** The peer's UDP port, when the exchange tells it (the prober sends there). */
  peerUdpPort?: number;
  /** Ask the peer to post an RDMA READ (of our fake memory) followed by a SEND; roce only. */
  readThenSend?(rkey: number, va: bigint, length: number): Promise<void>;
  close(): Promise<void>;
}

/** Variants a case may ask for; an exchange that cannot honour one says why. */
export interface SessionVariant {
  /** Our initial PSN (every exchange can: we choose it). */
  ourPsn?: number;
  noRecv?: boolean;
  access?: Access[];
}

export interface Exchange {
  readonly name: string;
  /** Why this exchange cannot give that variant, or undefined when it can. */
  cannot(v: SessionVariant): string | undefined;
  connect(ourQpn: number, ourAddress: string, v: SessionVariant): Promise<PeerSession>;
  /** Called before a reconnect when the peer's QP is gone (e.g. restart the tool). */
  restart?(reason: string): Promise<void>;
}

const randomPsn = (): number => Math.floor(Math.random() * 0xffffff);

function gidOfAddress(address: string): Uint8Array {
  const ip = parseIpAddress(address);
  if (!ip) throw new Error(`not an IP address: ${address}`);
  return gidFromIp(ip);
}

export interface PingpongExchangeOptions {
  host: string;
  port?: number;
  connectTimeoutMs?: number;
  restart?: (reason: string) => Promise<void>;
  /** The server's retry_cnt and timeout; default ibv_rc_pingpong's 7 and 14. */
  retryCnt?: number;
  timeout?: number;
}

export function pingpongExchange(o: PingpongExchangeOptions): Exchange {
  return {
    name: 'pingpong',
    cannot: (v) => (v.noRecv ? 'ibv_rc_pingpong keeps its receive queue full (rx_depth 500, refilled)' :
      v.access ? 'ibv_rc_pingpong registers no memory for remote access' : undefined),
    async connect(ourQpn, ourAddress, v) {
      const ourPsn = v.ourPsn ?? randomPsn();
      const r = await pingpongClientExchange(o.host, o.port ?? PINGPONG_DEFAULT_PORT, { lid: 0, qpn: ourQpn, psn: ourPsn, gid: gidOfAddress(ourAddress) },
        { connectTimeoutMs: o.connectTimeoutMs ?? 10_000 });
      return {
        exchange: 'pingpong', peerQpn: r.remote.qpn, peerPsn: r.remote.psn, ourPsn, mtu: 1024, access: [], recvPosted: true, echoes: true,
        // ibv_rc_pingpong: timeout 14, retry_cnt 7, rnr_retry 7.
        retryCnt: o.retryCnt ?? 7, timeout: o.timeout ?? 14,
        close: async () => undefined,
      };
    },
    ...(o.restart ? { restart: o.restart } : {}),
  };
}

export interface PerftestExchangeOptions {
  host: string;
  port?: number;
  verb: Exclude<PerftestVerb, 'send'>;
  connectTimeoutMs?: number;
  restart?: (reason: string) => Promise<void>;
  /** The -s size the server was started with (its buffer holds at least this much). Default 4096. */
  size?: number;
}

export function perftestExchange(o: PerftestExchangeOptions): Exchange {
  const access: Access[] = [o.verb];
  return {
    name: `perftest-${o.verb}`,
    cannot: (v) => (v.access && v.access.some((a) => !access.includes(a)) ? `the ib_${o.verb}_bw server's QP allows ${o.verb} only` : undefined),
    async connect(ourQpn, ourAddress, v) {
      const ourPsn = v.ourPsn ?? randomPsn();
      const s: PerftestSession = await perftestClientExchange(o.host, o.port ?? PERFTEST_DEFAULT_PORT, {
        verb: o.verb, mtu: 3, connectTimeoutMs: o.connectTimeoutMs ?? 10_000,
        local: { lid: 0, outReads: o.verb === 'write' ? 1 : 16, qpn: ourQpn, psn: ourPsn, rkey: 0x1234, vaddr: 0x10000n, gid: gidOfAddress(ourAddress), srqn: 0 },
      });
      await s.ready();
      const k = s.remote[0]!;
      return {
        exchange: `perftest-${o.verb}`, peerQpn: k.qpn, peerPsn: k.psn, ourPsn, mtu: mtuFromEnum(s.mtu), access,
        memory: { rkey: k.rkey, va: k.vaddr, length: o.size ?? 4096, exactLength: false },
        recvPosted: false, echoes: false, retryCnt: 7, timeout: 14,
        close: async () => {
          // Leaving mid-sequence makes the tool fail its next read and exit.
          s.close();
        },
      };
    },
    ...(o.restart ? { restart: o.restart } : {}),
  };
}

export interface PerftestReaderExchangeOptions {
  /** Our address, where the client connects (its server argument). */
  listen: string;
  port?: number;
  /** Starts the client tool once we listen (the harness runs `ib_read_bw … OUR-ADDRESS`). */
  startPeer?: (reason: string) => Promise<void>;
  acceptTimeoutMs?: number;
  /** The -s size the client runs with (its buffer holds at least this much). Default 8. */
  size?: number;
}

/** Our pretend buffer: the client READs it, the prober answers with zeros. */
const READER_RKEY = 0x1234;
const READER_VA = 0x10000n;

export function perftestReaderExchange(o: PerftestReaderExchangeOptions): Exchange {
  return {
    name: 'perftest-reader',
    cannot: (v) => (v.access ? 'the ib_read_bw client\'s QP allows READ only' : undefined),
    async connect(ourQpn, ourAddress, v) {
      const ourPsn = v.ourPsn ?? randomPsn();
      const server = net.createServer();
      const accepted = new Promise<net.Socket>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`no perftest client connected within ${o.acceptTimeoutMs ?? 30_000} ms`)), o.acceptTimeoutMs ?? 30_000);
        server.once('connection', (sock) => {
          clearTimeout(timer);
          resolve(sock);
        });
        server.once('error', (e) => {
          clearTimeout(timer);
          reject(e);
        });
      });
      await new Promise<void>((resolve, reject) => {
        server.once('error', reject);
        server.listen({ host: o.listen, port: o.port ?? PERFTEST_DEFAULT_PORT, exclusive: true }, () => resolve());
      });
      try {
        await o.startPeer?.('the perftest client is to connect to us');
        const sock = await accepted;
        const s = await perftestServerExchange(sock, {
          verb: 'read', mtu: 3,
          local: { lid: 0, outReads: 16, qpn: ourQpn, psn: ourPsn, rkey: READER_RKEY, vaddr: READER_VA, gid: gidOfAddress(ourAddress), srqn: 0 },
        });
        await s.ready();
        const k = s.remote[0]!;
        return {
          exchange: 'perftest-reader', peerQpn: k.qpn, peerPsn: k.psn, ourPsn, mtu: mtuFromEnum(s.mtu), access: ['read'],
          memory: { rkey: k.rkey, va: k.vaddr, length: o.size ?? 8, exactLength: false },
          recvPosted: false, echoes: false, readsOnItsOwn: true, retryCnt: 7, timeout: 14,
          close: async () => {
            s.close();
          },
        };
      } finally {
        server.close();
      }
    },
  };
}

// --- `roce serve` (the file-transfer server) as a target ---------------------------------------

export interface RoceExchangeOptions {
  host: string;
  /** The server's out-of-band TCP port. Default 18515. */
  port?: number;
  /** Our UDP port (the server answers there), or how to learn it once bound. Default 4791. */
  udpPort?: number | (() => number);
  /**
   * retry_cnt and timeout for the server's probe QP. Default 3 (7 would mean "forever" to our
   * engine, as to rxe) and 14 (~67 ms, ibv_rc_pingpong's: long enough that an implied-NAK
   * retransmission is told apart from a timeout one on a loaded machine).
   */
  retryCnt?: number;
  timeout?: number;
  connectTimeoutMs?: number;
}

/**
 * Our own server: the transfer protocol's hello, then a `probe` request (src/app/probe.ts) for a
 * QP with the receives and rights the variant asks for. Everything a case may want is on offer.
 */
export function roceExchange(o: RoceExchangeOptions): Exchange {
  const timeoutMs = o.connectTimeoutMs ?? 10_000;
  return {
    name: 'roce',
    cannot: () => undefined,
    async connect(ourQpn, ourAddress, v) {
      const ourPsn = v.ourPsn ?? randomPsn();
      const udpPort = typeof o.udpPort === 'function' ? o.udpPort() : o.udpPort ?? 4791;
      const socket = await new Promise<net.Socket>((resolve, reject) => {
        const s = net.connect({ host: o.host, port: o.port ?? DEFAULT_OOB_PORT });
        const timer = setTimeout(() => {
          s.destroy();
          reject(new Error(`roce serve at ${o.host}:${o.port ?? DEFAULT_OOB_PORT} did not accept within ${timeoutMs} ms`));
        }, timeoutMs);
        s.once('connect', () => {
          clearTimeout(timer);
          resolve(s);
        });
        s.once('error', (e) => {
          clearTimeout(timer);
          reject(e);
        });
      });
      const ch = new Channel(socket, 'roce serve');
      const mtu = 1024;
      try {
        ch.send({ type: 'hello', v: PROTOCOL_VERSION, qpn: ourQpn, psn: ourPsn, gid: gidToString(gidOfAddress(ourAddress)), address: ourAddress, port: udpPort, mtu });
        await ch.expect('hello', timeoutMs);
        ch.send({
          type: 'probe', qpn: ourQpn, psn: ourPsn, address: ourAddress, port: udpPort, mtu, recvs: v.noRecv ? 0 : 64,
          access: v.access ?? ['read', 'write', 'atomic'], retryCnt: o.retryCnt ?? 3, timeout: o.timeout ?? 14,
        });
        const r = await ch.expect('probed', timeoutMs);
        const mem = (m: ProbeRegion): MemoryInfo => ({ rkey: m.rkey, va: BigInt('0x' + m.va), length: m.length, exactLength: true });
        return {
          exchange: 'roce', peerQpn: r.qpn, peerPsn: r.psn, ourPsn, mtu: r.mtu, access: r.access, memory: mem(r.mem), readOnlyMemory: mem(r.ro),
          memoryPersists: true, recvPosted: r.recvs > 0, echoes: r.recvs > 0, retryCnt: r.retryCnt, timeout: r.timeout, peerUdpPort: r.port,
          readThenSend: async (rkey, va, length) => {
            ch.send({ type: 'probe-read', rkey, va: va.toString(16), length });
            await ch.expect('probe-posted', timeoutMs);
          },
          close: async () => {
            ch.close();
          },
        };
      } catch (e) {
        ch.close();
        socket.destroy();
        throw e instanceof RefusedError ? new Error(`roce serve refused the probe: ${e.message}`) : e;
      }
    },
  };
}

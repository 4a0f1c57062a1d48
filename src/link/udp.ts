/**
 * `UdpLink`: RoCEv2 over the host's UDP stack through `node:dgram`, port 4791.
 *
 * Read first: `docs/rxe-lab.md` ("Step 7", the IP ID table, "IPv6 facts", "What this means for the
 * stack's design") and `docs/perf-ceilings.md` (socket costs). The facts that shape this file:
 *
 * - IPv4, sending. The ICRC covers the IPv4 Identification and flags, which the kernel picks after
 *   we computed the ICRC. Only an *unconnected* socket with `IP_MTU_DISCOVER = IP_PMTUDISC_DO`
 *   sends a predictable header: ID 0 with DF. So every IPv4 socket gets that option (FFI, see
 *   `sockopt.ts`), the ICRC is computed for ID 0 / flags 0x4000, and `open` checks that it took
 *   effect: it reads the option back, and sends one probe to itself and looks at the probe's real
 *   IP header through a raw socket (when it may: CAP_NET_RAW), checking the ID, DF and the ICRC
 *   against that header, as a strict peer does. The probe cannot be judged from the UDP side: a
 *   receiving UDP socket recomputes the ICRC with the same assumed ID 0 the sender used, so it
 *   "recovers" ID 0 whatever the kernel put on the wire. The result is `ipIdZero`; a failure is
 *   warned loudly, since strict peers (rdma_rxe) would drop every packet.
 *   A connected socket would send faster but numbers its IDs from a random start: never connect.
 * - IPv4, receiving. The IP header is invisible to a UDP socket and peers' IDs change per packet,
 *   so the default check is `recover` (solve for the ID; ~15 bits of residual protection).
 * - IPv6. No ID, the variable fields are masked: the check is exact. But rdma_rxe sends UDP
 *   checksum 0, which Linux drops unless the socket has `UDP_NO_CHECK6_RX` (FFI again); `open`
 *   sets it, reads it back, and warns loudly when it is missing (`noCheck6Rx`).
 * - The source port. One bound socket has one source port, but rxe spreads flows over source
 *   ports (0xC000 | hash of the QPNs) for ECMP. `sourcePorts: 'per-flow'` opens extra sockets
 *   bound to the same address on the requested ports (same options), up to a cap; beyond it, or
 *   when a port cannot be bound, the bound socket is used and the fallback counted. The ICRC is
 *   always computed for the port actually used. The extra sockets receive as well (rxe answers
 *   to 4791, but a peer answering to our source port is heard).
 * - Size. DF is always set, so a datagram longer than the path MTU is refused by the kernel
 *   (EMSGSIZE): keep the RoCE path MTU below the interface MTU, as rxe does (1024 at MTU 1500).
 * - Buffers. By default `dgram` resolves the destination through `dns.lookup` even for a literal,
 *   which answers on a `process.nextTick`: the datagram would be read after `send` returned, so it
 *   could not be handed memory the caller reuses, and every datagram cost a fresh buffer (off-heap
 *   above 4 KiB) and a copy. Our sockets get a `lookup` that answers at once (`literalLookup`:
 *   every address that reaches a socket here was checked to be a literal), so `dgram` hands the
 *   datagram to libuv inside `send`, and `uv_udp_try_send` gives it to the kernel before `send`
 *   returns. The datagram is then gathered into a reused ring (`sendMode: 'ring'`, the default: one
 *   iovec, memory hot in cache), or sent as a scatter list (`'scatter'`: headers, pad and ICRC from
 *   the ring, payload parts of 512 bytes or more referenced where they are). Measured CPU per send
 *   (bench/README.md, "what mattered"): ring −17 % at 4 KiB against a fresh buffer, scatter only
 *   −8 % (dgram wraps every part in a Buffer and the kernel walks the iovecs), and worse than the
 *   fresh buffer at 1 KiB; hence the default.
 *   Two cases keep the datagram past the call: a send queue that is not empty (the kernel buffer was
 *   full; libuv sends when writable) and a flow socket not bound yet (dgram queues). Sends that find
 *   either take the old path, one fresh buffer `dgram` then owns. The one send that *starts* a queue
 *   (EAGAIN inside the call) keeps referring to its ring slice, which is not reused before that queue
 *   has drained, since every send in between takes the fresh path. In `scatter` mode that send also
 *   refers to its large parts, which must then stay unchanged until the queue drains: the engine's
 *   are registered memory (frozen until completion for RC; a UD or UC completion can come sooner,
 *   which is one more reason `ring` is the default).
 *   No send callback by default (~10 %): errors the kernel reports asynchronously are only counted
 *   with `reportSendErrors`.
 * - The batched path. All of the above describes `dgram`'s path, which stays for `batchIo: false`
 *   and where the FFI does not load. By default the datagrams go through `sendmmsg`/`recvmmsg` on
 *   the same sockets (`mmsg.ts`: why, and the rules it keeps — order, IP IDs of GSO trains, when a
 *   queue is flushed, how long a received datagram's memory is valid).
 */

import dgram, { type RemoteInfo, type Socket } from 'node:dgram';
import { once } from 'node:events';
import { randomBytes } from 'node:crypto';
import {
  checkIcrcOfIpDatagram, ICRC_BAD, ICRC_LEN, ICRC_UNCHECKED, icrcOfParts, icrcOfUdpPayload, IcrcFlowKey, Ipv4IcrcKey, Ipv6IcrcKey, MIN_ICRC_PAYLOAD, verified,
  verifyIcrc4, verifyIcrc6, receivedIpId, receivedVerdict, verifyReceived, writeIcrc,
  type IcrcMode, type IcrcStatus, type UdpDatagramInfo,
} from '../wire/icrc.js';
import { formatIpAddress, parseIpAddress } from '../wire/frame.js';
import { SystemClock, type Clock } from '../runtime/clock.js';
import { emptyDrops, type LinkCaps, type LinkDropReason, type LinkRxHandler, type PeerAddress, type RxMeta } from './link.js';
import type { RxHook, WireDatagram, WireLink } from './link.js';
import { addonWatch, pollWatch, RX_SLOT, RxRing, TxQueue, TxRing, type TxDest, type TxSeal } from './mmsg.js';
import {
  batchIoFfi,
  ffiStatus,
  IP_MTU_DISCOVER,
  IP_PMTUDISC_DO,
  IPPROTO_IP,
  openIpv4Observer,
  readSocketOption,
  setAndReadBack,
  setsockoptInt,
  socketFd,
  SOL_UDP,
  stopDgramReading,
  UDP_GRO,
  UDP_NO_CHECK6_RX,
  type BatchIoFfi,
  type SockoptResult,
} from './sockopt.js';

/** The RoCEv2 UDP destination port (IANA). */
export const ROCE_PORT = 4791;
/** Largest UDP payload of an IPv4 / IPv6 datagram. */
const MAX_UDP_PAYLOAD_V4 = 65507;
const MAX_UDP_PAYLOAD_V6 = 65527;
const BTH_LEN = 12;
/** `verifyIcrc`'s verdicts as `RxMeta` names them, by code. */
const ICRC_STATUS: readonly IcrcStatus[] = ['bad', 'ok', 'ok-recovered', 'unchecked'];
/** Parts shorter than this are copied into the send ring; longer ones are sent from where they are. */
const COPY_BELOW = 512;
/** Size of the send ring for small parts and ICRCs. */
const TX_SLAB_BYTES = 128 << 10;
/** Size of the batched path's send ring (`mmsg.ts`): every datagram queued in one task. */
const TX_RING_BYTES = 2 << 20;

/**
 * `dgram`'s `lookup` for addresses already known to be literals: answers synchronously, so that
 * `send` reaches the kernel before it returns (see the file comment). Node's own `dns.lookup`
 * returns a literal unchanged too, but on the next tick.
 */
function literalLookup(address: string, family: unknown, cb: (err: Error | null, address: string, family: number) => void): void {
  cb(null, address, typeof family === 'number' ? family : address.includes(':') ? 6 : 4);
}

export interface UdpLinkOptions {
  /** Local IPv4 or IPv6 address to bind (textual, no zone). The family follows from it. */
  address: string;
  /** Local UDP port. Default 4791. Tests may run several links on one host with other ports. */
  port?: number;
  /** How received ICRCs are judged. Default `recover` (IPv4 IDs are invisible); IPv6 is exact either way. */
  icrcVerify?: IcrcMode;
  /** Append an ICRC to what is sent. Default true. */
  icrcGenerate?: boolean;
  /** SO_RCVBUF to ask for, bytes. Default 8 MiB (the kernel caps it at net.core.rmem_max, then doubles it). */
  recvBufferBytes?: number;
  /** SO_SNDBUF to ask for, bytes. Default 4 MiB (capped at net.core.wmem_max, then doubled). */
  sendBufferBytes?: number;
  /** `bound`: every datagram leaves from `port`. `per-flow`: from the `srcPort` given to `send`. Default `bound`. */
  sourcePorts?: 'bound' | 'per-flow';
  /** `per-flow` only: most extra sockets to open. Default 64. */
  maxFlowSockets?: number;
  /** Largest UDP payload (ICRC included) `send` accepts. Default the UDP maximum for the family. */
  maxDatagram?: number;
  /**
   * How a datagram is handed to the kernel (see the file comment): `ring`, copied into one slice
   * of a reused ring (one iovec); `scatter`, headers and ICRC from the ring, large parts (payload
   * views) referenced where they are. Default `ring`.
   */
  sendMode?: 'ring' | 'scatter';
  /** Pass a completion callback to every send so that asynchronous kernel errors are counted. Default false. */
  reportSendErrors?: boolean;
  /**
   * Datagrams through `sendmmsg`/`recvmmsg` on the sockets (`mmsg.ts`), where the FFI loads; `dgram`
   * otherwise, or when false. Default true. `sendMode` and `reportSendErrors` apply to the `dgram` path.
   */
  batchIo?: boolean;
  /**
   * Batched path: consecutive datagrams of one size to one destination leave as one UDP GSO train,
   * segment `k` with IPv4 ID `k` and its ICRC computed for it (`mmsg.ts`). Strict peers that see the
   * IP header verify them; an IPv4 receiver on a UDP socket needs `icrcVerify: 'recover'` (the
   * default). Default: on for a loopback address only. Elsewhere a train crosses veths and bridges
   * as one large datagram until a device segments it, which is what a capture there shows.
   */
  gso?: boolean;
  /**
   * Batched path: the bound socket sets UDP_GRO, so that a train the kernel did not cut (a loopback
   * GSO train, or datagrams a device coalesced) is read as one message and cut into its datagrams
   * here: one copy out of the kernel for up to 64 datagrams. Default: on for a loopback address
   * only, and never with `icrcVerify: 'strict'` on IPv4 (a coalesced segment's IPv4 ID is not the
   * one strict mode assumes).
   */
  gro?: boolean;
  /**
   * Batched path: what reports the socket readable. `addon`, the native addon's watch
   * (`src/native/watch.c`), reads in the event loop's poll phase that found it readable; `poll`,
   * koffi's poll, reads in an immediate of the same turn (`mmsg.ts`, `pollWatch`). Default `addon`
   * where the addon is built.
   */
  watch?: 'addon' | 'poll';
  /**
   * Batched path: whose `sendmmsg` and `recvmmsg` it calls. `addon`, the native addon's
   * (`src/native/mmsg.c`), a plain N-API call; `koffi`, libc's through koffi, about 0.27 µs more per
   * call. Default `addon` where the addon is built.
   */
  calls?: 'addon' | 'koffi';
  /** `at` of received packets. Default a new SystemClock. */
  clock?: Clock;
  /** Where start-up problems are reported. Default `process.emitWarning` (type `RoceLinkWarning`), once per code. */
  warn?: (w: LinkWarning) => void;
  /** How long `open` waits for its IPv4 probe, ms. Default 1000. */
  probeTimeoutMs?: number;
}

export type LinkWarningCode =
  /** koffi or libc is missing: no socket options, see the other warnings for the consequences. */
  | 'ROCE_FFI_UNAVAILABLE'
  /** IPv4 packets do not leave with ID 0 + DF: strict peers drop everything this link sends. */
  | 'ROCE_IPV4_ID_NOT_ZERO'
  /** IPv6 socket without UDP_NO_CHECK6_RX: peers that send UDP checksum 0 (rxe) are never heard. */
  | 'ROCE_NO_CHECK6_RX';

export interface LinkWarning {
  code: LinkWarningCode;
  message: string;
}

/** What `open` found out about the sockets. */
export interface UdpLinkStartup {
  /** Whether the socket-option FFI (koffi + libc) loaded, and why not. */
  ffi: { ok: true } | { ok: false; message: string };
  /** IPv4: IP_MTU_DISCOVER as read back (2 = IP_PMTUDISC_DO); absent when it could not be read. */
  pmtuDiscover?: number;
  /**
   * IPv4: the probe sent to ourselves, observed with its real IP header through a raw socket.
   * `ok`: it left with ID 0 and DF and its ICRC checks against the real header, as a strict peer
   * checks it; `other-id`: it left with `probeIpId` (and/or without DF); `bad-icrc`: ID 0 and DF,
   * yet the ICRC does not match the real header; `timeout`: the observer never saw it;
   * `unverified`: no raw socket (it needs CAP_NET_RAW; `probeNote` says why), so only the
   * read-back vouches for the option. IPv6: `not-run`.
   *
   * (A probe received on the UDP socket itself would prove nothing: its ICRC implies the ID the
   * sender assumed, and the receiver recomputes it with the same assumption.)
   */
  probe: 'ok' | 'other-id' | 'bad-icrc' | 'timeout' | 'unverified' | 'not-run';
  probeIpId?: number;
  probeNote?: string;
  /**
   * IPv4: IP_MTU_DISCOVER reads back IP_PMTUDISC_DO and the probe did not contradict it (`ok` or
   * `unverified`). IPv6: true (the header has no ID).
   */
  ipIdZero: boolean;
  /** IPv6: UDP_NO_CHECK6_RX read back as 1. IPv4: absent. */
  noCheck6Rx?: boolean;
  /** Batched path: UDP_GRO is set on the bound socket and received trains are cut here (`gro`). */
  gro?: boolean;
  /** Batched path: what reports the socket readable (`watch`). */
  watch?: 'addon' | 'poll';
  /** Batched path: whose `sendmmsg` and `recvmmsg` it calls (`calls`). */
  calls?: 'addon' | 'koffi';
  /** SO_RCVBUF / SO_SNDBUF as the kernel reports them (twice the usable payload bytes, Linux). */
  recvBufferBytes: number;
  sendBufferBytes: number;
}

export interface UdpLinkCounters {
  sent: number;
  received: number;
  /** `per-flow`: extra sockets opened so far (including ones that failed to bind). */
  flowSockets: number;
  /** `per-flow`: datagrams that left from the bound port instead of the requested one. */
  flowFallbacks: number;
  /** `per-flow`: extra sockets on which IP_PMTUDISC_DO / UDP_NO_CHECK6_RX did not take. */
  flowOptionFailures: number;
  /** Batched path: datagrams the kernel would not take at once (EAGAIN), handed to `dgram`'s queue. */
  spilled: number;
  /** Batched path with `gro`: messages that arrived as a coalesced train and were cut here. */
  groTrains: number;
  /** Batched path: datagrams whose ICRC was checked with the rest of their chunk of a batch, in one native call. */
  batchChecked: number;
}

const DEFAULTS = {
  port: ROCE_PORT,
  icrcVerify: 'recover' as IcrcMode,
  icrcGenerate: true,
  recvBufferBytes: 8 << 20,
  sendBufferBytes: 4 << 20,
  sourcePorts: 'bound' as 'bound' | 'per-flow',
  maxFlowSockets: 64,
  reportSendErrors: false,
  sendMode: 'ring' as 'ring' | 'scatter',
  batchIo: true,
  probeTimeoutMs: 1000,
};

const warnedCodes = new Set<LinkWarningCode>();

function defaultWarn(w: LinkWarning): void {
  if (warnedCodes.has(w.code)) return;
  warnedCodes.add(w.code);
  process.emitWarning(w.message, { type: 'RoceLinkWarning', code: w.code });
}

interface FlowSocket {
  socket: Socket;
  state: 'binding' | 'bound' | 'failed';
  /** Sends issued while binding: dgram drops its queue if the bind fails. */
  queued: number;
}

/** RoCEv2 over node:dgram. Create with `await UdpLink.open(...)`. */
export class UdpLink implements WireLink {
  readonly caps: LinkCaps;
  readonly local: PeerAddress;
  readonly startup: UdpLinkStartup;
  readonly counters: UdpLinkCounters = { sent: 0, received: 0, flowSockets: 0, flowFallbacks: 0, flowOptionFailures: 0, spilled: 0, groTrains: 0, batchChecked: 0 };

  private readonly drop = emptyDrops();
  private readonly localAddr: Uint8Array;
  private readonly type: 'udp4' | 'udp6';
  private readonly flows = new Map<number, FlowSocket>();
  private readonly flowBySocket = new Map<Socket, FlowSocket>();
  private readonly addrCache = new Map<string, Uint8Array | null>();
  private readonly sendDone: ((err: Error | null) => void) | undefined;
  // One info record reused by every synchronous ICRC computation.
  private readonly info: UdpDatagramInfo;
  // The send ring for small parts and ICRCs, and the scatter list handed to dgram (which copies it).
  private readonly slab = Buffer.allocUnsafeSlow(TX_SLAB_BYTES);
  private slabAt = 0;
  private readonly iov: Uint8Array[] = [];
  private readonly sendMode: 'ring' | 'scatter';
  // The batched path (`mmsg.ts`): one send ring, a queue per socket, the main socket's reader.
  private readonly batch: BatchIoFfi | undefined;
  private txRing: TxRing | undefined;
  private readonly txQueues = new Map<Socket, TxQueue>();
  private rx: RxRing | undefined;
  private readonly txDests = new Map<string, TxDest>();
  private lastTxDest: TxDest | undefined;
  private batchEnd: ((last: boolean) => void) | undefined;
  /** Some datagram went through `dgram` (see `send`). */
  private dgramUsed = false;
  private readonly peers4 = new Map<number, PeerAddress>();
  /** The IPv4 peer of the last datagram read, and its address as a 32-bit word (see `peerFor`). */
  private lastPeer4: PeerAddress | undefined;
  private lastPeer4Addr = 0;
  private readonly peers6 = new Map<string, PeerAddress>();
  private lastPeer6: PeerAddress | undefined;
  private readonly lastPeer6Addr = new Uint8Array(16);
  /** `dgram`'s sources: address text → port → record (see `peerOfText`), and the last one read. */
  private readonly peersByText = new Map<string, Map<number, PeerAddress>>();
  private lastPeerText: PeerAddress | undefined;
  /**
   * The ICRC's key words of the flow from `rxKey6Peer` to this link, IPv6: built once per peer
   * rather than read out of two address arrays at every datagram (`verifyIcrc6`).
   */
  private rxKey6: Ipv6IcrcKey | undefined;
  private rxKey6Peer: PeerAddress | undefined;
  /** The same for IPv4 (`verifyIcrc4`): the key words of the flow from `rxKey4Peer` to this link. */
  private rxKey4: Ipv4IcrcKey | undefined;
  private rxKey4Peer: PeerAddress | undefined;
  /** The key words of the last send's flow (`icrcKey`): its destination address array and ports. */
  private txKey: IcrcFlowKey | undefined;
  private txKeyAddr: Uint8Array | undefined;
  private txKeyPorts = -1;
  /** While a recvmmsg batch is delivered: when it was read. */
  private rxAt: number | undefined;
  private readonly rxMeta: RxMeta = { src: { address: '', port: 0 }, icrc: 'unchecked', ipId: undefined, ce: false, at: 0 };
  private rxMetaInUse = false;
  private handler: LinkRxHandler | undefined;
  private rxHook: RxHook | undefined;
  private probeNonce: Uint8Array | undefined;
  private closed = false;

  private constructor(
    private readonly main: Socket,
    private readonly clock: Clock,
    private readonly opts: typeof DEFAULTS & { address: string; maxDatagram: number; gso: boolean; gro: boolean; watch?: 'addon' | 'poll'; calls?: 'addon' | 'koffi' },
    localAddr: Uint8Array,
    startup: UdpLinkStartup,
  ) {
    this.localAddr = localAddr;
    const family = localAddr.length === 4 ? 4 : 6;
    this.type = family === 4 ? 'udp4' : 'udp6';
    this.local = { address: opts.address, port: opts.port };
    this.caps = { family, icrcGenerate: opts.icrcGenerate, icrcVerify: opts.icrcVerify, maxDatagram: opts.maxDatagram };
    this.startup = startup;
    this.sendMode = opts.sendMode;
    this.info = { family, srcAddr: localAddr, dstAddr: localAddr, srcPort: 0, dstPort: 0, ipId: 0, ipFlagsFrag: 0x4000 };
    this.batch = opts.batchIo ? batchIoFfi(opts.calls) : undefined;
    if (this.batch !== undefined) startup.calls = this.batch.calls;
    if (this.batch !== undefined) this.txRing = new TxRing(this.batch, TX_RING_BYTES, (n) => (this.drop.sendError += n));
    this.sendDone = opts.reportSendErrors
      ? (err) => {
          if (err) this.drop.sendError++;
        }
      : undefined;
  }

  /** Binds, sets the socket options, checks them (see the file comment), and reports what it found. */
  static async open(options: UdpLinkOptions): Promise<UdpLink> {
    const addr = parseIpAddress(options.address);
    if (addr === undefined) throw new RangeError(`UdpLink: not an IP address: ${JSON.stringify(options.address)}`);
    const family = addr.length === 4 ? 4 : 6;
    const opts = {
      ...DEFAULTS,
      gso: isLoopback(addr),
      gro: isLoopback(addr) && !(family === 4 && options.icrcVerify === 'strict'),
      ...definedOnly(options),
      address: options.address,
      maxDatagram: options.maxDatagram ?? (family === 4 ? MAX_UDP_PAYLOAD_V4 : MAX_UDP_PAYLOAD_V6),
    };
    if (!Number.isInteger(opts.port) || opts.port < 0 || opts.port > 0xffff) throw new RangeError(`UdpLink: bad port ${opts.port}`);
    if (!Number.isInteger(opts.maxFlowSockets) || opts.maxFlowSockets < 0) throw new RangeError(`UdpLink: bad maxFlowSockets ${opts.maxFlowSockets}`);
    if (opts.maxDatagram < MIN_ICRC_PAYLOAD) throw new RangeError(`UdpLink: maxDatagram ${opts.maxDatagram} < ${MIN_ICRC_PAYLOAD}`);
    const warn = options.warn ?? defaultWarn;
    const clock = options.clock ?? new SystemClock();

    const socket = dgram.createSocket(family === 4 ? { type: 'udp4', lookup: literalLookup } : { type: 'udp6', ipv6Only: true, lookup: literalLookup });
    // Listened for before bind: with `literalLookup`, a successful bind emits 'listening' at once.
    const listening = once(socket, 'listening'); // rejects with the bind error (EADDRINUSE, EADDRNOTAVAIL)
    socket.bind({ address: options.address, port: opts.port, exclusive: true });
    try {
      await listening;
    } catch (e) {
      await closeSocket(socket);
      throw e;
    }
    const port = socket.address().port; // port 0 asks the kernel for one

    const ffi = ffiStatus();
    const startup: UdpLinkStartup = { ffi, probe: 'not-run', ipIdZero: family === 6, recvBufferBytes: 0, sendBufferBytes: 0 };
    [startup.recvBufferBytes, startup.sendBufferBytes] = setBuffers(socket, opts.recvBufferBytes, opts.sendBufferBytes);
    const where = family === 4 ? `${options.address}:${port}` : `[${options.address}]:${port}`;
    if (!ffi.ok) {
      warn({
        code: 'ROCE_FFI_UNAVAILABLE',
        message: `UdpLink ${where}: the socket-option FFI is unavailable (${ffi.message}); ` + (family === 4 ? 'IP_PMTUDISC_DO cannot be set.' : 'UDP_NO_CHECK6_RX cannot be set.'),
      });
    }
    const problems: string[] = [];
    if (family === 4) {
      const r = setAndReadBack(socket, IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO);
      if (r.ok) {
        startup.pmtuDiscover = r.value;
        if (r.value !== IP_PMTUDISC_DO) problems.push(`IP_MTU_DISCOVER reads back ${r.value}, not IP_PMTUDISC_DO (2)`);
      } else {
        problems.push(`IP_MTU_DISCOVER could not be set: ${r.message}`);
      }
    } else {
      const r = setAndReadBack(socket, SOL_UDP, UDP_NO_CHECK6_RX, 1);
      startup.noCheck6Rx = r.ok && r.value === 1;
      if (!startup.noCheck6Rx) {
        const why = r.ok ? `it reads back ${r.value}` : r.message;
        warn({
          code: 'ROCE_NO_CHECK6_RX',
          message:
            `UdpLink ${where}: UDP_NO_CHECK6_RX is not set (${why}). The kernel drops IPv6 datagrams with UDP ` +
            'checksum 0 (Udp6InCsumErrors), and rdma_rxe always sends checksum 0: this link will never hear rxe peers.',
        });
      }
    }

    const link = new UdpLink(socket, clock, { ...opts, port }, addr, startup);
    // Kept on the batched path too: whatever dgram read before its reading stopped is delivered.
    socket.on('message', (msg: Buffer, rinfo: RemoteInfo) => link.onMessage(msg, rinfo, port));
    link.startBatchRx();
    socket.on('error', () => {
      // Without a send callback dgram reports nothing here; with one, errors go to the callback.
      link.drop.sendError++;
    });

    if (family === 4) {
      const p = await link.runProbe(opts.probeTimeoutMs);
      link.counters.sent = 0; // counters cover traffic, not the probe
      startup.probe = p.status;
      if (p.ipId !== undefined) startup.probeIpId = p.ipId;
      if (p.note !== undefined) startup.probeNote = p.note;
      const id = `0x${(p.ipId ?? 0).toString(16).padStart(4, '0')}`;
      if (p.status === 'other-id') problems.push(`a probe sent to itself left with IP ID ${id}${p.df === false ? ' without DF' : ''}`);
      else if (p.status === 'bad-icrc') problems.push('a probe sent to itself left with ID 0 + DF, yet its ICRC does not match its real header');
      else if (p.status === 'timeout') problems.push(`a probe sent to itself was not seen within ${opts.probeTimeoutMs} ms`);
      startup.ipIdZero = problems.length === 0;
      if (!startup.ipIdZero) {
        warn({
          code: 'ROCE_IPV4_ID_NOT_ZERO',
          message:
            `UdpLink ${where}: IPv4 packets are not known to leave with IP ID 0 and DF (${problems.join('; ')}). ` +
            'The ICRC is computed for ID 0 + DF, so strict receivers (rdma_rxe) will drop every packet this link ' +
            'sends. (Receivers on UDP sockets cannot tell: they recompute the ICRC with the same assumption.)',
        });
      }
    }
    return link;
  }

  /** The clock `RxMeta.at` is read on (the `Link` contract). */
  get rxClock(): Clock {
    return this.clock;
  }

  get drops(): Readonly<Record<LinkDropReason, number>> {
    return this.drop;
  }

  /** IPv4: packets verifiably leave with ID 0 + DF. IPv6: true. */
  get ipIdZero(): boolean {
    return this.startup.ipIdZero;
  }

  /** IPv6: UDP_NO_CHECK6_RX is set. IPv4: false. */
  get noCheck6Rx(): boolean {
    return this.startup.noCheck6Rx === true;
  }

  /** Reads an int socket option of the bound socket (diagnostics: `roce doctor`, tests). */
  readSocketOption(level: number, optname: number): SockoptResult<number> {
    return readSocketOption(this.main, level, optname);
  }

  onReceive(handler: LinkRxHandler): void {
    this.handler = handler;
  }

  onReceiveBatchEnd(fn: (last: boolean) => void): void {
    this.batchEnd = fn;
  }

  readWaiting(): void {
    // dgram reads in the poll phase, after the timers, and cannot be asked to read now; the
    // batched path reads there too (or in an immediate of the check phase, on koffi's poll) and can.
    this.rx?.readNow();
  }

  setRxHook(hook: RxHook | undefined): void {
    this.rxHook = hook;
  }

  send(dst: PeerAddress, srcPort: number, parts: readonly Uint8Array[]): void {
    if (this.closed) {
      this.drop.closed++;
      return;
    }
    // The peer of the last send, by content, before the address map: many QPs share a peer.
    const last = this.lastTxDest;
    const dstAddr = last !== undefined && last.port === dst.port && last.address === dst.address ? last.addr : this.addressBytes(dst.address);
    const gen = this.opts.icrcGenerate;
    let len = gen ? ICRC_LEN : 0;
    for (let i = 0; i < parts.length; i++) len += parts[i]!.length;
    if (dstAddr === undefined || len > this.opts.maxDatagram || len < BTH_LEN + (gen ? ICRC_LEN : 0) || !validPort(dst.port)) {
      this.drop.sendError++;
      return;
    }
    const port = this.choosePort(srcPort);
    const socket = this.socketFor(port)!;
    // dgram's queue is asked only once dgram has been given a datagram: on the batched path that is rare
    // (a spill, an oversize or zoned datagram), and the question is a call into its handle per send.
    if (len > TX_SLAB_BYTES || (this.dgramUsed && socket.getSendQueueCount() > 0) || (socket !== this.main && this.flowBySocket.get(socket)?.state === 'binding')) {
      // dgram keeps what it is given past this call: one fresh buffer it can own (file comment).
      this.transmit(socket, dst, this.gather(dstAddr, dst.port, port, parts, len));
      return;
    }
    const q = this.txRing !== undefined ? this.txQueueFor(socket) : undefined;
    if (q !== undefined) {
      const d = this.txDest(dst, dstAddr);
      const at = d !== undefined ? q.add(d, len) : -1;
      if (at < 0) {
        // A zoned IPv6 peer (dgram resolves the zone) or a ring that would not drain.
        this.transmit(socket, dst, this.gather(dstAddr, dst.port, port, parts, len));
        return;
      }
      // The ICRC field is written at the flush, for every datagram queued, in one call (`sealFor`).
      const ring = this.txRing!.bytes;
      let o = at;
      for (let i = 0; i < parts.length; i++) {
        const p = parts[i]!;
        ring.set(p, o);
        o += p.length;
      }
      this.counters.sent++;
      return;
    }
    if (this.sendMode === 'ring') {
      // One contiguous slice of the ring: the fastest form for dgram (one iovec), hot in cache.
      const at = this.reserve(len);
      const d = this.slab.subarray(at, at + len);
      let o = 0;
      for (let i = 0; i < parts.length; i++) {
        const p = parts[i]!;
        d.set(p, o);
        o += p.length;
      }
      // Over the slice, which holds the field's place already: one call, however many parts.
      if (gen) writeIcrc(d, this.icrcKey(dstAddr, dst.port, port).icrc(0, d));
      this.transmit(socket, dst, d);
      return;
    }
    const iov = this.iov;
    iov.length = 0;
    // Consecutive small parts (and the ICRC) go into one slice of the ring; large ones as they are.
    let run = 0;
    let runAt = 0;
    for (let i = 0; i < parts.length; i++) {
      const p = parts[i]!;
      if (p.length >= COPY_BELOW) {
        if (run > 0) this.endRun(runAt, run);
        run = 0;
        iov.push(p);
        continue;
      }
      if (run === 0) runAt = this.reserve(len);
      this.slab.set(p, runAt + run);
      run += p.length;
    }
    if (gen) {
      const c = icrcOfParts(this.icrcInfo(dstAddr, dst.port, port), parts, len);
      if (run === 0) runAt = this.reserve(ICRC_LEN);
      const s = this.slab;
      const o = runAt + run;
      s[o] = c;
      s[o + 1] = c >>> 8;
      s[o + 2] = c >>> 16;
      s[o + 3] = c >>> 24;
      run += ICRC_LEN;
    }
    if (run > 0) this.endRun(runAt, run);
    this.transmit(socket, dst, iov);
  }

  /** The batched path's queue for `socket`, created on first use; undefined where it has no descriptor. */
  private txQueueFor(socket: Socket): TxQueue | undefined {
    let q = this.txQueues.get(socket);
    if (q === undefined) {
      const fd = socketFd(socket);
      if (fd === undefined) return undefined;
      const seal = this.opts.icrcGenerate ? this.sealFor(socket === this.main ? this.local.port : socket.address().port) : undefined;
      q = new TxQueue(this.batch!, fd, this.txRing!, this.opts.gso, (dst, datagram, k) => this.spill(socket, dst, datagram, k), seal);
      this.txQueues.set(socket, q);
    }
    return q;
  }

  /**
   * The batched path's ICRCs for the queue of the socket bound to `srcPort`: at the flush, one call
   * per run of messages to one peer computes every datagram's, each segment k of a GSO train with
   * IPv4 ID k (mmsg.ts), over the datagrams as the ring holds them. A call per datagram, at the send,
   * cost about 40 ns of a 1 KiB packet's ICRC, about 120 ns in all (bench/README.md, "What mattered").
   */
  private sealFor(srcPort: number): TxSeal {
    return (dst, desc, from, to) => this.icrcKey(dst.addr, dst.port, srcPort).trains(this.txRing!.bytes, desc, from, to);
  }

  /** The sockaddr form of `dst`, cached; undefined for a zoned IPv6 address (dgram resolves the zone). */
  private txDest(dst: PeerAddress, addr: Uint8Array): TxDest | undefined {
    const last = this.lastTxDest;
    // The same peer as last time, by content: a caller may pass a record of its own per send (QPs
    // share theirs, and their address strings compare by identity).
    if (last !== undefined && last.port === dst.port && last.address === dst.address) return last;
    if (dst.address.includes('%')) return undefined;
    const key = `${dst.address}|${dst.port}`;
    let d = this.txDests.get(key);
    if (d === undefined) {
      if (this.txDests.size >= 4096) this.txDests.clear();
      d = { address: dst.address, port: dst.port, addr };
      this.txDests.set(key, d);
    }
    this.lastTxDest = d;
    return d;
  }

  /**
   * A datagram the kernel would not take at once goes to dgram's queue, which sends it when the
   * socket is writable and keeps later sends behind it (`send` checks the queue first). Alone it
   * leaves with IPv4 ID 0, so a train segment's ICRC is recomputed for that.
   */
  private spill(socket: Socket, dst: TxDest, datagram: Uint8Array, k: number): void {
    if (this.closed) {
      this.drop.closed++;
      return;
    }
    if (k > 0 && this.opts.icrcGenerate && this.caps.family === 4) {
      const info = this.icrcInfo(dst.addr, dst.port, socket === this.main ? this.local.port : socket.address().port);
      writeIcrc(datagram, icrcOfUdpPayload(info, datagram));
    }
    this.counters.spilled++;
    this.transmit(socket, dst, datagram, false);
  }

  /**
   * Moves the main socket's reading from dgram to `recvmmsg` on a duplicate descriptor (`mmsg.ts`).
   * Where any step is not possible, dgram keeps reading.
   */
  private startBatchRx(): void {
    const ffi = this.batch;
    const fd = socketFd(this.main);
    if (ffi === undefined || fd === undefined) return;
    const dupFd = ffi.dup(fd);
    if (dupFd < 0) return;
    if (!stopDgramReading(this.main)) {
      ffi.close(dupFd);
      return;
    }
    const port = this.local.port;
    const gro = this.opts.gro && setsockoptInt(dupFd, SOL_UDP, UDP_GRO, 1).ok;
    this.startup.gro = gro;
    const watch = this.opts.watch !== 'poll' ? addonWatch : undefined;
    this.startup.watch = watch !== undefined ? 'addon' : 'poll';
    this.rx = new RxRing(
      ffi,
      dupFd,
      this.caps.family,
      (datagram, addr, srcPort, truncated, k, verdict) => {
        // Longer than any RoCEv2 packet: truncated into a slot, or whole in a GRO-sized one.
        if (truncated || datagram.length > RX_SLOT) {
          this.drop.notRoce++;
          return;
        }
        this.onDatagram(datagram, this.peerFor(addr, srcPort), port, addr, k, verdict);
      },
      // One receive time per batch: the datagrams of one recvmmsg were read at one moment.
      () => (this.rxAt = this.clock.now()),
      // After each batch: what the handlers answered goes out before the next batch is read.
      (last) => {
        this.batchEnd?.(last);
        this.rxAt = undefined;
        this.txRing?.flushAll();
      },
      gro,
      () => this.counters.groTrains++,
      // The ICRCs of a batch's chunk in one call, unless a receive hook may change the datagrams first.
      (mem, desc, messages, out) => {
        if (this.rxHook !== undefined) return 0;
        const judged = verifyReceived(this.caps.family, this.localAddr, port, this.opts.icrcVerify, mem, desc, messages, out);
        this.counters.batchChecked += judged;
        return judged;
      },
      watch ?? pollWatch(ffi),
    );
  }

  /** The source of a received datagram as the address record handlers get, cached per address and port. */
  private peerFor(addr: Uint8Array, port: number): PeerAddress {
    if (addr.length === 4) {
      // Most datagrams come from the peer of the one before (one peer's ACKs for many QPs arrive as a
      // train): that check compares two small integers. The map's key needs 48 bits, a heap number
      // and a hash probe per datagram.
      const a = (addr[0]! << 24) | (addr[1]! << 16) | (addr[2]! << 8) | addr[3]!;
      const last = this.lastPeer4;
      if (last !== undefined && last.port === port && this.lastPeer4Addr === a) return last;
      const key = (a >>> 0) * 65536 + port;
      let p = this.peers4.get(key);
      if (p === undefined) {
        if (this.peers4.size >= 4096) this.peers4.clear();
        p = { address: formatIpAddress(addr), port };
        this.peers4.set(key, p);
      }
      this.lastPeer4 = p;
      this.lastPeer4Addr = a;
      return p;
    }
    const last = this.lastPeer6;
    if (last !== undefined && last.port === port && sameBytes(this.lastPeer6Addr, addr)) return last;
    const text = formatIpAddress(addr);
    const key = `${text}|${port}`;
    let p = this.peers6.get(key);
    if (p === undefined) {
      if (this.peers6.size >= 4096) this.peers6.clear();
      p = { address: text, port };
      this.peers6.set(key, p);
    }
    this.lastPeer6 = p;
    this.lastPeer6Addr.set(addr);
    return p;
  }

  /** A run of small parts copied at `at` is complete: hand it to the list, give back what it did not use. */
  private endRun(at: number, n: number): void {
    this.iov.push(this.slab.subarray(at, at + n));
    this.slabAt = at + n;
  }

  /**
   * The send flow's ICRC key words, kept for the flow of the last send: many QPs send to one peer from
   * one port. `dstAddr` is compared by identity: it is always an array of the address caches, which
   * are never written after they are made (a new one, after a cache is cleared, only rebuilds the key).
   */
  private icrcKey(dstAddr: Uint8Array, dstPort: number, srcPort: number): IcrcFlowKey {
    const ports = ((srcPort & 0xffff) << 16) | (dstPort & 0xffff);
    let k = this.txKey;
    if (k !== undefined && this.txKeyAddr === dstAddr && this.txKeyPorts === ports) return k;
    const info = this.icrcInfo(dstAddr, dstPort, srcPort);
    if (k === undefined) k = this.txKey = new IcrcFlowKey(info);
    else k.set(info);
    this.txKeyAddr = dstAddr;
    this.txKeyPorts = ports;
    return k;
  }

  private icrcInfo(dstAddr: Uint8Array, dstPort: number, srcPort: number): UdpDatagramInfo {
    const info = this.info;
    info.srcAddr = this.localAddr;
    info.dstAddr = dstAddr;
    info.srcPort = srcPort;
    info.dstPort = dstPort;
    return info;
  }

  /** Start of `n` free bytes in the send ring (wrapping; see the file comment for why that is safe). */
  private reserve(n: number): number {
    let at = this.slabAt;
    if (at + n > TX_SLAB_BYTES) at = 0;
    this.slabAt = at + n;
    return at;
  }

  frame(dst: PeerAddress, srcPort: number, parts: readonly Uint8Array[]): WireDatagram | undefined {
    if (this.closed) {
      this.drop.closed++;
      return undefined;
    }
    const dstAddr = this.addressBytes(dst.address);
    let len = this.opts.icrcGenerate ? ICRC_LEN : 0;
    for (const p of parts) len += p.length;
    if (dstAddr === undefined || len > this.opts.maxDatagram || len < BTH_LEN + (this.opts.icrcGenerate ? ICRC_LEN : 0) || !validPort(dst.port)) {
      this.drop.sendError++;
      return undefined;
    }
    const port = this.choosePort(srcPort);
    return { datagram: this.gather(dstAddr, dst.port, port, parts, len), srcPort: port };
  }

  /** The parts gathered into one fresh buffer of `len` bytes, ICRC at its tail. */
  private gather(dstAddr: Uint8Array, dstPort: number, srcPort: number, parts: readonly Uint8Array[], len: number): Buffer {
    const datagram = Buffer.allocUnsafe(len);
    let at = 0;
    for (const p of parts) {
      datagram.set(p, at);
      at += p.length;
    }
    if (this.opts.icrcGenerate) {
      const info = this.info;
      info.srcAddr = this.localAddr;
      info.dstAddr = dstAddr;
      info.srcPort = srcPort;
      info.dstPort = dstPort;
      writeIcrc(datagram, icrcOfUdpPayload(info, datagram));
    }
    return datagram;
  }

  sendRaw(dst: PeerAddress, srcPort: number, datagram: Uint8Array): void {
    if (this.closed) {
      this.drop.closed++;
      return;
    }
    // Only from exactly `srcPort`: the ICRC inside was computed for it.
    const socket = srcPort === this.local.port ? this.main : this.choosePort(srcPort) === srcPort ? this.socketFor(srcPort) : undefined;
    if (socket === undefined || datagram.length > this.opts.maxDatagram || !validPort(dst.port)) {
      this.drop.sendError++;
      return;
    }
    this.transmit(socket, dst, datagram);
  }

  async close(): Promise<void> {
    if (this.closed) return;
    // What the engines sent before closing still leaves, as it would have on the dgram path.
    this.txRing?.flushAll();
    this.closed = true;
    this.handler = undefined;
    this.rxHook = undefined;
    this.rx?.close();
    this.rx = undefined;
    this.txQueues.clear();
    this.txRing?.dispose();
    this.txRing = undefined;
    const all = [this.main, ...[...this.flows.values()].map((f) => f.socket)];
    this.flows.clear();
    this.flowBySocket.clear();
    await Promise.all(all.map(closeSocket));
  }

  // --- send -------------------------------------------------------------------------------

  private transmit(socket: Socket, dst: PeerAddress, datagram: Uint8Array | readonly Uint8Array[], count = true): void {
    // Datagrams queued on the batched path go first: one socket's datagrams leave in send order.
    const q = this.txQueues.get(socket);
    if (q !== undefined && q.pending > 0) q.flush();
    this.dgramUsed = true;
    try {
      if (this.sendDone) socket.send(datagram, dst.port, dst.address, this.sendDone);
      else socket.send(datagram, dst.port, dst.address);
      if (count) this.counters.sent++;
      if (socket !== this.main) {
        const f = this.flowBySocket.get(socket);
        if (f?.state === 'binding') f.queued++;
      }
    } catch {
      this.drop.sendError++;
    }
  }

  /** The source port a datagram asking for `srcPort` leaves from; opens a flow socket if needed. */
  private choosePort(srcPort: number): number {
    const bound = this.local.port;
    if (this.opts.sourcePorts === 'bound' || srcPort === bound) return bound;
    if (!validPort(srcPort) || srcPort === 0) {
      this.counters.flowFallbacks++;
      return bound;
    }
    let f = this.flows.get(srcPort);
    if (f === undefined) {
      if (this.flows.size >= this.opts.maxFlowSockets) {
        this.counters.flowFallbacks++;
        return bound;
      }
      f = this.openFlow(srcPort);
    }
    if (f.state === 'failed') {
      this.counters.flowFallbacks++;
      return bound;
    }
    return srcPort;
  }

  private socketFor(port: number): Socket | undefined {
    if (port === this.local.port) return this.main;
    const f = this.flows.get(port);
    return f !== undefined && f.state !== 'failed' ? f.socket : undefined;
  }

  private openFlow(port: number): FlowSocket {
    const socket = dgram.createSocket(this.type === 'udp4' ? { type: 'udp4', lookup: literalLookup } : { type: 'udp6', ipv6Only: true, lookup: literalLookup });
    const f: FlowSocket = { socket, state: 'binding', queued: 0 };
    this.flows.set(port, f);
    this.flowBySocket.set(socket, f);
    this.counters.flowSockets++;
    // Registered before any send: dgram flushes its pre-bind queue from a later 'listening'
    // listener, so the options are in place before the first datagram leaves.
    socket.once('listening', () => {
      f.state = 'bound';
      f.queued = 0;
      setBuffers(socket, undefined, this.opts.sendBufferBytes);
      const ok = this.type === 'udp4'
        ? optionIs(setAndReadBack(socket, IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO), IP_PMTUDISC_DO)
        : optionIs(setAndReadBack(socket, SOL_UDP, UDP_NO_CHECK6_RX, 1), 1);
      // The socket stays in use either way (its pre-bind queue is flushed right after this
      // listener); a failure is counted, and the bound socket's `startup` says what it implies.
      if (!ok) this.counters.flowOptionFailures++;
    });
    socket.on('error', () => {
      if (f.state === 'binding') {
        // Bind failed (port taken): dgram discarded what was queued.
        this.drop.sendError += f.queued;
        this.counters.sent -= f.queued;
        f.state = 'failed';
        f.queued = 0;
        closeSocket(socket).catch(() => undefined);
      } else {
        this.drop.sendError++;
      }
    });
    socket.on('message', (msg: Buffer, rinfo: RemoteInfo) => this.onMessage(msg, rinfo, port));
    socket.bind({ address: this.local.address, port, exclusive: true });
    return f;
  }

  // --- receive ----------------------------------------------------------------------------

  private onMessage(msg: Buffer, rinfo: RemoteInfo, localPort: number): void {
    this.onDatagram(msg, this.peerOfText(rinfo.address, rinfo.port), localPort);
  }

  /**
   * `peerFor` for `dgram`'s reads, which give the source as text: the record of an address and port,
   * cached, where a new one per datagram was an allocation per packet on this path. Two lookups
   * rather than one keyed by `address|port`, whose string would be that allocation again.
   */
  private peerOfText(address: string, port: number): PeerAddress {
    const last = this.lastPeerText;
    if (last !== undefined && last.port === port && last.address === address) return last;
    let byPort = this.peersByText.get(address);
    if (byPort === undefined) {
      if (this.peersByText.size >= 4096) this.peersByText.clear();
      byPort = new Map();
      this.peersByText.set(address, byPort);
    }
    let p = byPort.get(port);
    if (p === undefined) {
      if (byPort.size >= 4096) byPort.clear();
      p = { address, port };
      byPort.set(port, p);
    }
    this.lastPeerText = p;
    return p;
  }

  /** `srcBytes`: the source address as the kernel gave it, where it did (batched reads). */
  private onDatagram(msg: Uint8Array, src: PeerAddress, localPort: number, srcBytes?: Uint8Array, idGuess = 0, verdict = -1): void {
    if (this.closed) return;
    if (this.probeNonce !== undefined && localPort === this.local.port && this.isProbe(msg, src.port)) return;
    const hook = this.rxHook;
    if (hook === undefined) this.accept(msg, src, localPort, false, srcBytes, idGuess, verdict);
    else this.hooked(hook, msg, src, localPort);
  }

  /**
   * A datagram through the receive hook. Apart from `onDatagram` because of the closure: the variables
   * a closure captures live in a context that V8 makes on every entry to the function that declares
   * them, closure made or not (52 B per packet when this was inline there, with no hook set).
   */
  private hooked(hook: RxHook, msg: Uint8Array, src: PeerAddress, localPort: number): void {
    hook(msg, src, (datagram, ce = false) => this.accept(datagram, src, localPort, ce));
  }

  /**
   * Length, BTH version and ICRC checks, then the handler. `srcBytes` saves the text-to-bytes lookup
   * of the source address (the ICRC covers it) where the caller has the bytes; read during the call only.
   * `idGuess` is the IPv4 ID to try first: segment k of a GSO train left with ID k (mmsg.ts), and
   * the right guess saves recovering it; a wrong one costs nothing more than the guess of 0 did.
   * `verdict`, where not -1, is the ICRC's already judged with the rest of its batch (`verifyReceived`).
   */
  private accept(datagram: Uint8Array, src: PeerAddress, localPort: number, ce: boolean, srcBytes?: Uint8Array, idGuess = 0, verdict = -1): void {
    if (this.closed) {
      this.drop.closed++;
      return;
    }
    if (datagram.length < MIN_ICRC_PAYLOAD) {
      this.drop.tooShort++;
      return;
    }
    const srcAddr = srcBytes ?? this.addressBytes(src.address);
    if ((datagram[1]! & 0x0f) !== 0 || srcAddr === undefined) {
      this.drop.notRoce++;
      return;
    }
    const v = verdict >= 0 ? receivedVerdict(verdict) : this.verify(datagram, src, localPort, srcAddr, idGuess);
    if (v === ICRC_BAD) {
      this.drop.badIcrc++;
      return;
    }
    this.counters.received++;
    const ipId = v !== ICRC_UNCHECKED && this.caps.family === 4 ? (verdict >= 0 ? receivedIpId(verdict) : verified.ipId) : undefined;
    const at = this.rxAt ?? this.clock.now();
    // One record for every datagram, as the payload is a view the next read reuses: a fresh one per
    // datagram was an allocation per packet, and one per ACK on a side that sends. A handler that
    // receives again from inside its call (a nested read) gets a record of its own.
    if (this.rxMetaInUse) {
      this.handler?.(datagram, { src, icrc: ICRC_STATUS[v]!, ipId, ce, at });
      return;
    }
    const meta = this.rxMeta;
    meta.src = src;
    meta.icrc = ICRC_STATUS[v]!;
    meta.ipId = ipId;
    meta.ce = ce;
    meta.at = at;
    this.rxMetaInUse = true;
    try {
      this.handler?.(datagram, meta);
    } finally {
      this.rxMetaInUse = false;
    }
  }

  /** The ICRC check of one datagram: `verifyIcrc4` or `verifyIcrc6`, with the last peer's key words. */
  private verify(datagram: Uint8Array, src: PeerAddress, localPort: number, srcAddr: Uint8Array, idGuess: number): number {
    const info = this.info;
    info.srcAddr = srcAddr;
    info.dstAddr = this.localAddr;
    info.srcPort = src.port;
    info.dstPort = localPort;
    info.ipId = idGuess;
    let v: number;
    if (srcAddr.length === 16) {
      // Sources are records cached per address and port (`peerFor`, `peerOfText`): the key words
      // built for one hold while datagrams keep coming from it, which is one address.
      let key = this.rxKey6;
      if (key === undefined || this.rxKey6Peer !== src) {
        if (key === undefined) key = this.rxKey6 = new Ipv6IcrcKey(srcAddr, this.localAddr);
        else key.set(srcAddr, this.localAddr);
        this.rxKey6Peer = src;
      }
      v = verifyIcrc6(info, key, datagram, this.opts.icrcVerify);
    } else {
      // IPv4 (`addressBytes` gives only the link's own family): the same, with its two words.
      let key = this.rxKey4;
      if (key === undefined || this.rxKey4Peer !== src) {
        if (key === undefined) key = this.rxKey4 = new Ipv4IcrcKey(srcAddr, this.localAddr);
        else key.set(srcAddr, this.localAddr);
        this.rxKey4Peer = src;
      }
      v = verifyIcrc4(info, key, datagram, this.opts.icrcVerify);
    }
    info.ipId = 0;
    return v;
  }

  /** Text address → bytes of this link's family, cached; undefined for anything else. */
  private addressBytes(text: string): Uint8Array | undefined {
    let b = this.addrCache.get(text);
    if (b === undefined) {
      const pct = text.indexOf('%');
      const parsed = parseIpAddress(pct < 0 ? text : text.slice(0, pct));
      b = parsed !== undefined && parsed.length === this.localAddr.length ? parsed : null;
      if (this.addrCache.size >= 4096) this.addrCache.clear();
      this.addrCache.set(text, b);
    }
    return b ?? undefined;
  }

  // --- start-up probe ---------------------------------------------------------------------

  /**
   * Sends a probe from the bound socket to itself and reads its real IPv4 header through a raw
   * socket. The probe is a UD SEND_ONLY to QP 0xffffff (never a real QP) carrying a random nonce;
   * the copy the UDP socket receives is swallowed by `isProbe`.
   */
  private async runProbe(timeoutMs: number): Promise<{ status: UdpLinkStartup['probe']; ipId?: number; df?: boolean; note?: string }> {
    const obs = openIpv4Observer(this.localAddr);
    if (!obs.ok) return { status: 'unverified', note: `no raw socket to observe the header: ${obs.message}` };
    const observer = obs.value;
    const nonce = randomBytes(8);
    this.probeNonce = nonce;
    try {
      const bth = new Uint8Array([0x64, 0x00, 0xff, 0xff, 0x00, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00]);
      this.send(this.local, this.local.port, [bth, new Uint8Array(8), nonce]);
      const end = Date.now() + timeoutMs;
      while (Date.now() < end) {
        await new Promise((r) => setTimeout(r, 1));
        for (const ip of observer.poll()) {
          if (!this.isOwnProbe(ip, nonce)) continue;
          const ipId = (ip[4]! << 8) | ip[5]!;
          const df = (((ip[6]! << 8) | ip[7]!) & 0x4000) !== 0;
          if (ipId !== 0 || !df) return { status: 'other-id', ipId, df };
          return { status: checkIcrcOfIpDatagram(ip).status === 'ok' ? 'ok' : 'bad-icrc', ipId, df };
        }
      }
      return { status: 'timeout' };
    } finally {
      observer.close();
      // The UDP copy may still be on its way; keep swallowing it for a moment.
      setTimeout(() => {
        if (this.probeNonce === nonce) this.probeNonce = undefined;
      }, 1000).unref();
    }
  }

  /** An IPv4 datagram from and to our address and port whose UDP payload ends in `nonce` + ICRC. */
  private isOwnProbe(ip: Uint8Array, nonce: Uint8Array): boolean {
    const ihl = (ip[0]! & 0x0f) * 4;
    if (ip[0]! >>> 4 !== 4 || ip[9] !== 17 || ip.length !== ihl + 8 + PROBE_LEN) return false;
    for (let i = 0; i < 4; i++) if (ip[12 + i] !== this.localAddr[i] || ip[16 + i] !== this.localAddr[i]) return false;
    const port = this.local.port;
    if (((ip[ihl]! << 8) | ip[ihl + 1]!) !== port || ((ip[ihl + 2]! << 8) | ip[ihl + 3]!) !== port) return false;
    return nonceAt(ip, ihl + 8 + 20, nonce);
  }

  /** The probe's own copy arriving on the UDP socket. */
  private isProbe(msg: Uint8Array, srcPort: number): boolean {
    const nonce = this.probeNonce;
    return nonce !== undefined && msg.length === PROBE_LEN && srcPort === this.local.port && nonceAt(msg, 20, nonce);
  }
}

/** BTH + DETH + 8-byte nonce + ICRC. */
const PROBE_LEN = 12 + 8 + 8 + ICRC_LEN;

function nonceAt(b: Uint8Array, at: number, nonce: Uint8Array): boolean {
  for (let i = 0; i < nonce.length; i++) if (b[at + i] !== nonce[i]) return false;
  return true;
}

/** 127.0.0.0/8 or ::1. */
/** Whether `address` (an IP literal) is a loopback address: 127.0.0.0/8 or ::1. */
export function isLoopbackAddress(address: string): boolean {
  const a = parseIpAddress(address);
  return a !== undefined && isLoopback(a);
}

function isLoopback(addr: Uint8Array): boolean {
  if (addr.length === 4) return addr[0] === 127;
  for (let i = 0; i < 15; i++) if (addr[i] !== 0) return false;
  return addr[15] === 1;
}

function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

function validPort(p: number): boolean {
  return Number.isInteger(p) && p >= 0 && p <= 0xffff;
}

function optionIs(r: { ok: boolean; value?: number }, want: number): boolean {
  return r.ok && r.value === want;
}

/** Asks for the buffer sizes (when given) and returns what the kernel granted: [receive, send]. */
function setBuffers(socket: Socket, recv: number | undefined, send: number | undefined): [number, number] {
  try {
    if (recv !== undefined) socket.setRecvBufferSize(recv);
  } catch {
    // Refused sizes leave the default; the read-back below reports it.
  }
  try {
    if (send !== undefined) socket.setSendBufferSize(send);
  } catch {
    // As above.
  }
  let r = 0;
  let s = 0;
  try {
    r = socket.getRecvBufferSize();
    s = socket.getSendBufferSize();
  } catch {
    // A closed socket: report zeros.
  }
  return [r, s];
}

function closeSocket(socket: Socket): Promise<void> {
  return new Promise((resolve) => {
    try {
      socket.close(() => resolve());
    } catch {
      resolve(); // already closed
    }
  });
}

function definedOnly<T extends object>(o: T): Partial<T> {
  const out: Partial<T> = {};
  for (const k of Object.keys(o) as (keyof T)[]) if (o[k] !== undefined) out[k] = o[k];
  return out;
}


/**
 * An ECN-marking bottleneck between stack processes on real UDP: the congestion point (CP) of
 * DCQCN for `roce bottleneck`. Senders send to the relay; the relay queues their datagrams in
 * one FIFO drained at a fixed rate toward the receiver, marks them RED-style as they join the
 * queue (the same `redProbability` as the simulator's CP, src/sim/bottleneck.ts), and drops at
 * the tail. The receiver's answers (ACKs, NAKs, READ responses, CNPs) go back unqueued: the
 * return path of a full-duplex link is not the congested one.
 *
 * The mark. `node:dgram` can neither read nor set the IP ECN bits, so the mark is BTH FECN
 * (byte 4, bit 7). The ICRC masks that byte, so setting it leaves the ICRC valid, as a switch
 * setting IP CE would; the receiver's NP (core/cc-hooks.ts) answers it with a CNP.
 *
 * Topology: one sender per IP address (on loopback, 127.0.0.x each), one receiver at `to`.
 *
 *     sender A (127.0.0.2:pA) ──▶ listen (127.0.0.1:L) ═╗ FIFO, RED, rate
 *                                                      ╚═▶ from 127.0.0.2:L ──▶ receiver (to)
 *     sender A ◀── from listen ◀── relay socket 127.0.0.2:L ◀── receiver's replies
 *
 *   - A sender's QP has the relay's `listen` address and port as its peer.
 *   - For each sender IP the relay opens an upstream socket on *that sender's IP* and the listen
 *     port, and forwards the sender's traffic to the receiver from it. So the receiver sees each
 *     flow coming from its sender's real IP: its QP names the sender's IP as its peer (as it
 *     would without the relay) and the listen port as the peer's port, and its source-address
 *     check (rxe's check_addr) holds. Replies to that address land on the upstream socket, which
 *     says which sender they belong to; the relay sends them on from `listen` to the port that
 *     sender last sent from.
 *   - A sender whose IP is the listen address gets its upstream socket on an ephemeral port
 *     (printed), since `listen` itself is taken.
 *
 * The ICRC. It covers the IP addresses and UDP ports. A datagram the relay sends from its own
 * socket carries other addresses and ports than the sender used, so the relay checks the ICRC
 * against what it received (the sender's address and port, the listen address and port; the
 * IPv4 ID recovered as UdpLink does) and computes a new one for the datagram it sends. A real
 * switch or router never does this: it leaves IP addresses and UDP ports alone, which is why it
 * need not touch the ICRC, and why a NAT between RoCEv2 hosts breaks every packet. The relay is
 * a NAT that repairs the damage; its sockets are UdpLinks, so what it sends leaves with IPv4 ID 0
 * and DF, which its ICRC assumes.
 */

import { SystemClock, type Clock, type TimerHandle } from '../runtime/clock.js';
import { isWireLink, type PeerAddress, type WireLink } from '../link/link.js';
import { UdpLink, type LinkWarning } from '../link/udp.js';
import { redProbability, type RedParams } from '../sim/bottleneck.js';
import { Rng } from '../sim/rng.js';
import { percentile } from '../sim/stats.js';
import { setBthFecn } from '../wire/bth.js';
import { parseIpAddress } from '../wire/frame.js';
import { checkIcrc, icrcOfUdpPayload, MIN_ICRC_PAYLOAD, writeIcrc, type UdpDatagramInfo } from '../wire/icrc.js';

export interface BottleneckOptions {
  /** Where senders send (their QPs' peer). */
  listen: PeerAddress;
  /** The receiver. */
  to: PeerAddress;
  /** Drain rate of the FIFO, bit/s, counting IP and UDP headers (what `tc` would count, less Ethernet). */
  rateBps: number;
  /** RED thresholds and the tail-drop limit, bytes. */
  kminBytes: number;
  kmaxBytes: number;
  pMax: number;
  limitBytes: number;
  /** Seeds the marking draws. */
  seed?: number;
  /** False: never mark (a plain drop-tail bottleneck). Default true. */
  marking?: boolean;
  /** Messages: upstream sockets opened, socket warnings. */
  log?: (line: string) => void;
  clock?: Clock;
}

export interface BottleneckCounters {
  /** Datagrams (and bytes, UDP payload) forwarded sender → receiver. */
  forwarded: number;
  forwardedBytes: number;
  /** Datagrams FECN-marked on entering the queue. */
  marked: number;
  /** Datagrams dropped at the tail limit. */
  dropped: number;
  /** Datagrams (receiver → senders) relayed back. */
  returned: number;
  /** Datagrams whose ICRC did not check against the addresses they arrived with; dropped. */
  badIcrc: number;
  /** Datagrams that are not RoCEv2 (too short, or from nobody the relay knows); dropped. */
  ignored: number;
  /** Largest queue seen, bytes (IP + UDP + payload). */
  queueMaxBytes: number;
}

export interface BottleneckSummary extends BottleneckCounters {
  /** Queue at packet arrivals, bytes. */
  queueMedianBytes: number;
  queueP99Bytes: number;
  /** Per sender IP: datagrams and bytes forwarded, marked, dropped. */
  perSender: Record<string, { forwarded: number; forwardedBytes: number; marked: number; dropped: number }>;
}

interface Sender {
  ip: string;
  ipBytes: Uint8Array;
  /** The port the sender last sent from: where its replies go. */
  port: number;
  upstream: WireLink | undefined;
  opening: Promise<void> | undefined;
  stats: { forwarded: number; forwardedBytes: number; marked: number; dropped: number };
}

interface Queued {
  datagram: Uint8Array;
  sender: Sender;
  /** IP + UDP + payload. */
  wireBytes: number;
  arrivedUs: number;
}

/** Bytes of IP + UDP header in front of each datagram, for the rate and the queue. */
const IPV4_UDP_HEADERS = 28;
const IPV6_UDP_HEADERS = 48;
/** At most this many queue samples are kept for the median and p99 (then every other one). */
const MAX_SAMPLES = 1 << 20;

export class BottleneckRelay {
  readonly counters: BottleneckCounters = { forwarded: 0, forwardedBytes: 0, marked: 0, dropped: 0, returned: 0, badIcrc: 0, ignored: 0, queueMaxBytes: 0 };
  private readonly senders = new Map<string, Sender>();
  private readonly queue: Queued[] = [];
  private qHead = 0;
  private qBytes = 0;
  /** When the packet now being serialized finishes, µs. */
  private freeAt = 0;
  private timer: TimerHandle | undefined;
  private timerAt = Infinity;
  private readonly samples: number[] = [];
  private sampleEvery = 1;
  private sampleTick = 0;
  private readonly rng: Rng;
  private readonly red: RedParams;
  private readonly headerBytes: number;
  private readonly toBytes: Uint8Array;
  private readonly listenBytes: Uint8Array;
  private readonly info: UdpDatagramInfo;
  private closed = false;

  private constructor(
    private readonly front: WireLink,
    private readonly opts: BottleneckOptions,
    private readonly clock: Clock,
  ) {
    this.rng = new Rng(opts.seed ?? 1);
    this.red = { kminBytes: opts.kminBytes, kmaxBytes: opts.kmaxBytes, pMax: opts.pMax, limitBytes: opts.limitBytes, marking: opts.marking ?? true };
    this.listenBytes = parseIpAddress(front.local.address)!;
    this.toBytes = parseIpAddress(opts.to.address)!;
    const family = this.listenBytes.length === 4 ? 4 : 6;
    this.headerBytes = family === 4 ? IPV4_UDP_HEADERS : IPV6_UDP_HEADERS;
    this.info = { family, srcAddr: this.listenBytes, dstAddr: this.listenBytes, srcPort: 0, dstPort: 0, ipId: 0, ipFlagsFrag: 0x4000 };
    front.setRxHook((datagram, src) => this.fromSender(datagram, src));
  }

  static async open(opts: BottleneckOptions): Promise<BottleneckRelay> {
    const listen = parseIpAddress(opts.listen.address);
    const to = parseIpAddress(opts.to.address);
    if (listen === undefined || to === undefined || listen.length !== to.length) {
      throw new RangeError(`bottleneck: ${opts.listen.address} and ${opts.to.address} must be IP addresses of one family`);
    }
    if (!(opts.rateBps > 0)) throw new RangeError(`bottleneck: rate ${opts.rateBps}`);
    if (!(opts.kmaxBytes > opts.kminBytes && opts.kminBytes >= 0)) throw new RangeError('bottleneck: need 0 ≤ Kmin < Kmax');
    if (!(opts.pMax >= 0 && opts.pMax <= 1)) throw new RangeError(`bottleneck: Pmax ${opts.pMax}`);
    if (!(opts.limitBytes > 0)) throw new RangeError(`bottleneck: limit ${opts.limitBytes}`);
    const clock = opts.clock ?? new SystemClock();
    const front = await UdpLink.open({ address: opts.listen.address, port: opts.listen.port, clock, warn: warner(opts.log) });
    if (!isWireLink(front)) throw new TypeError('bottleneck: the UDP link does not expose its wire level');
    return new BottleneckRelay(front, opts, clock);
  }

  /** The listen address and port (the port as bound, when 0 was asked for). */
  get listen(): PeerAddress {
    return this.front.local;
  }

  /** Counters, the queue's median and p99 at arrivals, and per-sender figures. */
  summary(): BottleneckSummary {
    const sorted = Float64Array.from(this.samples).sort();
    const perSender: BottleneckSummary['perSender'] = {};
    for (const s of this.senders.values()) perSender[s.ip] = { ...s.stats };
    return {
      ...this.counters,
      queueMedianBytes: sorted.length ? percentile(sorted, 0.5) : 0,
      queueP99Bytes: sorted.length ? percentile(sorted, 0.99) : 0,
      perSender,
    };
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.timer?.cancel();
    const links: WireLink[] = [this.front];
    for (const s of this.senders.values()) {
      await s.opening?.catch(() => undefined);
      if (s.upstream) links.push(s.upstream);
    }
    await Promise.all(links.map((l) => l.close()));
  }

  // --- sender → receiver: verify, queue (mark or drop), drain at the rate, re-ICRC, send ------

  private fromSender(datagram: Uint8Array, src: PeerAddress): void {
    if (this.closed) return;
    const srcBytes = parseIpAddress(src.address);
    if (datagram.length < MIN_ICRC_PAYLOAD || srcBytes === undefined || srcBytes.length !== this.listenBytes.length) {
      this.counters.ignored++;
      return;
    }
    const info = this.info;
    info.srcAddr = srcBytes;
    info.srcPort = src.port;
    info.dstAddr = this.listenBytes;
    info.dstPort = this.front.local.port;
    if (checkIcrc(info, datagram, 'recover').status === 'bad') {
      this.counters.badIcrc++;
      return;
    }
    const sender = this.sender(src.address, srcBytes);
    sender.port = src.port;
    const now = this.clock.now();
    // Bring the queue up to date first: its length at this arrival is what RED judges.
    this.drain(now);
    const wireBytes = datagram.length + this.headerBytes;
    if (this.qBytes + wireBytes > this.red.limitBytes) {
      this.counters.dropped++;
      sender.stats.dropped++;
      return;
    }
    const copy = new Uint8Array(datagram); // the link may reuse `datagram` after we return
    if (this.red.marking) {
      const p = redProbability(this.qBytes, this.red);
      if (p >= 1 || (p > 0 && this.rng.next() < p)) {
        setBthFecn(copy, 0, true);
        this.counters.marked++;
        sender.stats.marked++;
      }
    }
    if (this.qHead === this.queue.length) {
      // Idle link: serialization of this packet starts now.
      this.queue.length = 0;
      this.qHead = 0;
      if (this.freeAt < now) this.freeAt = now;
    }
    this.queue.push({ datagram: copy, sender, wireBytes, arrivedUs: now });
    this.qBytes += wireBytes;
    if (this.qBytes > this.counters.queueMaxBytes) this.counters.queueMaxBytes = this.qBytes;
    this.sample(this.qBytes);
    this.drain(now);
  }

  /** Sends every packet whose serialization has finished by `now`; re-arms for the next one. */
  private drain(now: number): void {
    while (this.qHead < this.queue.length) {
      const q = this.queue[this.qHead]!;
      if (q.sender.upstream === undefined) {
        // Its upstream socket is still opening; the link waits (opening resumes the drain).
        return;
      }
      const start = Math.max(this.freeAt, q.arrivedUs);
      const end = start + (q.wireBytes * 8e6) / this.opts.rateBps;
      if (end > now) {
        this.arm(end);
        return;
      }
      this.freeAt = end;
      this.qHead++;
      this.qBytes -= q.wireBytes;
      this.forward(q);
    }
    if (this.qHead > 4096 && this.qHead * 2 > this.queue.length) {
      this.queue.splice(0, this.qHead);
      this.qHead = 0;
    }
  }

  private arm(at: number): void {
    if (this.timer !== undefined && this.timerAt <= at) return;
    this.timer?.cancel();
    this.timerAt = at;
    this.timer = this.clock.at(at, () => {
      this.timer = undefined;
      this.timerAt = Infinity;
      if (!this.closed) this.drain(this.clock.now());
    });
  }

  private forward(q: Queued): void {
    const up = q.sender.upstream!;
    const info = this.info;
    info.srcAddr = q.sender.ipBytes;
    info.srcPort = up.local.port;
    info.dstAddr = this.toBytes;
    info.dstPort = this.opts.to.port;
    writeIcrc(q.datagram, icrcOfUdpPayload(info, q.datagram));
    up.sendRaw(this.opts.to, up.local.port, q.datagram);
    this.counters.forwarded++;
    this.counters.forwardedBytes += q.datagram.length;
    q.sender.stats.forwarded++;
    q.sender.stats.forwardedBytes += q.datagram.length;
  }

  private sample(bytes: number): void {
    if (++this.sampleTick < this.sampleEvery) return;
    this.sampleTick = 0;
    this.samples.push(bytes);
    if (this.samples.length >= MAX_SAMPLES) {
      // Keep every other sample and sample half as often: a long run stays bounded and uniform.
      for (let i = 0; i < this.samples.length / 2; i++) this.samples[i] = this.samples[2 * i]!;
      this.samples.length = this.samples.length / 2;
      this.sampleEvery *= 2;
    }
  }

  // --- upstream sockets, and receiver → sender --------------------------------------------

  private sender(ip: string, ipBytes: Uint8Array): Sender {
    let s = this.senders.get(ip);
    if (s !== undefined) return s;
    const sender: Sender = { ip, ipBytes, port: 0, upstream: undefined, opening: undefined, stats: { forwarded: 0, forwardedBytes: 0, marked: 0, dropped: 0 } };
    s = sender;
    this.senders.set(ip, sender);
    sender.opening = this.openUpstream(sender).then(
      (link) => {
        sender.opening = undefined;
        if (this.closed) {
          void link.close();
          return;
        }
        sender.upstream = link;
        link.setRxHook((datagram, src) => this.fromReceiver(sender, datagram, src));
        this.opts.log?.(`sender ${ip}: forwarding to ${this.opts.to.address}:${this.opts.to.port} from ${ip}:${link.local.port}`);
        this.drain(this.clock.now());
      },
      (e: Error) => {
        sender.opening = undefined;
        this.opts.log?.(`sender ${ip}: cannot open an upstream socket (${e.message}); its packets are dropped`);
        // Leave the sender unusable but the queue moving: drop what it has queued.
        this.purge(sender);
      },
    );
    return sender;
  }

  private async openUpstream(s: Sender): Promise<WireLink> {
    const open = (port: number): Promise<UdpLink> => UdpLink.open({ address: s.ip, port, clock: this.clock, warn: warner(this.opts.log), probeTimeoutMs: 200 });
    let link: UdpLink;
    try {
      link = await open(this.front.local.port);
    } catch {
      // The listen port on this IP is taken (the sender shares the listen address): any port.
      link = await open(0);
    }
    if (!isWireLink(link)) throw new TypeError('the UDP link does not expose its wire level');
    return link;
  }

  private purge(s: Sender): void {
    const keep = this.queue.slice(this.qHead).filter((q) => {
      if (q.sender !== s) return true;
      this.qBytes -= q.wireBytes;
      this.counters.dropped++;
      s.stats.dropped++;
      return false;
    });
    this.queue.length = 0;
    this.queue.push(...keep);
    this.qHead = 0;
    this.senders.delete(s.ip);
    this.drain(this.clock.now());
  }

  private fromReceiver(s: Sender, datagram: Uint8Array, src: PeerAddress): void {
    if (this.closed) return;
    const up = s.upstream!;
    const srcBytes = parseIpAddress(src.address);
    if (datagram.length < MIN_ICRC_PAYLOAD || srcBytes === undefined || srcBytes.length !== this.listenBytes.length || s.port === 0) {
      this.counters.ignored++;
      return;
    }
    const info = this.info;
    info.srcAddr = srcBytes;
    info.srcPort = src.port;
    info.dstAddr = s.ipBytes;
    info.dstPort = up.local.port;
    if (checkIcrc(info, datagram, 'recover').status === 'bad') {
      this.counters.badIcrc++;
      return;
    }
    const copy = new Uint8Array(datagram);
    info.srcAddr = this.listenBytes;
    info.srcPort = this.front.local.port;
    info.dstAddr = s.ipBytes;
    info.dstPort = s.port;
    writeIcrc(copy, icrcOfUdpPayload(info, copy));
    this.front.sendRaw({ address: s.ip, port: s.port }, this.front.local.port, copy);
    this.counters.returned++;
  }
}

function warner(log: ((line: string) => void) | undefined): (w: LinkWarning) => void {
  return (w) => log?.(`warning ${w.code}: ${w.message}`);
}

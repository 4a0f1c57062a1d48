/**
 * The prober: our side of a conformance session. It is not a QP of the verbs engine: every
 * packet it sends is crafted here (its own QPN and PSNs, any header value, a good or a wrong
 * ICRC, any length), and every datagram the peer sends is logged before the link judges it.
 *
 * It does keep just enough responder state to acknowledge the peer's own requests (pingpong
 * servers answer each SEND with one of their own and, without an ACK, retransmit it forever)
 * and to answer its RDMA READs with zeros (a perftest client reads from us), and a case can
 * switch that off to watch the peer's retransmissions.
 */

import { ackSyndrome, nakSyndrome, NAK_CODE } from '../wire/aeth.js';
import { DEFAULT_PKEY } from '../wire/constants.js';
import { opcodeOf, type OpcodeInfo } from '../wire/opcode.js';
import { emitPacket, packetLength, padFor, parsePacket, type PacketParse, type RocePacket } from '../wire/packet.js';
import { psnAdd, psnDiff } from '../wire/psn.js';
import { recoverIpv4Id } from '../wire/icrc.js';
import { parseIpAddress } from '../wire/frame.js';
import type { Bth } from '../wire/bth.js';
import type { Reth } from '../wire/reth.js';
import type { AtomicEth } from '../wire/atomic.js';
import { UdpLink } from '../link/udp.js';
import type { PeerAddress } from '../link/link.js';
import type { RxHook } from '../link/fault.js';
import { PcapWriter } from '../pcap/writer.js';

export interface LoggedPacket {
  dir: 'tx' | 'rx';
  /** ms since the prober opened (performance.now based). */
  at: number;
  /** The whole UDP payload, ICRC included (as sent or as received, before any check). */
  bytes: Uint8Array;
  /** UDP ports of the datagram. */
  srcPort: number;
  dstPort: number;
}

export interface Rx {
  at: number;
  bytes: Uint8Array;
  parsed: PacketParse;
  /** The packet passed the link's ICRC check (it reached the handler). */
  icrcOk: boolean;
}

export interface ProberOptions {
  /** Local address to bind (the address the peer was told in the GID). */
  bind: string;
  /** Local UDP port. Default 4791: real peers answer to 4791 whatever the source port. */
  port?: number;
  peer: PeerAddress;
}

export type IcrcChoice = 'good' | 'bad' | 'none';

/** Fields of a request the cases vary; anything not given is a valid default. */
export interface ReqOptions {
  psn: number;
  ackReq?: boolean;
  destQp?: number;
  pkey?: number;
  tver?: number;
  padCount?: number;
  se?: boolean;
  resv7?: number;
  reth?: Reth;
  atomicEth?: AtomicEth;
  payload?: Uint8Array;
  immDt?: number;
}

export class Prober {
  readonly link: UdpLink;
  readonly peer: PeerAddress;
  readonly ourQpn: number;
  readonly log: LoggedPacket[] = [];
  /** The peer's QPN of the current session. */
  peerQpn = 0;
  /** PSN of our next new request (the peer's ePSN when all is well). */
  nextPsn = 0;
  /** PSN we expect on the peer's next request to us. */
  peerPsn = 0;
  /** Our responder's MSN towards the peer. */
  msn = 0;
  /** Acknowledge the peer's requests (see the file comment). */
  autoAck = true;
  /** Path MTU of the session: how READ responses to the peer are cut. */
  mtu = 1024;
  /** Requests from the peer we acknowledged, by PSN (the echo counter of the cases). */
  peerRequests: { psn: number; opcode: number; at: number }[] = [];
  private readonly t0 = performance.now();
  private readonly waiters = new Set<{ pred: (r: Rx) => boolean; done: (r: Rx) => void }>();
  private readonly rxs: Rx[] = [];
  private readonly peerAddr: Uint8Array;
  private readonly localAddr: Uint8Array;
  private pendingRaw: Uint8Array | undefined;

  private constructor(link: UdpLink, peer: PeerAddress) {
    this.link = link;
    this.peer = peer;
    this.ourQpn = 0x100 + Math.floor(Math.random() * 0xfff000);
    this.peerAddr = parseIpAddress(peer.address) ?? new Uint8Array(4);
    this.localAddr = parseIpAddress(link.local.address) ?? new Uint8Array(4);
    const hook: RxHook = (datagram, src, deliver) => {
      // Logged before the ICRC check, so that what the link drops is still in the pcap.
      this.pendingRaw = datagram;
      this.log.push({ dir: 'rx', at: this.now(), bytes: Uint8Array.from(datagram), srcPort: src.port, dstPort: link.local.port });
      deliver(datagram);
      if (this.pendingRaw === datagram) {
        this.pendingRaw = undefined;
        this.record(datagram, false);
      }
    };
    link.setRxHook(hook);
    link.onReceive((payload) => {
      this.pendingRaw = undefined;
      this.record(payload, true);
    });
  }

  static async open(o: ProberOptions): Promise<Prober> {
    const link = await UdpLink.open({ address: o.bind, port: o.port ?? 4791, warn: () => undefined });
    return new Prober(link, o.peer);
  }

  now(): number {
    return performance.now() - this.t0;
  }

  /** Index into `log` / received packets, to ask for what happened after it. */
  mark(): { log: number; rx: number } {
    return { log: this.log.length, rx: this.rxs.length };
  }

  received(since: { rx: number }): Rx[] {
    return this.rxs.slice(since.rx);
  }

  /** Starts a fresh session (after an exchange). */
  resetSession(peerQpn: number, ourPsn: number, peerPsn: number): void {
    this.peerQpn = peerQpn;
    this.nextPsn = ourPsn;
    this.peerPsn = peerPsn;
    this.msn = 0;
    this.autoAck = true;
    this.peerRequests = [];
  }

  // --- building ------------------------------------------------------------------------

  /** A request packet record (RC) with valid defaults for everything not given. */
  request(name: string, o: ReqOptions): RocePacket {
    const opcode = opcodeOf(name);
    const payload = o.payload ?? new Uint8Array(0);
    const bth: Bth = {
      opcode, se: o.se ?? false, m: false, padCount: o.padCount ?? padFor(payload.length), tver: o.tver ?? 0,
      pkey: o.pkey ?? DEFAULT_PKEY, fecn: false, becn: false, resv6: 0, destQp: o.destQp ?? this.peerQpn,
      ackReq: o.ackReq ?? true, resv7: o.resv7 ?? 0, psn: o.psn & 0xffffff,
    };
    const p: RocePacket = { bth, payload, icrc: 0 };
    if (o.reth) p.reth = o.reth;
    if (o.atomicEth) p.atomicEth = o.atomicEth;
    if (o.immDt !== undefined) p.immDt = { data: o.immDt };
    return p;
  }

  ack(psn: number, syndrome = ackSyndrome(), destQp = this.peerQpn): RocePacket {
    const p = this.request('RC_ACKNOWLEDGE', { psn, destQp, ackReq: false });
    p.aeth = { syndrome, msn: this.msn };
    return p;
  }

  /** Bytes of a record without the ICRC (the link appends it). */
  static bytes(p: RocePacket): Uint8Array {
    const b = new Uint8Array(packetLength(p));
    emitPacket(p, b, 0);
    return b.subarray(0, b.length - 4);
  }

  // --- sending -------------------------------------------------------------------------

  send(p: RocePacket, icrc: IcrcChoice = 'good'): Uint8Array {
    return this.sendBytes(Prober.bytes(p), icrc);
  }

  /**
   * Sends `body` (a UDP payload without ICRC) with a correct ICRC, a wrong one (the correct
   * one with its bits inverted) or none at all. Returns the datagram as sent.
   */
  sendBytes(body: Uint8Array, icrc: IcrcChoice = 'good'): Uint8Array {
    let datagram: Uint8Array;
    if (icrc === 'none' || body.length < 12) {
      datagram = Uint8Array.from(body);
    } else {
      const w = this.link.frame(this.peer, this.link.local.port, [body]);
      if (w === undefined) return body;
      datagram = w.datagram;
      if (icrc === 'bad') {
        const n = datagram.length;
        for (let i = n - 4; i < n; i++) datagram[i] = datagram[i]! ^ 0xff;
      }
    }
    this.log.push({ dir: 'tx', at: this.now(), bytes: Uint8Array.from(datagram), srcPort: this.link.local.port, dstPort: this.peer.port });
    this.link.sendRaw(this.peer, this.link.local.port, datagram);
    return datagram;
  }

  // --- receiving -----------------------------------------------------------------------

  private record(datagram: Uint8Array, icrcOk: boolean): void {
    const bytes = Uint8Array.from(datagram);
    const r: Rx = { at: this.now(), bytes, parsed: parsePacket(bytes), icrcOk };
    this.rxs.push(r);
    if (icrcOk && r.parsed.ok) this.autoRespond(r.parsed.packet, r.parsed.info);
    for (const w of [...this.waiters]) {
      if (w.pred(r)) {
        this.waiters.delete(w);
        w.done(r);
      }
    }
  }

  /**
   * Answers a request received while `autoAck` was off, as `autoAck` would have: for a case that
   * held back its ACK on purpose and now lets the peer's request complete.
   */
  respondTo(r: Rx): void {
    if (r.icrcOk && r.parsed.ok) this.autoRespond(r.parsed.packet, r.parsed.info);
  }

  /** The peer's requests to us: ACK them in order (READs: answer them), re-ACK duplicates. */
  private autoRespond(p: RocePacket, info: OpcodeInfo): void {
    if (!info.request || info.transport !== 'RC' || p.bth.destQp !== this.ourQpn) return;
    if (!this.autoAck) return;
    const read = info.name === 'RC_RDMA_READ_REQUEST';
    const d = psnDiff(p.bth.psn, this.peerPsn);
    if (d === 0) {
      // A READ takes one PSN per response packet.
      const n = read ? this.readPackets(p.reth?.dmaLength ?? 0) : 1;
      this.peerPsn = psnAdd(this.peerPsn, n);
      if (info.end) this.msn = (this.msn + 1) & 0xffffff;
      if (info.end) this.peerRequests.push({ psn: p.bth.psn, opcode: p.bth.opcode, at: this.now() });
      if (read) this.sendReadResponses(p.bth.psn, p.reth?.dmaLength ?? 0);
      else if (p.bth.ackReq) this.send(this.ack(p.bth.psn));
    } else if (d < 0) {
      // Duplicate: a READ is executed again (IBTA C9-112 area), anything else re-ACKed.
      if (read) this.sendReadResponses(p.bth.psn, p.reth?.dmaLength ?? 0);
      else this.send(this.ack(psnAdd(this.peerPsn, -1)));
    } else {
      this.send(this.ack(this.peerPsn, nakSyndrome(NAK_CODE.PSN_SEQUENCE_ERROR)));
    }
  }

  /** Response packets of a READ of `len` bytes. */
  readPackets(len: number): number {
    return Math.max(1, Math.ceil(len / this.mtu));
  }

  /** The READ response packets for a READ at `psn` of `len` bytes (zeros), in order. */
  readResponses(psn: number, len: number): RocePacket[] {
    const n = this.readPackets(len);
    const out: RocePacket[] = [];
    for (let i = 0; i < n; i++) {
      const name = n === 1 ? 'RC_RDMA_READ_RESPONSE_ONLY' : i === 0 ? 'RC_RDMA_READ_RESPONSE_FIRST' : i === n - 1 ? 'RC_RDMA_READ_RESPONSE_LAST' : 'RC_RDMA_READ_RESPONSE_MIDDLE';
      const r = this.request(name, { psn: psnAdd(psn, i), ackReq: false, payload: new Uint8Array(i === n - 1 ? len - i * this.mtu : this.mtu) });
      // FIRST, LAST and ONLY carry an AETH; MIDDLE does not.
      if (name !== 'RC_RDMA_READ_RESPONSE_MIDDLE') r.aeth = { syndrome: ackSyndrome(), msn: this.msn };
      out.push(r);
    }
    return out;
  }

  private sendReadResponses(psn: number, len: number): void {
    for (const r of this.readResponses(psn, len)) this.send(r);
  }

  /** The first packet (from now on, or among those since `since`) that satisfies `pred`. */
  waitFor(pred: (r: Rx) => boolean, ms: number, since?: { rx: number }): Promise<Rx | undefined> {
    if (since) {
      const hit = this.rxs.slice(since.rx).find(pred);
      if (hit) return Promise.resolve(hit);
    }
    return new Promise((resolve) => {
      const w = {
        pred,
        done: (r: Rx) => {
          clearTimeout(timer);
          resolve(r);
        },
      };
      const timer = setTimeout(() => {
        this.waiters.delete(w);
        resolve(undefined);
      }, ms);
      this.waiters.add(w);
    });
  }

  /** Responses from the peer's QP to ours (ACK, NAK, READ responses, atomic ACKs). */
  static isResponse(r: Rx): boolean {
    return r.icrcOk && r.parsed.ok && !r.parsed.info.request && r.parsed.info.transport === 'RC';
  }

  // --- captures ------------------------------------------------------------------------

  /** The logged packets since `since` as a pcap (Ethernet, addresses of the session). */
  pcap(since: { log: number }, until = this.log.length): Uint8Array {
    const chunks: Uint8Array[] = [];
    const w = new PcapWriter((c) => chunks.push(Uint8Array.from(c)));
    for (const p of this.log.slice(since.log, until)) {
      const tx = p.dir === 'tx';
      const src = tx ? this.localAddr : this.peerAddr;
      const dst = tx ? this.peerAddr : this.localAddr;
      // The socket never showed us the peer's IPv4 ID (rxe numbers its packets), and the ICRC
      // covers it: write the ID the ICRC implies, so the capture checks strictly in Wireshark and
      // `roce decode`. Ours went out with ID 0 and DF; a packet with a broken ICRC keeps that too.
      const id = !tx && src.length === 4
        ? recoverIpv4Id({ family: 4, srcAddr: src, dstAddr: dst, srcPort: p.srcPort, dstPort: p.dstPort }, p.bytes)
        : undefined;
      w.writeRoce(BigInt(Math.round(p.at * 1e6)), {
        src, dst, srcPort: p.srcPort, dstPort: p.dstPort,
        ...(id !== undefined ? { ipId: id.ipId, dontFragment: id.dontFragment } : {}),
      }, p.bytes);
    }
    return Buffer.concat(chunks);
  }

  async close(): Promise<void> {
    for (const w of this.waiters) w.done(undefined as unknown as Rx);
    this.waiters.clear();
    await this.link.close();
  }
}

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

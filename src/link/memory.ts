/**
 * `MemoryLink`: two links joined in memory on a clock, for deterministic tests and the simulator.
 *
 * It behaves like a wire between two RoCEv2 hosts, minus loss (wrap it in `FaultyLink` for that):
 * - each datagram is copied once, at send time, into a buffer that becomes the receiver's payload,
 *   so the sender may reuse its parts as soon as `send` returns;
 * - it arrives `latencyUs` later on the clock, in send order;
 * - the ICRC is computed for real (IPv4 with ID 0 + DF, as `UdpLink` sends) and checked strictly
 *   on arrival, so a bit flipped in between is caught and counted as on a real wire.
 *   `icrc: false` turns both off (fuzzing): the ICRC field is still there (A17: every RoCEv2
 *   packet ends in it, and every receiver, ours included, parses the last 4 bytes as the ICRC),
 *   but `send` leaves it zero and nothing is checked, as `caps.icrcGenerate` / `caps.icrcVerify`
 *   say. (Leaving the field out made the peer read 4 bytes of every payload as the ICRC and
 *   every ACK as truncated.) `sendRaw` puts bytes on the wire as they are.
 */

import type { Clock } from '../runtime/clock.js';
import { parseIpAddress } from '../wire/frame.js';
import { checkIcrc, icrcOfUdpPayload, ICRC_LEN, MIN_ICRC_PAYLOAD, writeIcrc, type UdpDatagramInfo } from '../wire/icrc.js';
import type { RxHook, WireDatagram, WireLink } from './link.js';
import { emptyDrops, type LinkCaps, type LinkDropReason, type LinkRxHandler, type PeerAddress, type RxMeta } from './link.js';

export interface MemoryLinkOptions {
  /** Side A's address. Default 10.0.0.1:4791 (IPv4) or [fd00::1]:4791 (IPv6). */
  a?: PeerAddress;
  /** Side B's address. Default 10.0.0.2:4791 or [fd00::2]:4791. */
  b?: PeerAddress;
  /** Default: the family of `a`/`b` when given, else 4. */
  family?: 4 | 6;
  /** One-way delay, µs. Default 2. */
  latencyUs?: number;
  /** Generate and verify ICRCs. Default true. */
  icrc?: boolean;
  /** Largest UDP payload accepted, ICRC included. Default 65507 (IPv4) / 65527 (IPv6). */
  maxDatagram?: number;
}

export interface MemoryLinkCounters {
  sent: number;
  received: number;
}

const BTH_LEN = 12;

export class MemoryLink implements WireLink {
  readonly caps: LinkCaps;
  readonly local: PeerAddress;
  readonly counters: MemoryLinkCounters = { sent: 0, received: 0 };

  private readonly drop = emptyDrops();
  private readonly addr: Uint8Array;
  private readonly info: UdpDatagramInfo;
  private peer!: MemoryLink;
  private handler: LinkRxHandler | undefined;
  private rxHook: RxHook | undefined;
  private closed = false;

  private constructor(
    private readonly clock: Clock,
    local: PeerAddress,
    addr: Uint8Array,
    private readonly latencyUs: number,
    icrc: boolean,
    maxDatagram: number,
  ) {
    this.local = { address: local.address, port: local.port };
    this.addr = addr;
    const family = addr.length === 4 ? 4 : 6;
    this.caps = { family, icrcGenerate: icrc, icrcVerify: icrc ? 'strict' : 'off', maxDatagram };
    this.info = { family, srcAddr: addr, dstAddr: addr, srcPort: 0, dstPort: 0, ipId: 0, ipFlagsFrag: 0x4000 };
  }

  /** Two links, each the other's only peer. */
  static pair(clock: Clock, opts: MemoryLinkOptions = {}): [MemoryLink, MemoryLink] {
    const family = opts.family ?? (opts.a !== undefined ? familyOf(opts.a.address) : opts.b !== undefined ? familyOf(opts.b.address) : 4);
    const a = opts.a ?? { address: family === 4 ? '10.0.0.1' : 'fd00::1', port: 4791 };
    const b = opts.b ?? { address: family === 4 ? '10.0.0.2' : 'fd00::2', port: 4791 };
    const aAddr = parseIpAddress(a.address);
    const bAddr = parseIpAddress(b.address);
    const len = family === 4 ? 4 : 16;
    if (aAddr?.length !== len || bAddr?.length !== len) throw new RangeError(`MemoryLink: ${a.address} and ${b.address} must both be IPv${family} addresses`);
    const latency = opts.latencyUs ?? 2;
    if (!Number.isFinite(latency) || latency < 0) throw new RangeError(`MemoryLink: latencyUs ${latency}`);
    const icrc = opts.icrc ?? true;
    const max = opts.maxDatagram ?? (family === 4 ? 65507 : 65527);
    const la = new MemoryLink(clock, a, aAddr, latency, icrc, max);
    const lb = new MemoryLink(clock, b, bAddr, latency, icrc, max);
    la.peer = lb;
    lb.peer = la;
    return [la, lb];
  }

  get drops(): Readonly<Record<LinkDropReason, number>> {
    return this.drop;
  }

  onReceive(handler: LinkRxHandler): void {
    this.handler = handler;
  }

  setRxHook(hook: RxHook | undefined): void {
    this.rxHook = hook;
  }

  send(dst: PeerAddress, srcPort: number, parts: readonly Uint8Array[]): void {
    const w = this.frame(dst, srcPort, parts);
    if (w !== undefined) this.sendRaw(dst, w.srcPort, w.datagram);
  }

  frame(dst: PeerAddress, srcPort: number, parts: readonly Uint8Array[]): WireDatagram | undefined {
    if (this.closed) {
      this.drop.closed++;
      return undefined;
    }
    const gen = this.caps.icrcGenerate;
    let len = ICRC_LEN;
    for (const p of parts) len += p.length;
    if (!this.routes(dst) || !validPort(srcPort) || len > this.caps.maxDatagram || len < BTH_LEN + ICRC_LEN) {
      this.drop.sendError++;
      return undefined;
    }
    const datagram = new Uint8Array(len);
    let at = 0;
    for (const p of parts) {
      datagram.set(p, at);
      at += p.length;
    }
    if (gen) {
      const info = this.info;
      info.srcAddr = this.addr;
      info.dstAddr = this.peer.addr;
      info.srcPort = srcPort;
      info.dstPort = dst.port;
      writeIcrc(datagram, icrcOfUdpPayload(info, datagram));
    }
    return { datagram, srcPort };
  }

  sendRaw(dst: PeerAddress, srcPort: number, datagram: Uint8Array): void {
    if (this.closed) {
      this.drop.closed++;
      return;
    }
    if (!this.routes(dst) || !validPort(srcPort) || datagram.length > this.caps.maxDatagram) {
      this.drop.sendError++;
      return;
    }
    this.counters.sent++;
    const peer = this.peer;
    const src: PeerAddress = { address: this.local.address, port: srcPort };
    this.clock.at(this.clock.now() + this.latencyUs, () => peer.arrive(datagram, src));
  }

  async close(): Promise<void> {
    this.closed = true;
    this.handler = undefined;
    this.rxHook = undefined;
  }

  /** The only destination is the peer, at its address and port. */
  private routes(dst: PeerAddress): boolean {
    return dst.port === this.peer.local.port && sameAddress(dst.address, this.peer);
  }

  private arrive(datagram: Uint8Array, src: PeerAddress): void {
    if (this.closed) {
      this.drop.closed++;
      return;
    }
    const hook = this.rxHook;
    if (hook === undefined) this.accept(datagram, src, false);
    else hook(datagram, src, (d, ce = false) => this.accept(d, src, ce));
  }

  private accept(datagram: Uint8Array, src: PeerAddress, ce: boolean): void {
    if (this.closed) {
      this.drop.closed++;
      return;
    }
    if (datagram.length < MIN_ICRC_PAYLOAD) {
      this.drop.tooShort++;
      return;
    }
    if ((datagram[1]! & 0x0f) !== 0) {
      this.drop.notRoce++;
      return;
    }
    const info = this.info;
    info.srcAddr = this.peer.addr;
    info.dstAddr = this.addr;
    info.srcPort = src.port;
    info.dstPort = this.local.port;
    const c = checkIcrc(info, datagram, this.caps.icrcVerify);
    if (c.status === 'bad') {
      this.drop.badIcrc++;
      return;
    }
    this.counters.received++;
    const meta: RxMeta = { src, icrc: c.status, ce, at: this.clock.now() };
    if (c.ipId !== undefined) meta.ipId = c.ipId;
    this.handler?.(datagram, meta);
  }
}

function familyOf(address: string): 4 | 6 {
  return address.includes(':') ? 6 : 4;
}

function validPort(p: number): boolean {
  return Number.isInteger(p) && p >= 0 && p <= 0xffff;
}

function sameAddress(text: string, link: MemoryLink): boolean {
  if (text === link.local.address) return true;
  const b = parseIpAddress(text);
  const a = parseIpAddress(link.local.address);
  return b !== undefined && a !== undefined && b.length === a.length && b.every((x, i) => x === a[i]);
}

/**
 * The link: where RoCEv2 UDP payloads enter and leave the stack.
 *
 * A link owns everything below the BTH that a UDP socket owns or knows: addresses, ports
 * and the ICRC, which covers the IP and UDP headers. The transport engines above hand it
 * packets without an ICRC and receive packets whose ICRC it has already judged.
 *
 * Implementations: `UdpLink` (node:dgram on 4791), `MemoryLink` (an in-process pair on a
 * virtual clock), and middleware that wraps another link: `FaultyLink` (seeded loss,
 * reordering, duplication, bit flips, delay, FECN marking), `PcapTap` (writes every packet
 * sent and received to a capture).
 */

import type { Clock } from '../runtime/clock.js';
import type { IcrcMode, IcrcStatus } from '../wire/icrc.js';

export interface PeerAddress {
  /** Textual IPv4 or IPv6 address. */
  address: string;
  /** UDP port: 4791 for every RoCEv2 peer, but tests may run several stacks on one host. */
  port: number;
}

export interface RxMeta {
  /** Where the datagram came from (address and UDP source port). */
  src: PeerAddress;
  /** ICRC verdict (never `bad`: bad packets are counted and dropped by the link). */
  icrc: IcrcStatus;
  /** IPv4 ID the ICRC implied, when it was recovered. */
  ipId?: number | undefined;
  /** The IP header carried ECN CE. Only links that can see it set it (not node:dgram). */
  ce: boolean;
  /** Receive time on the link's clock, µs. */
  at: number;
}

export interface LinkCaps {
  family: 4 | 6;
  /** Whether the link appends an ICRC to what it sends. */
  icrcGenerate: boolean;
  /** How received ICRCs are judged. */
  icrcVerify: IcrcMode;
  /** Largest UDP payload the link carries (headers + path MTU + ICRC must fit). */
  maxDatagram: number;
}

/** Why a link dropped a datagram before the transport saw it. */
export type LinkDropReason = 'badIcrc' | 'tooShort' | 'notRoce' | 'injectedLoss' | 'sendError' | 'closed';

export type LinkRxHandler = (payload: Uint8Array, meta: RxMeta) => void;

export interface Link {
  readonly caps: LinkCaps;
  /** The local address and port the link sends from and receives on. */
  readonly local: PeerAddress;
  /**
   * Optional: the clock `RxMeta.at` is read on, for a link that reads it as it receives (within
   * a batch, at most 32 datagrams before the handler sees one). A device on the same clock takes
   * that time instead of reading the clock again for every packet.
   */
  readonly rxClock?: Clock;
  /**
   * Sends one RoCEv2 UDP payload, given as parts (e.g. headers, payload view, pad) WITHOUT
   * the 4 ICRC bytes: the link computes and appends the ICRC when `caps.icrcGenerate`.
   * `srcPort` is the UDP source port to use where the link can choose it (rxe derives it
   * from the QPNs for ECMP entropy). The parts may be reused by the caller after return.
   */
  send(dst: PeerAddress, srcPort: number, parts: readonly Uint8Array[]): void;
  /**
   * Registers the single receive handler. `payload` is the whole UDP payload including the
   * ICRC; it and `meta` are valid only until the handler returns (the link may reuse both).
   */
  onReceive(handler: LinkRxHandler): void;
  /**
   * Optional: registers a callback run after each batch of received datagrams has been handed to
   * the receive handler (one `recvmmsg`), before the link reads on and before what was sent in
   * answer is flushed. The device answers a batch there (coalesced ACKs, freed send windows)
   * instead of on the next event-loop turn, so that the peer is not kept waiting for the rest of the
   * link's receive budget. The last batch of a read is answered after the promise reactions it
   * caused have run, so that what the application posted in answer leaves in the same flush; `last`
   * says which call that is (nothing more is waiting to be read). A link that delivers one datagram
   * at a time need not call it.
   */
  onReceiveBatchEnd?(fn: (last: boolean) => void): void;
  /**
   * Optional: reads and delivers, now, the datagrams that have arrived and wait to be read. The
   * device calls it before it runs the QPs whose deadline has come: a link that reads after the
   * event loop's timers would otherwise let an ACK that came in time wait behind the timer that
   * declares it late.
   */
  readWaiting?(): void;
  /** Drops by reason since the link was opened. */
  readonly drops: Readonly<Record<LinkDropReason, number>>;
  close(): Promise<void>;
}

export function emptyDrops(): Record<LinkDropReason, number> {
  return { badIcrc: 0, tooShort: 0, notRoce: 0, injectedLoss: 0, sendError: 0, closed: 0 };
}

// Below the ICRC: what link middleware (fault injection, capture, trace) needs. A flipped bit
// must be flipped after the sender computed the ICRC, so the receiving link's check catches
// it as it would on a real wire; see fault.ts for how the layers compose.

/** A datagram as it goes on the wire (a fresh buffer, ICRC included) and its UDP source port. */
export interface WireDatagram {
  datagram: Uint8Array;
  srcPort: number;
}

/** Passes a received datagram on to the link's checks and handler; `ce` sets `RxMeta.ce`. */
export type RxAccept = (datagram: Uint8Array, ce?: boolean) => void;

/**
 * Sees each received datagram before the link checks it. `datagram` is valid only during the call
 * (copy it to hold it); `accept` may be called later, more than once, or never.
 */
export type RxHook = (datagram: Uint8Array, src: PeerAddress, accept: RxAccept) => void;

/** A link that middleware can reach below the ICRC. See the file comment. */
export interface WireLink extends Link {
  /** The datagram `send` would transmit, or undefined when the link cannot send it (counted in `drops`). */
  frame(dst: PeerAddress, srcPort: number, parts: readonly Uint8Array[]): WireDatagram | undefined;
  /** Transmits a datagram (normally from `frame`, possibly altered) as is. The link owns it after the call. */
  sendRaw(dst: PeerAddress, srcPort: number, datagram: Uint8Array): void;
  /** Installs (or removes) the single receive hook. */
  setRxHook(hook: RxHook | undefined): void;
}

export function isWireLink(l: Link): l is WireLink {
  const w = l as Partial<WireLink>;
  return typeof w.frame === 'function' && typeof w.sendRaw === 'function' && typeof w.setRxHook === 'function';
}

/**
 * `PcapTap`: writes every datagram a link sends and receives to a capture, as smoltcp's
 * `phy::PcapWriter` does (`PcapMode { Both, RxOnly, TxOnly }`).
 *
 * Each RoCEv2 UDP payload is framed in synthetic Ethernet/IP/UDP headers by the capture writer, so
 * Wireshark's RoCEv2 dissector decodes it and the ICRC in the file is checkable against the IP and
 * UDP headers written next to it:
 * - sent: the datagram exactly as the inner link framed it (its real ICRC, the source port it
 *   actually leaves from), IPv4 with ID 0 and DF, the header the ICRC was computed for;
 * - received: what the inner link accepted (after its ICRC check; dropped datagrams are counted
 *   there, not captured), IPv4 with the ID the ICRC implied (`RxMeta.ipId`, recovered when the
 *   peer's IDs vary) and DF, and ECN CE in the TOS byte when `RxMeta.ce`.
 *
 * Where it sits decides what it sees: `PcapTap(FaultyLink(l))` captures what the stack sent,
 * `FaultyLink(PcapTap(l))` what went on the wire after the injected faults.
 *
 * Timestamps come from `clock` (µs), shifted by `epochOffsetUs` into Unix time: by default the
 * wall clock's offset for a `SystemClock`, and 0 (1970 plus virtual time) for any other clock, so
 * captures of simulated runs are reproducible byte for byte.
 */

import { SystemClock, type Clock } from '../runtime/clock.js';
import { parseIpAddress } from '../wire/frame.js';
import type { RoceFrameOptions } from '../pcap/writer.js';
import type { PeerAddress, RxMeta, WireLink } from './link.js';
import { TapLink } from './middleware.js';

/** What the tap needs of a capture writer; `PcapWriter` and `PcapngWriter` both fit. */
export interface RoceCaptureWriter {
  writeRoce(timestampNs: bigint, frame: RoceFrameOptions, udpPayload: Uint8Array, opts?: { direction?: 'in' | 'out' }): void;
}

export type PcapMode = 'both' | 'rx' | 'tx';

export interface PcapTapOptions {
  /** Default a new SystemClock. */
  clock?: Clock;
  /** Added to `clock.now()` to get Unix time in µs. Default: see the file comment. */
  epochOffsetUs?: number;
}

/** IPv4 TOS / IPv6 traffic class with ECN = CE (RFC 3168). */
const ECN_CE = 0x03;

export class PcapTap extends TapLink {
  /** Frames written, and datagrams the writer refused (it threw: a closed file, say). */
  readonly counters = { written: 0, writeErrors: 0 };

  private readonly clock: Clock;
  private readonly epochOffsetUs: number;
  private readonly tx: boolean;
  private readonly rx: boolean;
  private readonly localAddr: Uint8Array;
  private readonly addrCache = new Map<string, Uint8Array | null>();

  constructor(
    inner: WireLink,
    private readonly writer: RoceCaptureWriter,
    mode: PcapMode = 'both',
    opts: PcapTapOptions = {},
  ) {
    super(inner);
    this.clock = opts.clock ?? new SystemClock();
    this.epochOffsetUs = opts.epochOffsetUs ?? (this.clock instanceof SystemClock ? Date.now() * 1000 - this.clock.now() : 0);
    this.tx = mode !== 'rx';
    this.rx = mode !== 'tx';
    const local = parseIpAddress(inner.local.address);
    if (local === undefined) throw new RangeError(`PcapTap: link address ${inner.local.address} is not an IP address`);
    this.localAddr = local;
  }

  protected observeRx(payload: Uint8Array, meta: RxMeta): void {
    if (this.rx) this.record(payload, 'in', this.addressBytes(meta.src.address), this.localAddr, meta.src.port, this.inner.local.port, meta);
  }

  protected observeTx(dst: PeerAddress, srcPort: number, datagram: Uint8Array): void {
    // Recorded before the inner link owns (and may reuse) the buffer.
    if (this.tx) this.record(datagram, 'out', this.localAddr, this.addressBytes(dst.address), srcPort, dst.port, undefined);
  }

  private record(
    datagram: Uint8Array,
    direction: 'in' | 'out',
    src: Uint8Array | undefined,
    dst: Uint8Array | undefined,
    srcPort: number,
    dstPort: number,
    meta: RxMeta | undefined,
  ): void {
    if (src === undefined || dst === undefined || src.length !== dst.length) {
      this.counters.writeErrors++;
      return;
    }
    const frame: RoceFrameOptions = {
      src,
      dst,
      srcPort,
      dstPort,
      ttl: 64,
      tos: meta?.ce === true ? ECN_CE : 0,
      ipId: meta?.ipId ?? 0,
      dontFragment: true,
    };
    const ts = BigInt(Math.round(this.epochOffsetUs + this.clock.now())) * 1000n;
    try {
      this.writer.writeRoce(ts < 0n ? 0n : ts, frame, datagram, { direction });
      this.counters.written++;
    } catch {
      this.counters.writeErrors++;
    }
  }

  private addressBytes(text: string): Uint8Array | undefined {
    let b = this.addrCache.get(text);
    if (b === undefined) {
      const pct = text.indexOf('%');
      b = parseIpAddress(pct < 0 ? text : text.slice(0, pct)) ?? null;
      if (this.addrCache.size >= 4096) this.addrCache.clear();
      this.addrCache.set(text, b);
    }
    return b ?? undefined;
  }
}

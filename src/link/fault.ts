/**
 * `FaultyLink`: seeded fault injection as link middleware, after smoltcp's `phy::FaultInjector`
 * (its own xorshift32, percentages, "a single bitflip, as the most likely, and the hardest to
 * detect, error"), plus what RoCE needs: duplication, reordering and ECN marking.
 *
 * Where faults happen: on the wire side of the ICRC. A flipped bit must be a bit flipped *after*
 * the sender computed the ICRC, so that the receiving link's ICRC check catches it, as it would on
 * a real wire. The plain `Link.send(dst, srcPort, parts)` takes parts without the ICRC, so it is
 * too high for that; the links expose a lower level for middleware, `WireLink`:
 *
 * - `frame(dst, srcPort, parts)` builds the exact UDP payload `send` would put on the wire, the
 *   ICRC appended, as a fresh buffer, with the source port it would leave from;
 * - `sendRaw(dst, srcPort, datagram)` puts such a datagram on the wire as it is (the ICRC is not
 *   touched); `send` is `frame` + `sendRaw`;
 * - `setRxHook(hook)` shows each received datagram to the hook *before* the link's length and ICRC
 *   checks; the hook passes it on (now, later, twice, altered) with `accept`, or not at all.
 *
 * Middleware implements `WireLink` itself by delegating, so layers compose and their order
 * decides what each sees: `PcapTap(FaultyLink(UdpLink))` records what the stack sent,
 * `FaultyLink(PcapTap(UdpLink))` what went on the wire after the faults.
 *
 * Faults per direction (`tx`: on `sendRaw`, `rx`: in the receive hook), decided per datagram in
 * a fixed order, each with its own draw, so changing one percentage does not shift the others'
 * fates: drop, corrupt (one bit flip), mark (BTH FECN: byte 4 bit 7, which the ICRC masks),
 * duplicate, reorder (hold the datagram back by `delayUs`), and one draw for the flipped bit.
 * The bit is never in BTH byte 4: the ICRC does not cover that byte (a real wire's Ethernet FCS
 * would catch such a flip; nothing here models it). Each direction has its own generator.
 */

import type { Clock, TimerHandle } from '../runtime/clock.js';
import { isWireLink, type LinkCaps, type LinkDropReason, type LinkRxHandler, type PeerAddress, type RxHook, type WireDatagram, type WireLink } from './link.js';

export { isWireLink, type RxAccept, type RxHook, type WireDatagram, type WireLink } from './link.js';

/** Marsaglia's xorshift32 (13, 17, 5), as smoltcp's FaultInjector uses. Never 0. */
export class Xorshift32 {
  private s: number;

  constructor(seed: number) {
    this.s = seed >>> 0 || 0x9e3779b9;
  }

  next(): number {
    let x = this.s;
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    this.s = x >>> 0;
    return this.s;
  }
}

export interface FaultOptions {
  /** Seeds both generators (the rx one through a fixed mix). Print it so a run can be repeated. */
  seed: number;
  /** Percent of datagrams lost. */
  dropPct?: number;
  /** Percent of datagrams with one bit flipped. */
  corruptPct?: number;
  /** Percent of datagrams delivered twice. */
  duplicatePct?: number;
  /** Percent of datagrams held back by `delayUs`, so later ones overtake them. */
  reorderPct?: number;
  /** How long a reordered datagram is held, µs. Default 100. */
  delayUs?: number;
  /** Percent of datagrams marked congested: BTH FECN set (outside the ICRC, so they stay valid). */
  fecnPct?: number;
  /** Also report rx-marked datagrams as IP ECN CE (`RxMeta.ce`), as a link that sees the IP header would. */
  ceMark?: boolean;
  /** Which way faults apply. Default `both`. */
  direction?: 'tx' | 'rx' | 'both';
  /** Called for every fault injected (traces, tests). */
  onFault?: (e: FaultEvent) => void;
}

export type FaultKind = 'drop' | 'corrupt' | 'mark' | 'duplicate' | 'reorder';

export interface FaultEvent {
  dir: 'tx' | 'rx';
  kind: FaultKind;
  /** Datagram number in its direction, from 0. */
  seq: number;
  /** `corrupt`: where the bit was flipped. */
  byte?: number;
  bit?: number;
}

export interface FaultCounters {
  dropped: number;
  corrupted: number;
  duplicated: number;
  reordered: number;
  marked: number;
}

/** What befalls one datagram. */
interface Fate {
  drop: boolean;
  corrupt: boolean;
  mark: boolean;
  duplicate: boolean;
  reorder: boolean;
  /** The raw draw that picks the flipped bit. */
  where: number;
}

const TWO_32 = 2 ** 32;
/** Mixed into the seed for the rx generator so the two directions are independent. */
const RX_SEED_MIX = 0x5bd1e995;
/** The BTH byte the ICRC does not cover (FECN, BECN, reserved). */
const BTH_ECN_BYTE = 4;
const FECN = 0x80;

function threshold(name: string, pct: number | undefined): number {
  const p = pct ?? 0;
  if (!Number.isFinite(p) || p < 0 || p > 100) throw new RangeError(`FaultyLink: ${name} ${p} not in 0..100`);
  return (p / 100) * TWO_32;
}

export class FaultyLink implements WireLink {
  readonly injected: FaultCounters = { dropped: 0, corrupted: 0, duplicated: 0, reordered: 0, marked: 0 };

  private readonly txRng: Xorshift32;
  private readonly rxRng: Xorshift32;
  private readonly t: { drop: number; corrupt: number; mark: number; duplicate: number; reorder: number };
  private readonly delayUs: number;
  private readonly tx: boolean;
  private readonly rx: boolean;
  private readonly held = new Set<TimerHandle>();
  private txSeq = 0;
  private rxSeq = 0;
  private lost = 0;
  private outerHook: RxHook | undefined;
  private closed = false;

  constructor(
    private readonly inner: WireLink,
    private readonly clock: Clock,
    private readonly opts: FaultOptions,
  ) {
    if (!isWireLink(inner)) throw new TypeError('FaultyLink needs a WireLink (frame, sendRaw, setRxHook) to fault below the ICRC');
    if (!Number.isInteger(opts.seed)) throw new RangeError(`FaultyLink: seed ${opts.seed} is not an integer`);
    this.txRng = new Xorshift32(opts.seed);
    this.rxRng = new Xorshift32((opts.seed ^ RX_SEED_MIX) >>> 0);
    this.t = {
      drop: threshold('dropPct', opts.dropPct),
      corrupt: threshold('corruptPct', opts.corruptPct),
      mark: threshold('fecnPct', opts.fecnPct),
      duplicate: threshold('duplicatePct', opts.duplicatePct),
      reorder: threshold('reorderPct', opts.reorderPct),
    };
    this.delayUs = opts.delayUs ?? 100;
    if (!Number.isFinite(this.delayUs) || this.delayUs < 0) throw new RangeError(`FaultyLink: delayUs ${this.delayUs}`);
    const dir = opts.direction ?? 'both';
    this.tx = dir !== 'rx';
    this.rx = dir !== 'tx';
    if (this.rx) inner.setRxHook(this.rxHook);
  }

  get caps(): LinkCaps {
    return this.inner.caps;
  }

  get local(): PeerAddress {
    return this.inner.local;
  }

  /** The inner link's drops, with injected losses counted as `injectedLoss`. */
  get drops(): Readonly<Record<LinkDropReason, number>> {
    const d = { ...this.inner.drops };
    d.injectedLoss += this.lost;
    return d;
  }

  onReceive(handler: LinkRxHandler): void {
    this.inner.onReceive(handler);
  }

  onReceiveBatchEnd(fn: (last: boolean) => void): void {
    this.inner.onReceiveBatchEnd?.(fn);
  }

  readWaiting(): void {
    this.inner.readWaiting?.();
  }

  setRxHook(hook: RxHook | undefined): void {
    if (this.rx) this.outerHook = hook;
    else this.inner.setRxHook(hook);
  }

  send(dst: PeerAddress, srcPort: number, parts: readonly Uint8Array[]): void {
    const w = this.inner.frame(dst, srcPort, parts);
    if (w !== undefined) this.sendRaw(dst, w.srcPort, w.datagram);
  }

  frame(dst: PeerAddress, srcPort: number, parts: readonly Uint8Array[]): WireDatagram | undefined {
    return this.inner.frame(dst, srcPort, parts);
  }

  sendRaw(dst: PeerAddress, srcPort: number, datagram: Uint8Array): void {
    if (!this.tx || this.closed) {
      this.inner.sendRaw(dst, srcPort, datagram);
      return;
    }
    const seq = this.txSeq++;
    const f = this.fate(this.txRng);
    if (this.apply(f, 'tx', seq, datagram)) return;
    const send = (d: Uint8Array): void => this.inner.sendRaw(dst, srcPort, d);
    const copy = f.duplicate ? datagram.slice() : undefined;
    if (f.reorder) this.hold(() => send(datagram));
    else send(datagram);
    if (copy !== undefined) send(copy);
  }

  async close(): Promise<void> {
    this.closed = true;
    for (const h of this.held) h.cancel();
    this.held.clear();
    await this.inner.close();
  }

  // ---------------------------------------------------------------------------------------

  private readonly rxHook: RxHook = (datagram, src, accept) => {
    if (this.closed) return;
    const seq = this.rxSeq++;
    const f = this.fate(this.rxRng);
    const outer = this.outerHook;
    const ce = f.mark && this.opts.ceMark === true;
    const pass = (d: Uint8Array): void => {
      if (outer === undefined) accept(d, ce);
      else outer(d, src, (d2, ce2) => accept(d2, ce || ce2 === true));
    };
    // Anything held past this call, or delivered twice, needs its own copy.
    const d = f.reorder || f.duplicate ? datagram.slice() : datagram;
    if (this.apply(f, 'rx', seq, d)) return;
    const copy = f.duplicate ? d.slice() : undefined;
    if (f.reorder) this.hold(() => pass(d));
    else pass(d);
    if (copy !== undefined) pass(copy);
  };

  private fate(rng: Xorshift32): Fate {
    const t = this.t;
    return {
      drop: rng.next() < t.drop,
      corrupt: rng.next() < t.corrupt,
      mark: rng.next() < t.mark,
      duplicate: rng.next() < t.duplicate,
      reorder: rng.next() < t.reorder,
      where: rng.next(),
    };
  }

  /** Counts and applies drop, corruption and marking in place; returns true if the datagram is gone. */
  private apply(f: Fate, dir: 'tx' | 'rx', seq: number, d: Uint8Array): boolean {
    const on = this.opts.onFault;
    if (f.drop) {
      this.injected.dropped++;
      this.lost++;
      on?.({ dir, kind: 'drop', seq });
      return true;
    }
    if (f.corrupt && d.length > 1) {
      // A bit anywhere but BTH byte 4.
      const idx = f.where % ((d.length - 1) * 8);
      let byte = idx >>> 3;
      if (byte >= BTH_ECN_BYTE) byte++;
      const bit = idx & 7;
      d[byte] = d[byte]! ^ (1 << bit);
      this.injected.corrupted++;
      on?.({ dir, kind: 'corrupt', seq, byte, bit });
    }
    if (f.mark && d.length > BTH_ECN_BYTE) {
      d[BTH_ECN_BYTE] = d[BTH_ECN_BYTE]! | FECN;
      this.injected.marked++;
      on?.({ dir, kind: 'mark', seq });
    }
    if (f.duplicate) {
      this.injected.duplicated++;
      on?.({ dir, kind: 'duplicate', seq });
    }
    if (f.reorder) {
      this.injected.reordered++;
      on?.({ dir, kind: 'reorder', seq });
    }
    return false;
  }

  private hold(fn: () => void): void {
    const h = this.clock.at(this.clock.now() + this.delayUs, () => {
      this.held.delete(h);
      if (!this.closed) fn();
    });
    this.held.add(h);
  }
}

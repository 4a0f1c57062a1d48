/**
 * `TapLink`: the base of link middleware that watches traffic without changing it (`PcapTap`,
 * `TraceLink`). It passes everything through to the inner link and gives subclasses two places
 * to look: `observeRx` for each datagram the inner link accepted (before the stack's handler),
 * and `observeTx` for each datagram as it goes to the wire (framed, ICRC included).
 */

import type { LinkCaps, LinkDropReason, LinkRxHandler, PeerAddress, RxHook, RxMeta, WireDatagram, WireLink } from './link.js';

export abstract class TapLink implements WireLink {
  private handler: LinkRxHandler | undefined;

  constructor(protected readonly inner: WireLink) {
    inner.onReceive((payload, meta) => {
      this.observeRx(payload, meta);
      this.handler?.(payload, meta);
    });
  }

  /** A datagram the inner link accepted; valid only during the call. */
  protected abstract observeRx(payload: Uint8Array, meta: RxMeta): void;

  /** A datagram about to be handed to the inner link, which owns it afterwards. */
  protected abstract observeTx(dst: PeerAddress, srcPort: number, datagram: Uint8Array): void;

  get caps(): LinkCaps {
    return this.inner.caps;
  }

  get local(): PeerAddress {
    return this.inner.local;
  }

  get drops(): Readonly<Record<LinkDropReason, number>> {
    return this.inner.drops;
  }

  onReceive(handler: LinkRxHandler): void {
    this.handler = handler;
  }

  onReceiveBatchEnd(fn: (last: boolean) => void): void {
    this.inner.onReceiveBatchEnd?.(fn);
  }

  readWaiting(): void {
    this.inner.readWaiting?.();
  }

  setRxHook(hook: RxHook | undefined): void {
    this.inner.setRxHook(hook);
  }

  send(dst: PeerAddress, srcPort: number, parts: readonly Uint8Array[]): void {
    const w = this.inner.frame(dst, srcPort, parts);
    if (w !== undefined) this.sendRaw(dst, w.srcPort, w.datagram);
  }

  frame(dst: PeerAddress, srcPort: number, parts: readonly Uint8Array[]): WireDatagram | undefined {
    return this.inner.frame(dst, srcPort, parts);
  }

  sendRaw(dst: PeerAddress, srcPort: number, datagram: Uint8Array): void {
    this.observeTx(dst, srcPort, datagram);
    this.inner.sendRaw(dst, srcPort, datagram);
  }

  close(): Promise<void> {
    this.handler = undefined;
    return this.inner.close();
  }
}

/** Shared by the link tests: RoCEv2 packets to send, and waiting for what arrives. */

import dgram, { type Socket } from 'node:dgram';
import { once } from 'node:events';
import { emitBth } from '../../src/wire/bth.js';
import { padFor } from '../../src/wire/packet.js';
import type { Link, RxMeta } from '../../src/link/link.js';

export const RC_SEND_ONLY = 0x04;

/** RC SEND_ONLY to QP `destQp` as send parts (BTH, payload, pad): what the transport hands a link. */
export function sendOnly(psn: number, payload: Uint8Array, destQp = 0x11): Uint8Array[] {
  const h = new Uint8Array(12);
  const pad = padFor(payload.length);
  emitBth(
    { opcode: RC_SEND_ONLY, se: false, m: false, padCount: pad, tver: 0, pkey: 0xffff, fecn: false, becn: false, resv6: 0, destQp, ackReq: true, resv7: 0, psn },
    h,
    0,
  );
  return pad > 0 ? [h, payload, new Uint8Array(pad)] : [h, payload];
}

export function concat(parts: readonly Uint8Array[]): Uint8Array {
  let n = 0;
  for (const p of parts) n += p.length;
  const out = new Uint8Array(n);
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

/** BTH PSN of a received payload. */
export const psnOf = (d: Uint8Array): number => (d[9]! << 16) | (d[10]! << 8) | d[11]!;

export interface Received {
  payload: Uint8Array;
  meta: RxMeta;
}

/** Records everything `link` delivers (payloads and their records copied: they are valid only during the call). */
export function recorder(link: Link): Received[] {
  const got: Received[] = [];
  link.onReceive((payload, meta) => got.push({ payload: payload.slice(), meta: { ...meta, src: { ...meta.src } } }));
  return got;
}

/** Resolves once `cond()` holds, polling on timers; rejects after `ms`. */
export async function until(cond: () => boolean, ms = 2000, what = 'condition'): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 2));
  }
}

/** Lets pending I/O callbacks run (loopback datagrams arrive within a few turns). */
export function settle(ms = 50): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** A plain dgram socket bound on `address`, for sending raw datagrams at a link. */
export async function plainSocket(address: string, port = 0): Promise<Socket> {
  const s = address.includes(':') ? dgram.createSocket({ type: 'udp6', ipv6Only: true }) : dgram.createSocket('udp4');
  s.bind(port, address);
  await once(s, 'listening');
  return s;
}

export function closeSocket(s: Socket): Promise<void> {
  return new Promise((r) => s.close(() => r()));
}

/** UDP ports that were free a moment ago on `address` (bound, read, released). */
export async function freePorts(address: string, n: number): Promise<number[]> {
  const socks = await Promise.all(Array.from({ length: n }, () => plainSocket(address)));
  const ports = socks.map((s) => s.address().port);
  await Promise.all(socks.map(closeSocket));
  return ports;
}

/**
 * One RoCEv2 endpoint for the transfer tools: a device on a UDP link, with the optional layers
 * the CLI offers stacked in a fixed order:
 *
 *   device → FaultyLink (--loss) → TraceLink (--trace) → PcapTap (--capture) → UdpLink
 *
 * Loss sits outermost, so the trace and the capture show what really went on the wire: a dropped
 * datagram is absent, and its retransmission shows up later, as it would in a capture taken on a
 * lossy network.
 */

import dgram from 'node:dgram';
import { lookup } from 'node:dns/promises';
import net from 'node:net';
import { openDevice, type Context } from '../api/verbs.js';
import { DROP_COUNTERS, type Counters } from '../core/counters.js';
import { FaultyLink } from '../link/fault.js';
import type { Link, LinkDropReason } from '../link/link.js';
import { PcapTap } from '../link/pcap-tap.js';
import { TraceLink } from '../link/trace.js';
import { UdpLink } from '../link/udp.js';
import { openPcapFile, type CaptureFile } from '../pcap/file.js';
import type { PcapWriter } from '../pcap/writer.js';
import { SystemClock } from '../runtime/clock.js';

export const MTUS = [256, 512, 1024, 2048, 4096] as const;

export interface EndpointOptions {
  address: string;
  /** Local UDP port; 0 lets the kernel choose. */
  port: number;
  mtu: number;
  /** Percent of our own outgoing datagrams to drop, seeded. */
  lossPct?: number;
  seed?: number;
  /** Print one line per datagram. */
  trace?: (line: string) => void;
  /** Write every datagram sent and received to this pcap. */
  capture?: string;
  /** Bytes of each packet kept in the capture (the rest is cut off, as tcpdump -s does). */
  snapLength?: number;
  /** Congestion control of the device's QPs (and whether it answers ECN marks with CNPs). Default none. */
  cc?: 'none' | 'dcqcn';
}

/** A local resource could not be had: the address, the port, the capture file. */
export class EndpointError extends Error {
  constructor(readonly kind: 'address' | 'port' | 'capture', message: string) {
    super(message);
  }
}

export interface Endpoint {
  ctx: Context;
  link: Link;
  faulty: FaultyLink | undefined;
  capture: CaptureFile<PcapWriter> | undefined;
  close(): Promise<void>;
}

export async function openEndpoint(o: EndpointOptions): Promise<Endpoint> {
  const clock = new SystemClock();
  let udp: UdpLink;
  try {
    // The probe only checks our own IPv4 ID; a short bound keeps start-up snappy. Datagrams leave
    // from rxe's per-QP source ports (ECMP entropy), as openDevice's links do.
    udp = await UdpLink.open({ address: o.address, port: o.port, clock, probeTimeoutMs: 300, warn: () => {}, sourcePorts: 'per-flow' });
  } catch (e) {
    throw bindError(e, o.address, o.port, 'UDP');
  }
  let capture: CaptureFile<PcapWriter> | undefined;
  let link: UdpLink | PcapTap | TraceLink | FaultyLink = udp;
  try {
    if (o.capture !== undefined) {
      try {
        capture = await openPcapFile(o.capture, o.snapLength !== undefined ? { snapLength: o.snapLength } : {});
      } catch (e) {
        throw new EndpointError('capture', `cannot write capture ${o.capture}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
      }
      link = new PcapTap(link, capture.writer, 'both', { clock });
    }
    if (o.trace !== undefined) link = new TraceLink(link, o.trace);
    let faulty: FaultyLink | undefined;
    if (o.lossPct !== undefined && o.lossPct > 0) {
      faulty = new FaultyLink(link, clock, { seed: o.seed ?? 1, dropPct: o.lossPct, direction: 'tx' });
      link = faulty;
    }
    const ctx = await openDevice({ address: o.address, link, clock, mtu: o.mtu, cc: o.cc ?? 'none' });
    let closed = false;
    return {
      ctx, link, faulty, capture,
      async close() {
        if (closed) return;
        closed = true;
        await ctx.close();
        await capture?.close().catch(() => undefined);
      },
    };
  } catch (e) {
    await udp.close();
    await capture?.close().catch(() => undefined);
    throw e;
  }
}

/** Turns a bind failure into the one line a user needs. */
export function bindError(e: unknown, address: string, port: number, proto: 'UDP' | 'TCP'): Error {
  const code = (e as NodeJS.ErrnoException).code;
  const where = hostPort(address, port);
  if (code === 'EADDRINUSE') return new EndpointError('port', `${proto} port ${where} is already in use`);
  if (code === 'EADDRNOTAVAIL') return new EndpointError('address', `${address} is not an address of this host`);
  if (code === 'EACCES') return new EndpointError('port', `not allowed to bind ${proto} ${where}`);
  if (e instanceof RangeError) return new EndpointError('address', `'${address}' is not an IP address`);
  return new EndpointError('address', `cannot bind ${proto} ${where}: ${code ?? (e as Error).message}`);
}

export function hostPort(host: string, port: number): string {
  return host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`;
}

/** A host name or literal, resolved to one address (literals stay as they are). */
export async function resolveHost(host: string): Promise<string> {
  const h = host.startsWith('[') && host.endsWith(']') ? host.slice(1, -1) : host;
  if (net.isIP(h) !== 0) return h;
  try {
    return (await lookup(h)).address;
  } catch (e) {
    throw new Error(`cannot resolve host '${host}': ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
  }
}

/**
 * The local address the kernel would send to `peer` from: a connected UDP socket is given one by
 * the routing table without a datagram being sent. Loopback peers get the loopback address of
 * their family.
 */
export async function localAddressFor(peer: string): Promise<string> {
  const family = net.isIP(peer);
  if (peer === '::1') return '::1';
  if (family === 4 && peer.startsWith('127.')) return '127.0.0.1';
  const s = dgram.createSocket(family === 6 ? 'udp6' : 'udp4');
  try {
    await new Promise<void>((resolve, reject) => {
      s.once('error', reject);
      s.connect(9, peer, () => resolve());
    });
    return s.address().address;
  } finally {
    s.close();
  }
}

/** Non-zero drops, by reason: the device's demux/responder/completer reasons and the link's. */
export function dropsByReason(c: Counters, link: Readonly<Record<LinkDropReason, number>>): Array<[string, number]> {
  const out: Array<[string, number]> = [];
  for (const [k, v] of Object.entries(link)) if (v > 0 && k !== 'badIcrc') out.push([linkReasonName(k as LinkDropReason), v]);
  if (c.icrcErr > 0) out.push(['bad ICRC', c.icrcErr]);
  for (const k of DROP_COUNTERS) if (c[k] > 0) out.push([k, c[k]]);
  return out;
}

function linkReasonName(r: LinkDropReason): string {
  switch (r) {
    case 'injectedLoss': return 'injected loss (--loss)';
    case 'tooShort': return 'too short';
    case 'notRoce': return 'not RoCE';
    case 'sendError': return 'send error';
    case 'closed': return 'link closed';
    case 'badIcrc': return 'bad ICRC';
  }
}

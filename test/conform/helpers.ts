/**
 * `roce serve`'s server (TransferServer) in-process on 127.0.0.2 and a prober on 127.0.0.1, on
 * free ports, for the tests that need a fault hook inside the server; the process-level test is
 * serve-process.test.ts.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { openDevice, type Context } from '../../src/api/verbs.js';
import { TransferServer } from '../../src/app/transfer.js';
import { roceExchange, type Exchange } from '../../src/conform/exchange.js';
import { Prober } from '../../src/conform/prober.js';
import { UdpLink } from '../../src/link/udp.js';
import type { Link, LinkRxHandler } from '../../src/link/link.js';

export interface BenchOptions {
  /** Test-only fault: return false to drop a datagram before the server's device sees it. */
  rxFilter?: (datagram: Uint8Array) => boolean;
}

export interface Bench {
  server: TransferServer;
  ctx: Context;
  prober: Prober;
  exchange(): Exchange;
  close(): Promise<void>;
}

/** A link that hands received datagrams through `filter` first. */
function filtered(inner: UdpLink, filter: (d: Uint8Array) => boolean): Link {
  return {
    get caps() { return inner.caps; },
    get local() { return inner.local; },
    get drops() { return inner.drops; },
    send: (dst, srcPort, parts) => inner.send(dst, srcPort, parts),
    onReceive: (handler: LinkRxHandler) => inner.onReceive((payload, meta) => {
      if (filter(payload)) handler(payload, meta);
    }),
    close: () => inner.close(),
  };
}

export async function bench(o: BenchOptions = {}): Promise<Bench> {
  const prober = await Prober.open({ bind: '127.0.0.1', port: 0, peer: { address: '127.0.0.2', port: 0 } });
  const udp = await UdpLink.open({ address: '127.0.0.2', port: 0, warn: () => undefined });
  const ctx = await openDevice({ address: '127.0.0.2', link: o.rxFilter ? filtered(udp, o.rxFilter) : udp });
  const dir = await mkdtemp(path.join(os.tmpdir(), 'conform-serve-'));
  const server = await TransferServer.start({ ctx, dir, oobAddress: '127.0.0.2', oobPort: 0, log: () => undefined });
  prober.peer.port = udp.local.port;
  return {
    server, ctx, prober,
    exchange: () => roceExchange({ host: '127.0.0.2', port: server.oobPort, udpPort: prober.link.local.port }),
    async close() {
      await prober.close();
      await server.close();
      await ctx.close();
      await rm(dir, { recursive: true, force: true });
    },
  };
}

export const FAST = { responseMs: 400, quietMs: 120 };

/**
 * The reference target: a small responder built on the verbs API, for `roce conform` to test
 * our own stack the way it tests rxe.
 *
 * It speaks two exchanges:
 *  - the `ibv_rc_pingpong` server exchange (on `pingpongPort`): an RC QP with receives posted
 *    that answers every received SEND with one of its own, as the C tool does;
 *  - a JSON-lines control connection (on `controlPort`, exchange `self`): one RC QP per
 *    connection, with the receives, QP access rights and memory the client asks for, and a
 *    command to issue an RDMA READ towards the client (for the implied-NAK case).
 * Memory outlives sessions, so a case can check after a reconnect that a NAKed request left
 * it untouched.
 *
 * `rxFilter` is a test-only fault hook: every datagram passes through it before the device.
 */

import net from 'node:net';
import { UdpLink } from '../link/udp.js';
import type { Link, LinkRxHandler } from '../link/link.js';
import {
  allocPd, createCq, createQp, destroyQp, modifyQp, openDevice, pollCq, postRecv, postSend, regMr,
  type Context, type Cq, type Pd, type Qp,
} from '../api/verbs.js';
import { ACCESS } from '../core/types.js';
import type { MemoryRegion } from '../core/mr.js';
import { formatPingpongMessage, parsePingpongMessage, PINGPONG_MESSAGE_SIZE } from '../oob/pingpong.js';
import { SocketReader } from '../oob/common.js';
import { formatIpAddress, gidFromIp, ipFromGid, parseIpAddress } from '../wire/frame.js';
import type { Access, SelfConnectReply, SelfConnectRequest } from './exchange.js';

export interface TargetOptions {
  /** Address to bind (UDP 4791 by default and the TCP listeners). */
  address: string;
  udpPort?: number;
  /** The UDP port peers listen on (where our answers go). Default 4791. */
  peerUdpPort?: number;
  /** ibv_rc_pingpong-style exchange port (0: any free port; null: off). Default 18515. */
  pingpongPort?: number | null;
  /** Control port of the `self` exchange (0: any free port; null: off). Default 18600. */
  controlPort?: number | null;
  /** retry_cnt of our QPs: small, so retry exhaustion is observable (7 would mean "forever"). Default 3. */
  retryCnt?: number;
  /** Local ACK timeout code (4.096 µs × 2^timeout). Default 12 (~17 ms). */
  timeout?: number;
  /** Test-only fault hook: return false to drop a received datagram before the device sees it. */
  rxFilter?: (datagram: Uint8Array) => boolean;
  log?: (line: string) => void;
}

export interface Target {
  readonly address: string;
  readonly udpPort: number;
  readonly pingpongPort: number;
  readonly controlPort: number;
  readonly ctx: Context;
  /** Sessions set up so far. */
  readonly sessions: number;
  close(): Promise<void>;
}

const MEM_LEN = 64 * 1024;
const RO_LEN = 4096;
const RECV_LEN = 4096;
const ECHO_LEN = 64;

const ACCESS_BITS: Record<Access, number> = { read: ACCESS.REMOTE_READ, write: ACCESS.REMOTE_WRITE, atomic: ACCESS.REMOTE_ATOMIC };

interface Session {
  qp: Qp;
  cq: Cq;
  echo: boolean;
  sendBusy: boolean;
  nextWr: number;
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

export async function startTarget(o: TargetOptions): Promise<Target> {
  const log = o.log ?? (() => undefined);
  const udp = await UdpLink.open({ address: o.address, port: o.udpPort ?? 4791, warn: () => undefined });
  const link: Link = o.rxFilter ? filtered(udp, o.rxFilter) : udp;
  const ctx = await openDevice({ address: o.address, link });
  const pd: Pd = allocPd(ctx);
  const mem = regMr(pd, new Uint8Array(MEM_LEN), ACCESS.LOCAL_WRITE | ACCESS.REMOTE_WRITE | ACCESS.REMOTE_READ | ACCESS.REMOTE_ATOMIC);
  const ro = regMr(pd, new Uint8Array(RO_LEN), ACCESS.LOCAL_WRITE | ACCESS.REMOTE_READ);
  const scratch = regMr(pd, new Uint8Array(RECV_LEN * 256 + 4096), ACCESS.LOCAL_WRITE);
  const retryCnt = o.retryCnt ?? 3;
  const timeout = o.timeout ?? 12;
  const peerUdpPort = o.peerUdpPort ?? 4791;
  const sessions = new Set<Session>();
  let pingpong: Session | undefined;
  let count = 0;

  const open = (peer: { qpn: number; psn: number; address: string; port?: number }, access: Access[], recvs: number, echo: boolean): Session => {
    const cq = createCq(ctx, { cqe: 1024 });
    const qp = createQp(pd, { type: 'RC', sendCq: cq, recvCq: cq, sqSigAll: true, cap: { maxSendWr: 64, maxRecvWr: 256, maxSendSge: 1, maxRecvSge: 1, maxInlineData: 64 } });
    let flags = ACCESS.LOCAL_WRITE;
    for (const a of access) flags |= ACCESS_BITS[a];
    const sqPsn = Math.floor(Math.random() * 0xffffff);
    modifyQp(qp, { qpState: 'INIT', pkeyIndex: 0, portNum: 1, qpAccessFlags: flags });
    modifyQp(qp, {
      qpState: 'RTR', ahAttr: { address: peer.address, port: peer.port ?? peerUdpPort }, pathMtu: 1024, destQpNum: peer.qpn, rqPsn: peer.psn,
      maxDestRdAtomic: 16, minRnrTimer: 1,
    });
    modifyQp(qp, { qpState: 'RTS', sqPsn, timeout, retryCnt, rnrRetry: 7, maxRdAtomic: 16 });
    const s: Session = { qp, cq, echo, sendBusy: false, nextWr: 1 };
    for (let i = 0; i < recvs; i++) postRecv(qp, { wrId: 0, sgList: [scratch.sge((i % 256) * RECV_LEN, RECV_LEN)] });
    sessions.add(s);
    count++;
    log(`session ${count}: qp 0x${qp.qpNum.toString(16)} <-> 0x${peer.qpn.toString(16)} at ${peer.address}, sq psn 0x${sqPsn.toString(16)}`);
    return s;
  };
  const closeSession = (s: Session | undefined): void => {
    if (!s || !sessions.has(s)) return;
    sessions.delete(s);
    destroyQp(s.qp);
  };

  // Completions: refill receives, echo SENDs (one outstanding at a time, like the C tool).
  const poller = setInterval(() => {
    for (const s of sessions) {
      for (const wc of pollCq(s.cq, 64)) {
        if (wc.opcode === 'RECV') {
          if (wc.status !== 'SUCCESS') continue;
          try {
            postRecv(s.qp, { wrId: 0, sgList: [scratch.sge(0, RECV_LEN)] });
            if (s.echo && !s.sendBusy) {
              s.sendBusy = true;
              postSend(s.qp, { wrId: s.nextWr++, opcode: 'SEND', sgList: [scratch.sge(RECV_LEN * 256, ECHO_LEN)] });
            }
          } catch {
            // The QP went to error meanwhile: nothing to refill.
          }
        } else if (wc.opcode === 'SEND') {
          s.sendBusy = false;
        }
      }
    }
  }, 1);

  const servers: net.Server[] = [];
  const sockets = new Set<net.Socket>();
  const listen = (port: number, onConn: (s: net.Socket) => void): Promise<number> => new Promise((resolve, reject) => {
    const srv = net.createServer((sock) => {
      sockets.add(sock);
      sock.on('close', () => sockets.delete(sock));
      sock.on('error', () => undefined);
      onConn(sock);
    });
    srv.once('error', reject);
    srv.listen({ host: o.address, port }, () => resolve((srv.address() as net.AddressInfo).port));
    servers.push(srv);
  });

  const ownGid = gidFromIp(parseIpAddress(o.address)!);
  let pingpongPort = 0;
  if (o.pingpongPort !== null) pingpongPort = await listen(o.pingpongPort ?? 18515, (sock) => void servePingpong(sock));
  // By hand rather than with pingpongServerExchange: our reply must carry the QPN of a QP
  // created from the client's message, and that helper formats its reply before it asks.
  async function servePingpong(sock: net.Socket): Promise<void> {
    const reader = new SocketReader(sock, 'pingpong client');
    try {
      const remote = parsePingpongMessage(await reader.readExact(PINGPONG_MESSAGE_SIZE, 10_000, 'address message'));
      if (remote instanceof Error) throw remote;
      closeSession(pingpong);
      const address = formatIpAddress(ipFromGid(remote.gid));
      pingpong = open({ qpn: remote.qpn, psn: remote.psn, address }, [], 64, true);
      sock.write(formatPingpongMessage({ lid: 0, qpn: pingpong.qp.qpNum, psn: pingpong.qp.core.attrs.sqPsn, gid: ownGid }));
      await reader.readCString(8, 10_000, '"done"');
    } catch (e) {
      log(`pingpong exchange failed: ${(e as Error).message}`);
    } finally {
      sock.end();
    }
  }

  let controlPort = 0;
  if (o.controlPort !== null) {
    controlPort = await listen(o.controlPort ?? 18600, (sock) => void serveControl(sock));
  }
  async function serveControl(sock: net.Socket): Promise<void> {
    sock.setNoDelay(true);
    const reader = new SocketReader(sock, 'conform client');
    let session: Session | undefined;
    const reply = (obj: object): void => {
      sock.write(JSON.stringify(obj) + '\n');
    };
    sock.on('close', () => closeSession(session));
    try {
      for (;;) {
        let line = '';
        for (;;) {
          const c = await reader.readExact(1, 24 * 3600_000, 'command');
          if (c[0] === 0x0a) break;
          line += String.fromCharCode(c[0]!);
        }
        const req = JSON.parse(line) as { op: string } & Record<string, unknown>;
        if (req.op === 'connect') {
          const r = req as unknown as SelfConnectRequest;
          closeSession(session);
          session = open({ qpn: r.qpn, psn: r.psn, address: r.address, port: r.udpPort }, r.access, r.recvs, r.recvs > 0);
          const va = (m: MemoryRegion): string => '0x' + m.addr.toString(16);
          const out: SelfConnectReply = {
            ok: true, qpn: session.qp.qpNum, psn: session.qp.core.attrs.sqPsn, mtu: 1024, retryCnt, timeout, access: r.access, recvs: r.recvs,
            mem: { rkey: mem.rkey, va: va(mem), length: MEM_LEN }, ro: { rkey: ro.rkey, va: va(ro), length: RO_LEN },
          };
          reply(out);
        } else if (req.op === 'readThenSend' && session) {
          const s = session;
          postSend(s.qp, [
            { wrId: s.nextWr++, opcode: 'RDMA_READ', sgList: [scratch.sge(0, Number(req['length']))], rdma: { remoteAddr: BigInt(String(req['va'])), rkey: Number(req['rkey']) } },
            { wrId: s.nextWr++, opcode: 'SEND', sgList: [scratch.sge(RECV_LEN * 256, 8)] },
          ]);
          reply({ ok: true });
        } else {
          reply({ ok: false, error: `unknown command ${req.op}` });
        }
      }
    } catch {
      closeSession(session);
    }
  }

  log(`target on ${o.address}: udp ${udp.local.port}, pingpong ${pingpongPort || 'off'}, control ${controlPort || 'off'}`);
  return {
    address: o.address, udpPort: udp.local.port, pingpongPort, controlPort, ctx,
    get sessions() { return count; },
    async close() {
      clearInterval(poller);
      for (const s of [...sessions]) closeSession(s);
      for (const s of sockets) s.destroy();
      await Promise.all(servers.map((srv) => new Promise<void>((r) => srv.close(() => r()))));
      await ctx.close();
    },
  };
}

/**
 * The file transfer's rendezvous over RDMA CM (`--cm`), instead of a TCP connection.
 *
 * Wire design, version 1:
 *
 *  - The client connects an rdma_cm id to the server's rdma_cm port: a REQ on QP1 to the
 *    server's RoCE UDP port (4791 on a real network) for service ID 0x0000000001060000 + port,
 *    with the IP CM header (rdma_cm's) in its private data. After that header, the REQ's user
 *    data is `RTX` + the protocol version (4 bytes). The server's REP carries the same 4 bytes;
 *    a REQ without them, or of another version, is rejected (REJ reason 28, consumer reject)
 *    with the server's 4 bytes as REJ private data, so the client can say which version the
 *    server speaks. No listener on the port: the CM itself answers REJ reason 8.
 *  - That RC connection is the *control QP*. It carries exactly the JSON messages of the TCP
 *    path (protocol.ts: hello, put/ready/credit/stored, get/source/avail/credit/done, abort,
 *    refuse), one message per SEND, at most MAX_CM_MESSAGE bytes. Each side keeps CTRL_RECVS
 *    receives posted and reposts each one as it is consumed; a peer that outruns them gets RNR
 *    NAKs and retries (RNR retry 7: forever), so no message is lost and order is kept.
 *  - The *data QP* is a second RC QP, connected by the `hello` exchange over the control QP,
 *    exactly as over TCP. Keeping it apart matters: WRITE_WITH_IMM and SEND_WITH_IMM consume
 *    receive WQEs in order, so control SENDs on the data QP would land in chunk buffers; and
 *    the transfer engine (transfer.ts) stays one code path for both rendezvous.
 *  - Teardown: either side's DREQ (or the control QP failing) closes the channel; a transfer
 *    in progress sees "the peer went away" exactly as when a TCP connection drops.
 *
 * Timeouts: the client's REQ is resent with a CM response timeout chosen so that its four tries
 * together take about the caller's timeout; then the connect fails with ETIMEDOUT.
 */

import {
  allocPd, createCq, deregMr, destroyCq, postRecv, postSend, regMr, type Context, type Cq, type Pd,
} from '../api/verbs.js';
import type { MemoryRegion } from '../core/mr.js';
import { ACCESS } from '../core/types.js';
import { cmTimeoutUs } from '../cm/messages.js';
import { createEventChannel, RdmaCmError, type EventChannel, type RdmaCmEvent, type RdmaCmId } from '../cm/rdmacm.js';
import { hostPort } from './endpoint.js';
import {
  ChannelError, fmtSecs, MessageInbox, PROTOCOL_VERSION, validate, type Message, type MessageOf, type MessageType,
} from './protocol.js';

/** The REQ's and REP's user data: `RTX` and the protocol version. */
export const CM_MAGIC = Uint8Array.of(0x52, 0x54, 0x58, PROTOCOL_VERSION);
/** Largest control message, bytes (a `source` with a 255-byte name is about 500). */
export const MAX_CM_MESSAGE = 4096;
const CTRL_RECVS = 16;
const CTRL_SENDS = 16;
/** REQ tries (the first and its resends) over which a client spreads its timeout. */
const REQ_TRIES = 4;
/** Packet life time exponent of the client's CM: 4.096 µs × 2^12 ≈ 17 ms (rdma_cm's 16 would add 0.5 s to every try). */
const CLIENT_PACKET_LIFE = 12;

/** What the transfer needs of its control channel: protocol.ts's Channel, or a CmChannel. */
export interface MessageChannel {
  readonly peer: string;
  readonly closed: boolean;
  send(m: Message): void;
  next(timeoutMs?: number): Promise<Message>;
  expect<T extends MessageType>(type: T, timeoutMs?: number): Promise<MessageOf<T>>;
  /** Flushes what was sent (within a bound) and closes; a process about to exit awaits it. */
  close(): void | Promise<void>;
}

/** The control QP's resources, made before the connection so its receives are posted first. */
interface Ctrl {
  pd: Pd;
  cq: Cq;
  recvMr: MemoryRegion;
  sendMr: MemoryRegion;
}

function prepareControlQp(ctx: Context, id: RdmaCmId): Ctrl {
  const pd = allocPd(ctx);
  const cq = createCq(ctx, { cqe: 2 * (CTRL_RECVS + CTRL_SENDS) });
  const qp = id.createQp(pd, {
    sendCq: cq, recvCq: cq, sqSigAll: true,
    cap: { maxSendWr: CTRL_SENDS, maxRecvWr: CTRL_RECVS, maxSendSge: 1, maxRecvSge: 1, maxInlineData: 0 },
  });
  const recvMr = regMr(pd, new Uint8Array(CTRL_RECVS * MAX_CM_MESSAGE), ACCESS.LOCAL_WRITE);
  const sendMr = regMr(pd, new Uint8Array(CTRL_SENDS * MAX_CM_MESSAGE), ACCESS.LOCAL_WRITE);
  for (let i = 0; i < CTRL_RECVS; i++) postRecv(qp, { wrId: i, sgList: [recvMr.sge(i * MAX_CM_MESSAGE, MAX_CM_MESSAGE)] });
  return { pd, cq, recvMr, sendMr };
}

/** The JSON-message channel over a connected control QP; same behaviour as protocol.ts's Channel. */
export class CmChannel extends MessageInbox implements MessageChannel {
  /** Send slots free, and messages waiting for one. */
  private readonly freeSlots: number[] = [];
  private readonly backlog: Uint8Array[] = [];
  private readonly stop = new AbortController();
  private released = false;

  constructor(readonly id: RdmaCmId, private readonly ctrl: Ctrl, readonly peer: string) {
    super();
    for (let i = 0; i < CTRL_SENDS; i++) this.freeSlots.push(i);
    id.on('disconnected', () => this.fail(new ChannelError('closed', `${peer} disconnected`)));
    void this.poll();
  }

  send(m: Message): void {
    if (this.closed) return;
    const bytes = new TextEncoder().encode(JSON.stringify(m));
    if (bytes.length > MAX_CM_MESSAGE) throw new Error(`a ${m.type} message of ${bytes.length} bytes does not fit a control SEND`);
    this.backlog.push(bytes);
    this.pump();
  }

  /**
   * Sends what is queued and waits for its ACKs (at most 2 s: a peer that stopped answering
   * must not hold us), then disconnects (DREQ, which must leave before the device closes) and
   * frees the control QP.
   */
  async close(): Promise<void> {
    this.fail(new ChannelError('closed', 'connection closed'));
    const deadline = Date.now() + 2000;
    while (!this.released && (this.backlog.length > 0 || this.freeSlots.length < CTRL_SENDS) && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 2));
    }
    this.release();
    await this.id.context.device.gsi.flush().catch(() => undefined);
  }

  private release(): void {
    if (this.released) return;
    this.released = true;
    this.stop.abort();
    try {
      this.id.disconnect();
      this.id.destroyQp();
      destroyCq(this.ctrl.cq);
      deregMr(this.ctrl.recvMr);
      deregMr(this.ctrl.sendMr);
    } catch {
      // the device is already closed
    }
  }

  private pump(): void {
    const qp = this.id.qp;
    while (qp !== undefined && this.backlog.length > 0 && this.freeSlots.length > 0) {
      const slot = this.freeSlots.shift()!;
      const bytes = this.backlog.shift()!;
      this.ctrl.sendMr.buffer.set(bytes, slot * MAX_CM_MESSAGE);
      try {
        postSend(qp, { wrId: CTRL_RECVS + slot, opcode: 'SEND', sgList: [this.ctrl.sendMr.sge(slot * MAX_CM_MESSAGE, bytes.length)] });
      } catch (e) {
        this.fail(new ChannelError('closed', `sending to ${this.peer} failed: ${(e as Error).message}`));
        return;
      }
    }
  }

  private async poll(): Promise<void> {
    for (;;) {
      let wc;
      try {
        wc = await this.ctrl.cq.next({ signal: this.stop.signal });
      } catch {
        return;
      }
      const wrId = Number(wc.wrId);
      if (wc.status !== 'SUCCESS') {
        this.fail(new ChannelError('closed', wc.status === 'WR_FLUSH_ERR' ? `${this.peer} closed the connection` : `the connection to ${this.peer} failed (${wc.status})`));
        continue;
      }
      if (wrId >= CTRL_RECVS) {
        this.freeSlots.push(wrId - CTRL_RECVS);
        this.pump();
        continue;
      }
      const text = new TextDecoder().decode(this.ctrl.recvMr.buffer.subarray(wrId * MAX_CM_MESSAGE, wrId * MAX_CM_MESSAGE + wc.byteLen));
      const qp = this.id.qp;
      if (qp !== undefined && qp.state !== 'ERR') postRecv(qp, { wrId, sgList: [this.ctrl.recvMr.sge(wrId * MAX_CM_MESSAGE, MAX_CM_MESSAGE)] });
      let m: Message | undefined;
      try {
        m = validate(JSON.parse(text));
      } catch {
        m = undefined;
      }
      if (m === undefined) {
        this.fail(new ChannelError('malformed', `${this.peer} sent something that is not roce transfer protocol v${PROTOCOL_VERSION}`));
        this.id.disconnect();
        continue;
      }
      this.deliver(m);
    }
  }
}

function hasMagic(b: Uint8Array): boolean {
  return b.length >= 3 && b[0] === CM_MAGIC[0] && b[1] === CM_MAGIC[1] && b[2] === CM_MAGIC[2];
}

// ---------------------------------------------------------------------------------------------
// Server

export interface CmListener {
  readonly port: number;
  close(): Promise<void>;
}

/**
 * Listens on rdma_cm `port` of `ctx`'s device; every connection that speaks our version
 * becomes a CmChannel for `onChannel`. `peerPort`: where peers' RoCE stacks listen (default the
 * device's own port, as on a network where everyone uses 4791).
 */
export function listenCm(ctx: Context, port: number, onChannel: (ch: CmChannel, peer: string) => void, peerPort?: number): CmListener {
  const ec: EventChannel = createEventChannel(ctx, peerPort !== undefined ? { peerPort } : {});
  const listener = ec.createId();
  listener.listen(port);
  const live = new Set<CmChannel>();
  listener.on('connect_request', (ev: RdmaCmEvent) => {
    const id = ev.id;
    const ud = ev.privateData;
    if (!hasMagic(ud) || ud[3] !== PROTOCOL_VERSION) {
      id.reject(CM_MAGIC);
      return;
    }
    let ctrl: Ctrl;
    try {
      ctrl = prepareControlQp(ctx, id);
    } catch {
      id.reject(CM_MAGIC);
      return;
    }
    const peer = hostPort(id.remoteAddress, id.remotePort);
    const ch = new CmChannel(id, ctrl, `client ${peer}`);
    live.add(ch);
    id.accept({ privateData: CM_MAGIC });
    // The session starts at once: the client's first SEND may beat the RTU, and the control
    // QP is already in RTS (rdma_accept's order).
    onChannel(ch, peer);
    id.once('disconnected', () => live.delete(ch));
  });
  return {
    port,
    async close() {
      listener.destroy();
      await Promise.all([...live].map((ch) => ch.close()));
      await ctx.device.gsi.flush();
    },
  };
}

// ---------------------------------------------------------------------------------------------
// Client

export interface CmConnectOptions {
  ctx: Context;
  host: string;
  /** The server's rdma_cm port. */
  port: number;
  /** The server's RoCE UDP port. Default: our own (4791 on a network). */
  peerRocePort?: number;
  timeoutMs: number;
  signal?: AbortSignal;
}

/** Why a connect failed, in words a user can act on. */
export class CmConnectError extends Error {
  constructor(readonly kind: 'rejected' | 'unreachable' | 'interrupted', message: string) {
    super(message);
  }
}

/** The CM response timeout exponent whose REQ_TRIES tries take about `timeoutMs` in all. */
export function cmTimeoutFor(timeoutMs: number): number {
  const perTryUs = (timeoutMs * 1000) / REQ_TRIES - 2 * cmTimeoutUs(CLIENT_PACKET_LIFE);
  let t = 8;
  while (t < 24 && cmTimeoutUs(t + 1) <= perTryUs) t++;
  return t;
}

/** Connects the control QP to a `roce serve --cm`; resolves once ESTABLISHED. */
export async function connectCm(o: CmConnectOptions): Promise<CmChannel> {
  const ec = createEventChannel(o.ctx, {
    ...(o.peerRocePort !== undefined ? { peerPort: o.peerRocePort } : {}),
    agent: { packetLifeTime: CLIENT_PACKET_LIFE },
  });
  const id = ec.createId();
  const ctrl = prepareControlQp(o.ctx, id);
  const where = `${o.host} rdma_cm port ${o.port}`;
  const t = cmTimeoutFor(o.timeoutMs);
  const est = id.waitFor('established', o.timeoutMs * 2 + 5000);
  const onAbort = (): void => id.destroy();
  o.signal?.addEventListener('abort', onAbort, { once: true });
  try {
    id.connect({
      address: o.host, port: o.port, privateData: CM_MAGIC, cmResponseTimeout: t, maxCmRetries: REQ_TRIES - 1,
      // The data QP's ACK timeout (≈134 ms), not rdma_cm's 19 (≈2 s): a lost control SEND is
      // resent as soon as a lost chunk would be.
      localAckTimeout: 15,
    });
    const ev = await est;
    if (!hasMagic(ev.privateData)) throw new CmConnectError('rejected', `cannot reach ${where}: the peer is not a roce transfer server`);
    return new CmChannel(id, ctrl, `the server at ${where}`);
  } catch (e) {
    id.destroy();
    id.destroyQp();
    destroyCq(ctrl.cq);
    if (o.signal?.aborted) throw new CmConnectError('interrupted', 'interrupted');
    if (e instanceof CmConnectError) throw e;
    if (e instanceof RdmaCmError) {
      const ev = e.event;
      if (ev.type === 'rejected') {
        if (ev.status === 8) throw new CmConnectError('rejected', `cannot reach ${where}: no rdma_cm listener there (REJ reason 8, ${ev.reason ?? 'Invalid Service ID'}; is \`roce serve --cm\` running?)`);
        if (hasMagic(ev.privateData) && ev.privateData[3] !== PROTOCOL_VERSION) {
          throw new CmConnectError('rejected', `cannot reach ${where}: the server speaks protocol version ${ev.privateData[3]}, not ${PROTOCOL_VERSION}`);
        }
        throw new CmConnectError('rejected', `cannot reach ${where}: rejected (REJ reason ${ev.status}${ev.reason ? `, ${ev.reason}` : ''})`);
      }
      throw new CmConnectError('unreachable', `cannot reach ${where}: no answer from its RDMA CM within ${fmtSecs(o.timeoutMs)} (REQ sent ${REQ_TRIES} times)`);
    }
    throw new CmConnectError('unreachable', `cannot reach ${where}: ${(e as Error).message}`);
  } finally {
    o.signal?.removeEventListener('abort', onAbort);
  }
}

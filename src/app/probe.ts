/**
 * The conformance probe of `roce serve`: what `roce conform --exchange roce` talks to, so that
 * the conformance suite runs against the very server users run, not a look-alike.
 *
 * On a `probe` request (protocol.ts) the session gets a second RC QP, towards the prober's QP,
 * with the remote rights and the number of posted receives the prober asked for, and retry_cnt
 * and timeout as asked (a small retry_cnt makes retry exhaustion observable: rxe and our engine
 * read 7 as "forever"). Like ibv_rc_pingpong, the QP answers each received SEND with a SEND of
 * its own (one outstanding at a time), which gives the prober a requester to test: ACK timeout,
 * retry exhaustion, ghost ACKs. `probe-read` makes it RDMA READ from the prober and then SEND,
 * for the implied-NAK case.
 *
 * The scratch memory belongs to the server's PD and outlives sessions: a case that got a NAK
 * for a write checks on the next session, by READ, that the write did not land.
 */

import {
  createCq, createQp, destroyCq, destroyQp, modifyQp, postRecv, postSend, regMr,
  type Cq, type Pd, type Qp,
} from '../api/verbs.js';
import type { MemoryRegion } from '../core/mr.js';
import { ACCESS, type MtuValue } from '../core/types.js';
import { MTUS } from './endpoint.js';
import type { MessageChannel } from './cm-channel.js';
import { ChannelError, type Message, type ProbeAccess, type ProbeRegion } from './protocol.js';

/** Read/write/atomic scratch region. */
export const PROBE_MEM_BYTES = 64 * 1024;
/** Region registered with remote read only (the missing-access case writes to it). */
export const PROBE_RO_BYTES = 4096;
const RECV_BYTES = 4096;
/** Receive buffers are recycled round-robin; what lands in them is never looked at. */
const RECV_SLOTS = 256;
const ECHO_BYTES = 64;
/** Bounds on what a client may ask for. */
const MAX_RECVS = 256;
const MAX_SEND_WR = 64;

const ACCESS_BITS: Record<ProbeAccess, number> = { read: ACCESS.REMOTE_READ, write: ACCESS.REMOTE_WRITE, atomic: ACCESS.REMOTE_ATOMIC };

interface ProbeMemory {
  mem: MemoryRegion;
  ro: MemoryRegion;
  /** Receive slots, then the echo message, then where probe-read lands. */
  scratch: MemoryRegion;
}

/** One set of regions per PD (per server), made on the first probe. */
const memories = new WeakMap<Pd, ProbeMemory>();

function memoryOf(pd: Pd): ProbeMemory {
  let m = memories.get(pd);
  if (m === undefined) {
    m = {
      mem: regMr(pd, new Uint8Array(PROBE_MEM_BYTES), ACCESS.LOCAL_WRITE | ACCESS.REMOTE_WRITE | ACCESS.REMOTE_READ | ACCESS.REMOTE_ATOMIC),
      ro: regMr(pd, new Uint8Array(PROBE_RO_BYTES), ACCESS.LOCAL_WRITE | ACCESS.REMOTE_READ),
      scratch: regMr(pd, new Uint8Array(RECV_BYTES * RECV_SLOTS + ECHO_BYTES + PROBE_MEM_BYTES), ACCESS.LOCAL_WRITE),
    };
    memories.set(pd, m);
  }
  return m;
}

const region = (mr: MemoryRegion): ProbeRegion => ({ rkey: mr.rkey, va: mr.va(0).toString(16), length: mr.length });

/**
 * Serves one probe session on `ch` until the client closes it; the QP is destroyed then.
 * Bad requests are refused on the channel, never thrown, and end the connection (as the
 * transfer session ends on an unexpected message).
 */
export async function serveProbe(pd: Pd, ch: MessageChannel, req: Extract<Message, { type: 'probe' }>, log: (line: string) => void): Promise<void> {
  const refuse = (message: string): void => {
    ch.send({ type: 'refuse', code: 'BAD_REQUEST', message: `probe: ${message}` });
    log(`probe refused: ${message}`);
    ch.close();
  };
  const ctx = pd.context;
  const mtu = Math.min(ctx.queryPort().activeMtu, req.mtu);
  if (!(MTUS as readonly number[]).includes(mtu)) {
    refuse(`MTU ${req.mtu} is not 256..4096`);
    return;
  }
  const recvs = Math.min(req.recvs, MAX_RECVS);
  const m = memoryOf(pd);
  const cq: Cq = createCq(ctx, { cqe: 2 * (MAX_RECVS + MAX_SEND_WR) });
  let qp: Qp | undefined;
  try {
    qp = createQp(pd, {
      type: 'RC', sendCq: cq, recvCq: cq, sqSigAll: true,
      cap: { maxSendWr: MAX_SEND_WR, maxRecvWr: MAX_RECVS, maxSendSge: 1, maxRecvSge: 1, maxInlineData: 0 },
    });
    let flags = ACCESS.LOCAL_WRITE;
    for (const a of req.access) flags |= ACCESS_BITS[a];
    const sqPsn = Math.floor(Math.random() * 0xffffff);
    modifyQp(qp, { qpState: 'INIT', pkeyIndex: 0, portNum: 1, qpAccessFlags: flags });
    modifyQp(qp, {
      qpState: 'RTR', ahAttr: { address: req.address, port: req.port }, pathMtu: mtu as MtuValue, destQpNum: req.qpn, rqPsn: req.psn,
      maxDestRdAtomic: 16, minRnrTimer: 1,
    });
    modifyQp(qp, { qpState: 'RTS', sqPsn, timeout: req.timeout, retryCnt: req.retryCnt, rnrRetry: 7, maxRdAtomic: 16 });
    let slot = 0;
    const nextSlot = (): ReturnType<MemoryRegion['sge']> => m.scratch.sge((slot++ % RECV_SLOTS) * RECV_BYTES, RECV_BYTES);
    for (let i = 0; i < recvs; i++) postRecv(qp, { wrId: 0, sgList: [nextSlot()] });

    // Echo: each received SEND is answered by one SEND, one outstanding at a time (ibv_rc_pingpong).
    const echo = m.scratch.sge(RECV_BYTES * RECV_SLOTS, ECHO_BYTES);
    let sendBusy = false;
    let wrId = 1;
    const live = qp;
    const drain = (): void => {
      for (const wc of cq.poll(cq.cqe)) {
        if (wc.opcode === 'RECV') {
          if (wc.status !== 'SUCCESS') continue;
          try {
            postRecv(live, { wrId: 0, sgList: [nextSlot()] });
            if (recvs > 0 && !sendBusy) {
              sendBusy = true;
              postSend(live, { wrId: wrId++, opcode: 'SEND', sgList: [echo] });
            }
          } catch {
            // The QP went to Error meanwhile (a case drove it there): nothing to refill.
          }
        } else if (wc.opcode === 'SEND') {
          sendBusy = false;
        }
      }
    };
    // Polled outside the engine's call stack: posting from inside a completion would re-enter it.
    let scheduled = false;
    cq.core.onCompletion = () => {
      if (scheduled) return;
      scheduled = true;
      setImmediate(() => {
        scheduled = false;
        drain();
      });
    };
    ch.send({
      type: 'probed', qpn: qp.qpNum, psn: sqPsn, address: ctx.address, port: ctx.port, mtu, retryCnt: req.retryCnt, timeout: req.timeout,
      access: req.access, recvs, mem: region(m.mem), ro: region(m.ro),
    });
    log(`probe: QP 0x${qp.qpNum.toString(16)} ↔ QP 0x${req.qpn.toString(16)}, access [${req.access.join(',')}], ${recvs} receives, retry_cnt ${req.retryCnt}`);
    for (;;) {
      let c: Message;
      try {
        c = await ch.next();
      } catch (e) {
        if (e instanceof ChannelError) return;
        throw e;
      }
      if (c.type !== 'probe-read') {
        refuse(`unexpected '${c.type}'`);
        return;
      }
      const len = Math.min(c.length, PROBE_MEM_BYTES);
      try {
        postSend(qp, [
          { wrId: wrId++, opcode: 'RDMA_READ', sgList: [m.scratch.sge(RECV_BYTES * RECV_SLOTS + ECHO_BYTES, len)], rdma: { remoteAddr: BigInt('0x' + c.va), rkey: c.rkey } },
          { wrId: wrId++, opcode: 'SEND', sgList: [m.scratch.sge(RECV_BYTES * RECV_SLOTS, 8)] },
        ]);
        ch.send({ type: 'probe-posted' });
      } catch (e) {
        // The QP went to Error (a case drove it there): the client learns it here.
        refuse(`cannot post the READ: ${(e as Error).message}`);
        return;
      }
    }
  } catch (e) {
    // modifyQp refused the attributes, or the device is gone.
    refuse((e as Error).message);
  } finally {
    cq.core.onCompletion = undefined;
    if (qp !== undefined) {
      try {
        destroyQp(qp);
      } catch {
        // already gone with the device
      }
    }
    try {
      destroyCq(cq);
    } catch {
      // already gone with the device
    }
  }
}

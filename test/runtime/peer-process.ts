/**
 * The server half of the two-process test (run as `node dist/test/runtime/peer-process.js`).
 * Out-of-band exchange over stdio, one JSON line each way, like ibv_rc_pingpong's TCP exchange:
 * it prints { port, qpn, psn, rkey, va }, reads the client's, connects an RC QP, then
 *  1. waits for a SEND_WITH_IMM (the client has RDMA-written 1 MiB into its region before it),
 *  2. answers with a SEND carrying the sha256 of its region,
 *  3. waits for the client's "bye" SEND and exits 0.
 */
import { createHash } from 'node:crypto';
import { createInterface } from 'node:readline';
import {
  allocPd, closeDevice, createCq, createQp, modifyQp, openDevice, postRecv, postSend, regMr,
} from '../../src/api/verbs.js';
import { ACCESS } from '../../src/core/types.js';

const access = ACCESS.LOCAL_WRITE | ACCESS.REMOTE_WRITE | ACCESS.REMOTE_READ;
const ctx = await openDevice({ address: '127.0.0.1', port: 0 });
const pd = allocPd(ctx);
const cq = createCq(ctx, { cqe: 16 });
const qp = createQp(pd, { type: 'RC', sendCq: cq, recvCq: cq, sqSigAll: true });
const region = regMr(pd, new Uint8Array(1 << 20), access);
const msg = regMr(pd, new Uint8Array(256), access);
const psn = 0x5d2907;
process.stdout.write(JSON.stringify({ port: ctx.port, qpn: qp.qpNum, psn, rkey: region.rkey, va: region.va(0).toString() }) + '\n');

const lines = createInterface({ input: process.stdin });
const peer = JSON.parse(await new Promise<string>((r) => lines.once('line', r))) as { port: number; qpn: number; psn: number };
modifyQp(qp, { qpState: 'INIT', pkeyIndex: 0, portNum: 1, qpAccessFlags: access });
modifyQp(qp, { qpState: 'RTR', ahAttr: { address: '127.0.0.1', port: peer.port }, pathMtu: 1024, destQpNum: peer.qpn, rqPsn: peer.psn, maxDestRdAtomic: 4, minRnrTimer: 12 });
modifyQp(qp, { qpState: 'RTS', sqPsn: psn, timeout: 14, retryCnt: 7, rnrRetry: 7, maxRdAtomic: 4 });
postRecv(qp, [{ wrId: 1, sgList: [msg.sge(0, 128)] }, { wrId: 2, sgList: [msg.sge(128, 128)] }]);

const first = await cq.next({ timeoutMs: 20_000 });
if (first.status !== 'SUCCESS' || first.immData !== 0xc0ffee) throw new Error(`unexpected ${JSON.stringify(first)}`);
const digest = createHash('sha256').update(region.buffer).digest('hex');
const out = regMr(pd, new TextEncoder().encode(digest), access);
postSend(qp, { wrId: 3, opcode: 'SEND', sgList: [out.sge(0, 64)] });
const done = await cq.wait(2, { timeoutMs: 20_000 });
if (!done.every((w) => w.status === 'SUCCESS')) throw new Error(`unexpected ${JSON.stringify(done)}`);
process.stderr.write(`server counters ${JSON.stringify(ctx.counters)}\n`);
await closeDevice(ctx);
lines.close();

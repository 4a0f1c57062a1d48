/**
 * A passive RC peer in a process of its own (run as `node dist/test/runtime/ack-peer-process.js
 * N BATCHIO`): N QPs over one region, each answering the WRITEs sent to it with ACKs, while the
 * other process's event loop may be held up. Out of band over stdio, one JSON line each way: it
 * prints { port, qpns, psn, rkey, va }, reads { port, qpns, psn }, connects, and exits when stdin
 * closes.
 */
import { createInterface } from 'node:readline';
import { allocPd, closeDevice, createCq, createQp, modifyQp, openDevice, regMr } from '../../src/api/verbs.js';
import { ACCESS } from '../../src/core/types.js';

const n = Number(process.argv[2] ?? 1);
const batchIo = process.argv[3] !== 'false';
const access = ACCESS.LOCAL_WRITE | ACCESS.REMOTE_WRITE;
const ctx = await openDevice({ address: '127.0.0.1', port: 0, udp: { batchIo } });
const pd = allocPd(ctx);
const cq = createCq(ctx, { cqe: 16 });
const qps = Array.from({ length: n }, () => createQp(pd, { type: 'RC', sendCq: cq, recvCq: cq }));
const region = regMr(pd, new Uint8Array(4096), access);
const psn = 0x4400;
process.stdout.write(JSON.stringify({ port: ctx.port, qpns: qps.map((q) => q.qpNum), psn, rkey: region.rkey, va: region.va(0).toString() }) + '\n');

const lines = createInterface({ input: process.stdin });
const peer = JSON.parse(await new Promise<string>((r) => lines.once('line', r))) as { port: number; qpns: number[]; psn: number };
qps.forEach((qp, i) => {
  modifyQp(qp, { qpState: 'INIT', pkeyIndex: 0, portNum: 1, qpAccessFlags: access });
  modifyQp(qp, { qpState: 'RTR', ahAttr: { address: '127.0.0.1', port: peer.port }, pathMtu: 1024, destQpNum: peer.qpns[i]!, rqPsn: peer.psn, maxDestRdAtomic: 1, minRnrTimer: 12 });
  modifyQp(qp, { qpState: 'RTS', sqPsn: psn, timeout: 14, retryCnt: 7, rnrRetry: 7, maxRdAtomic: 1 });
});
process.stdout.write('ready\n');
await new Promise<void>((r) => lines.once('close', r));
await closeDevice(ctx);

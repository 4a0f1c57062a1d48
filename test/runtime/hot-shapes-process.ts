/**
 * Child of hot-shapes.test.ts, run with `--allow-natives-syntax`: two devices on loopback, one RC QP
 * each, 32 RDMA WRITEs; then prints, as one JSON line, whether the records every packet touches kept
 * V8's fast properties, and whether the receive metadata and the target's parsed packets were one
 * record each.
 */
import {
  allocPd, closeDevice, createCq, createQp, modifyQp, openDevice, pollCq, postSend, regMr, type Context, type Qp,
} from '../../src/api/verbs.js';
import type { RxMeta } from '../../src/link/link.js';
import { ACCESS } from '../../src/core/types.js';

// Natives syntax parses only under --allow-natives-syntax: built at run time, not in the module.
const hasFastProperties = new Function('o', 'return %HasFastProperties(o)') as (o: object) => boolean;

const access = ACCESS.LOCAL_WRITE | ACCESS.REMOTE_WRITE | ACCESS.REMOTE_READ;
const a = await openDevice({ address: '127.0.0.1', port: 0 });
const b = await openDevice({ address: '127.0.0.1', port: 0 });
const side = (ctx: Context) => {
  const pd = allocPd(ctx);
  const cq = createCq(ctx, { cqe: 64 });
  const qp = createQp(pd, { type: 'RC', sendCq: cq, recvCq: cq, sqSigAll: true });
  modifyQp(qp, { qpState: 'INIT', pkeyIndex: 0, portNum: 1, qpAccessFlags: access });
  return { pd, cq, qp, mr: regMr(pd, new Uint8Array(4096), access) };
};
const sa = side(a);
const sb = side(b);
const connect = (qp: Qp, peer: Context, peerQp: Qp): void => {
  modifyQp(qp, { qpState: 'RTR', ahAttr: { address: '127.0.0.1', port: peer.port }, pathMtu: 4096, destQpNum: peerQp.qpNum, rqPsn: 0, maxDestRdAtomic: 4, minRnrTimer: 1 });
  modifyQp(qp, { qpState: 'RTS', sqPsn: 0, timeout: 14, retryCnt: 7, rnrRetry: 7, maxRdAtomic: 4 });
};
connect(sa.qp, b, sb.qp);
connect(sb.qp, a, sa.qp);

// What the initiator's device is handed for each datagram it receives (the ACKs).
const metas = new Set<RxMeta>();
let fastMetas = true;
const link = a.device.link;
link.onReceive((payload, meta) => {
  metas.add(meta);
  fastMetas &&= hasFastProperties(meta);
  a.device.receive(payload, meta);
});

// What the target's QP is handed for each packet it receives (the WRITEs).
const packets = new Set<object>();
let fastPackets = true;
let fastReth = true;
const qpb = sb.qp.core;
const onPacket = qpb.onPacket.bind(qpb);
qpb.onPacket = (now, pkt, info, rx) => {
  packets.add(pkt);
  fastPackets &&= hasFastProperties(pkt);
  // The RETH record too: it keeps the VA's halves beside the fields (not enumerable), which must not
  // cost it its layout (an accessor for a lazy VA did: V8 turned the record into a hash table).
  if (pkt.reth !== undefined) fastReth &&= hasFastProperties(pkt.reth) && pkt.reth.vaHi !== undefined;
  onPacket(now, pkt, info, rx);
};

let done = 0;
for (let i = 0; i < 32; i++) {
  postSend(sa.qp, [{ wrId: BigInt(i), opcode: 'RDMA_WRITE', sgList: [sa.mr.sge(0, 4096)], rdma: { remoteAddr: sb.mr.va(0), rkey: sb.mr.rkey } }]);
  const until = Date.now() + 5000;
  while (pollCq(sa.cq, 1).length === 0) {
    if (Date.now() > until) throw new Error(`WRITE ${i} did not complete`);
    await new Promise((r) => setImmediate(r));
  }
  done++;
}
process.stdout.write(JSON.stringify({
  done,
  metaRecords: metas.size,
  fastMetas,
  packetRecords: packets.size,
  fastPackets,
  fastReth,
  deviceCounters: hasFastProperties(a.device.counters),
  linkCounters: hasFastProperties((link as unknown as { counters: object }).counters),
  qp: hasFastProperties(sa.qp.core),
  mr: hasFastProperties(sa.mr),
}) + '\n');
await closeDevice(a);
await closeDevice(b);

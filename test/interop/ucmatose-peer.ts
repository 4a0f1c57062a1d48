/**
 * librdmacm's `ucmatose` (librdmacm/examples/cmatose.c) played on our rdma_cm API, either role,
 * for test/interop/ucmatose.test.ts. Run in the lab's host namespace:
 *
 *   node ucmatose-peer.js server|client LOCAL_IP PEER_IP CONNECTIONS COUNT SIZE
 *
 * ucmatose's exchange, per connection: both sides post COUNT receives of SIZE bytes before
 * rdma_connect / rdma_accept. Once every connection is ESTABLISHED, the server posts COUNT SENDs
 * of SIZE bytes on each, reaps their completions, then reaps COUNT receives on each, and
 * disconnects them all. The client reaps COUNT receives on each connection, then posts its
 * COUNT SENDs, and waits for the server's DREQs (answering each). Port 7471, port space TCP, no
 * private data. Prints one JSON line: { ok, sends, recvs, bytes, message? }.
 */

import { openDevice, postRecv, postSend, type Cq, type Qp } from '../../src/api/verbs.js';
import { createEventChannel, type RdmaCmEvent, type RdmaCmId } from '../../src/cm/rdmacm.js';
import { SEND_FLAGS } from '../../src/core/types.js';

const UCMATOSE_PORT = 7471;
const WAIT_MS = 30_000;

const [role, local, peer, connText, countText, sizeText] = process.argv.slice(2);
const connections = Number(connText);
const count = Number(countText);
const size = Number(sizeText);
const out = (o: object): boolean => process.stdout.write(JSON.stringify(o) + '\n');

interface Node {
  id: RdmaCmId;
  qp: Qp;
  sendCq: Cq;
  recvCq: Cq;
}

const ctx = await openDevice({ address: local! });
const ch = createEventChannel(ctx);
const pd = ctx.allocPd();
// One buffer per side, as ucmatose has: every receive lands in it, every SEND comes from it.
const recvMr = pd.regMr(new Uint8Array(size), 1);
const sendMr = pd.regMr(new Uint8Array(size).map((_, i) => i & 0xff), 0);
let sends = 0;
let recvs = 0;
let bytes = 0;

function prepare(id: RdmaCmId): Node {
  const sendCq = ctx.createCq({ cqe: count });
  const recvCq = ctx.createCq({ cqe: count });
  const qp = id.createQp(pd, { sendCq, recvCq, sqSigAll: true, cap: { maxSendWr: count, maxRecvWr: count, maxSendSge: 1, maxRecvSge: 1 } });
  for (let i = 0; i < count; i++) postRecv(qp, { wrId: i, sgList: [recvMr.sge()] });
  return { id, qp, sendCq, recvCq };
}

async function reap(cq: Cq, want: 'SEND' | 'RECV'): Promise<void> {
  for (let i = 0; i < count; i++) {
    const wc = await cq.next({ timeoutMs: WAIT_MS });
    if (wc.status !== 'SUCCESS' || wc.opcode !== want) throw new Error(`${want} ${i}: ${wc.opcode} ${wc.status}`);
    if (want === 'RECV') {
      if (wc.byteLen !== size) throw new Error(`RECV ${i}: ${wc.byteLen} bytes, not ${size}`);
      recvs++;
      bytes += wc.byteLen;
    } else {
      sends++;
    }
  }
}

function postSends(n: Node): void {
  for (let i = 0; i < count; i++) postSend(n.qp, { wrId: i, opcode: 'SEND', sendFlags: SEND_FLAGS.SIGNALED, sgList: [sendMr.sge()] });
}

try {
  const nodes: Node[] = [];
  if (role === 'server') {
    const listener = ch.createId();
    listener.listen(UCMATOSE_PORT);
    out({ listening: true });
    const established: Promise<RdmaCmEvent>[] = [];
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('no connect requests')), WAIT_MS);
      listener.on('connect_request', (ev: RdmaCmEvent) => {
        const n = prepare(ev.id);
        nodes.push(n);
        established.push(ev.id.waitFor('established', WAIT_MS));
        ev.id.accept();
        if (nodes.length === connections) {
          clearTimeout(timer);
          resolve();
        }
      });
    });
    await Promise.all(established);
    for (const n of nodes) postSends(n);
    for (const n of nodes) await reap(n.sendCq, 'SEND');
    for (const n of nodes) await reap(n.recvCq, 'RECV');
    const gone = nodes.map((n) => n.id.waitFor('disconnected', WAIT_MS));
    for (const n of nodes) n.id.disconnect();
    await Promise.all(gone);
    listener.destroy();
  } else {
    const established: Promise<RdmaCmEvent>[] = [];
    for (let i = 0; i < connections; i++) {
      const id = ch.createId();
      nodes.push(prepare(id));
      established.push(id.waitFor('established', WAIT_MS));
      // ucmatose's conn_param: responder resources and initiator depth 1, retry count 5.
      id.connect({ address: peer!, port: UCMATOSE_PORT, retryCount: 5 });
    }
    await Promise.all(established);
    const gone = nodes.map((n) => n.id.waitFor('disconnected', WAIT_MS));
    for (const n of nodes) await reap(n.recvCq, 'RECV');
    for (const n of nodes) postSends(n);
    for (const n of nodes) await reap(n.sendCq, 'SEND');
    await Promise.all(gone);
  }
  await ctx.device.gsi.flush();
  out({ ok: true, sends, recvs, bytes });
} catch (e) {
  out({ ok: false, sends, recvs, bytes, message: (e as Error).message });
}
await ctx.close();
process.exit(0);

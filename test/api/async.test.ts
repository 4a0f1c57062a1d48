/** The verbs facade end to end over real UDP: async completions, the async iterator, events. */
import t from 'tap';
import {
  allocPd, closeDevice, createCq, createQp, modifyQp, openDevice, postRecv, postSend, queryQp, regMr,
} from '../../src/api/verbs.js';
import { ACCESS, QP_ATTR_MASK } from '../../src/core/types.js';
import { RoceError } from '../../src/core/errors.js';
import { pattern } from '../helpers/engine.js';

t.test('openDevice over UDP loopback, RC ping-pong with await and for-await', async (t) => {
  const a = await openDevice({ address: '127.0.0.1', port: 0 });
  const b = await openDevice({ address: '127.0.0.1', port: 0 });
  t.teardown(async () => {
    await closeDevice(a);
    await closeDevice(b);
  });
  t.same([...a.gid], [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1], 'GID is the IPv4-mapped address');
  await new Promise((r) => setImmediate(r));
  t.match(a.events.history, [{ type: 'PORT_ACTIVE' }], 'PORT_ACTIVE was announced');
  const access = ACCESS.LOCAL_WRITE | ACCESS.REMOTE_WRITE;
  const mk = (ctx: typeof a) => {
    const pd = allocPd(ctx);
    const cq = createCq(ctx, { cqe: 16 });
    return { pd, cq, qp: createQp(pd, { type: 'RC', sendCq: cq, recvCq: cq, cap: { maxSendWr: 8, maxRecvWr: 8 } }) };
  };
  const A = mk(a);
  const B = mk(b);
  t.equal(A.qp.state, 'RESET');
  t.throws(() => postSend(A.qp, { wrId: 0, opcode: 'SEND' }), { code: 'ERR_QP_STATE' });
  for (const [me, peer, ctx, psn, ppsn] of [[A, B, b, 10, 20], [B, A, a, 20, 10]] as const) {
    // With an explicit mask, as libibverbs callers write it.
    modifyQp(me.qp, { qpState: 'INIT', pkeyIndex: 0, portNum: 1, qpAccessFlags: access },
      QP_ATTR_MASK.STATE | QP_ATTR_MASK.PKEY_INDEX | QP_ATTR_MASK.PORT | QP_ATTR_MASK.ACCESS_FLAGS);
    modifyQp(me.qp, { qpState: 'RTR', ahAttr: { dgid: ctx.gid, port: ctx.port }, pathMtu: 1024, destQpNum: peer.qp.qpNum, rqPsn: ppsn, maxDestRdAtomic: 1, minRnrTimer: 12 });
    modifyQp(me.qp, { qpState: 'RTS', sqPsn: psn, timeout: 14, retryCnt: 7, rnrRetry: 7, maxRdAtomic: 1 });
  }
  t.match(queryQp(A.qp), { qpState: 'RTS', destQpNum: B.qp.qpNum, pathMtu: 1024, timeout: 14, ahAttr: { address: '127.0.0.1', port: b.port } });

  const mrA = regMr(A.pd, pattern(4096, 1), access);
  const mrB = regMr(B.pd, new Uint8Array(4096 * 4), access);
  for (let i = 0; i < 4; i++) postRecv(B.qp, { wrId: 100 + i, sgList: [mrB.sge(i * 4096, 4096)] });
  for (let i = 0; i < 4; i++) postSend(A.qp, { wrId: i, opcode: 'SEND_WITH_IMM', immData: i, sendFlags: 2, sgList: [mrA.sge(0, 1000 * (i + 1))] });
  const sent = await A.cq.wait(4, { timeoutMs: 5000 });
  t.same(sent.map((w) => [w.wrId, w.status]), [[0, 'SUCCESS'], [1, 'SUCCESS'], [2, 'SUCCESS'], [3, 'SUCCESS']]);
  const got: number[] = [];
  for await (const wc of B.cq) {
    t.equal(wc.status, 'SUCCESS');
    got.push(wc.byteLen);
    if (got.length === 4) break;
  }
  t.same(got, [1000, 2000, 3000, 4000]);
  t.ok(a.counters.sentPkts >= 10 && b.counters.rcvdPkts >= 10);
  let err: unknown;
  try {
    modifyQp(A.qp, { qpState: 'INIT' });
  } catch (e) {
    err = e;
  }
  t.ok(err instanceof RoceError, 'RTS → INIT is refused with a RoceError');
  t.match(err, { code: 'ERR_INVALID_TRANSITION' });
  t.equal(A.qp.state, 'RTS');
});

/**
 * The device's QP table (src/runtime/device.ts): QPNs index a direct-mapped table that grows with
 * the QPs, and the map stays the registry. Through creation and destruction in any order every live
 * QP is found by its QPN, and only by it; traffic reaches each one; a destroyed QP is gone.
 */
import t from 'tap';
import { destroyQp, pollCq, postSend, regMr, type Qp } from '../../src/api/verbs.js';
import { ALL_ACCESS, connectPair, memoryPair, runUntil } from '../helpers/engine.js';

t.test('every live QP is found by its QPN, and only by it, through growth and churn', async (t) => {
  const p = await memoryPair();
  const device = p.a.ctx.device;
  const mr = regMr(p.a.pd, new Uint8Array(64), ALL_ACCESS);
  const target = regMr(p.b.pd, new Uint8Array(64), ALL_ACCESS);
  let pairs: [Qp, Qp][] = [];
  const gone: number[] = [];
  // Grow past several table sizes, destroy every third pair, grow again: new QPNs land between
  // live ones, whose low bits the table already uses.
  for (let round = 0; round < 3; round++) {
    for (let i = 0; i < 150; i++) pairs.push(connectPair(p, 'RC'));
    pairs = pairs.filter((pair, i) => {
      if (i % 3 !== 1) return true;
      gone.push(pair[0].qpNum);
      destroyQp(pair[0]);
      destroyQp(pair[1]);
      return false;
    });
  }
  const qpns = pairs.map(([qa]) => qa.qpNum);
  t.equal(new Set(qpns).size, qpns.length, 'distinct QPNs');
  t.ok(pairs.every(([qa]) => device.qp(qa.qpNum) === qa.core), `${pairs.length} live QPs found by their QPN`);
  t.ok(gone.every((n) => device.qp(n) === undefined), `${gone.length} destroyed QPs not found`);
  // A QPN that shares a live QP's low bits (any table size up to 2^20) is not that QP.
  t.ok(qpns.every((n) => device.qp(n + (1 << 20)) === undefined), 'no alias by the low bits');

  // Traffic reaches every live QP: one RDMA WRITE each, every one acknowledged.
  for (const [qa] of pairs) postSend(qa, { wrId: qa.qpNum, opcode: 'RDMA_WRITE', sgList: [mr.sge(0, 8)], rdma: { remoteAddr: target.va(0), rkey: target.rkey } });
  const done = new Map<number, string>();
  runUntil(p.clock, () => {
    for (const wc of pollCq(p.a.cq, 64)) done.set(Number(wc.wrId), wc.status);
    return done.size >= pairs.length;
  });
  t.equal(done.size, pairs.length, 'a completion for every QP');
  t.ok([...done.values()].every((s) => s === 'SUCCESS'), 'all successful');
  t.equal(device.counters.noQp, 0, 'no packet to an unknown QP');
  t.equal(p.b.ctx.device.counters.noQp, 0, 'nor at the peer');
});

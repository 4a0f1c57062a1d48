/**
 * The device's QP deadlines: one heap and one clock timer for all QPs (src/runtime/device.ts). Each
 * QP still times out at its own deadline, in deadline order whatever the order of arming, and a QP
 * destroyed with a deadline pending is never run again.
 */
import t from 'tap';
import { destroyQp, pollCq, postSend, regMr, type Qp } from '../../src/api/verbs.js';
import { ackTimeoutUs } from '../../src/core/time.js';
import type { WorkCompletion } from '../../src/core/types.js';
import { bringUp, makeQp, memoryPair, ALL_ACCESS } from '../helpers/engine.js';

t.test('QPs time out at their own deadlines, in deadline order; a destroyed QP never runs again', async (t) => {
  const p = await memoryPair();
  const mr = regMr(p.a.pd, new Uint8Array(64), ALL_ACCESS);
  // Armed in this order, due in another: exponents 12, 10, 11 (16.8, 4.2, 8.4 ms), no retries.
  const exponents = [12, 10, 11, 10];
  const qps: Qp[] = [];
  for (const timeout of exponents) {
    const qa = makeQp(p.a, 'RC');
    const qb = makeQp(p.b, 'RC');
    bringUp(qa, qb, p.b.ctx, { timeout, retryCnt: 0 }, 0x100, 0x200, ALL_ACCESS);
    bringUp(qb, qa, p.a.ctx, {}, 0x200, 0x100, ALL_ACCESS);
    // The peer goes away: nothing will ever answer this QP.
    destroyQp(qb);
    qps.push(qa);
  }
  const t0 = p.clock.now();
  qps.forEach((qp, i) => postSend(qp, { wrId: i, opcode: 'SEND', sgList: [mr.sge(0, 64)] }));
  // The last one is destroyed with its deadline pending.
  p.clock.advanceTo(t0 + 100);
  destroyQp(qps[3]!);
  const seen: { wrId: number; at: number; status: string }[] = [];
  p.clock.run(1_000_000, () => {
    for (const wc of pollCq(p.a.cq, 8) as WorkCompletion[]) seen.push({ wrId: Number(wc.wrId), at: p.clock.now() - t0, status: wc.status });
    return seen.length >= 3;
  });
  p.clock.advanceTo(p.clock.now() + 100_000);
  for (const wc of pollCq(p.a.cq, 8) as WorkCompletion[]) seen.push({ wrId: Number(wc.wrId), at: p.clock.now() - t0, status: wc.status });
  t.same(seen.map((s) => s.wrId), [1, 2, 0], 'in deadline order (4.2, 8.4, 16.8 ms), not in the order armed');
  t.ok(seen.every((s) => s.status === 'RETRY_EXC_ERR'), 'each one a retry-exceeded error');
  for (const s of seen) {
    const due = ackTimeoutUs(exponents[s.wrId]!)!;
    t.ok(s.at >= due && s.at <= due + 1000, `QP ${s.wrId}: failed at ${s.at} µs, due at ${Math.round(due)} µs`);
  }
  t.equal(seen.length, 3, 'nothing from the destroyed QP');
});

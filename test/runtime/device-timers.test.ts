/**
 * The device's QP deadlines: one heap and one clock timer for all QPs (src/runtime/device.ts). Each
 * QP still times out at its own deadline, in deadline order whatever the order of arming, and a QP
 * destroyed with a deadline pending is never run again.
 */
import t from 'tap';
import { destroyQp, pollCq, postSend, queryQp, regMr, type Qp } from '../../src/api/verbs.js';
import { ackTimeoutUs } from '../../src/core/time.js';
import type { WorkCompletion } from '../../src/core/types.js';
import { DeadlineHeap } from '../../src/runtime/deadline-heap.js';
import { bringUp, collect, connectPair, makeQp, memoryPair, ALL_ACCESS } from '../helpers/engine.js';

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

t.test('a QP with one message in flight at a time keeps one deadline entry, not one per message', async (t) => {
  const p = await memoryPair();
  const src = regMr(p.a.pd, new Uint8Array(64), ALL_ACCESS);
  const dst = regMr(p.b.pd, new Uint8Array(64), ALL_ACCESS);
  const [idle] = connectPair(p, 'RC', { timeout: 14, retryCnt: 0 });
  const [busy, busyPeer] = connectPair(p, 'RC', { timeout: 14, retryCnt: 0 });
  // Deadlines the device pushes for each QP (the virtual clock's own events use the same heap class).
  const pushes = new Map<unknown, number>();
  const push = DeadlineHeap.prototype.push;
  DeadlineHeap.prototype.push = function (this: DeadlineHeap<unknown>, at: number, item: unknown): void {
    pushes.set(item, (pushes.get(item) ?? 0) + 1);
    push.call(this, at, item);
  };
  t.teardown(() => {
    DeadlineHeap.prototype.push = push;
  });
  const write = (qp: Qp, wrId: number): void =>
    postSend(qp, { wrId, opcode: 'RDMA_WRITE', sgList: [src.sge(0, 64)], rdma: { remoteAddr: dst.va(0), rkey: dst.rkey } });
  const timeoutUs = ackTimeoutUs(14)!;
  const t0 = p.clock.now();
  const MESSAGES = 50;
  for (let i = 0; i < MESSAGES; i++) {
    for (const qp of [idle, busy]) {
      write(qp, i);
      t.equal(collect(p.clock, p.a.cq, 1)[0]?.status, 'SUCCESS', `WRITE ${i} completed`);
    }
  }
  t.ok(p.clock.now() - t0 < timeoutUs / 10, 'every message well inside one ACK timeout');
  // Each message arms an ACK deadline; acknowledged, it leaves the QP's entry in place for the next.
  t.equal(pushes.get(idle.core), 1, `${MESSAGES} messages, one after the other: 1 deadline entry`);
  t.equal(pushes.get(busy.core), 1, 'the same on the second QP');

  // The busy QP's peer goes away, and one more WRITE waits for an ACK that never comes. Its deadline
  // is later than the kept entry: the entry wakes the QP early, which re-arms for the real one.
  destroyQp(busyPeer);
  const t1 = p.clock.now();
  write(busy, 99);
  const failed = collect(p.clock, p.a.cq, 1, 3 * timeoutUs);
  t.equal(failed[0]?.status, 'RETRY_EXC_ERR', 'the unanswered WRITE fails (no retries allowed)');
  const at = p.clock.now() - t1;
  t.ok(at >= timeoutUs && at <= timeoutUs + 1000, `at its own deadline: ${Math.round(at)} µs after the post, due at ${Math.round(timeoutUs)}`);
  t.equal(pushes.get(busy.core), 2, 'by a second entry, pushed when the first came up early');

  // The idle QP's entry came up too, found nothing outstanding and was not replaced.
  p.clock.advanceTo(p.clock.now() + 3 * timeoutUs);
  t.equal(pushes.get(idle.core), 1, 'the idle QP armed nothing more');
  t.equal(queryQp(idle).qpState, 'RTS', 'and did not time out (no retries were allowed)');
  t.equal(p.a.ctx.counters.ackTimeouts, 1, 'one ACK timeout in all: the busy QP\'s');
});

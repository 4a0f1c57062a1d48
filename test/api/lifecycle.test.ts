/**
 * Destroying resources in the order libibverbs requires: a CQ only once no QP uses it, a protection
 * domain only once its regions and QPs are gone (EBUSY there, ERR_BUSY here), and nothing made from a
 * destroyed one.
 */
import t, { type Test } from 'tap';
import {
  allocPd, closeDevice, createCq, createQp, deallocPd, deregMr, destroyCq, destroyQp, openDevice, regMr, type Context,
} from '../../src/api/verbs.js';
import { ACCESS } from '../../src/core/types.js';

async function device(t: Test): Promise<Context> {
  const ctx = await openDevice({ address: '127.0.0.1', port: 0 });
  t.teardown(() => closeDevice(ctx));
  return ctx;
}

t.test('a CQ is destroyed only once no QP uses it', async (t) => {
  const ctx = await device(t);
  const pd = allocPd(ctx);
  const scq = createCq(ctx, { cqe: 8 });
  const rcq = createCq(ctx, { cqe: 8 });
  const qp = createQp(pd, { type: 'RC', sendCq: scq, recvCq: rcq });
  t.throws(() => destroyCq(scq), { code: 'ERR_BUSY' }, 'the send CQ of a live QP');
  t.throws(() => destroyCq(rcq), { code: 'ERR_BUSY' }, 'the receive CQ of a live QP');
  const waiting = rcq.next();
  destroyQp(qp);
  destroyCq(scq);
  destroyCq(rcq);
  await t.rejects(waiting, { code: 'ERR_RESOURCE', message: 'CQ destroyed' }, 'a pending wait is rejected by the destroy, as one begun after it');
  await t.rejects(rcq.next(), { code: 'ERR_RESOURCE' }, 'a wait after the destroy is rejected, not left pending');
  t.throws(() => createQp(pd, { type: 'RC', sendCq: scq, recvCq: createCq(ctx, { cqe: 8 }) }), { code: 'ERR_RESOURCE' }, 'no QP on a destroyed CQ');
});

t.test('a CQ used twice by one QP, or by two QPs, is free once each is destroyed', async (t) => {
  const ctx = await device(t);
  const pd = allocPd(ctx);
  const cq = createCq(ctx, { cqe: 8 });
  const a = createQp(pd, { type: 'RC', sendCq: cq, recvCq: cq });
  const b = createQp(pd, { type: 'UD', sendCq: cq, recvCq: cq });
  destroyQp(a);
  destroyQp(a); // a second destroy is a no-op and releases nothing more
  t.throws(() => destroyCq(cq), { code: 'ERR_BUSY' }, 'still used by the second QP');
  destroyQp(b);
  t.doesNotThrow(() => destroyCq(cq));
});

t.test('a protection domain is deallocated only once its regions and QPs are gone', async (t) => {
  const ctx = await device(t);
  const pd = allocPd(ctx);
  const cq = createCq(ctx, { cqe: 8 });
  const mr1 = regMr(pd, new Uint8Array(64), ACCESS.LOCAL_WRITE);
  const mr2 = regMr(pd, new Uint8Array(64), ACCESS.LOCAL_WRITE);
  const qp = createQp(pd, { type: 'RC', sendCq: cq, recvCq: cq });
  t.throws(() => deallocPd(pd), { code: 'ERR_BUSY' }, 'two regions and a QP');
  deregMr(mr1);
  deregMr(mr1); // deregistered twice: counted once
  t.throws(() => deallocPd(pd), { code: 'ERR_BUSY' }, 'a region and a QP');
  destroyQp(qp);
  t.throws(() => deallocPd(pd), { code: 'ERR_BUSY' }, 'a region left');
  deregMr(mr2);
  t.doesNotThrow(() => deallocPd(pd));
  t.throws(() => regMr(pd, new Uint8Array(64), ACCESS.LOCAL_WRITE), { code: 'ERR_RESOURCE' }, 'no region in a deallocated PD');
  t.throws(() => createQp(pd, { type: 'RC', sendCq: cq, recvCq: cq }), { code: 'ERR_RESOURCE' }, 'no QP in a deallocated PD');
  t.doesNotThrow(() => destroyCq(cq), 'the CQ was freed by the QP the PD held');
  const other = allocPd(ctx);
  t.doesNotThrow(() => deallocPd(other), 'an unused PD');
});

t.test('on a closed device, everything can be destroyed in any order', async (t) => {
  const ctx = await openDevice({ address: '127.0.0.1', port: 0 });
  const pd = allocPd(ctx);
  const cq = createCq(ctx, { cqe: 8 });
  regMr(pd, new Uint8Array(64), ACCESS.LOCAL_WRITE);
  createQp(pd, { type: 'RC', sendCq: cq, recvCq: cq });
  t.throws(() => destroyCq(cq), { code: 'ERR_BUSY' }, 'refused while the device is open');
  await closeDevice(ctx);
  t.doesNotThrow(() => destroyCq(cq));
  t.doesNotThrow(() => deallocPd(pd));
});

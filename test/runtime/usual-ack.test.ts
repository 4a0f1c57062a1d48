/**
 * The ACK path a device takes for the usual answer (a plain ACK of its QP's oldest WQE, from the QP's
 * peer: `Device.usualAck`, `Completer.ackOfHead`) agrees with the general one: it completes exactly
 * that WQE, and every other ACK — a duplicate, one from a stranger or another partition, an RNR NAK,
 * an ACK where a READ response is due, one covering several WQEs, one to a QP in error — is judged as
 * before. The peer QP is left in RESET, so it answers nothing: every ACK here is handed to
 * `Device.receive` by the test.
 */
import t, { type Test } from 'tap';
import { modifyQp, postSend, regMr } from '../../src/api/verbs.js';
import type { WorkCompletion } from '../../src/core/types.js';
import { emitPacket, packetLength, type RocePacket } from '../../src/wire/packet.js';
import { ackSyndrome } from '../../src/wire/aeth.js';
import { ALL_ACCESS, bringUp, bth, makeQp, memoryPair, runUntil } from '../helpers/engine.js';
import { MAX_UNACKED_PSNS } from '../../src/core/limits.js';

const S = 0x200; // the requester's first PSN

function ackBytes(destQp: number, psn: number, o: { syndrome?: number; pkey?: number } = {}): Uint8Array {
  const p: RocePacket = { bth: bth('RC_ACKNOWLEDGE', psn, { destQp, pkey: o.pkey ?? 0xffff }), aeth: { syndrome: o.syndrome ?? ackSyndrome(), msn: 0 }, payload: new Uint8Array(0), icrc: 0 };
  const b = new Uint8Array(packetLength(p));
  emitPacket(p, b, 0);
  return b;
}

async function setup(t: Test, ops: ('RDMA_WRITE' | 'RDMA_READ')[]) {
  const p = await memoryPair();
  const qa = makeQp(p.a, 'RC'); // stays in RESET: drops what it is sent
  const qb = makeQp(p.b, 'RC');
  bringUp(qb, qa, p.a.ctx, { timeout: 20 }, S, 0x100, ALL_ACCESS);
  const mr = regMr(p.b.pd, new Uint8Array(512), ALL_ACCESS);
  ops.forEach((opcode, i) => postSend(qb, { wrId: i + 1, opcode, sgList: [mr.sge(0, 512)], rdma: { remoteAddr: 0x1000n, rkey: 0x77 } }));
  const dev = p.b.ctx.device;
  t.ok(runUntil(p.clock, () => p.b.ctx.counters.sentPkts >= ops.length, 1000), 'the requests left');
  const c = () => p.b.ctx.counters;
  const wcs: WorkCompletion[] = [];
  const poll = () => {
    wcs.push(...p.b.cq.poll(16));
    return wcs.map((w) => `${w.wrId}:${w.status}`);
  };
  const from = { src: { address: p.a.ctx.address, port: 4791 }, icrc: 'ok' as const, ce: false, at: 0 };
  const send = (b: Uint8Array, address = p.a.ctx.address) => dev.receive(b, { ...from, src: { address, port: 4791 } });
  return { p, qb, c, poll, send };
}

t.test('ACKs of the oldest WQE, one by one, and what is not that', async (t) => {
  const { qb, c, poll, send } = await setup(t, ['RDMA_WRITE', 'RDMA_WRITE', 'RDMA_WRITE', 'RDMA_WRITE']);
  send(ackBytes(qb.qpNum, S));
  t.same(poll(), ['1:SUCCESS'], 'the ACK of the first WRITE completes it, and only it');
  send(ackBytes(qb.qpNum, S));
  t.same(poll(), ['1:SUCCESS'], 'its duplicate completes nothing');
  t.equal(c().staleResponse, 1, 'and is counted stale');
  send(ackBytes(qb.qpNum, S + 1), '10.9.9.9');
  t.equal(c().badAddr, 1, 'an ACK from a stranger is dropped');
  send(ackBytes(qb.qpNum, S + 1, { pkey: 0x1234 }));
  t.equal(c().badPkey, 1, 'one of another partition too');
  send(ackBytes(qb.qpNum, S + 1, { syndrome: 0x20 | 1 }));
  t.equal(c().rcvRnr, 1, 'an RNR NAK of the second WRITE is an RNR NAK');
  t.same(poll(), ['1:SUCCESS'], 'and completes nothing');
  send(ackBytes(qb.qpNum, S + 3));
  t.same(poll(), ['1:SUCCESS', '2:SUCCESS', '3:SUCCESS', '4:SUCCESS'], 'an ACK of the last WRITE completes every one before it');
  t.equal(c().unexpectedResponse, 0, 'nothing was unexpected');
});

t.test('a plain ACK where a READ response is due, and an ACK to a QP in error', async (t) => {
  const { qb, c, poll, send } = await setup(t, ['RDMA_READ', 'RDMA_WRITE']);
  send(ackBytes(qb.qpNum, S));
  t.same(poll(), [], 'a plain ACK does not complete a READ');
  t.equal(c().staleResponse, 1, 'it is counted stale');
  modifyQp(qb, { qpState: 'ERR' });
  const flushed = poll();
  send(ackBytes(qb.qpNum, S + 1));
  t.equal(c().badState, 1, 'an ACK to a QP in ERR is dropped');
  t.same(poll(), flushed, 'and completes nothing more');
});

t.test("a completion handler that throws inside the usual ACK: the exception reaches the caller, and the QP sends what the ACK let it", async (t) => {
  // One WRITE more than the window of unacknowledged PSNs: the last waits for the first's ACK.
  const ops = Array.from({ length: MAX_UNACKED_PSNS + 1 }, () => 'RDMA_WRITE' as const);
  const { p, qb, c, poll, send } = await setup(t, ops.slice(0, MAX_UNACKED_PSNS));
  const mr = regMr(p.b.pd, new Uint8Array(512), ALL_ACCESS);
  postSend(qb, { wrId: ops.length, opcode: 'RDMA_WRITE', sgList: [mr.sge(0, 512)], rdma: { remoteAddr: 0x1000n, rkey: 0x77 } });
  p.clock.run(1000);
  t.equal(c().sentPkts, MAX_UNACKED_PSNS, 'the window holds the last WRITE back');
  let thrown = 0;
  p.b.cq.core.onCompletion = () => {
    thrown++;
    throw new Error('handler bug');
  };
  const rcvd = c().rcvdPkts;
  t.throws(() => send(ackBytes(qb.qpNum, S)), /handler bug/, "the handler's exception comes out of the receive");
  t.equal(thrown, 1, 'the handler ran once');
  t.equal(c().rcvdPkts, rcvd + 1, 'the ACK is counted received');
  p.b.cq.core.onCompletion = undefined;
  // Far less than the ACK timeout (timeout 20: about 4.3 s): only a run the ACK scheduled sends it.
  p.clock.run(1000);
  t.equal(c().sentPkts, MAX_UNACKED_PSNS + 1, 'the window the ACK opened let the last WRITE go');
  t.equal(c().retransPkts, 0, 'nothing was sent again');
  t.same(poll(), ['1:SUCCESS'], 'the ACK completed the first WRITE, and only it');
});

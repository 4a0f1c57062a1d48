/**
 * A local region deregistered in the middle of a message. rxe looks the L_Key up for every packet it
 * copies to or from local memory (rxe_mr.c `copy_data` → `lookup_mr`): the rest of a message is
 * neither read from nor written to a region that is gone. The requester fails the WQE (local
 * protection error), the completer a READ's or atomic's sink, the responder a receive buffer (class A,
 * NAK Remote Operational Error); each QP goes to ERR.
 */
import t from 'tap';
import { ackSyndrome, NAK_CODE, nakSyndrome } from '../../src/wire/aeth.js';
import { regionsStillHeld } from '../../src/core/mr.js';
import { EngineHarness, bth, pattern } from '../helpers/engine.js';

const S = 100; // the harness's first send PSN
const E = 500; // the PSN the harness's responder expects first
const ack = (psn: number, syndrome = ackSyndrome()) => ({ bth: bth('RC_ACKNOWLEDGE', psn), aeth: { syndrome, msn: 0 } });

t.test('regionsStillHeld: looks again only after a deregistration, and finds a region gone', async (t) => {
  const h = new EngineHarness('RC');
  const a = h.mr(64);
  const b = h.mr(64);
  const wqe = { sges: [a.sge(0, 8), b.sge(0, 0)], mrEpoch: h.mrs.deregistrations };
  t.ok(regionsStillHeld(h.mrs, wqe), 'nothing deregistered');
  h.mrs.deregister(b);
  t.ok(regionsStillHeld(h.mrs, wqe), 'another region gone (an empty SGE does not count)');
  t.equal(wqe.mrEpoch, 1, 'the WQE notes that it looked');
  h.mrs.deregister(b);
  t.equal(h.mrs.deregistrations, 1, 'a second deregistration of one region is not counted');
  h.mrs.deregister(a);
  t.notOk(regionsStillHeld(h.mrs, wqe), 'its own region gone');
});

t.test('requester: the rest of a SEND from a region deregistered after its first packet is not sent', async (t) => {
  for (const when of ['between runs', 'in a send'] as const) {
    const h = new EngineHarness('RC');
    const src = h.mr(pattern(1024));
    h.qp.postSend(0, [{ wrId: 7, opcode: 'SEND', sgList: [src.sge()] }]);
    let out;
    if (when === 'between runs') {
      h.qp.poll(0, 1);
      h.mrs.deregister(src);
      out = h.poll(0);
    } else {
      h.onTransmit = () => {
        if (!src.deregistered) h.mrs.deregister(src);
      };
      out = h.poll(0);
    }
    t.same(h.names(out), [`SEND_FIRST@${S}`], `${when}: only the FIRST left (of four)`);
    t.match(h.scq.poll(4), [{ wrId: 7, status: 'LOC_PROT_ERR' }], `${when}: the SEND completes with a local protection error`);
    t.equal(h.qp.state, 'ERR', `${when}: QP to ERR`);
  }
});

t.test('requester: a resend from a region deregistered after the whole message left fails the WQE', async (t) => {
  const h = new EngineHarness('RC');
  const src = h.mr(pattern(768));
  h.qp.postSend(0, [{ wrId: 3, opcode: 'RDMA_WRITE', sgList: [src.sge()], rdma: { remoteAddr: 0x1000n, rkey: 9 } }]);
  t.same(h.names(h.poll()), [`RDMA_WRITE_FIRST@${S}`, `RDMA_WRITE_MIDDLE@${S + 1}`, `RDMA_WRITE_LAST@${S + 2}!`]);
  h.mrs.deregister(src);
  // The responder lost the MIDDLE: go back to it, from a region that is gone.
  h.send(ack(S + 1, nakSyndrome(NAK_CODE.PSN_SEQUENCE_ERROR)));
  t.same(h.poll(), [], 'nothing resent');
  t.match(h.scq.poll(4), [{ wrId: 3, status: 'LOC_PROT_ERR' }]);
  t.equal(h.qp.state, 'ERR');
});

t.test('requester: an inline SEND does not read its region again; one from a region still held completes', async (t) => {
  const h = new EngineHarness('RC');
  const src = h.mr(pattern(600));
  const other = h.mr(16);
  h.qp.postSend(0, [{ wrId: 1, opcode: 'SEND', sgList: [src.sge()] }]);
  h.qp.poll(0, 1);
  h.mrs.deregister(other);
  t.same(h.names(h.poll(0)), [`SEND_FIRST@${S}`, `SEND_MIDDLE@${S + 1}`, `SEND_LAST@${S + 2}!`], 'another region gone: the message goes on');
  h.send(ack(S + 2));
  h.poll();
  t.match(h.scq.poll(4), [{ wrId: 1, status: 'SUCCESS' }]);
  const small = h.mr(pattern(32));
  h.qp.postSend(0, [{ wrId: 2, opcode: 'SEND', sendFlags: 8 /* INLINE */, sgList: [small.sge()] }]);
  t.same(h.names(h.poll()), [`SEND_ONLY@${S + 3}!`]);
  h.mrs.deregister(small);
  // Lost: sent again, from the copy made at post time.
  h.send(ack(S + 3, nakSyndrome(NAK_CODE.PSN_SEQUENCE_ERROR)));
  const again = h.poll();
  t.same(h.names(again), [`SEND_ONLY@${S + 3}!`], 'the inline SEND is sent again');
  t.same(again[0]!.payload, pattern(32), 'its bytes');
  h.send(ack(S + 3));
  h.poll();
  t.match(h.scq.poll(4), [{ wrId: 2, status: 'SUCCESS' }]);
});

t.test('completer: READ responses for a sink deregistered before the first, or between two, are not placed', async (t) => {
  for (const before of [0, 1]) {
    const h = new EngineHarness('RC');
    const sink = h.mr(600);
    h.qp.postSend(0, [{ wrId: 5, opcode: 'RDMA_READ', sgList: [sink.sge()], rdma: { remoteAddr: 0x2000n, rkey: 7 } }]);
    t.same(h.names(h.poll()), [`RDMA_READ_REQUEST@${S}!`]);
    const body = pattern(600, 3);
    const resp = (k: number, op: string) => ({
      bth: bth(op, S + k), payload: body.slice(k * 256, Math.min(600, (k + 1) * 256)),
      ...(op.endsWith('MIDDLE') ? {} : { aeth: { syndrome: ackSyndrome(), msn: 1 } }),
    });
    if (before === 1) h.send(resp(0, 'RC_RDMA_READ_RESPONSE_FIRST'));
    h.mrs.deregister(sink);
    h.send(resp(before, before === 0 ? 'RC_RDMA_READ_RESPONSE_FIRST' : 'RC_RDMA_READ_RESPONSE_MIDDLE'));
    h.poll();
    t.match(h.scq.poll(4), [{ wrId: 5, status: 'LOC_PROT_ERR' }], `deregistered after ${before} responses: local protection error`);
    t.equal(h.qp.state, 'ERR');
    t.same(sink.buffer.subarray(0, before * 256), body.subarray(0, before * 256), 'what came before landed');
    t.ok(sink.buffer.subarray(before * 256).every((x) => x === 0), 'nothing after');
  }
});

t.test('completer: an atomic\'s original value is not written to a sink deregistered before its response', async (t) => {
  const h = new EngineHarness('RC');
  const sink = h.mr(8);
  h.qp.postSend(0, [{ wrId: 6, opcode: 'ATOMIC_FETCH_AND_ADD', sgList: [sink.sge()], atomic: { remoteAddr: 0x3000n, rkey: 7, compareAdd: 1n } }]);
  t.same(h.names(h.poll()), [`FETCH_ADD@${S}!`]);
  h.mrs.deregister(sink);
  h.send({ bth: bth('RC_ATOMIC_ACKNOWLEDGE', S), aeth: { syndrome: ackSyndrome(), msn: 1 }, atomicAckEth: { originalData: 0x1122334455667788n } });
  h.poll();
  t.match(h.scq.poll(4), [{ wrId: 6, status: 'LOC_PROT_ERR' }]);
  t.ok(sink.buffer.every((x) => x === 0), 'nothing written');
});

t.test('responder: the rest of a SEND into a receive buffer deregistered after its first packet: NAK Remote Operational Error, QP to ERR', async (t) => {
  const h = new EngineHarness('RC');
  const dst = h.mr(1024);
  h.qp.postRecv(0, [{ wrId: 9, sgList: [dst.sge()] }]);
  const body = pattern(600, 5);
  h.send({ bth: bth('RC_SEND_FIRST', E), payload: body.slice(0, 256) });
  h.mrs.deregister(dst);
  h.send({ bth: bth('RC_SEND_MIDDLE', E + 1), payload: body.slice(256, 512) });
  const out = h.poll();
  t.same(h.names(out), [`ACKNOWLEDGE@${E + 1}`], 'a NAK at the MIDDLE\'s PSN');
  t.equal(out[0]!.aeth!.syndrome, nakSyndrome(NAK_CODE.REMOTE_OPERATIONAL_ERROR), 'Remote Operational Error');
  t.equal(h.qp.state, 'ERR');
  t.match(h.rcq.poll(4), [{ wrId: 9, status: 'LOC_PROT_ERR' }], 'the receive completes in error');
  t.same(dst.buffer.subarray(0, 256), body.subarray(0, 256), 'the FIRST landed');
  t.ok(dst.buffer.subarray(256).every((x) => x === 0), 'the MIDDLE did not');
});

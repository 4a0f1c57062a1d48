/**
 * Requester and completer against crafted responses (IBTA 9.7.1–9.7.2, 9.7.5–9.7.6; rxe_req.c,
 * rxe_comp.c): segmentation and AckReq, the PSN window, ACK/implied ACK, NAK classes, RNR
 * waits, go-back-N, the ACK timer and retry exhaustion.
 */
import t from 'tap';
import { ackSyndrome, NAK_CODE, nakSyndrome, rnrNakSyndrome } from '../../src/wire/aeth.js';
import { ackTimeoutUs, rnrTimerUs } from '../../src/core/time.js';
import { EngineHarness, bth, pattern } from '../helpers/engine.js';

const S = 100; // the harness's first send PSN
const ack = (psn: number, syndrome = ackSyndrome(), msn = 0) => ({ bth: bth('RC_ACKNOWLEDGE', psn), aeth: { syndrome, msn } });

function sendWr(h: EngineHarness, id: number, len: number, opcode: 'SEND' | 'RDMA_WRITE' = 'SEND') {
  const mr = h.mr(pattern(Math.max(len, 1)));
  const remote = { remoteAddr: 0x1000n, rkey: 0x1234 };
  h.qp.postSend(h.now, [{ wrId: id, opcode, sgList: [mr.sge(0, len)], ...(opcode === 'RDMA_WRITE' ? { rdma: remote } : {}) }]);
}

t.test('segmentation: FIRST/MIDDLE/LAST, AckReq on the last, PSNs in order', async (t) => {
  const h = new EngineHarness('RC');
  sendWr(h, 1, 600, 'RDMA_WRITE');
  const out = h.poll();
  t.same(h.names(out), ['RDMA_WRITE_FIRST@100', 'RDMA_WRITE_MIDDLE@101', 'RDMA_WRITE_LAST@102!']);
  t.equal(out[0]!.reth!.dmaLength, 600, 'RETH on the first packet only');
  t.equal(out[1]!.reth, undefined);
  t.same(out.map((p) => p.payload.length), [256, 256, 88]);
  t.equal(out[2]!.bth.padCount, 0);
});

t.test('AckReq at least every 64 packets; window of 128 unacknowledged PSNs', async (t) => {
  const h = new EngineHarness('RC');
  sendWr(h, 1, 200 * 256, 'RDMA_WRITE');
  const out = h.poll();
  t.equal(out.length, 128, 'stops at 128 unacknowledged PSNs');
  t.same(out.flatMap((p, i) => (p.bth.ackReq ? [i] : [])), [63, 127], 'AckReq every 64th packet');
  h.send(ack(S + 63));
  t.equal(h.poll().length, 64, 'an ACK opens the window by what it acknowledges');
});

t.test('ACK completes; a coalesced ACK completes every earlier message', async (t) => {
  const h = new EngineHarness('RC');
  sendWr(h, 1, 10);
  sendWr(h, 2, 10);
  sendWr(h, 3, 10);
  t.same(h.names(h.poll()), ['SEND_ONLY@100!', 'SEND_ONLY@101!', 'SEND_ONLY@102!']);
  h.send(ack(S + 1));
  t.same(h.scq.poll(5).map((w) => [w.wrId, w.status]), [[1, 'SUCCESS'], [2, 'SUCCESS']]);
  h.send(ack(S + 1));
  t.equal(h.counters.staleResponse, 1, 'a repeated ACK is stale');
  h.send(ack(S + 2));
  t.match(h.scq.poll(5), [{ wrId: 3, status: 'SUCCESS', opcode: 'SEND', byteLen: 10 }]);
});

t.test('a READ response implies the ACK of earlier SENDs', async (t) => {
  const h = new EngineHarness('RC');
  sendWr(h, 1, 10);
  const dst = h.mr(16);
  h.qp.postSend(0, [{ wrId: 2, opcode: 'RDMA_READ', sgList: [dst.sge(0, 16)], rdma: { remoteAddr: 0x2000n, rkey: 7 } }]);
  t.same(h.names(h.poll()), ['SEND_ONLY@100!', 'RDMA_READ_REQUEST@101!']);
  h.send({ bth: bth('RC_RDMA_READ_RESPONSE_ONLY', S + 1), aeth: { syndrome: ackSyndrome(), msn: 2 }, payload: pattern(16, 4) });
  t.same(h.scq.poll(5).map((w) => [w.wrId, w.status, w.opcode]), [[1, 'SUCCESS', 'SEND'], [2, 'SUCCESS', 'RDMA_READ']]);
  t.same(dst.buffer, pattern(16, 4));
});

t.test('NAK PSN sequence error: go back to the NAKed PSN', async (t) => {
  const h = new EngineHarness('RC');
  sendWr(h, 1, 1024);
  t.equal(h.poll().length, 4);
  h.send(ack(S + 2, nakSyndrome(NAK_CODE.PSN_SEQUENCE_ERROR)));
  t.same(h.names(h.poll()), ['SEND_MIDDLE@102', 'SEND_LAST@103!'], 'resends from 102 with the right opcodes');
  t.equal(h.counters.rcvSeqErr, 1);
  t.equal(h.counters.retransPkts, 2);
  h.send(ack(S + 2, nakSyndrome(NAK_CODE.PSN_SEQUENCE_ERROR)));
  t.same(h.poll(), [], 'the same NAK again, without progress, is ignored');
  h.send(ack(S + 3));
  t.match(h.scq.poll(1), [{ wrId: 1, status: 'SUCCESS' }]);
});

for (const [code, status] of [
  [NAK_CODE.INVALID_REQUEST, 'REM_INV_REQ_ERR'],
  [NAK_CODE.REMOTE_ACCESS_ERROR, 'REM_ACCESS_ERR'],
  [NAK_CODE.REMOTE_OPERATIONAL_ERROR, 'REM_OP_ERR'],
] as const) {
  t.test(`NAK ${status}: the WR fails, the rest is flushed, QP → ERR`, async (t) => {
    const h = new EngineHarness('RC');
    sendWr(h, 1, 10);
    sendWr(h, 2, 10);
    h.poll();
    h.send(ack(S, nakSyndrome(code)));
    t.same(h.scq.poll(5).map((w) => [w.wrId, w.status]), [[1, status], [2, 'WR_FLUSH_ERR']]);
    t.equal(h.qp.state, 'ERR');
    t.match(h.events, [{ type: 'QP_FATAL' }]);
  });
}

t.test('RNR NAK: wait the timer, then resend; counters reset on progress', async (t) => {
  const h = new EngineHarness('RC', { rnrRetry: 2 });
  sendWr(h, 1, 10);
  h.poll();
  h.send(ack(S, rnrNakSyndrome(14)), 1000);
  t.same(h.poll(1000 + rnrTimerUs(14) - 1), [], 'nothing before the RNR timer');
  t.equal(h.qp.pollAt(), 1000 + rnrTimerUs(14));
  t.same(h.names(h.poll(1000 + rnrTimerUs(14))), ['SEND_ONLY@100!']);
  t.equal(h.qp.compRnrRetry, 1);
  h.send(ack(S));
  t.equal(h.qp.compRnrRetry, 2, 'reset on progress');
  t.match(h.scq.poll(1), [{ status: 'SUCCESS' }]);
});

t.test('RNR retry 0: RNR_RETRY_EXC_ERR at the first RNR NAK', async (t) => {
  const h = new EngineHarness('RC', { rnrRetry: 0 });
  sendWr(h, 1, 10);
  h.poll();
  h.send(ack(S, rnrNakSyndrome(1)));
  t.match(h.scq.poll(1), [{ status: 'RNR_RETRY_EXC_ERR' }]);
});

t.test('ACK timeout: 4.096 µs × 2^timeout, doubling per timeout in a row, go-back-N, RETRY_EXC_ERR after retryCnt', async (t) => {
  const h = new EngineHarness('RC', { timeout: 10, retryCnt: 2 });
  sendWr(h, 1, 300);
  t.equal(h.poll(0).length, 2);
  const to = ackTimeoutUs(10)!;
  t.equal(h.qp.pollAt(), to);
  t.same(h.poll(to - 1), []);
  t.same(h.names(h.poll(to)), ['SEND_FIRST@100', 'SEND_LAST@101!'], 'first retry');
  t.equal(h.qp.pollAt(), to + 2 * to, 'no progress since: the timer runs twice as long');
  t.same(h.poll(3 * to - 1), []);
  t.same(h.names(h.poll(3 * to)), ['SEND_FIRST@100', 'SEND_LAST@101!'], 'second retry');
  t.equal(h.qp.pollAt(), 3 * to + 4 * to, 'four times as long');
  t.same(h.poll(7 * to), [], 'no third');
  t.match(h.scq.poll(1), [{ status: 'RETRY_EXC_ERR' }]);
  t.equal(h.counters.retryExceeded, 1);
  t.equal(h.counters.ackTimeouts, 3);
  t.equal(h.qp.state, 'ERR');
});

t.test('the ACK timer backs off to four times its length at most, and progress restores it', async (t) => {
  const h = new EngineHarness('RC', { timeout: 10, retryCnt: 6 });
  sendWr(h, 1, 100 * 256, 'RDMA_WRITE');
  h.poll(0);
  const to = ackTimeoutUs(10)!;
  let at = 0;
  const gaps: number[] = [];
  for (let k = 0; k < 5; k++) {
    const next = h.qp.pollAt()!;
    gaps.push(Math.round((next - at) / to));
    h.poll(next);
    at = next;
  }
  t.same(gaps, [1, 2, 4, 4, 4], 'T, 2T, 4T, then 4T');
  t.equal(h.counters.ackTimeouts, 5);
  h.send(ack(S + 63), at + 10);
  t.equal(h.qp.pollAt(), at + 10 + to, 'an ACK that advances: back to T');
});

t.test('a partial ACK restarts the timer and the retry counter', async (t) => {
  const h = new EngineHarness('RC', { timeout: 10, retryCnt: 1 });
  sendWr(h, 1, 100 * 256, 'RDMA_WRITE');
  h.poll(0);
  const to = ackTimeoutUs(10)!;
  h.poll(to); // retry 1 of 1
  h.send(ack(S + 63), to + 10);
  t.equal(h.qp.compRetryCnt, 1, 'progress resets retryCnt');
  t.equal(h.qp.pollAt(), to + 10 + to, 'timer restarted by progress');
});

t.test('a peer that answers late but surely: the ACK timer stretches to twice its response time, not past 4×', async (t) => {
  const h = new EngineHarness('RC', { timeout: 10, retryCnt: 2 });
  const to = ackTimeoutUs(10)!;
  t.ok(Number.isInteger(to), `the timeout is whole microseconds: ${to}`);
  // Times in whole microseconds, as the runtime's clock reads them.
  const r1 = Math.round(0.75 * to);
  const r2 = Math.round(1.2 * to);
  // Message 1 is ACKed 0.75 T after it left: that is the QP's response time from now on.
  sendWr(h, 1, 300);
  h.poll(0);
  h.send(ack(S + 1), r1);
  t.match(h.scq.poll(1), [{ wrId: 1, status: 'SUCCESS' }]);
  // Message 2 waits 1.5 T for its ACK, which comes at 1.2 T: no retry.
  const t2 = 10 * to;
  sendWr(h, 2, 300);
  t.equal(h.poll(t2).length, 2);
  t.equal(h.qp.pollAt(), t2 + 2 * r1, 'twice the response time');
  t.same(h.poll(t2 + r2), [], 'not timed out at 1.2 T');
  h.send(ack(S + 3), t2 + r2);
  t.match(h.scq.poll(1), [{ wrId: 2, status: 'SUCCESS' }]);
  t.equal(h.counters.ackTimeouts, 0);
  // Message 3 is never answered. The response time is now 0.75 + (1.2 - 0.75) / 8 T, to the
  // microsecond: the timer runs twice that, then doubles per timeout, but never past 4 T.
  const srtt = Math.round(r1 + (r2 - r1) / 8);
  const t3 = 20 * to;
  sendWr(h, 3, 300);
  h.poll(t3);
  const gaps: number[] = [];
  let at = t3;
  for (let k = 0; k < 3; k++) {
    const next = h.qp.pollAt()!;
    gaps.push(next - at);
    h.poll(next);
    at = next;
  }
  t.same(gaps, [2 * srtt, 4 * srtt, 4 * to], 'timeouts after 2·srtt, 4·srtt, then 4 T (the cap)');
  t.ok(gaps.every(Number.isInteger), 'every deadline a whole microsecond');
  t.match(h.scq.poll(1), [{ wrId: 3, status: 'RETRY_EXC_ERR' }]);
});

t.test('maxRdAtomic bounds outstanding READs; fence waits for them', async (t) => {
  const h = new EngineHarness('RC', { maxRdAtomic: 1 });
  const dst = h.mr(64);
  h.qp.postSend(0, [
    { wrId: 1, opcode: 'RDMA_READ', sgList: [dst.sge(0, 8)], rdma: { remoteAddr: 0x10n, rkey: 1 } },
    { wrId: 2, opcode: 'RDMA_READ', sgList: [dst.sge(8, 8)], rdma: { remoteAddr: 0x18n, rkey: 1 } },
  ]);
  t.same(h.names(h.poll()), ['RDMA_READ_REQUEST@100!'], 'one READ at a time');
  h.send({ bth: bth('RC_RDMA_READ_RESPONSE_ONLY', S), aeth: { syndrome: ackSyndrome(), msn: 1 }, payload: pattern(8) });
  t.same(h.names(h.poll()), ['RDMA_READ_REQUEST@101!']);
  const src = h.mr(8);
  h.qp.postSend(0, [{ wrId: 3, opcode: 'SEND', sendFlags: 1 /* FENCE */, sgList: [src.sge(0, 8)] }]);
  t.same(h.poll(), [], 'fenced behind the outstanding READ');
  h.send({ bth: bth('RC_RDMA_READ_RESPONSE_ONLY', S + 1), aeth: { syndrome: ackSyndrome(), msn: 2 }, payload: pattern(8) });
  t.same(h.names(h.poll()), ['SEND_ONLY@102!']);
});

/** A READ of 768 bytes (three responses at MTU 256) whose FIRST response has arrived. */
function readAfterFirstResponse(): { h: EngineHarness; dst: ReturnType<EngineHarness['mr']>; data: Uint8Array } {
  const h = new EngineHarness('RC');
  const dst = h.mr(768);
  h.qp.postSend(0, [{ wrId: 1, opcode: 'RDMA_READ', sgList: [dst.sge(0, 768)], rdma: { remoteAddr: 0x1000n, rkey: 9 } }]);
  h.poll();
  const data = pattern(768, 6);
  h.send({ bth: bth('RC_RDMA_READ_RESPONSE_FIRST', S), aeth: { syndrome: ackSyndrome(), msn: 1 }, payload: data.subarray(0, 256) });
  return { h, dst, data };
}

t.test('READ responses out of order: dropped, re-requested from the gap', async (t) => {
  const { h, dst, data } = readAfterFirstResponse();
  h.send({ bth: bth('RC_RDMA_READ_RESPONSE_LAST', S + 2), aeth: { syndrome: ackSyndrome(), msn: 1 }, payload: data.subarray(512) });
  const re = h.poll();
  t.same(h.names(re), ['RDMA_READ_REQUEST@101!']);
  t.equal(re[0]!.reth!.va, 0x1100n, 'for the rest of the data');
  t.equal(re[0]!.reth!.dmaLength, 512);
  h.send({ bth: bth('RC_RDMA_READ_RESPONSE_MIDDLE', S + 1), payload: data.subarray(256, 512) });
  h.send({ bth: bth('RC_RDMA_READ_RESPONSE_LAST', S + 2), aeth: { syndrome: ackSyndrome(), msn: 1 }, payload: data.subarray(512) });
  t.match(h.scq.poll(1), [{ status: 'SUCCESS', byteLen: 768 }]);
  t.same(dst.buffer, data);
});

t.test('a NAK inside a READ\'s responses ends the READ with its error; a plain ACK there is dropped', async (t) => {
  const { h } = readAfterFirstResponse();
  h.send(ack(S + 1, ackSyndrome(), 1));
  t.equal(h.counters.badOpcodeSeq, 1, 'a plain ACK at the MIDDLE\'s PSN: out of sequence, dropped');
  t.same(h.scq.poll(4), [], 'nothing completed');
  // The responder found the region gone (deregistered, or its R_Key invalidated) before the MIDDLE.
  h.send(ack(S + 1, nakSyndrome(NAK_CODE.REMOTE_ACCESS_ERROR), 1));
  t.match(h.scq.poll(4), [{ wrId: 1n, status: 'REM_ACCESS_ERR' }], 'NAK Remote Access Error at the MIDDLE\'s PSN: the READ fails');
  t.equal(h.qp.state, 'ERR');
  t.equal(h.counters.badOpcodeSeq, 1, 'the NAK was not dropped');
});

t.test('atomic ACK: original value lands little-endian in the local buffer', async (t) => {
  const h = new EngineHarness('RC');
  const res = h.mr(8);
  h.qp.postSend(0, [{ wrId: 1, opcode: 'ATOMIC_CMP_AND_SWP', sgList: [res.sge(0, 8)], atomic: { remoteAddr: 0x40n, compareAdd: 5n, swap: 6n, rkey: 3 } }]);
  const out = h.poll();
  t.equal(out[0]!.atomicEth!.swapAdd, 6n);
  t.equal(out[0]!.atomicEth!.compare, 5n);
  h.send({ bth: bth('RC_ATOMIC_ACKNOWLEDGE', S), aeth: { syndrome: ackSyndrome(), msn: 1 }, atomicAckEth: { originalData: 0x0102030405060708n } });
  t.match(h.scq.poll(1), [{ status: 'SUCCESS', opcode: 'COMP_SWAP', byteLen: 8 }]);
  t.equal(new DataView(res.buffer.buffer).getBigUint64(0, true), 0x0102030405060708n);
});

t.test('unsignaled WRs complete silently; errors always complete', async (t) => {
  const h = new EngineHarness('RC');
  (h.qp.attrs as { sqSigAll: boolean }).sqSigAll = false;
  const mr = h.mr(8);
  h.qp.postSend(0, [{ wrId: 1, opcode: 'SEND', sgList: [mr.sge(0, 8)] }, { wrId: 2, opcode: 'SEND', sendFlags: 2, sgList: [mr.sge(0, 8)] }]);
  h.poll();
  h.send(ack(S + 1));
  t.same(h.scq.poll(5).map((w) => w.wrId), [2]);
  h.qp.postSend(0, [{ wrId: 3, opcode: 'SEND', sgList: [mr.sge(0, 8)] }]);
  h.poll();
  h.send(ack(S + 2, nakSyndrome(NAK_CODE.REMOTE_OPERATIONAL_ERROR)));
  t.match(h.scq.poll(5), [{ wrId: 3, status: 'REM_OP_ERR' }]);
});

t.test('UC: completes when sent, no ACK timer', async (t) => {
  const h = new EngineHarness('UC');
  sendWr(h, 1, 600);
  t.same(h.names(h.poll()), ['SEND_FIRST@100', 'SEND_MIDDLE@101', 'SEND_LAST@102!']);
  t.match(h.scq.poll(1), [{ wrId: 1, status: 'SUCCESS' }]);
  t.equal(h.qp.pollAt(), undefined);
});

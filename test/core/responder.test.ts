/**
 * The responder pipeline, one check and one NAK class at a time (rxe_resp.c order; IBTA
 * 9.7.3–9.7.5, 9.9.3). Packets are crafted and injected into a QueuePair; what it sends back is
 * parsed and compared.
 */
import t from 'tap';
import { aethKind, aethValue, NAK_CODE, nakSyndrome, rnrNakSyndrome } from '../../src/wire/aeth.js';
import { ACCESS } from '../../src/core/types.js';
import { EngineHarness, bth, pattern } from '../helpers/engine.js';
import { blankFields, HeaderBuilder } from '../../src/core/headers.js';
import { opcodeOf } from '../../src/wire/opcode.js';

const E = 500; // the harness's expected PSN
const syn = (p: { aeth?: { syndrome: number } | undefined }): number => p.aeth!.syndrome;

t.test('checkPsn (RC)', async (t) => {
  t.test('in sequence: executed, ACKed when AckReq is set, MSN counts messages', async (t) => {
    const h = new EngineHarness('RC');
    const dst = h.mr(1024);
    h.qp.postRecv(0, [{ wrId: 1, sgList: [dst.sge(0, 1024)] }]);
    h.send({ bth: bth('RC_SEND_ONLY', E, { ackReq: true }), payload: pattern(100) });
    const out = h.take();
    t.same(h.names(out), ['ACKNOWLEDGE@500']);
    t.equal(syn(out[0]!), 0x1f, 'ACK syndrome 0x1f (unlimited credit), as rxe');
    t.equal(out[0]!.aeth!.msn, 1);
    t.match(h.rcq.poll(1), [{ wrId: 1, status: 'SUCCESS', opcode: 'RECV', byteLen: 100 }]);
    h.qp.postRecv(0, [{ wrId: 2, sgList: [dst.sge(0, 1024)] }]);
    h.send({ bth: bth('RC_SEND_ONLY', E + 1), payload: pattern(8) });
    t.same(h.take(), [], 'no AckReq, no ACK (coalescing is the requester\'s call)');
  });

  t.test('class B: a gap is NAKed once, with the expected PSN', async (t) => {
    const h = new EngineHarness('RC');
    h.send({ bth: bth('RC_RDMA_WRITE_MIDDLE', E + 2), payload: pattern(256) });
    const out = h.take();
    t.same(h.names(out), ['ACKNOWLEDGE@500']);
    t.equal(syn(out[0]!), nakSyndrome(NAK_CODE.PSN_SEQUENCE_ERROR));
    h.send({ bth: bth('RC_RDMA_WRITE_MIDDLE', E + 3), payload: pattern(256) });
    t.same(h.take(), [], 'second packet of the same gap: dropped without a NAK');
    t.equal(h.counters.outOfSeqReq, 1);
    t.equal(h.qp.state, 'RTS');
  });

  t.test('duplicate SEND/WRITE: re-ACKed with ePSN−1, not executed again', async (t) => {
    const h = new EngineHarness('RC');
    const dst = h.mr(1024);
    h.qp.postRecv(0, [{ wrId: 1, sgList: [dst.sge(0, 1024)] }, { wrId: 2, sgList: [dst.sge(0, 1024)] }]);
    h.send({ bth: bth('RC_SEND_ONLY', E, { ackReq: true }), payload: pattern(10) });
    h.take();
    h.send({ bth: bth('RC_SEND_ONLY', E, { ackReq: true }), payload: pattern(10) });
    const out = h.take();
    t.same(h.names(out), ['ACKNOWLEDGE@500']);
    t.equal(aethKind(syn(out[0]!)), 'ACK');
    t.equal(h.rcq.length, 1, 'one receive completion only');
    t.equal(h.qp.rq.length, 1, 'the second receive WQE is untouched');
    t.equal(h.counters.dupReq, 1);
  });
});

t.test('checkOpSeq', async (t) => {
  t.test('RC class C: MIDDLE without FIRST → NAK Invalid Request, QP to ERR', async (t) => {
    const h = new EngineHarness('RC');
    h.send({ bth: bth('RC_SEND_MIDDLE', E), payload: pattern(256) });
    const out = h.take();
    t.equal(syn(out[0]!), nakSyndrome(NAK_CODE.INVALID_REQUEST));
    t.equal(h.qp.state, 'ERR');
    t.equal(h.counters.badOpcodeSeq, 1);
  });
  t.test('RC class C: SEND FIRST then WRITE FIRST (missing LAST)', async (t) => {
    const h = new EngineHarness('RC');
    const dst = h.mr(4096);
    h.qp.postRecv(0, [{ wrId: 1, sgList: [dst.sge(0, 4096)] }]);
    h.send({ bth: bth('RC_SEND_FIRST', E), payload: pattern(256) });
    h.send({ bth: bth('RC_RDMA_WRITE_FIRST', E + 1), reth: { va: dst.va(0), rkey: dst.rkey, dmaLength: 512 }, payload: pattern(256) });
    t.equal(syn(h.take()[0]!), nakSyndrome(NAK_CODE.INVALID_REQUEST));
    t.match(h.rcq.poll(1), [{ wrId: 1, status: 'REM_INV_REQ_ERR' }], 'the receive in progress completes in error');
  });
  t.test('UC: MIDDLE without FIRST is dropped silently', async (t) => {
    const h = new EngineHarness('UC');
    h.send({ bth: bth('UC_SEND_MIDDLE', E), payload: pattern(256) });
    t.same(h.take(), []);
    t.equal(h.qp.state, 'RTS');
  });
});

t.test('checkOpValid: QP access flags (class C, NAK Invalid Request)', async (t) => {
  const h = new EngineHarness('RC', { accessB: ACCESS.LOCAL_WRITE | ACCESS.REMOTE_WRITE });
  const mr = h.mr(64);
  h.send({ bth: bth('RC_RDMA_READ_REQUEST', E), reth: { va: mr.va(0), rkey: mr.rkey, dmaLength: 64 } });
  t.equal(syn(h.take()[0]!), nakSyndrome(NAK_CODE.INVALID_REQUEST));
  t.equal(h.counters.invalidRequest, 1);
});

t.test('checkResource', async (t) => {
  t.test('RC class B: no receive WQE → RNR NAK with minRnrTimer at the packet PSN', async (t) => {
    const h = new EngineHarness('RC', { minRnrTimer: 22 });
    h.send({ bth: bth('RC_SEND_ONLY', E, { ackReq: true }), payload: pattern(10) });
    const out = h.take();
    t.equal(syn(out[0]!), rnrNakSyndrome(22), 'AETH 0x36 as in the rxe capture');
    t.equal(out[0]!.bth.psn, E);
    t.equal(out[0]!.aeth!.msn, 0);
    t.equal(h.counters.sndRnr, 1);
    t.equal(h.qp.respPsn, E, 'ePSN unchanged: the SEND will be retried');
  });
  t.test('UD class D: no receive WQE → dropped, counted', async (t) => {
    const h = new EngineHarness('UD');
    h.send({ bth: bth('UD_SEND_ONLY', 0), deth: { qkey: 0x11111111, srcQp: 0x33 }, payload: pattern(10) });
    t.same(h.take(), []);
    t.equal(h.counters.noRecvWqe, 1);
  });
  t.test('READ with maxDestRdAtomic 0 → NAK Invalid Request', async (t) => {
    const h = new EngineHarness('RC', { maxDestRdAtomic: 0 });
    const mr = h.mr(64);
    h.send({ bth: bth('RC_RDMA_READ_REQUEST', E), reth: { va: mr.va(0), rkey: mr.rkey, dmaLength: 64 } });
    t.equal(syn(h.take()[0]!), nakSyndrome(NAK_CODE.INVALID_REQUEST));
  });
});

t.test('checkLength (class C)', async (t) => {
  const h = new EngineHarness('RC');
  const mr = h.mr(4096);
  h.send({ bth: bth('RC_RDMA_WRITE_FIRST', E), reth: { va: mr.va(0), rkey: mr.rkey, dmaLength: 1024 }, payload: pattern(200) });
  t.equal(syn(h.take()[0]!), nakSyndrome(NAK_CODE.INVALID_REQUEST), 'FIRST shorter than the MTU');
  t.equal(h.counters.badLength, 1);
  t.ok(mr.buffer.every((x) => x === 0));
});

t.test('checkRkey (class C, NAK Remote Access Error)', async (t) => {
  for (const [why, f] of [
    ['unknown R_Key', (va: bigint, rkey: number) => ({ va, rkey: rkey + 0x100 })],
    ['out of bounds', (va: bigint, rkey: number) => ({ va: va + 4000n, rkey })],
  ] as const) {
    const h = new EngineHarness('RC');
    const mr = h.mr(4096);
    const r = f(mr.va(0), mr.rkey);
    h.send({ bth: bth('RC_RDMA_WRITE_ONLY', E, { ackReq: true }), reth: { va: r.va, rkey: r.rkey, dmaLength: 200 }, payload: pattern(200) });
    const out = h.take();
    t.equal(syn(out[0]!), nakSyndrome(NAK_CODE.REMOTE_ACCESS_ERROR), why);
    t.equal(h.qp.state, 'ERR');
    t.ok(mr.buffer.every((x) => x === 0), `${why}: memory untouched`);
  }
  const h = new EngineHarness('RC');
  const mr = h.mr(64);
  h.send({ bth: bth('RC_FETCH_ADD', E), atomicEth: { va: mr.va(3), rkey: mr.rkey, swapAdd: 1n, compare: 0n } });
  t.equal(syn(h.take()[0]!), nakSyndrome(NAK_CODE.INVALID_REQUEST), 'misaligned atomic: Invalid Request (rxe)');
});

t.test('a WRITE of several packets: each lands after the last, the R_Key checked whole at the first; revoked between packets → NAK Remote Access Error', async (t) => {
  const MTU = 256;
  const body = pattern(3 * MTU - 56);
  const write = (h: EngineHarness, va: bigint, rkey: number, upTo: 'FIRST' | 'MIDDLE' | 'LAST', before?: (i: number) => void): void => {
    const ops = ['RC_RDMA_WRITE_FIRST', 'RC_RDMA_WRITE_MIDDLE', 'RC_RDMA_WRITE_LAST'] as const;
    for (let i = 0; i < 3; i++) {
      before?.(i);
      const first = i === 0;
      h.send({
        bth: bth(ops[i]!, E + i, { ackReq: i === 2 }),
        ...(first ? { reth: { va, rkey, dmaLength: body.length } } : {}),
        payload: body.subarray(i * MTU, Math.min(body.length, (i + 1) * MTU)),
      });
      if (ops[i]!.endsWith(upTo)) return;
    }
  };
  {
    const h = new EngineHarness('RC');
    const mr = h.mr(1024);
    write(h, mr.va(100), mr.rkey, 'LAST');
    const out = h.take();
    t.same(h.names(out), [`ACKNOWLEDGE@${E + 2}`], 'one ACK, for the LAST');
    t.equal(out[0]!.aeth!.msn, 1, 'one message');
    t.same(mr.buffer.subarray(100, 100 + body.length), body, 'the three packets in order, at the RETH\'s VA');
    t.ok(mr.buffer.subarray(0, 100).every((x) => x === 0) && mr.buffer.subarray(100 + body.length).every((x) => x === 0), 'nothing around it');
  }
  {
    // The whole message must fit at the first packet: its last byte past the region is refused there.
    const h = new EngineHarness('RC');
    const mr = h.mr(1024);
    write(h, mr.va(1024 - body.length + 1), mr.rkey, 'FIRST');
    t.equal(syn(h.take()[0]!), nakSyndrome(NAK_CODE.REMOTE_ACCESS_ERROR), 'a message one byte past the region: NAKed at its FIRST');
    t.ok(mr.buffer.every((x) => x === 0), 'nothing written');
  }
  for (const [why, revoke] of [
    ['deregistered', (h: EngineHarness, mr: ReturnType<EngineHarness['mr']>) => h.mrs.deregister(mr)],
    ['R_Key invalidated', (h: EngineHarness, mr: ReturnType<EngineHarness['mr']>) => t.ok(h.mrs.invalidate(h.pd, mr.rkey))],
  ] as const) {
    const h = new EngineHarness('RC');
    const mr = h.mr(1024);
    write(h, mr.va(0), mr.rkey, 'LAST', (i) => {
      if (i === 2) revoke(h, mr);
    });
    const out = h.take();
    t.equal(syn(out[out.length - 1]!), nakSyndrome(NAK_CODE.REMOTE_ACCESS_ERROR), `${why} before the LAST: NAK Remote Access Error`);
    t.equal(h.qp.state, 'ERR', `${why}: QP to ERR`);
    t.same(mr.buffer.subarray(0, 2 * MTU), body.subarray(0, 2 * MTU), `${why}: FIRST and MIDDLE landed`);
    t.ok(mr.buffer.subarray(2 * MTU).every((x) => x === 0), `${why}: the LAST did not`);
  }
});

t.test('READ: response packets, then a duplicate READ is re-executed from its PSN', async (t) => {
  const h = new EngineHarness('RC');
  const mr = h.mr(pattern(600, 9));
  h.send({ bth: bth('RC_RDMA_READ_REQUEST', E, { ackReq: true }), reth: { va: mr.va(0), rkey: mr.rkey, dmaLength: 600 } });
  const out = h.poll();
  t.same(h.names(out), ['RDMA_READ_RESPONSE_FIRST@500', 'RDMA_READ_RESPONSE_MIDDLE@501', 'RDMA_READ_RESPONSE_LAST@502']);
  t.equal(out[0]!.aeth!.msn, 1, 'C9-148: MSN counts the READ at once');
  t.same(Buffer.concat(out.map((p) => p.payload)), Buffer.from(mr.buffer));
  t.equal(h.qp.respPsn, E + 3);
  // The requester lost response 501 and asks again from there, for the rest.
  h.send({ bth: bth('RC_RDMA_READ_REQUEST', E + 1, { ackReq: true }), reth: { va: mr.va(256), rkey: mr.rkey, dmaLength: 344 } });
  const again = h.poll();
  t.same(h.names(again), ['RDMA_READ_RESPONSE_MIDDLE@501', 'RDMA_READ_RESPONSE_LAST@502']);
  t.equal(h.counters.dupReadReplay, 1);
});

t.test('a READ whose region is deregistered or its R_Key invalidated while its responses go out: NAK Remote Access Error at the next response\'s PSN, QP to ERR, nothing more read', async (t) => {
  for (const [why, revoke] of [
    ['deregistered', (h: EngineHarness, mr: ReturnType<EngineHarness['mr']>) => h.mrs.deregister(mr)],
    ['R_Key invalidated', (h: EngineHarness, mr: ReturnType<EngineHarness['mr']>) => t.ok(h.mrs.invalidate(h.pd, mr.rkey))],
  ] as const) {
    // Between two runs of the QP (a run sends at most its budget), and from inside a response's send.
    for (const when of ['between runs', 'in a send'] as const) {
      const h = new EngineHarness('RC');
      const mr = h.mr(pattern(600, 9));
      h.send({ bth: bth('RC_RDMA_READ_REQUEST', E, { ackReq: true }), reth: { va: mr.va(0), rkey: mr.rkey, dmaLength: 600 } });
      let out;
      if (when === 'between runs') {
        h.qp.poll(0, 1);
        revoke(h, mr);
        out = h.poll(0);
      } else {
        h.onTransmit = () => {
          if (!mr.deregistered && !mr.rkeyInvalidated) revoke(h, mr);
        };
        out = h.poll(0);
      }
      t.same(h.names(out), [`RDMA_READ_RESPONSE_FIRST@${E}`, `ACKNOWLEDGE@${E + 1}`], `${why}, ${when}: the FIRST, then a NAK at the MIDDLE's PSN`);
      t.equal(syn(out[1]!), nakSyndrome(NAK_CODE.REMOTE_ACCESS_ERROR), `${why}, ${when}: NAK Remote Access Error`);
      t.equal(h.qp.state, 'ERR', `${why}, ${when}: QP to ERR`);
      t.same(h.events.map((e) => e.type), ['QP_FATAL'], `${why}, ${when}: the affiliated error`);
      t.equal(h.counters.rkeyViolation, 1, `${why}, ${when}: counted`);
      t.equal(h.qp.respJobs.length, 0, `${why}, ${when}: no job left`);
    }
  }
});

t.test('READ/atomic resources: a ring of maxDestRdAtomic records refilled in place, the oldest first; duplicates find only what it holds', async (t) => {
  const h = new EngineHarness('RC', { maxDestRdAtomic: 2 });
  const mr = h.mr(pattern(600, 5));
  const read = (psn: number, off: number, len: number): string[] => {
    h.send({ bth: bth('RC_RDMA_READ_REQUEST', psn, { ackReq: true }), reth: { va: mr.va(off), rkey: mr.rkey, dmaLength: len } });
    const out = h.poll();
    t.same(Buffer.concat(out.map((p) => p.payload)), Buffer.from(mr.buffer.subarray(off, off + len)), `READ @${psn}: the bytes asked for`);
    return h.names(out);
  };
  t.same(read(E, 0, 300), ['RDMA_READ_RESPONSE_FIRST@500', 'RDMA_READ_RESPONSE_LAST@501']);
  t.same(read(E + 2, 100, 200), ['RDMA_READ_RESPONSE_ONLY@502']);
  const ring = h.qp.respResources;
  const [r0, r1] = ring;
  t.equal(ring.length, 2);
  // A third READ takes the oldest slot: the same record, now this request's.
  t.same(read(E + 3, 256, 344), ['RDMA_READ_RESPONSE_FIRST@503', 'RDMA_READ_RESPONSE_LAST@504']);
  t.equal(ring.length, 2, 'the ring does not grow past maxDestRdAtomic');
  t.equal(ring[0], r0, 'slot 0 refilled in place');
  t.match(ring[0], { kind: 'read', firstPsn: E + 3, lastPsn: E + 4, length: 344, rkey: mr.rkey });
  // A duplicate of the READ the slot held before is no longer answerable; the one it holds now is.
  h.send({ bth: bth('RC_RDMA_READ_REQUEST', E, { ackReq: true }), reth: { va: mr.va(0), rkey: mr.rkey, dmaLength: 300 } });
  t.same(h.poll(), [], 'READ @500 evicted: not replayed');
  t.equal(h.counters.dupNoResource, 1);
  t.same(read(E + 4, 512, 88), ['RDMA_READ_RESPONSE_LAST@504'], 'READ @503 replayed from its second packet');
  t.same(read(E + 2, 100, 200), ['RDMA_READ_RESPONSE_ONLY@502'], 'READ @502, still in slot 1, replayed');
  t.equal(h.counters.dupReadReplay, 2);
  // An atomic takes the next slot (slot 1) in place: its replay carries its own result.
  const dv = new DataView(mr.buffer.buffer, mr.buffer.byteOffset);
  const before = dv.getBigUint64(8, true);
  h.send({ bth: bth('RC_FETCH_ADD', E + 5), atomicEth: { va: mr.va(8), rkey: mr.rkey, swapAdd: 1n, compare: 0n } });
  h.take();
  t.equal(ring[1], r1, 'slot 1 refilled in place by the atomic');
  t.match(ring[1], { kind: 'atomic', firstPsn: E + 5, origValue: before });
  h.send({ bth: bth('RC_FETCH_ADD', E + 5), atomicEth: { va: mr.va(8), rkey: mr.rkey, swapAdd: 1n, compare: 0n } });
  t.equal(h.take()[0]!.atomicAckEth!.originalData, before, 'the replay carries the original value');
  t.equal(dv.getBigUint64(8, true), before + 1n, 'applied once');
  h.send({ bth: bth('RC_RDMA_READ_REQUEST', E + 2, { ackReq: true }), reth: { va: mr.va(100), rkey: mr.rkey, dmaLength: 200 } });
  t.same(h.poll(), [], 'READ @502, whose slot the atomic took: not replayed');
  t.equal(h.counters.dupNoResource, 2);
});

t.test('a QP moved to ERR or RESET from inside the send of a READ response (a link or trace hook): no throw, nothing sent after it, its job given back once', async (t) => {
  for (const next of ['ERR', 'RESET'] as const) {
    for (const [len, last] of [[600, 'RDMA_READ_RESPONSE_LAST'], [100, 'RDMA_READ_RESPONSE_ONLY'], [600, 'RDMA_READ_RESPONSE_FIRST']] as const) {
      const h = new EngineHarness('RC'); // path MTU 256
      const mr = h.mr(pattern(600, 7));
      h.onTransmit = (p) => {
        if (h.names([p])[0]!.startsWith(`${last}@`)) h.qp.modify(0, { qpState: next });
      };
      h.send({ bth: bth('RC_RDMA_READ_REQUEST', E, { ackReq: true }), reth: { va: mr.va(0), rkey: mr.rkey, dmaLength: len } });
      const out = h.poll();
      t.equal(h.names(out).at(-1)!.split('@')[0], last, `${next} at ${last}: the packet whose send moved the QP is the last one sent`);
      t.equal(h.qp.state, next);
      t.equal(h.qp.respJobs.length, 0, 'no job left on the QP');
    }
  }
  // Two QPs with a READ each waiting to be answered at once: had a job gone back to the free list
  // twice above, both would hold the same record and one would answer with the other's bytes.
  const a = new EngineHarness('RC');
  const b = new EngineHarness('RC');
  const ma = a.mr(pattern(600, 8));
  const mb = b.mr(pattern(600, 9));
  a.send({ bth: bth('RC_RDMA_READ_REQUEST', E, { ackReq: true }), reth: { va: ma.va(0), rkey: ma.rkey, dmaLength: 600 } });
  b.send({ bth: bth('RC_RDMA_READ_REQUEST', E, { ackReq: true }), reth: { va: mb.va(0), rkey: mb.rkey, dmaLength: 600 } });
  t.not(a.qp.respJobs[0], b.qp.respJobs[0], 'two jobs, not one record twice');
  t.same(Buffer.concat(a.poll().map((p) => p.payload)), Buffer.from(ma.buffer), 'QP A: its own bytes');
  t.same(Buffer.concat(b.poll().map((p) => p.payload)), Buffer.from(mb.buffer), 'QP B: its own bytes');
});

t.test('atomics: executed once, duplicates replayed from the cache', async (t) => {
  const h = new EngineHarness('RC');
  const mr = h.mr(16);
  const dv = new DataView(mr.buffer.buffer);
  dv.setBigUint64(8, 40n, true);
  h.send({ bth: bth('RC_FETCH_ADD', E), atomicEth: { va: mr.va(8), rkey: mr.rkey, swapAdd: 2n, compare: 0n } });
  const a1 = h.take();
  t.same(h.names(a1), ['ATOMIC_ACKNOWLEDGE@500']);
  t.equal(a1[0]!.atomicAckEth!.originalData, 40n);
  h.send({ bth: bth('RC_FETCH_ADD', E), atomicEth: { va: mr.va(8), rkey: mr.rkey, swapAdd: 2n, compare: 0n } });
  const a2 = h.take();
  t.equal(a2[0]!.atomicAckEth!.originalData, 40n, 'the replay carries the original result');
  t.equal(dv.getBigUint64(8, true), 42n, 'applied exactly once');
  t.equal(h.counters.dupAtomicReplay, 1);
});

t.test('UC: a gap abandons the message; the next FIRST starts cleanly', async (t) => {
  const h = new EngineHarness('UC');
  const dst = h.mr(2048);
  h.qp.postRecv(0, [{ wrId: 1, sgList: [dst.sge(0, 2048)] }]);
  h.send({ bth: bth('UC_SEND_FIRST', E), payload: pattern(256, 1) });
  h.send({ bth: bth('UC_SEND_LAST', E + 2), payload: pattern(10, 1) }); // E+1 lost
  t.equal(h.rcq.length, 0);
  t.equal(h.counters.ucDroppedMsg, 1);
  h.send({ bth: bth('UC_SEND_FIRST', E + 3), payload: pattern(256, 2) });
  h.send({ bth: bth('UC_SEND_LAST', E + 4), payload: pattern(10, 3) });
  t.match(h.rcq.poll(1), [{ wrId: 1, status: 'SUCCESS', byteLen: 266 }]);
  t.same(dst.buffer.subarray(0, 256), pattern(256, 2), 'the receive WQE was reused from its start');
  t.same(h.take(), [], 'UC never acknowledges');
});

t.test('UD: GRH area, byte length and source QP', async (t) => {
  const h = new EngineHarness('UD');
  const dst = h.mr(200);
  h.qp.postRecv(0, [{ wrId: 1, sgList: [dst.sge(0, 200)] }]);
  h.send({ bth: bth('UD_SEND_ONLY_WITH_IMMEDIATE', 7), deth: { qkey: 0x11111111, srcQp: 0x33 }, immDt: { data: 0xabcd }, payload: pattern(50) });
  t.match(h.rcq.poll(1), [{ status: 'SUCCESS', byteLen: 90, srcQp: 0x33, immData: 0xabcd, wcFlags: 1 | 2 }]);
  t.equal(dst.buffer[20], 0x45, 'IPv4 header at offset 20');
  t.same([...dst.buffer.subarray(32, 40)], [10, 0, 0, 2, 10, 0, 0, 1], 'source and destination addresses');
  t.same(dst.buffer.subarray(40, 90), pattern(50));
  t.equal(aethValue(0), 0);
});

t.test('ACK coalescing: one ACK per receive batch, never ahead of a NAK or a READ response', async (t) => {
  t.test('two AckReq packets in one batch: one ACK, the later PSN and its MSN', async (t) => {
    const h = new EngineHarness('RC');
    const dst = h.mr(1024);
    h.qp.postRecv(0, [{ wrId: 1, sgList: [dst.sge(0, 512)] }, { wrId: 2, sgList: [dst.sge(512, 512)] }]);
    h.send({ bth: bth('RC_SEND_ONLY', E, { ackReq: true }), payload: pattern(16) });
    h.send({ bth: bth('RC_SEND_ONLY', E + 1, { ackReq: true }), payload: pattern(16) });
    t.equal(h.rcq.length, 2, 'both messages completed before the ACK left');
    const out = h.take();
    t.same(h.names(out), ['ACKNOWLEDGE@501']);
    t.equal(out[0]!.aeth!.msn, 2);
    t.equal(aethKind(syn(out[0]!)), 'ACK');
  });

  t.test('a NAK sends the waiting ACK first, in PSN order', async (t) => {
    const h = new EngineHarness('RC');
    const mr = h.mr(1024);
    h.send({ bth: bth('RC_RDMA_WRITE_ONLY', E, { ackReq: true }), reth: { va: mr.va(0), rkey: mr.rkey, dmaLength: 8 }, payload: pattern(8) });
    h.send({ bth: bth('RC_RDMA_WRITE_ONLY', E + 3, { ackReq: true }), reth: { va: mr.va(0), rkey: mr.rkey, dmaLength: 8 }, payload: pattern(8) });
    const out = h.take();
    t.same(h.names(out), ['ACKNOWLEDGE@500', 'ACKNOWLEDGE@501']);
    t.equal(aethKind(syn(out[0]!)), 'ACK');
    t.equal(syn(out[1]!), nakSyndrome(NAK_CODE.PSN_SEQUENCE_ERROR));
  });

  t.test('a READ after a waiting ACK: the ACK carries the WRITE\'s PSN and leaves before the responses', async (t) => {
    const h = new EngineHarness('RC');
    const mr = h.mr(pattern(600, 3));
    h.send({ bth: bth('RC_RDMA_WRITE_ONLY', E, { ackReq: true }), reth: { va: mr.va(0), rkey: mr.rkey, dmaLength: 8 }, payload: pattern(8) });
    h.send({ bth: bth('RC_RDMA_READ_REQUEST', E + 1, { ackReq: true }), reth: { va: mr.va(0), rkey: mr.rkey, dmaLength: 300 } });
    t.same(h.names(h.poll()), ['ACKNOWLEDGE@500', 'RDMA_READ_RESPONSE_FIRST@501', 'RDMA_READ_RESPONSE_LAST@502']);
  });

  t.test('a state change sends the waiting ACK first', async (t) => {
    const h = new EngineHarness('RC');
    const mr = h.mr(64);
    h.send({ bth: bth('RC_RDMA_WRITE_ONLY', E, { ackReq: true }), reth: { va: mr.va(0), rkey: mr.rkey, dmaLength: 8 }, payload: pattern(8) });
    h.qp.modify(0, { qpState: 'RESET' }); // RESET forgets the responder's state, the ACK included
    t.same(h.names(h.take()), ['ACKNOWLEDGE@500']);
  });
});

t.test('an ACK or NAK is written in place: the bytes the header builder writes for its fields', async (t) => {
  // The responder writes a plain ACK over a template instead of through the header builder; every
  // byte of BTH and AETH must still be the builder's, at the 24-bit edges too (PSN and MSN wrapping,
  // a destination QPN with all bits set).
  for (const start of [E, 0xfffffe]) {
    const h = new EngineHarness('RC', { sqPsnB: start });
    h.qp.destQpNum = 0xfedcba;
    const mr = h.mr(64);
    const write = (psn: number): void =>
      h.send({ bth: bth('RC_RDMA_WRITE_ONLY', psn & 0xffffff, { ackReq: true }), reth: { va: mr.va(0), rkey: mr.rkey, dmaLength: 8 }, payload: pattern(8) });
    write(start);
    h.take();
    write(start + 1);
    write(start + 2); // one ACK for both, PSN start + 2 (wrapped past 0xffffff when start is 0xfffffe)
    h.take();
    write(start + 9); // a gap: NAK PSN sequence error, with the expected PSN
    h.take();
    write(start + 1); // a duplicate: ACK with ePSN − 1
    h.take();
    const want = [
      { psn: start, syndrome: 0x1f, msn: 1 },
      { psn: (start + 2) & 0xffffff, syndrome: 0x1f, msn: 3 },
      { psn: (start + 3) & 0xffffff, syndrome: nakSyndrome(NAK_CODE.PSN_SEQUENCE_ERROR), msn: 3 },
      { psn: (start + 2) & 0xffffff, syndrome: 0x1f, msn: 3 },
    ];
    t.equal(h.wire.length, want.length, `${want.length} responses`);
    const hb = new HeaderBuilder();
    want.forEach((w, i) => {
      const expected = hb.build({ ...blankFields(), opcode: opcodeOf('RC_ACKNOWLEDGE'), destQp: 0xfedcba, ...w });
      t.same([...h.wire[i]!], [...expected], `response ${i} from PSN 0x${start.toString(16)}`);
    });
  }
});

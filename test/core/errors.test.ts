/**
 * Every error class provoked end to end on MemoryLink + VirtualClock: the requester's
 * completion status, the responder's side, the QP states, the counters, and that remote memory
 * is untouched where the spec says it must be.
 */
import t from 'tap';
import { modifyQp, pollCq, postRecv, postSend, queryQp, regMr, type Qp } from '../../src/api/verbs.js';
import { ACCESS, type QpState, type SendWr, type WrOpcode } from '../../src/core/types.js';
import { ackTimeoutUs } from '../../src/core/time.js';
import { InvalidTransitionError, InvalidWrError, RoceError } from '../../src/core/errors.js';
import { WR_OPCODES_FOR } from '../../src/core/requester.js';
import { releaseSendWqe, takeSendWqe } from '../../src/core/wqe.js';
import { ALL_ACCESS, collect, connectPair, memoryPair, pattern, runUntil } from '../helpers/engine.js';

async function rcPair(o: Parameters<typeof connectPair>[2] = {}) {
  const p = await memoryPair();
  const [qa, qb] = connectPair(p, 'RC', o);
  return { p, qa, qb };
}

t.test('bad rkey: REM_ACCESS_ERR, both QPs to ERR, memory untouched', async (t) => {
  const { p, qa, qb } = await rcPair();
  const src = regMr(p.a.pd, pattern(2048, 1), ALL_ACCESS);
  const dst = regMr(p.b.pd, new Uint8Array(2048), ALL_ACCESS);
  postSend(qa, { wrId: 1, opcode: 'RDMA_WRITE', sgList: [src.sge(0, 2048)], rdma: { remoteAddr: dst.va(0), rkey: dst.rkey ^ 0x100 } });
  postSend(qa, { wrId: 2, opcode: 'SEND', sgList: [src.sge(0, 8)] });
  const [w1, w2] = collect(p.clock, p.a.cq, 2);
  t.match(w1, { wrId: 1, status: 'REM_ACCESS_ERR', opcode: 'RDMA_WRITE' });
  t.equal(w1?.vendorErr, 0x62, 'vendorErr carries the NAK syndrome');
  t.match(w2, { wrId: 2, status: 'WR_FLUSH_ERR' }, 'the rest is flushed');
  t.equal(qa.state, 'ERR');
  t.equal(qb.state, 'ERR');
  t.equal(p.b.ctx.counters.rkeyViolation, 1);
  t.ok(dst.buffer.every((x) => x === 0), 'nothing written');
  t.match(p.a.ctx.events.history.find((e) => e.type === 'QP_FATAL'), { qpNum: qa.qpNum, reason: /REM_ACCESS_ERR/ });
});

t.test('out of bounds: WRITE past the region end, READ before it', async (t) => {
  for (const op of ['RDMA_WRITE', 'RDMA_READ'] as const) {
    const { p, qa, qb } = await rcPair();
    const local = regMr(p.a.pd, pattern(4096, 2), ALL_ACCESS);
    const remote = regMr(p.b.pd, new Uint8Array(1024), ALL_ACCESS);
    const remoteAddr = op === 'RDMA_WRITE' ? remote.va(512) : remote.va(0) - 1n;
    postSend(qa, { wrId: 1, opcode: op, sgList: [local.sge(0, 1024)], rdma: { remoteAddr, rkey: remote.rkey } });
    t.match(collect(p.clock, p.a.cq, 1)[0], { status: 'REM_ACCESS_ERR' }, op);
    t.ok(remote.buffer.every((x) => x === 0), `${op}: remote untouched`);
    t.equal(qb.state, 'ERR');
  }
});

t.test('missing access flag on the MR: WRITE refused, memory untouched (checked by a later READ)', async (t) => {
  const p = await memoryPair();
  let [qa, qb] = connectPair(p, 'RC');
  const local = regMr(p.a.pd, pattern(3000, 3), ALL_ACCESS);
  const readOnly = regMr(p.b.pd, pattern(3000, 9), ACCESS.LOCAL_WRITE | ACCESS.REMOTE_READ);
  const before = Buffer.from(readOnly.buffer);
  postSend(qa, { wrId: 1, opcode: 'RDMA_WRITE', sgList: [local.sge(0, 3000)], rdma: { remoteAddr: readOnly.va(0), rkey: readOnly.rkey } });
  t.match(collect(p.clock, p.a.cq, 1)[0], { status: 'REM_ACCESS_ERR' });
  t.equal(qa.state, 'ERR');
  // A fresh connection reads the region back: it must be exactly what it was.
  [qa, qb] = connectPair(p, 'RC');
  const back = regMr(p.a.pd, new Uint8Array(3000), ALL_ACCESS);
  postSend(qa, { wrId: 2, opcode: 'RDMA_READ', sgList: [back.sge(0, 3000)], rdma: { remoteAddr: readOnly.va(0), rkey: readOnly.rkey } });
  t.match(collect(p.clock, p.a.cq, 1)[0], { status: 'SUCCESS', opcode: 'RDMA_READ' });
  t.same(Buffer.from(back.buffer), before, 'READ returns the untouched bytes');
  t.equal(qb.state, 'RTS');
});

t.test('missing QP access flag: REM_INV_REQ_ERR', async (t) => {
  const { p, qa } = await rcPair({ accessB: ACCESS.LOCAL_WRITE | ACCESS.REMOTE_WRITE });
  const local = regMr(p.a.pd, new Uint8Array(64), ALL_ACCESS);
  const remote = regMr(p.b.pd, pattern(64, 4), ALL_ACCESS);
  postSend(qa, { wrId: 1, opcode: 'RDMA_READ', sgList: [local.sge(0, 64)], rdma: { remoteAddr: remote.va(0), rkey: remote.rkey } });
  t.match(collect(p.clock, p.a.cq, 1)[0], { status: 'REM_INV_REQ_ERR' });
  t.equal(p.b.ctx.counters.invalidRequest, 1);
});

t.test('RNR: no receive posted → RNR NAKs, recovery once one is posted', async (t) => {
  const { p, qa, qb } = await rcPair({ minRnrTimer: 14, rnrRetry: 7 });
  const src = regMr(p.a.pd, pattern(5000, 5), ALL_ACCESS);
  const dst = regMr(p.b.pd, new Uint8Array(5000), ALL_ACCESS);
  postSend(qa, { wrId: 1, opcode: 'SEND', sgList: [src.sge(0, 5000)] });
  p.clock.advanceTo(p.clock.now() + 5_000);
  t.same(pollCq(p.a.cq, 1), [], 'no completion while the responder is not ready');
  t.ok(p.b.ctx.counters.sndRnr >= 2, `responder sent RNR NAKs (${p.b.ctx.counters.sndRnr})`);
  t.ok(p.a.ctx.counters.rcvRnr >= 2, 'requester saw them');
  postRecv(qb, { wrId: 9, sgList: [dst.sge(0, 5000)] });
  t.match(collect(p.clock, p.a.cq, 1)[0], { wrId: 1, status: 'SUCCESS' });
  t.match(collect(p.clock, p.b.cq, 1)[0], { wrId: 9, status: 'SUCCESS', byteLen: 5000 });
  t.same(dst.buffer, src.buffer);
});

t.test('RNR retries run out: RNR_RETRY_EXC_ERR', async (t) => {
  const { p, qa } = await rcPair({ minRnrTimer: 1, rnrRetry: 2 });
  const src = regMr(p.a.pd, pattern(100, 5), ALL_ACCESS);
  postSend(qa, { wrId: 1, opcode: 'SEND', sgList: [src.sge(0, 100)] });
  const w = collect(p.clock, p.a.cq, 1, 1_000_000)[0];
  t.match(w, { status: 'RNR_RETRY_EXC_ERR' });
  t.equal(p.a.ctx.counters.rcvRnr, 3, 'initial try + 2 retries');
  t.equal(p.a.ctx.counters.rnrRetryExceeded, 1);
});

t.test('peer gone: RETRY_EXC_ERR after timeouts of T, 2T, 4T and 4T (backing off), no hang', async (t) => {
  const { p, qa, qb } = await rcPair({ timeout: 12, retryCnt: 3 });
  modifyQp(qb, { qpState: 'RESET' }); // the peer forgets the connection: packets to it are dropped
  const src = regMr(p.a.pd, pattern(100, 5), ALL_ACCESS);
  const t0 = p.clock.now();
  postSend(qa, { wrId: 1, opcode: 'SEND', sgList: [src.sge(0, 100)] });
  const bound = ackTimeoutUs(12)! * 11 + 1000;
  const w = collect(p.clock, p.a.cq, 1, bound)[0];
  t.match(w, { status: 'RETRY_EXC_ERR' });
  const took = p.clock.now() - t0;
  t.ok(took >= ackTimeoutUs(12)! * 11 && took <= bound, `gave up after ${took} µs`);
  t.equal(p.a.ctx.counters.retryExceeded, 1);
  t.equal(p.a.ctx.counters.ackTimeouts, 4);
  t.equal(p.b.ctx.counters.badState, 4, 'the peer dropped the original and 3 retries');
  t.equal(qa.state, 'ERR');
});

t.test('unaligned atomic: REM_INV_REQ_ERR (rxe: NAK Invalid Request), memory untouched', async (t) => {
  const { p, qa } = await rcPair();
  const res = regMr(p.a.pd, new Uint8Array(8), ALL_ACCESS);
  const word = regMr(p.b.pd, pattern(32, 6), ALL_ACCESS);
  const before = Buffer.from(word.buffer);
  postSend(qa, { wrId: 1, opcode: 'ATOMIC_FETCH_AND_ADD', sgList: [res.sge(0, 8)], atomic: { remoteAddr: word.va(4), compareAdd: 1n, rkey: word.rkey } });
  t.match(collect(p.clock, p.a.cq, 1)[0], { status: 'REM_INV_REQ_ERR', opcode: 'FETCH_ADD' });
  t.same(Buffer.from(word.buffer), before);
});

t.test('local protection error: bad lkey completes LOC_PROT_ERR', async (t) => {
  const { p, qa } = await rcPair();
  const mr = regMr(p.a.pd, new Uint8Array(64), ALL_ACCESS);
  postSend(qa, { wrId: 1, opcode: 'SEND', sgList: [{ addr: mr.va(0), length: 64, lkey: mr.lkey + 1 }] });
  t.match(collect(p.clock, p.a.cq, 1)[0], { status: 'LOC_PROT_ERR' });
  t.equal(qa.state, 'ERR');
});

t.test('receive too small: LOC_LEN_ERR at the responder, REM_INV_REQ_ERR at the requester', async (t) => {
  const { p, qa, qb } = await rcPair();
  const src = regMr(p.a.pd, pattern(3000, 7), ALL_ACCESS);
  const dst = regMr(p.b.pd, new Uint8Array(1000), ALL_ACCESS);
  postRecv(qb, { wrId: 5, sgList: [dst.sge(0, 1000)] });
  postSend(qa, { wrId: 1, opcode: 'SEND', sgList: [src.sge(0, 3000)] });
  t.match(collect(p.clock, p.a.cq, 1)[0], { status: 'REM_INV_REQ_ERR' });
  t.match(collect(p.clock, p.b.cq, 1)[0], { wrId: 5, status: 'LOC_LEN_ERR' });
});

t.test('any → ERR flushes every outstanding WR, send and receive', async (t) => {
  const { p, qa } = await rcPair();
  const mr = regMr(p.a.pd, new Uint8Array(64), ALL_ACCESS);
  for (let i = 0; i < 3; i++) postRecv(qa, { wrId: 100 + i, sgList: [mr.sge(0, 64)] });
  modifyQp(qa, { qpState: 'SQD' });
  for (let i = 0; i < 2; i++) postSend(qa, { wrId: i, opcode: 'SEND', sgList: [mr.sge(0, 8)] });
  modifyQp(qa, { qpState: 'ERR' });
  const wcs = pollCq(p.a.cq, 10);
  t.equal(wcs.length, 5);
  t.ok(wcs.every((w) => w.status === 'WR_FLUSH_ERR'));
  t.same(wcs.map((w) => Number(w.wrId)).sort((x, y) => x - y), [0, 1, 100, 101, 102]);
  postRecv(qa, { wrId: 7, sgList: [mr.sge(0, 64)] });
  t.match(pollCq(p.a.cq, 1), [{ wrId: 7, status: 'WR_FLUSH_ERR' }], 'posting in ERR flushes at once');
  modifyQp(qa, { qpState: 'RESET' });
  t.equal(qa.state, 'RESET');
  t.equal(qa.core.sqLength + qa.core.rq.length, 0, 'RESET clears');
});

t.test('SQD drains and raises SQ_DRAINED; SQD → RTS resumes', async (t) => {
  const { p, qa, qb } = await rcPair();
  const src = regMr(p.a.pd, pattern(8192, 8), ALL_ACCESS);
  const dst = regMr(p.b.pd, new Uint8Array(8192), ALL_ACCESS);
  postSend(qa, { wrId: 1, opcode: 'RDMA_WRITE', sgList: [src.sge(0, 8192)], rdma: { remoteAddr: dst.va(0), rkey: dst.rkey } });
  p.clock.advanceTo(p.clock.now()); // WR 1 goes on the wire (it is started) …
  modifyQp(qa, { qpState: 'SQD', enSqdAsyncNotify: true }); // … before the SQ is told to drain
  postSend(qa, { wrId: 2, opcode: 'RDMA_WRITE', sgList: [src.sge(0, 16)], rdma: { remoteAddr: dst.va(0), rkey: dst.rkey } });
  t.notOk(p.a.ctx.events.history.some((e) => e.type === 'SQ_DRAINED'), 'not drained while WR 1 is in flight');
  runUntil(p.clock, () => p.a.ctx.events.history.some((e) => e.type === 'SQ_DRAINED'), 1_000_000);
  t.match(p.a.ctx.events.history.find((e) => e.type === 'SQ_DRAINED'), { qpNum: qa.qpNum });
  t.equal(queryQp(qa).sqDraining, false);
  const w = collect(p.clock, p.a.cq, 1, 100_000);
  t.match(w, [{ wrId: 1, status: 'SUCCESS' }], 'the started WR finished; the new one waits');
  t.same(pollCq(p.a.cq, 1), []);
  modifyQp(qa, { qpState: 'RTS' });
  t.match(collect(p.clock, p.a.cq, 1), [{ wrId: 2, status: 'SUCCESS' }]);
  void qb;
});

t.test('every invalid transition throws a typed error and leaves the state unchanged', async (t) => {
  const p = await memoryPair();
  const states: QpState[] = ['RESET', 'INIT', 'RTR', 'RTS', 'SQD', 'SQE', 'ERR'];
  const legal: Record<string, QpState[]> = {
    RESET: ['RESET', 'INIT', 'ERR'], INIT: ['RESET', 'INIT', 'RTR', 'ERR'], RTR: ['RESET', 'RTS', 'ERR'],
    RTS: ['RESET', 'RTS', 'SQD', 'ERR'], SQD: ['RESET', 'RTS', 'SQD', 'ERR'], SQE: ['RESET', 'RTS', 'ERR'], ERR: ['RESET', 'ERR'],
  };
  let checked = 0;
  for (const type of ['RC', 'UC', 'UD'] as const) {
    for (const from of states) {
      if (from === 'SQE' && type === 'RC') continue;
      for (const to of states) {
        if (legal[from]!.includes(to)) continue;
        const [qa] = connectPair(p, type);
        driveTo(qa, from);
        t.equal(qa.state, from);
        const e = throws(() => modifyQp(qa, { qpState: to }));
        if (!(e instanceof InvalidTransitionError) || !(e instanceof RoceError) || e.code !== 'ERR_INVALID_TRANSITION') {
          t.fail(`${type} ${from} -> ${to}: ${String(e)}`);
        }
        t.equal(qa.state, from, `${type} ${from} -> ${to} refused, state unchanged`);
        checked++;
      }
    }
  }
  t.ok(checked > 60, `${checked} invalid transitions checked`);
});

t.test('an opcode the QP type does not carry: InvalidWrError, nothing queued; one it carries is posted', async (t) => {
  const p = await memoryPair();
  const mr = regMr(p.a.pd, pattern(64, 4), ALL_ACCESS);
  const remote = regMr(p.b.pd, new Uint8Array(64), ALL_ACCESS);
  const ah = p.a.pd.createAh({ address: p.b.ctx.address, port: p.b.ctx.port });
  const opcodes = [...new Set(Object.values(WR_OPCODES_FOR).flat()), 'NOT_AN_OPCODE'] as WrOpcode[];
  let refused = 0;
  for (const type of ['RC', 'UC', 'UD'] as const) {
    for (const opcode of opcodes) {
      const [qa, qb] = connectPair(p, type);
      // Everything any opcode needs, so that only the opcode itself can be refused.
      const wr: SendWr = {
        wrId: 1, opcode, sgList: [mr.sge(0, 8)], immData: 7, invalidateRkey: remote.rkey,
        rdma: { remoteAddr: remote.va(0), rkey: remote.rkey },
        atomic: { remoteAddr: remote.va(0), rkey: remote.rkey, compareAdd: 0n, swap: 1n },
        ...(type === 'UD' ? { ud: { ah, remoteQpn: qb.qpNum, remoteQkey: 0x80000000 } } : {}),
      };
      const carried = WR_OPCODES_FOR[type].includes(opcode);
      const e = throws(() => postSend(qa, wr));
      if (carried) {
        t.equal(e, undefined, `${type} ${opcode} posted`);
        t.equal(qa.core.sqLength, 1, `${type} ${opcode}: one WQE queued`);
      } else {
        refused++;
        t.ok(e instanceof InvalidWrError, `${type} ${opcode}: InvalidWrError`);
        t.match(String(e), `${opcode} is not available on a ${type} QP`);
        t.equal(qa.core.sqLength, 0, `${type} ${opcode}: nothing queued`);
      }
    }
  }
  // RC refuses only the made-up one; UC four verbs and it; UD six and it.
  t.equal(refused, 1 + 5 + 7);
});

function throws(f: () => void): unknown {
  try {
    f();
  } catch (e) {
    return e;
  }
  return undefined;
}

/** From RTS, reach `s` by legal transitions (SQE: provoke a UC/UD send error). */
function driveTo(qp: Qp, s: QpState): void {
  switch (s) {
    case 'RTS': return;
    case 'SQD': modifyQp(qp, { qpState: 'SQD' }); return;
    case 'ERR': modifyQp(qp, { qpState: 'ERR' }); return;
    case 'SQE': qp.core.setState('SQE', 'test'); return;
    default:
      modifyQp(qp, { qpState: 'RESET' });
      if (s === 'RESET') return;
      modifyQp(qp, qp.type === 'UD' ? { qpState: 'INIT', pkeyIndex: 0, portNum: 1, qkey: 1 } : { qpState: 'INIT', pkeyIndex: 0, portNum: 1, qpAccessFlags: 0 });
      if (s === 'INIT') return;
      modifyQp(qp, qp.type === 'UD' ? { qpState: 'RTR' } : qp.type === 'UC'
        ? { qpState: 'RTR', ahAttr: { address: '10.0.0.2' }, pathMtu: 1024, destQpNum: 0x11, rqPsn: 0 }
        : { qpState: 'RTR', ahAttr: { address: '10.0.0.2' }, pathMtu: 1024, destQpNum: 0x11, rqPsn: 0, maxDestRdAtomic: 1, minRnrTimer: 1 });
  }
}

t.test('a receive list with one WR over maxRecvSge: InvalidWrError naming it, nothing queued; a WR without SGEs takes a 0-byte SEND', async (t) => {
  const { p, qa, qb } = await rcPair({ cap: { maxRecvSge: 2 } });
  const mr = regMr(p.b.pd, new Uint8Array(64), ALL_ACCESS);
  const ok = { wrId: 1, sgList: [mr.sge(0, 8), mr.sge(8, 8)] };
  const over = { wrId: 2, sgList: [mr.sge(0, 8), mr.sge(8, 8), mr.sge(16, 8)] };
  const e = throws(() => postRecv(qb, [ok, ok, over, ok]));
  t.ok(e instanceof InvalidWrError, 'InvalidWrError');
  t.match(String(e), 'recv WR 2: 3 SGEs > maxRecvSge 2');
  t.equal(qb.core.rq.length, 0, 'nothing queued, not even the WRs before it');
  postRecv(qb, [{ wrId: 3 }, ok]);
  t.equal(qb.core.rq.length, 2, 'both queued');
  const src = regMr(p.a.pd, pattern(16, 5), ALL_ACCESS);
  postSend(qa, [{ wrId: 10, opcode: 'SEND', sgList: [] }, { wrId: 11, opcode: 'SEND', sgList: [src.sge(0, 16)] }]);
  const wcs = collect(p.clock, p.b.cq, 2);
  t.match(wcs, [{ wrId: 3, status: 'SUCCESS', byteLen: 0 }, { wrId: 1, status: 'SUCCESS', byteLen: 16 }]);
  t.same([...mr.buffer.subarray(0, 16)], [...pattern(16, 5)]);
});

t.test('a send list with a bad WR: InvalidWrError naming it, nothing queued, the WQEs taken for the WRs before it back in the free list; a good list posts in order', async (t) => {
  const { p, qa, qb } = await rcPair();
  const src = regMr(p.a.pd, pattern(64, 6), ALL_ACCESS);
  const dst = regMr(p.b.pd, new Uint8Array(64), ALL_ACCESS);
  const write = (wrId: number, off: number): SendWr => ({ wrId, opcode: 'RDMA_WRITE', sgList: [src.sge(off, 16)], rdma: { remoteAddr: dst.va(off), rkey: dst.rkey } });
  // The free list hands out last what came back last: `w` is what the next post takes first.
  const w = takeSendWqe();
  releaseSendWqe(w);
  const e = throws(() => postSend(qa, [write(1, 0), { wrId: 2, opcode: 'RDMA_WRITE', sgList: [src.sge(16, 16)] }, write(3, 32)]));
  t.ok(e instanceof InvalidWrError, 'InvalidWrError');
  t.match(String(e), 'send WR 1: RDMA_WRITE needs rdma');
  t.equal(qa.core.sqLength, 0, 'nothing queued, not even the WR before it');
  const again = takeSendWqe();
  t.equal(again, w, 'the WQE taken for WR 0 went back to the free list');
  releaseSendWqe(again);
  postSend(qa, [write(4, 0), write(5, 16), write(6, 32)]);
  t.equal(qa.core.sqLength, 3, 'a good list: all three queued');
  const wcs = collect(p.clock, p.a.cq, 3);
  t.match(wcs, [{ wrId: 4, status: 'SUCCESS' }, { wrId: 5, status: 'SUCCESS' }, { wrId: 6, status: 'SUCCESS' }]);
  t.same([...dst.buffer.subarray(0, 48)], [...src.buffer.subarray(0, 48)]);
  t.equal(qb.state, 'RTS');
});

import t from 'tap';
import { pollCq, pollCqInto, postRecv, postSend, regMr } from '../../src/api/verbs.js';
import { CompletionQueue, newWorkCompletion } from '../../src/core/cq.js';
import { WC_FLAGS, type WorkCompletion } from '../../src/core/types.js';
import { ALL_ACCESS, connectPair, memoryPair, runUntil } from '../helpers/engine.js';

function wc(wrId: number, o: Partial<WorkCompletion> = {}): WorkCompletion {
  return { wrId, status: 'SUCCESS', opcode: 'RECV', vendorErr: 0, byteLen: wrId * 10, qpNum: 5, srcQp: 0, wcFlags: 0, pkeyIndex: 0, ...o };
}

t.test('push keeps a copy: the record pushed can be reused at once, as the engines do', async (t) => {
  const cq = new CompletionQueue(1, 4);
  const scratch = newWorkCompletion();
  for (let i = 1; i <= 3; i++) {
    Object.assign(scratch, wc(i, i === 2 ? { immData: 0xabc, wcFlags: WC_FLAGS.WITH_IMM } : {}));
    if (i !== 2) scratch.immData = undefined;
    t.ok(cq.push(scratch));
  }
  scratch.wrId = 99;
  const got = cq.poll(3);
  t.same(got.map((w) => w.wrId), [1, 2, 3], 'each completion as it was pushed');
  t.equal(got[1]!.immData, 0xabc);
  t.notOk('immData' in got[0]!, 'poll hands out no immData key where the completion has none');
  t.notOk('invalidatedRkey' in got[1]!);
  t.not(got[0], got[2], 'new objects');
});

t.test('pollInto copies into the caller\'s records, reuses them, and respects max and the ring\'s order', async (t) => {
  const cq = new CompletionQueue(1, 4);
  const out: WorkCompletion[] = [];
  t.equal(cq.pollInto(out, 4), 0, 'nothing to poll');
  // Around the ring twice, so that slots' records are written again.
  let next = 1;
  let first: WorkCompletion | undefined;
  for (let round = 0; round < 3; round++, next += 3) {
    for (let k = 0; k < 3; k++) cq.push(wc(next + k, (next + k) % 2 === 0 ? { immData: next + k, invalidatedRkey: next + k + 1 } : {}));
    t.equal(cq.pollInto(out, 2), 2, 'max honoured');
    t.same([out[0]!.wrId, out[1]!.wrId], [next, next + 1], `round ${round}: the oldest two`);
    t.same([out[0]!.immData, out[1]!.immData], next % 2 === 0 ? [next, undefined] : [undefined, next + 1]);
    t.equal(cq.pollInto(out, 5), 1, 'no more than the ring holds');
    t.equal(out[0]!.wrId, next + 2);
    first ??= out[0];
    t.equal(out[0], first, 'the same record every time');
  }
  t.equal(cq.length, 0);

  const recs = [newWorkCompletion(), newWorkCompletion()];
  cq.push(wc(7, { immData: 70, invalidatedRkey: 71 }));
  cq.push(wc(8));
  cq.push(wc(9));
  t.equal(cq.pollInto(recs), 2, 'max defaults to the records given');
  t.same([recs[0]!.wrId, recs[0]!.byteLen, recs[0]!.immData, recs[0]!.invalidatedRkey], [7, 70, 70, 71]);
  t.equal(recs[1]!.wrId, 8);
  t.equal(recs[1]!.immData, undefined, 'a field the completion lacks reads undefined, not the last value');
  t.equal(cq.pollInto(recs), 1);
  t.equal(recs[0]!.wrId, 9);
  t.equal(recs[0]!.invalidatedRkey, undefined);
  t.equal(recs[1]!.wrId, 8, 'records past the count untouched');
});

t.test('a full ring drops, counts nothing into the user\'s records, and polls again once drained', async (t) => {
  const cq = new CompletionQueue(1, 2);
  t.ok(cq.push(wc(1)));
  t.ok(cq.push(wc(2)));
  t.notOk(cq.push(wc(3)), 'full');
  t.ok(cq.overflowed);
  const recs = [newWorkCompletion(), newWorkCompletion(), newWorkCompletion()];
  t.equal(cq.pollInto(recs), 2);
  t.same(recs.map((r) => r.wrId), [1, 2, 0]);
  t.equal(cq.shift(), undefined);
});

t.test('pollCqInto over an RC pair: SENDs with and without immediate data, and WRITEs, all in reused records', async (t) => {
  const p = await memoryPair();
  const [qa, qb] = connectPair(p, 'RC');
  const src = regMr(p.a.pd, new Uint8Array(4096).fill(3), ALL_ACCESS);
  const dst = regMr(p.b.pd, new Uint8Array(64 * 1024), ALL_ACCESS);
  const n = 12;
  for (let i = 0; i < n; i++) postRecv(qb, { wrId: 100 + i, sgList: [dst.sge(i * 4096, 4096)] });
  for (let i = 0; i < n; i++) {
    postSend(qa, i % 3 === 1
      ? { wrId: i, opcode: 'SEND_WITH_IMM', immData: 0x1000 + i, sgList: [src.sge(0, 100 + i)] }
      : i % 3 === 2
        ? { wrId: i, opcode: 'RDMA_WRITE_WITH_IMM', immData: 0x2000 + i, sgList: [src.sge(0, 50)], rdma: { remoteAddr: dst.va(60_000), rkey: dst.rkey } }
        : { wrId: i, opcode: 'SEND', sgList: [src.sge(0, 100 + i)] });
  }
  const recvRecs = [newWorkCompletion(), newWorkCompletion(), newWorkCompletion()];
  const sendRecs: WorkCompletion[] = [];
  const recv: { wrId: number; opcode: string; byteLen: number; immData: number | undefined; imm: boolean }[] = [];
  const sent: number[] = [];
  runUntil(p.clock, () => {
    // Three records at a time: every one is written again several times over the run.
    for (let k = pollCqInto(p.b.cq, recvRecs); k > 0; k = pollCqInto(p.b.cq, recvRecs)) {
      for (let j = 0; j < k; j++) {
        const r = recvRecs[j]!;
        recv.push({ wrId: Number(r.wrId), opcode: r.opcode, byteLen: r.byteLen, immData: r.immData, imm: (r.wcFlags & WC_FLAGS.WITH_IMM) !== 0 });
      }
    }
    const k = pollCqInto(p.a.cq, sendRecs, 4);
    for (let j = 0; j < k; j++) sent.push(Number(sendRecs[j]!.wrId));
    return recv.length === n && sent.length === n;
  });
  t.same(sent, Array.from({ length: n }, (_, i) => i), 'every send completion, in order');
  t.equal(sendRecs.length, 4, 'pollCqInto made the records it was not given, up to max');
  t.same(recv.map((r) => r.wrId), Array.from({ length: n }, (_, i) => 100 + i), 'every receive completion, in order');
  for (let i = 0; i < n; i++) {
    const r = recv[i]!;
    const want = i % 3 === 1
      ? { opcode: 'RECV', byteLen: 100 + i, immData: 0x1000 + i, imm: true }
      : i % 3 === 2
        ? { opcode: 'RECV_RDMA_WITH_IMM', byteLen: 50, immData: 0x2000 + i, imm: true }
        : { opcode: 'RECV', byteLen: 100 + i, immData: undefined, imm: false };
    t.same({ opcode: r.opcode, byteLen: r.byteLen, immData: r.immData, imm: r.imm }, want, `receive ${i}`);
  }
  t.same(pollCq(p.b.cq, 4), [], 'nothing left');
});

t.test('a send completion written into a slot that held a receive completion with immediate data reads none', async (t) => {
  // One CQ of three slots for both of B's queues: its receive completions (with immediate data) and
  // its send completions take turns, so each record holds one kind and then the other.
  const p = await memoryPair({ cqe: 3 });
  const [qa, qb] = connectPair(p, 'RC');
  const a = regMr(p.a.pd, new Uint8Array(256), ALL_ACCESS);
  const b = regMr(p.b.pd, new Uint8Array(256), ALL_ACCESS);
  const rec = [newWorkCompletion()];
  const seen: string[] = [];
  for (let i = 0; i < 4; i++) {
    postRecv(qb, { wrId: 10 + i, sgList: [b.sge(0, 64)] });
    postRecv(qa, { wrId: 20 + i, sgList: [a.sge(0, 64)] });
    postSend(qa, { wrId: 30 + i, opcode: 'SEND_WITH_IMM', immData: 0xbeef00 + i, sgList: [a.sge(64, 16)] });
    runUntil(p.clock, () => pollCqInto(p.b.cq, rec) === 1);
    seen.push(`${rec[0]!.opcode} ${String(rec[0]!.wrId)} ${String(rec[0]!.immData)}`);
    postSend(qb, { wrId: 40 + i, opcode: 'SEND', sgList: [b.sge(64, 16)] });
    runUntil(p.clock, () => pollCqInto(p.b.cq, rec) === 1);
    seen.push(`${rec[0]!.opcode} ${String(rec[0]!.wrId)} ${String(rec[0]!.immData)} ${rec[0]!.wcFlags}`);
    runUntil(p.clock, () => pollCq(p.a.cq, 2).length > 0);
  }
  t.same(seen, [0, 1, 2, 3].flatMap((i) => [`RECV ${10 + i} ${0xbeef00 + i}`, `SEND ${40 + i} undefined 0`]));
});

/**
 * WQEs are recycled (wqe.ts, the free lists): a retired one is refilled by a later post, of any QP.
 * What must hold: a WQE still in a send or receive queue is never handed out again, and every
 * completion reads the WR it was posted for — here under loss and reordering, so that
 * retransmissions, go-back-N and ACKs of several messages at once retire WQEs while others are in
 * flight, and receives are posted again as SENDs consume them.
 */
import t from 'tap';
import { pollCq, postRecv, postSend, regMr } from '../../src/api/verbs.js';
import type { RecvWqe, SendWqe } from '../../src/core/wqe.js';
import type { SendWr, WrOpcode } from '../../src/core/types.js';
import { Xorshift32 } from '../../src/link/fault.js';
import { ALL_ACCESS, connectPair, memoryPair, runUntil } from '../helpers/engine.js';

t.test('a WQE is posted again only once retired, and every completion reads its own WR', async (t) => {
  const p = await memoryPair({ fault: { seed: 0x9e37, dropPct: 4, reorderPct: 4 } });
  // Two connections between the same devices: their WQEs come from, and go back to, one free list.
  const pairs = [connectPair(p, 'RC'), connectPair(p, 'RC')];
  const local = regMr(p.a.pd, new Uint8Array(64 * 1024), ALL_ACCESS);
  const remote = regMr(p.b.pd, new Uint8Array(64 * 1024), ALL_ACCESS);
  // Receives: a few at a time, posted again as SENDs consume them, each pair's ids in order.
  const recvPosted = pairs.map(() => [] as number[]);
  const seenRecv = new Set<RecvWqe>();
  let recvHandedOutWhileQueued = 0;
  const postOneRecv = (j: number): void => {
    const qb = pairs[j]![1];
    const id = 1_000_000 * (j + 1) + recvPosted[j]!.length;
    postRecv(qb, { wrId: id, sgList: [remote.sge(0, 8192)] });
    recvPosted[j]!.push(id);
    const rq = qb.core.rq;
    const w = rq.at(rq.tail - 1)!;
    // The WQE just queued is in the queues once: not also where another post still has it.
    let copies = 0;
    for (const [, other] of pairs) for (const x of other.core.rq) if (x === w) copies++;
    if (copies !== 1) recvHandedOutWhileQueued++;
    seenRecv.add(w);
  };
  for (let j = 0; j < pairs.length; j++) for (let i = 0; i < 40; i++) postOneRecv(j);
  const sendLens = pairs.map(() => [] as number[]);
  const recvDone = pairs.map(() => [] as { wrId: number; byteLen: number }[]);
  const qpnIndex = new Map(pairs.map(([, qb], j) => [qb.core.qpn, j]));

  const rng = new Xorshift32(0x51ab);
  const OPS: WrOpcode[] = ['RDMA_WRITE', 'SEND', 'RDMA_READ', 'SEND_WITH_IMM'];
  const posted = new Map<number, { opcode: WrOpcode; byteLen: number }>();
  const seen = new Set<SendWqe>();
  let handedOutWhileQueued = 0;
  let nextId = 0;
  const done = new Map<number, { opcode: string; byteLen: number; status: string }>();
  let twice = 0;
  const drain = (): void => {
    for (const wc of pollCq(p.a.cq, 64)) {
      if (done.has(Number(wc.wrId))) twice++;
      done.set(Number(wc.wrId), { opcode: wc.opcode, byteLen: wc.byteLen, status: wc.status });
    }
    for (const wc of pollCq(p.b.cq, 64)) {
      const j = qpnIndex.get(wc.qpNum)!;
      recvDone[j]!.push({ wrId: Number(wc.wrId), byteLen: wc.status === 'SUCCESS' ? wc.byteLen : -1 });
      postOneRecv(j);
    }
  };
  for (let round = 0; round < 12; round++) {
    for (const [j, [qa]] of pairs.entries()) {
      for (let k = 0; k < 6; k++) {
        const opcode = OPS[rng.next() % OPS.length]!;
        const len = 1 + (rng.next() % 6000);
        const id = nextId++;
        const wr: SendWr = { wrId: id, opcode, sgList: [local.sge(0, len)] };
        if (opcode === 'RDMA_WRITE' || opcode === 'RDMA_READ') wr.rdma = { remoteAddr: remote.va(1024), rkey: remote.rkey };
        if (opcode === 'SEND_WITH_IMM') wr.immData = id;
        postSend(qa, wr);
        posted.set(id, { opcode, byteLen: len });
        if (opcode === 'SEND' || opcode === 'SEND_WITH_IMM') sendLens[j]!.push(len);
        // The WQE just queued: not one that another post still has in a send queue.
        const q = qa.core;
        const w = q.sqAt(q.sqEnd - 1)!;
        for (const [other] of pairs) {
          const o = other.core;
          for (let i = o.sqHead; i < o.sqEnd; i++) if (o.sqAt(i) === w && !(o === q && i === q.sqEnd - 1)) handedOutWhileQueued++;
        }
        seen.add(w);
      }
    }
    // Let about half of what is outstanding complete before the next round posts more.
    const want = Math.floor((nextId + done.size) / 2);
    runUntil(p.clock, () => {
      drain();
      return done.size >= want;
    });
  }
  runUntil(p.clock, () => {
    drain();
    return done.size === nextId && recvDone.every((d, j) => d.length === sendLens[j]!.length);
  });

  t.equal(handedOutWhileQueued, 0, 'no WQE was handed out while still queued');
  t.equal(twice, 0, 'no WR completed twice');
  t.equal(done.size, nextId, `all ${nextId} WRs completed`);
  const WC_OF: Record<string, string> = { RDMA_WRITE: 'RDMA_WRITE', SEND: 'SEND', SEND_WITH_IMM: 'SEND', RDMA_READ: 'RDMA_READ' };
  let wrong = 0;
  for (const [id, want] of posted) {
    const got = done.get(id);
    if (!got || got.status !== 'SUCCESS' || got.opcode !== WC_OF[want.opcode] || got.byteLen !== want.byteLen) wrong++;
  }
  t.equal(wrong, 0, 'every completion has its own WR\'s opcode and length, and succeeded');
  t.ok(seen.size < nextId / 2, `${nextId} posts were served by ${seen.size} WQEs`);

  // Each pair's SENDs landed in its receives in posting order, each completion its own receive's.
  t.equal(recvHandedOutWhileQueued, 0, 'no receive WQE was handed out while still queued');
  for (let j = 0; j < pairs.length; j++) {
    const n = sendLens[j]!.length;
    t.same(recvDone[j]!.map((r) => r.wrId), recvPosted[j]!.slice(0, n), `pair ${j}: ${n} receives completed in posting order`);
    t.same(recvDone[j]!.map((r) => r.byteLen), sendLens[j], `pair ${j}: each with its SEND's length`);
  }
  const posts = recvPosted.reduce((a, r) => a + r.length, 0);
  t.ok(seenRecv.size < posts, `${posts} receive posts were served by ${seenRecv.size} receive WQEs`);
});

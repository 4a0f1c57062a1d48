/**
 * 64 MiB of RC WRITE, READ and SEND over MemoryLink behind FaultyLink (fixed seed, virtual
 * clock): 5 % loss each way, plus reordering, duplication and bit flips. Everything must land
 * byte-exact (sha256), and the run must have needed retransmissions to get there.
 */
import t from 'tap';
import { postRecv, postSend, regMr } from '../../src/api/verbs.js';
import type { WorkCompletion } from '../../src/core/types.js';
import { ALL_ACCESS, collect, connectPair, memoryPair, pattern, sha256 } from '../helpers/engine.js';

const MiB = 1 << 20;
const SEED = 0x5eed_2026;

t.test('64 MiB RC mix survives 5 % loss, reorder, duplication and bit flips', async (t) => {
  const p = await memoryPair({
    fault: { seed: SEED, dropPct: 5, reorderPct: 3, duplicatePct: 2, corruptPct: 1, delayUs: 30 },
    cqe: 8192,
  });
  const [qa, qb] = connectPair(p, 'RC', { pathMtu: 4096, timeout: 8, retryCnt: 7, rnrRetry: 7, sqPsnA: 0xfffff0 - 5000 });
  t.comment(`seed 0x${SEED.toString(16)}`);

  const writeSrc = regMr(p.a.pd, pattern(24 * MiB, 11), ALL_ACCESS);
  const writeDst = regMr(p.b.pd, new Uint8Array(24 * MiB), ALL_ACCESS);
  const readSrc = regMr(p.b.pd, pattern(24 * MiB, 22), ALL_ACCESS);
  const readDst = regMr(p.a.pd, new Uint8Array(24 * MiB), ALL_ACCESS);
  const sendSrc = regMr(p.a.pd, pattern(16 * MiB, 33), ALL_ACCESS);
  const recvDst = regMr(p.b.pd, new Uint8Array(16 * MiB), ALL_ACCESS);

  for (let i = 0; i < 16; i++) postRecv(qb, { wrId: 1000 + i, sgList: [recvDst.sge(i * MiB, MiB)] });
  let wr = 0;
  for (let i = 0; i < 24; i++) {
    postSend(qa, { wrId: wr++, opcode: 'RDMA_WRITE', sgList: [writeSrc.sge(i * MiB, MiB)], rdma: { remoteAddr: writeDst.va(i * MiB), rkey: writeDst.rkey } });
    postSend(qa, { wrId: wr++, opcode: 'RDMA_READ', sgList: [readDst.sge(i * MiB, MiB)], rdma: { remoteAddr: readSrc.va(i * MiB), rkey: readSrc.rkey } });
    if (i < 16) postSend(qa, { wrId: wr++, opcode: 'SEND', sgList: [sendSrc.sge(i * MiB, MiB)] });
  }
  const started = Date.now();
  const sendWcs: WorkCompletion[] = collect(p.clock, p.a.cq, wr, 600_000_000);
  const recvWcs: WorkCompletion[] = collect(p.clock, p.b.cq, 16, 60_000_000);
  t.comment(`${wr} WRs in ${(p.clock.now() / 1e6).toFixed(3)} s virtual, ${Date.now() - started} ms real`);

  t.equal(sendWcs.length, wr, 'every send WR completed');
  t.same(sendWcs.filter((w) => w.status !== 'SUCCESS').map((w) => w.status), [], 'all SUCCESS');
  t.same(sendWcs.map((w) => Number(w.wrId)), [...Array(wr).keys()], 'completions in posting order');
  t.equal(recvWcs.length, 16);
  t.ok(recvWcs.every((w) => w.status === 'SUCCESS' && w.byteLen === MiB), 'receives complete with 1 MiB each');
  t.equal(sha256(writeDst.buffer), sha256(writeSrc.buffer), 'WRITE data byte-exact');
  t.equal(sha256(readDst.buffer), sha256(readSrc.buffer), 'READ data byte-exact');
  t.equal(sha256(recvDst.buffer), sha256(sendSrc.buffer), 'SEND data byte-exact');

  const ca = p.a.ctx.counters;
  const cb = p.b.ctx.counters;
  t.comment(`A: ${JSON.stringify(ca)}`);
  t.comment(`B: ${JSON.stringify(cb)}`);
  t.ok(ca.retransPkts > 0, `requester retransmitted (${ca.retransPkts} packets)`);
  t.ok(ca.compRetry > 0, 'completer retried');
  t.ok(cb.dupReq + cb.outOfSeqReq > 0, 'responder saw duplicates / gaps');
  t.equal(qa.state, 'RTS');
  t.equal(qb.state, 'RTS');
});

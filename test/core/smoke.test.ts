import t from 'tap';
import { postRecv, postSend, regMr } from '../../src/api/verbs.js';
import { ALL_ACCESS, collect, connectPair, memoryPair, pattern } from '../helpers/engine.js';

t.test('RC SEND, WRITE, READ over MemoryLink', async (t) => {
  const p = await memoryPair();
  const [qa, qb] = connectPair(p, 'RC');
  const src = regMr(p.a.pd, pattern(5000, 3), ALL_ACCESS);
  const dst = regMr(p.b.pd, new Uint8Array(8192), ALL_ACCESS);
  postRecv(qb, { wrId: 7, sgList: [dst.sge(0, 8192)] });
  postSend(qa, { wrId: 1, opcode: 'SEND', sgList: [src.sge(0, 5000)] });
  const wcs = collect(p.clock, p.a.cq, 1);
  t.equal(wcs[0]?.status, 'SUCCESS');
  const rw = collect(p.clock, p.b.cq, 1);
  t.equal(rw[0]?.status, 'SUCCESS');
  t.equal(rw[0]?.byteLen, 5000);
  t.same(dst.buffer.subarray(0, 5000), src.buffer);

  postSend(qa, { wrId: 2, opcode: 'RDMA_WRITE', sgList: [src.sge(0, 3000)], rdma: { remoteAddr: dst.va(4000), rkey: dst.rkey } });
  t.equal(collect(p.clock, p.a.cq, 1)[0]?.status, 'SUCCESS');
  t.same(dst.buffer.subarray(4000, 7000), src.buffer.subarray(0, 3000));

  const back = regMr(p.a.pd, new Uint8Array(8192), ALL_ACCESS);
  postSend(qa, { wrId: 3, opcode: 'RDMA_READ', sgList: [back.sge(0, 7000)], rdma: { remoteAddr: dst.va(0), rkey: dst.rkey } });
  const r = collect(p.clock, p.a.cq, 1)[0];
  t.equal(r?.status, 'SUCCESS');
  t.equal(r?.opcode, 'RDMA_READ');
  t.same(back.buffer.subarray(0, 7000), dst.buffer.subarray(0, 7000));
  t.ok(p.a.ctx.counters.sentPkts > 0);
});

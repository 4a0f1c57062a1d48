/** RC WRITE, READ and SEND across the 24-bit PSN wrap (start at 0xfffff0), clean and lossy. */
import t from 'tap';
import { postRecv, postSend, regMr } from '../../src/api/verbs.js';
import { ALL_ACCESS, collect, connectPair, memoryPair, pattern, sha256 } from '../helpers/engine.js';

for (const lossy of [false, true]) {
  t.test(`PSN wrap-around from 0xfffff0${lossy ? ' with 3 % loss' : ''}`, async (t) => {
    const p = await memoryPair(lossy ? { fault: { seed: 77, dropPct: 3, reorderPct: 2 } } : {});
    const [qa, qb] = connectPair(p, 'RC', { pathMtu: 256, sqPsnA: 0xfffff0, sqPsnB: 0xfffffa, timeout: 8 });
    const size = 64 * 256; // 64 packets per message: every message crosses or follows the wrap
    const src = regMr(p.a.pd, pattern(size, 1), ALL_ACCESS);
    const wdst = regMr(p.b.pd, new Uint8Array(size), ALL_ACCESS);
    const rsrc = regMr(p.b.pd, pattern(size, 2), ALL_ACCESS);
    const rdst = regMr(p.a.pd, new Uint8Array(size), ALL_ACCESS);
    const sdst = regMr(p.b.pd, new Uint8Array(size), ALL_ACCESS);
    postRecv(qb, { wrId: 9, sgList: [sdst.sge(0, size)] });
    postSend(qa, [
      { wrId: 1, opcode: 'RDMA_WRITE', sgList: [src.sge(0, size)], rdma: { remoteAddr: wdst.va(0), rkey: wdst.rkey } },
      { wrId: 2, opcode: 'RDMA_READ', sgList: [rdst.sge(0, size)], rdma: { remoteAddr: rsrc.va(0), rkey: rsrc.rkey } },
      { wrId: 3, opcode: 'SEND', sgList: [src.sge(0, size)] },
    ]);
    const wcs = collect(p.clock, p.a.cq, 3);
    t.same(wcs.map((w) => [w.wrId, w.status]), [[1, 'SUCCESS'], [2, 'SUCCESS'], [3, 'SUCCESS']]);
    t.match(collect(p.clock, p.b.cq, 1), [{ wrId: 9, status: 'SUCCESS', byteLen: size }]);
    t.equal(sha256(wdst.buffer), sha256(src.buffer), 'WRITE');
    t.equal(sha256(rdst.buffer), sha256(rsrc.buffer), 'READ');
    t.equal(sha256(sdst.buffer), sha256(src.buffer), 'SEND');
    // 0xfffff0 + 64 (WRITE) + 64 (READ) + 64 (SEND) wraps to 0xb0.
    t.equal(qa.core.reqPsn, 0xb0, 'requester PSN wrapped');
    t.equal(qa.core.compPsn, 0xb0, 'completer PSN wrapped');
    t.equal(qb.core.respPsn, 0xb0, 'responder PSN wrapped');
    if (lossy) t.ok(p.a.ctx.counters.retransPkts > 0, 'losses were repaired across the wrap');
  });
}

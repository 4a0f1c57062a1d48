/**
 * A message of several packets leaves as views of its region, which the region hands out again
 * (`MemoryRegion.viewAt`): the same buffer sent, read or received into again after its bytes
 * changed carries the new bytes, a part of a region takes the general path, and the views are of
 * exactly their ranges.
 */
import t from 'tap';
import { postRecv, postSend, regMr } from '../../src/api/verbs.js';
import { MrTable, ProtectionDomain } from '../../src/core/mr.js';
import { ACCESS } from '../../src/core/types.js';
import { ALL_ACCESS, collect, connectPair, memoryPair, pattern, sha256 } from '../helpers/engine.js';

t.test('a region hands out the view of a part it made before, of exactly that part', async (t) => {
  const table = new MrTable();
  const backing = new Uint8Array(4096 + 32).map((_, i) => i & 0xff);
  const mr = table.register(new ProtectionDomain(1, {}), backing.subarray(32), ACCESS.LOCAL_WRITE);
  t.equal(mr.viewAt(0, 4096), mr.whole, 'the whole region: its own view');
  const a = mr.viewAt(256, 256);
  t.equal(mr.viewAt(256, 256), a, 'the same part again: the same view');
  t.not(mr.viewAt(256, 255), a, 'a part that ends elsewhere: a view of its own');
  t.not(mr.viewAt(257, 256), a);
  // Every 1-byte part (many share an entry of the table): each view over exactly its byte.
  const ok = Array.from({ length: 4096 }, (_, o) => o).every((o) => {
    const v = mr.viewAt(o, 1);
    return v.length === 1 && v.byteOffset === 32 + o && v[0] === ((32 + o) & 0xff);
  });
  t.ok(ok, 'every 1-byte part over its own byte');
  mr.viewAt(256, 256)[0] = 0xee;
  t.equal(backing[32 + 256], 0xee, 'a write through a part lands in the registered memory');
});

t.test('several-packet WRITE, READ and SEND of one region, twice with new bytes, and of part of a region', async (t) => {
  const p = await memoryPair({});
  const [qa, qb] = connectPair(p, 'RC', { pathMtu: 256 });
  const size = 8 * 256 + 100; // nine packets, the last short
  const src = regMr(p.a.pd, pattern(size, 1), ALL_ACCESS);
  const wdst = regMr(p.b.pd, new Uint8Array(size), ALL_ACCESS);
  const rsrc = regMr(p.b.pd, pattern(size, 2), ALL_ACCESS);
  const rdst = regMr(p.a.pd, new Uint8Array(size), ALL_ACCESS);
  const sdst = regMr(p.b.pd, new Uint8Array(size), ALL_ACCESS);
  for (const round of [1, 2]) {
    if (round === 2) {
      src.buffer.set(pattern(size, 3));
      rsrc.buffer.set(pattern(size, 4));
    }
    postRecv(qb, { wrId: 10 + round, sgList: [sdst.sge()] });
    postSend(qa, [
      { wrId: 1, opcode: 'RDMA_WRITE', sgList: [src.sge()], rdma: { remoteAddr: wdst.va(0), rkey: wdst.rkey } },
      { wrId: 2, opcode: 'RDMA_READ', sgList: [rdst.sge()], rdma: { remoteAddr: rsrc.va(0), rkey: rsrc.rkey } },
      { wrId: 3, opcode: 'SEND', sgList: [src.sge()] },
    ]);
    t.same(collect(p.clock, p.a.cq, 3).map((w) => [w.wrId, w.status]), [[1, 'SUCCESS'], [2, 'SUCCESS'], [3, 'SUCCESS']]);
    t.match(collect(p.clock, p.b.cq, 1), [{ wrId: 10 + round, status: 'SUCCESS', byteLen: size }]);
    t.equal(sha256(wdst.buffer), sha256(src.buffer), `round ${round}: WRITE`);
    t.equal(sha256(rdst.buffer), sha256(rsrc.buffer), `round ${round}: READ`);
    t.equal(sha256(sdst.buffer), sha256(src.buffer), `round ${round}: SEND`);
  }
  // Part of a region (from byte 100, over five packets): the general path.
  const part = 5 * 256 - 7;
  postSend(qa, { wrId: 4, opcode: 'RDMA_WRITE', sgList: [src.sge(100, part)], rdma: { remoteAddr: wdst.va(0), rkey: wdst.rkey } });
  t.match(collect(p.clock, p.a.cq, 1), [{ wrId: 4, status: 'SUCCESS' }]);
  t.equal(sha256(wdst.buffer.subarray(0, part)), sha256(src.buffer.subarray(100, 100 + part)), 'a part of a region');
});

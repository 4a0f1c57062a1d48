/**
 * Local SGE resolution (core/mr.ts `resolveSges`, IBTA 10.7.2.2): each SGE becomes a view of exactly
 * its bytes of the registered memory (also for a region that is a slice of a larger buffer, and for an
 * SGE that covers its whole region), and any violation refuses the whole list.
 */
import t from 'tap';
import { MrTable, ProtectionDomain, resolveSges } from '../../src/core/mr.js';
import { ACCESS } from '../../src/core/types.js';

t.test('SGEs resolve to views of their own bytes; violations refuse the list', async (t) => {
  const table = new MrTable();
  const pd = new ProtectionDomain(1, {});
  const other = new ProtectionDomain(2, {});
  const backing = new Uint8Array(64).map((_, i) => i);
  // A region in the middle of a larger buffer: views must start at the region, not at the buffer.
  const mr = table.register(pd, backing.subarray(16, 48), ACCESS.LOCAL_WRITE);
  const ro = table.register(pd, new Uint8Array(8), 0);
  const got = resolveSges(table, pd, [mr.sge(), mr.sge(4, 3), mr.sge(0, 0), mr.sge(31, 1)], true);
  t.ok(got, 'resolved');
  t.same(got!.map((v) => [...v]), [
    Array.from({ length: 32 }, (_, i) => 16 + i),
    [20, 21, 22],
    [47],
  ], 'the whole region, a middle slice, its last byte; the empty SGE is skipped');
  got![0]![0] = 0xaa;
  got![1]![0] = 0xbb;
  t.equal(backing[16], 0xaa, 'a write through the whole-region view lands in the registered memory');
  t.equal(backing[20], 0xbb, 'and through a slice');
  t.equal(resolveSges(table, other, [mr.sge()], false), undefined, 'another PD');
  t.equal(resolveSges(table, pd, [mr.sge(), ro.sge()], true), undefined, 'no LOCAL_WRITE on one of them');
  t.ok(resolveSges(table, pd, [ro.sge()], false), 'read-only memory is fine to send from');
  t.equal(resolveSges(table, pd, [{ addr: mr.va(30), length: 3, lkey: mr.lkey }], false), undefined, 'past the region');
  t.equal(resolveSges(table, pd, [{ addr: mr.va(0) - 1n, length: 1, lkey: mr.lkey }], false), undefined, 'before the region');
  t.equal(resolveSges(table, pd, [{ addr: mr.va(0), length: 1, lkey: mr.lkey ^ 0x100 }], false), undefined, 'an unknown L_Key');
});

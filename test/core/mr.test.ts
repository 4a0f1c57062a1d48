/**
 * Local SGE resolution (core/mr.ts `resolveSges`, IBTA 10.7.2.2): each SGE becomes a view of exactly
 * its bytes of the registered memory (also for a region that is a slice of a larger buffer, and for an
 * SGE that covers its whole region), and any violation refuses the whole list.
 */
import { inspect } from 'node:util';
import t from 'tap';
import fc from 'fast-check';
import { gather, MrTable, ProtectionDomain, resolveSges, scatter } from '../../src/core/mr.js';
import { newRethRecord, parseReth, parseRethInto } from '../../src/wire/reth.js';
import { ACCESS } from '../../src/core/types.js';

/**
 * A table with a writable region in the middle of a larger buffer (bytes 16 … 47 of `backing`, which
 * holds its own index: views must start at the region, not at the buffer) and a read-only one.
 */
function regions() {
  const table = new MrTable();
  const pd = new ProtectionDomain(1, {});
  const other = new ProtectionDomain(2, {});
  const backing = new Uint8Array(64).map((_, i) => i);
  const mr = table.register(pd, backing.subarray(16, 48), ACCESS.LOCAL_WRITE);
  const ro = table.register(pd, new Uint8Array(8), 0);
  return { table, pd, other, backing, mr, ro };
}

t.test('SGEs resolve to views of their own bytes; violations refuse the list', async (t) => {
  const { table, pd, other, backing, mr, ro } = regions();
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

t.test('the R_Key check gives the same answer from a parsed RETH (its VA in halves) as from the bigint alone', async (t) => {
  const table = new MrTable();
  const pd = new ProtectionDomain(1, {});
  const other = new ProtectionDomain(2, {});
  const regions = [
    table.register(pd, new Uint8Array(4096), ACCESS.LOCAL_WRITE | ACCESS.REMOTE_WRITE),
    table.register(pd, new Uint8Array(100), ACCESS.LOCAL_WRITE | ACCESS.REMOTE_READ),
    table.register(other, new Uint8Array(64), ACCESS.LOCAL_WRITE | ACCESS.REMOTE_WRITE),
  ];
  // VAs at and around each region's edges, the next 4 GiB slot's, across a carry of the low half,
  // and far away (a high half that differs by 2^20 and more: an offset no double holds exactly).
  const vas = (base: bigint, len: number): bigint[] => [
    base, base - 1n, base + 1n, base + BigInt(len) - 1n, base + BigInt(len), base + BigInt(len) + 1n,
    base - (1n << 32n), base + (1n << 32n), base + 0xffff_ffffn, base - 0x1_0000_0001n,
    base + (1n << 52n), base + (1n << 60n), base ^ (1n << 63n), 0n, (1n << 64n) - 1n,
  ];
  const wire = new Uint8Array(16);
  const dv = new DataView(wire.buffer);
  const rec = newRethRecord();
  let cases = 0;
  for (const mr of regions) {
    for (const va of vas(mr.va(), mr.length)) {
      if (va < 0n || va >= 1n << 64n) continue;
      for (const len of [0, 1, 8, mr.length, mr.length + 1]) {
        for (const access of [ACCESS.REMOTE_WRITE, ACCESS.REMOTE_READ]) {
          dv.setBigUint64(0, va);
          dv.setUint32(8, mr.rkey);
          dv.setUint32(12, len);
          parseRethInto(wire, 0, rec);
          t.equal(rec.vaHi! * 2 ** 32 + rec.vaLo!, Number(va), 'the halves are the VA');
          const plain = { ...table.remote(pd, mr.rkey, access, { va }, len) };
          const halves = { ...table.remote(pd, mr.rkey, access, rec, len) };
          if (JSON.stringify(plain, (_, v) => (v === mr ? 'mr' : v)) !== JSON.stringify(halves, (_, v) => (v === mr ? 'mr' : v))) {
            t.fail(`va 0x${va.toString(16)} len ${len} access ${access}: ${JSON.stringify(plain, (_, v) => (v === mr ? 'mr' : v))} vs ${JSON.stringify(halves, (_, v) => (v === mr ? 'mr' : v))}`);
          }
          cases++;
        }
      }
    }
  }
  t.ok(cases > 400, `${cases} cases agree`);
  // The answer is one record refilled: a refusal after a match leaves no region in it.
  const ok = table.remote(pd, regions[0]!.rkey, ACCESS.REMOTE_WRITE, { va: regions[0]!.va(16) }, 8);
  t.same({ ok: ok.ok, offset: ok.ok ? ok.offset : -1 }, { ok: true, offset: 16 });
  const bad = table.remote(pd, regions[0]!.rkey, ACCESS.REMOTE_WRITE, { va: regions[0]!.va(4096) }, 8);
  t.equal(bad, ok, 'the same record');
  t.same({ ...bad }, { ok: false, mr: undefined, offset: 0, fault: 'bounds' });
  // The halves stay out of what the record shows: it compares, serializes and prints as a RETH (its
  // `va` is the class's accessor, made from them).
  t.same(rec, parseReth(wire, 0));
  t.same(Object.keys(rec), ['rkey', 'dmaLength']);
  t.equal(inspect(rec), inspect(parseReth(wire, 0)));
});

t.test('one SGE over its whole region resolves to the region’s own list, checked like any other; other lists are their own', async (t) => {
  const { table, pd, other, mr, ro } = regions();
  const whole = resolveSges(table, pd, [mr.sge()], true)!;
  t.equal(resolveSges(table, pd, [mr.sge()], false), whole, 'the same list at every post');
  t.equal(whole.length, 1);
  t.same([...whole[0]!], Array.from({ length: 32 }, (_, i) => 16 + i), 'over the region’s bytes');
  // Part of the region, or the whole region beside another SGE: a list made for the post.
  const part = resolveSges(table, pd, [mr.sge(0, 31)], true)!;
  t.not(part, resolveSges(table, pd, [mr.sge(0, 31)], true), 'a part: a list per post');
  t.equal(part[0]!.length, 31);
  const two = resolveSges(table, pd, [mr.sge(), mr.sge(0, 2)], true)!;
  t.not(two, whole);
  t.same(two.map((v) => v.length), [32, 2], 'both SGEs');
  t.equal(whole.length, 1, 'the region’s list untouched');
  t.same(resolveSges(table, pd, [mr.sge(0, 0)], true), [], 'an empty SGE: no segments');
  // The checks still refuse a whole-region SGE.
  t.equal(resolveSges(table, other, [mr.sge()], false), undefined, 'another PD');
  t.equal(resolveSges(table, pd, [ro.sge()], true), undefined, 'no LOCAL_WRITE');
  t.equal(resolveSges(table, pd, [{ ...mr.sge(), lkey: mr.lkey ^ 0x100 }], false), undefined, 'an unknown L_Key');
  table.deregister(mr);
  t.equal(resolveSges(table, pd, [mr.sge()], false), undefined, 'a deregistered region');
});

t.test('scatter writes a payload across segments as into their concatenation, and gather reads it back', async (t) => {
  fc.assert(
    fc.property(fc.array(fc.nat(9), { maxLength: 5 }), fc.nat(40), fc.uint8Array({ maxLength: 30 }), (lengths, at, src) => {
      const segments = lengths.map((n, k) => new Uint8Array(n).fill(0xe0 + k));
      const total = lengths.reduce((a, b) => a + b, 0);
      const want = Uint8Array.from(segments.flatMap((s) => [...s]));
      const fits = at + src.length <= total;
      if (fits) want.set(src, at);
      if (scatter(segments, at, src) !== fits) return false;
      // Refused: nothing written; taken: exactly the bytes at `at` changed.
      if (segments.flatMap((s) => [...s]).join() !== [...want].join()) return false;
      if (!fits) return true;
      const parts: Uint8Array[] = [];
      gather(segments, at, src.length, parts);
      return parts.flatMap((p) => [...p]).join() === [...src].join();
    }),
    { numRuns: 3000 },
  );
  // The whole payload into one segment, at its start and inside it.
  const seg = new Uint8Array(8);
  t.ok(scatter([new Uint8Array(2), seg], 3, Uint8Array.of(1, 2, 3)));
  t.same([...seg], [0, 1, 2, 3, 0, 0, 0, 0]);
});

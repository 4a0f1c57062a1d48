/** FaultyLink: determinism, each fault kind, and bit flips caught by the receiving link's ICRC. */

import t from 'tap';
import { FaultyLink, Xorshift32, type FaultEvent, type FaultOptions } from '../../src/link/fault.js';
import { MemoryLink } from '../../src/link/memory.js';
import { UdpLink } from '../../src/link/udp.js';
import { VirtualClock, SystemClock } from '../../src/runtime/clock.js';
import { psnOf, recorder, sendOnly, until } from './helpers.js';

const N = 200;

/** Sends N packets a → b through a FaultyLink (tx side unless told), returns what happened. */
function run(opts: FaultOptions, side: 'tx' | 'rx' = 'tx') {
  const clock = new VirtualClock();
  const [a0, b0] = MemoryLink.pair(clock, { latencyUs: 3 });
  const events: FaultEvent[] = [];
  const wrapped = new FaultyLink(side === 'tx' ? a0 : b0, clock, { ...opts, onFault: (e) => events.push(e) });
  const a = side === 'tx' ? wrapped : a0;
  const b = side === 'tx' ? b0 : wrapped;
  const got = recorder(b);
  for (let i = 0; i < N; i++) {
    a.send(b.local, 0xc000, sendOnly(i, new Uint8Array(32).fill(i)));
    clock.advanceTo(clock.now() + 10);
  }
  clock.run();
  return { events, got, faulty: wrapped, receiver: b0, order: got.map((r) => psnOf(r.payload)) };
}

t.test('xorshift32 is the classic 13/17/5 generator', (t) => {
  const r = new Xorshift32(1);
  t.same([r.next(), r.next(), r.next()], [270369, 67634689, 2647435461]);
  t.equal(new Xorshift32(0).next() !== 0, true, 'seed 0 is remapped, never stuck at 0');
  t.end();
});

t.test('same seed, same fates; another seed, other fates', (t) => {
  const opts: FaultOptions = { seed: 42, dropPct: 10, corruptPct: 10, duplicatePct: 10, reorderPct: 10, fecnPct: 10, delayUs: 25 };
  const x = run(opts);
  const y = run(opts);
  const z = run({ ...opts, seed: 43 });
  t.ok(x.events.length > 50, `${x.events.length} faults injected`);
  t.same(y.events, x.events, 'identical fault sequence');
  t.same(y.order, x.order, 'identical arrival order');
  t.same(y.faulty.injected, x.faulty.injected);
  t.notSame(z.events, x.events, 'a different seed changes them');
  const rx1 = run({ ...opts, direction: 'rx' }, 'rx');
  const rx2 = run({ ...opts, direction: 'rx' }, 'rx');
  t.same(rx1.events, rx2.events, 'rx side deterministic too');
  t.ok(rx1.events.every((e) => e.dir === 'rx'));
  t.end();
});

t.test('drop', (t) => {
  const r = run({ seed: 1, dropPct: 100 });
  t.equal(r.got.length, 0);
  t.equal(r.faulty.injected.dropped, N);
  t.equal(r.faulty.drops.injectedLoss, N, 'counted in drops.injectedLoss');
  const some = run({ seed: 1, dropPct: 30 });
  t.equal(some.got.length + some.faulty.injected.dropped, N);
  t.ok(some.faulty.injected.dropped > 30 && some.faulty.injected.dropped < 90, `${some.faulty.injected.dropped} of ${N} dropped at 30 %`);
  t.end();
});

t.test('corrupt on tx: every flipped packet is dropped by the receiving link (strict ICRC)', (t) => {
  const r = run({ seed: 7, corruptPct: 100 });
  t.equal(r.faulty.injected.corrupted, N);
  t.equal(r.got.length, 0);
  t.equal(r.receiver.drops.badIcrc + r.receiver.drops.notRoce, N, 'badIcrc, or notRoce when the flip hit the BTH version');
  t.ok(r.events.every((e) => e.kind !== 'corrupt' || e.byte !== 4), 'never in BTH byte 4 (outside the ICRC)');
  const half = run({ seed: 7, corruptPct: 50 });
  t.equal(half.got.length, N - half.faulty.injected.corrupted, 'exactly the clean ones arrive');
  t.end();
});

t.test('corrupt on rx: flipped before the link checks, caught by that link', (t) => {
  const r = run({ seed: 9, corruptPct: 100, direction: 'rx' }, 'rx');
  t.equal(r.faulty.injected.corrupted, N);
  t.equal(r.got.length, 0);
  t.equal(r.receiver.drops.badIcrc + r.receiver.drops.notRoce, N);
  t.end();
});

t.test('duplicate', (t) => {
  const r = run({ seed: 3, duplicatePct: 100 });
  t.equal(r.got.length, 2 * N);
  t.same(r.order.slice(0, 4), [0, 0, 1, 1]);
  const rx = run({ seed: 3, duplicatePct: 100, direction: 'rx' }, 'rx');
  t.equal(rx.got.length, 2 * N);
  t.ok(rx.got.every((g) => g.meta.icrc === 'ok'), 'duplicates are intact copies');
  t.end();
});

t.test('reorder: held back by delayUs, later packets overtake, none lost', (t) => {
  const r = run({ seed: 5, reorderPct: 20, delayUs: 25 });
  t.equal(r.got.length, N);
  t.same([...r.order].sort((x, y) => x - y), Array.from({ length: N }, (_, i) => i), 'every packet arrives');
  t.notSame(r.order, Array.from({ length: N }, (_, i) => i), 'not in send order');
  const held = new Set(r.events.filter((e) => e.kind === 'reorder').map((e) => e.seq));
  const first = r.events.find((e) => e.kind === 'reorder' && ![1, 2, 3].some((k) => held.has(e.seq + k)))!;
  const idx = r.order.indexOf(first.seq);
  t.ok(r.order.indexOf(first.seq + 1) < idx && r.order.indexOf(first.seq + 2) < idx, 'overtaken by the next two (held 25 µs, sent 10 µs apart)');
  t.ok(r.order.indexOf(first.seq + 3) > idx, 'but not by the third');
  t.equal(r.faulty.injected.reordered, r.events.filter((e) => e.kind === 'reorder').length);
  t.end();
});

t.test('FECN mark (outside the ICRC) and CE on rx', (t) => {
  const r = run({ seed: 11, fecnPct: 100 });
  t.equal(r.got.length, N, 'marked packets stay valid');
  t.ok(r.got.every((g) => (g.payload[4]! & 0x80) !== 0 && g.meta.icrc === 'ok'), 'FECN set, ICRC ok');
  t.ok(r.got.every((g) => !g.meta.ce), 'no CE from the tx side');
  const rx = run({ seed: 11, fecnPct: 50, ceMark: true, direction: 'rx' }, 'rx');
  t.equal(rx.faulty.injected.marked, rx.got.filter((g) => g.meta.ce).length, 'CE on exactly the marked ones');
  t.ok(rx.got.every((g) => g.meta.ce === ((g.payload[4]! & 0x80) !== 0)));
  t.end();
});

t.test('options are validated', (t) => {
  const [a] = MemoryLink.pair(new VirtualClock());
  t.throws(() => new FaultyLink(a, new VirtualClock(), { seed: 1, dropPct: 101 }), RangeError);
  t.throws(() => new FaultyLink(a, new VirtualClock(), { seed: 1.5 }), RangeError);
  t.end();
});

t.test('over UdpLink: tx bit flips are caught by the receiving UdpLink', async (t) => {
  const a0 = await UdpLink.open({ address: '127.0.0.1', port: 0 });
  const b = await UdpLink.open({ address: '127.0.0.1', port: 0, icrcVerify: 'strict' });
  t.teardown(async () => {
    await a0.close();
    await b.close();
  });
  const a = new FaultyLink(a0, new SystemClock(), { seed: 2024, corruptPct: 50 });
  const got = recorder(b);
  for (let i = 0; i < 40; i++) a.send(b.local, 0xc000, sendOnly(i, new Uint8Array(100).fill(i)));
  const c = a.injected.corrupted;
  await until(() => got.length + b.drops.badIcrc + b.drops.notRoce === 40, 2000, 'all 40 judged');
  t.ok(c > 5 && c < 35, `${c} corrupted`);
  t.equal(got.length, 40 - c, 'the clean ones arrive');
  t.equal(b.drops.badIcrc + b.drops.notRoce, c, 'each corrupted one dropped');
});

/**
 * DeadlineHeap, under the device's QP deadlines and VirtualClock: items come out by deadline, equal
 * deadlines in insertion order, through random interleavings of pushes and pops.
 */
import t from 'tap';
import { DeadlineHeap } from '../../src/runtime/deadline-heap.js';
import { Xorshift32 } from '../../src/link/fault.js';

t.test('random pushes and pops: the order of a stable sort by deadline', async (t) => {
  const rng = new Xorshift32(0xdead);
  const h = new DeadlineHeap<number>();
  let model: { at: number; id: number }[] = [];
  let id = 0;
  let bad = 0;
  for (let step = 0; step < 20000; step++) {
    if (rng.next() % 3 !== 0) {
      const at = rng.next() % 50; // few distinct deadlines: many ties
      h.push(at, id);
      model.push({ at, id: id++ });
    } else {
      model.sort((a, b) => a.at - b.at || a.id - b.id);
      const want = model.shift();
      if (h.topAt() !== want?.at || h.top() !== want?.id) bad++;
      if (h.pop() !== want?.id) bad++;
    }
    if (h.size !== model.length) bad++;
  }
  t.equal(bad, 0, '20000 steps, no difference');
  h.clear();
  t.equal(h.size, 0);
  t.equal(h.pop(), undefined, 'empty after clear');
});

t.test('mostly sorted pushes (the ACK timers of many QPs) with earlier ones mixed in: still a stable sort', async (t) => {
  const rng = new Xorshift32(0xbeef);
  const h = new DeadlineHeap<number>();
  const model: { at: number; id: number }[] = [];
  // Kept sorted by (at, id): a new entry goes after every entry with the same deadline.
  const insert = (at: number, id: number): void => {
    let lo = 0;
    let hi = model.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (model[mid]!.at <= at) lo = mid + 1;
      else hi = mid;
    }
    model.splice(lo, 0, { at, id });
  };
  let id = 0;
  let now = 0;
  let bad = 0;
  let maxSize = 0;
  for (let step = 0; step < 50000; step++) {
    const r = rng.next() % 16;
    if (r < 9) {
      // now + a constant, as every QP's ACK deadline; now moves on as entries come due
      const at = now + 1000;
      h.push(at, id);
      insert(at, id++);
    } else if (r < 11) {
      const at = now + (rng.next() % 1500); // before or after the run's last: either lane
      h.push(at, id);
      insert(at, id++);
    } else {
      const want = model.shift();
      if (h.topAt() !== want?.at || h.top() !== want?.id) bad++;
      if (h.pop() !== want?.id) bad++;
      if (want !== undefined) now = Math.max(now, want.at - 900);
    }
    if (h.size !== model.length) bad++;
    maxSize = Math.max(maxSize, h.size);
  }
  t.equal(bad, 0, '50000 steps, no difference');
  t.ok(maxSize > 64, `the run grew past its first capacity (${maxSize} entries)`);
  t.same(h.values().sort((a, b) => a - b), model.map((m) => m.id).sort((a, b) => a - b), 'values() holds every entry of both lanes');
});

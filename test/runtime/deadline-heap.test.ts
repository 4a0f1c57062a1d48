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

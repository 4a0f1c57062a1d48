/**
 * WorkQueue, the ring under every send and receive queue: against a plain array model, through
 * growth, wrap-around, emptying and clearing, with absolute indices that outlive the front.
 */
import t from 'tap';
import { WorkQueue } from '../../src/core/wqe.js';
import { Xorshift32 } from '../../src/link/fault.js';

t.test('random pushes, shifts, clears: the same entries, order and absolute indices as an array', async (t) => {
  const rng = new Xorshift32(0x5eed);
  const q = new WorkQueue<number>();
  let model: number[] = [];
  let base = 0; // absolute index of model[0]
  let next = 0;
  let bad = 0;
  for (let step = 0; step < 20000; step++) {
    const r = rng.next() % 100;
    if (r < 50) {
      // Bursts of pushes, so that the ring grows well past its first capacity.
      const n = 1 + (rng.next() % 40);
      for (let i = 0; i < n; i++) {
        q.push(next);
        model.push(next++);
      }
    } else if (r < 97) {
      const n = 1 + (rng.next() % 40);
      for (let i = 0; i < n; i++) {
        const got = q.shift();
        const want = model.shift();
        if (want !== undefined) base++;
        if (got !== want) bad++;
      }
    } else {
      q.clear();
      base += model.length;
      model = [];
    }
    if (q.head !== base || q.tail !== base + model.length || q.length !== model.length) bad++;
    if (q.peek() !== model[0]) bad++;
    // Every live index, and the ones just outside.
    for (let a = base - 2; a < base + model.length + 2; a++) if (q.at(a) !== model[a - base]) bad++;
    if ([...q].join() !== model.join()) bad++;
  }
  t.equal(bad, 0, '20000 steps, no difference');
});

t.test('an emptied queue holds no entry alive', async (t) => {
  const q = new WorkQueue<object>();
  const refs: WeakRef<object>[] = [];
  for (let i = 0; i < 100; i++) {
    const o = { i };
    refs.push(new WeakRef(o));
    q.push(o);
  }
  while (q.shift() !== undefined);
  // What the ring still points to, read back by its slots: nothing.
  const slots = (q as unknown as { items: unknown[] }).items;
  t.ok(slots.every((x) => x === undefined), 'every slot cleared on shift');
  q.push({ i: -1 });
  q.clear();
  t.ok((q as unknown as { items: unknown[] }).items.every((x) => x === undefined), 'and on clear');
  t.equal(refs.length, 100);
});

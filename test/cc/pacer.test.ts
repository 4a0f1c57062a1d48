/** The token bucket: 8 Gb/s is 1000 bytes per µs, which keeps the arithmetic by hand. */

import t from 'tap';
import { Pacer } from '../../src/cc/pacer.js';
import { FixedRate } from '../../src/cc/fixed.js';

t.test('a full bucket lets a burst out, then the rate spaces packets', async (t) => {
  const p = new Pacer(8e9, 2000, 0);
  t.equal(p.nextSendAt(0, 1000), 0);
  p.onSend(0, 1000);
  t.equal(p.canSend(0, 1000), true, 'the second packet of the burst');
  p.onSend(0, 1000);
  t.equal(p.nextSendAt(0, 1000), 1, 'empty: 1000 bytes take 1 µs to accrue');
  t.equal(p.canSend(0.5, 1000), false);
  t.equal(p.canSend(1, 1000), true);
  // Idle for a long time: the bucket holds at most the burst.
  t.equal(p.nextSendAt(100, 1000), 100);
  p.onSend(100, 1000);
  p.onSend(100, 1000);
  t.equal(p.nextSendAt(100, 1000), 101);
});

t.test('a rate change keeps what accrued at the old rate', async (t) => {
  const p = new Pacer(8e9, 1000, 0);
  p.onSend(0, 1000); // empty at 0
  p.setRate(0.5, 4e9); // 500 bytes accrued at 8 Gb/s; 500 bytes/µs from now
  t.equal(p.nextSendAt(0.5, 1000), 1.5);
  t.equal(p.rateBps, 4e9);
});

t.test('a packet bigger than the bucket waits for a full bucket; sending anyway leaves a debt', async (t) => {
  const p = new Pacer(8e9, 1000, 0);
  t.equal(p.nextSendAt(0, 4000), 0, 'full bucket');
  p.onSend(0, 4000); // 1000 − 4000 = −3000
  t.equal(p.nextSendAt(0, 1000), 4, '3000 bytes of debt plus 1000 to accrue');
  t.throws(() => new Pacer(0, 1000));
  t.throws(() => new Pacer(1e9, 0));
});

t.test('FixedRate paces at its rate and ignores CNPs', async (t) => {
  const c = new FixedRate(8e9, 1000, 0);
  c.onSend(0, 1000);
  c.onCnp(0);
  t.equal(c.rateBps(0), 8e9);
  t.equal(c.nextSendAt(0, 1000), 1);
  t.equal(c.nextTimerAt(), undefined);
});

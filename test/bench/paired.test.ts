/**
 * The benchmarks' paired ratios: a figure over its baseline round by round, so that a slow stretch
 * of a shared machine, which slows both figures of a round alike, does not move the ratio.
 */
import t from 'tap';
import { median, pairedRatios } from '../../bench/harness.js';

t.test('median: the middle value, or the mean of the middle two', (t) => {
  t.equal(median([3, 1, 2]), 2);
  t.equal(median([4, 1, 3, 2]), 2.5);
  t.equal(median([5]), 5);
  t.end();
});

t.test('pairedRatios divides round k by round k, not median by median', (t) => {
  // The machine halves in speed for rounds 2 and 3; every round the N-QP case gets 0.9 of one QP.
  const single = [10, 5, 5, 10, 10].map((gbps) => ({ gbps }));
  const many = [9, 4.5, 4.5, 9, 9].map((gbps) => ({ gbps }));
  const r = pairedRatios(many, single, 'gbps');
  t.same(r.map((x) => Math.round(x * 100) / 100), [0.9, 0.9, 0.9, 0.9, 0.9]);
  t.equal(Math.round(median(r) * 100) / 100, 0.9);
  // A slow stretch that starts during round 1's N-QP case and ends with round 3: the ratio of the
  // two medians (4.5 / 10) reads half of what every unaffected round shows.
  const single2 = [10, 5, 5, 10, 10].map((gbps) => ({ gbps }));
  const many2 = [4.5, 4.5, 4.5, 9, 9].map((gbps) => ({ gbps }));
  t.equal(median(many2.map((x) => x.gbps)) / median(single2.map((x) => x.gbps)), 0.45);
  t.equal(Math.round(median(pairedRatios(many2, single2, 'gbps')) * 100) / 100, 0.9);
  t.end();
});

t.test('pairedRatios pairs only the rounds both cases have', (t) => {
  const r = pairedRatios([{ gbps: 8 }, { gbps: 6 }, { gbps: 7 }], [{ gbps: 10 }, { gbps: 10 }], 'gbps');
  t.same(r, [0.8, 0.6]);
  t.end();
});

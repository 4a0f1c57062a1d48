/**
 * The paper's qualitative results, reproduced by the simulator running the real RP and NP
 * (Zhu et al., SIGCOMM 2015, §5–6): flows sharing a 40 Gb/s bottleneck converge to a fair
 * share with a queue held near Kmin..Kmax; an incast stays fair; without congestion control
 * the queue fills to its limit and drops. Every run is seeded; the figures go to the log.
 */

import t from 'tap';
import { runDcqcnSim, type DcqcnSimOptions, type DcqcnSimResult } from '../../src/sim/dcqcn-sim.js';
import { CX_RPG_BYTE_RESET_BYTES } from '../../src/cc/profiles.js';
import { jainIndex, percentile } from '../../src/sim/stats.js';
import { redProbability } from '../../src/sim/bottleneck.js';
import { Rng } from '../../src/sim/rng.js';
import { EventQueue } from '../../src/sim/event-queue.js';

const KMIN = 5 * 1024;
const KMAX = 200 * 1024;

function run(o: DcqcnSimOptions): DcqcnSimResult {
  return runDcqcnSim(o);
}

function report(t: { comment: (...a: unknown[]) => unknown }, name: string, r: DcqcnSimResult): void {
  const g = (b: number): string => (b / 1e9).toFixed(2);
  const q = r.queueSecondHalf;
  t.comment(
    `${name}: jain ${r.jainSecondHalf.toFixed(4)}, rates ${g(Math.min(...r.secondHalfBps))}..${g(Math.max(...r.secondHalfBps))} Gb/s, ` +
      `total ${g(r.secondHalfBps.reduce((a, b) => a + b, 0))} Gb/s; queue median ${(q.medianBytes / 1024).toFixed(1)} KiB, ` +
      `p99 ${(q.p99Bytes / 1024).toFixed(1)} KiB (Kmin 5, Kmax 200); drops ${r.drops}, CNPs ${r.cnpsSent}`,
  );
}

t.test('2 flows at 40 Gb/s share fairly with a bounded queue (paper profile, 100 ms)', async (t) => {
  const r = run({ flows: 2, durationUs: 100_000, seed: 1 });
  report(t, '2 flows', r);
  t.ok(r.jainSecondHalf >= 0.95, `Jain ${r.jainSecondHalf} ≥ 0.95 over 50–100 ms`);
  t.ok(r.secondHalfBps.reduce((a, b) => a + b, 0) >= 0.95 * 40e9, 'the link stays busy');
  t.ok(r.queueSecondHalf.p99Bytes <= KMAX, `p99 queue ${r.queueSecondHalf.p99Bytes} ≤ Kmax`);
  t.ok(r.queueSecondHalf.medianBytes >= KMIN && r.queueSecondHalf.medianBytes <= KMAX, 'median queue between Kmin and Kmax');
  t.equal(r.drops, 0);
  t.ok(r.cnpsSent > 0 && r.cuts === r.cnpsSent, 'every CNP cut a rate (paper: cut on each CNP)');
});

t.test('a late second flow converges to the fair share', async (t) => {
  const r = run({ flows: 2, durationUs: 100_000, startGapUs: 10_000, seed: 2 });
  report(t, '2 flows, 10 ms apart', r);
  t.ok(r.jainSecondHalf >= 0.95, `Jain ${r.jainSecondHalf}`);
});

t.test('a 16-flow incast stays fair', async (t) => {
  const r = run({ flows: 16, durationUs: 100_000, seed: 3 });
  report(t, '16-flow incast', r);
  t.ok(r.jainSecondHalf >= 0.95, `Jain ${r.jainSecondHalf}`);
  t.ok(r.queueSecondHalf.p99Bytes <= 1.5 * KMAX, `p99 queue ${r.queueSecondHalf.p99Bytes} within 1.5 × Kmax once settled`);
  t.ok(r.secondHalfBps.reduce((a, b) => a + b, 0) >= 0.9 * 40e9);
});

t.test('the ConnectX profile: 16-flow incast fair too', async (t) => {
  const r = run({ flows: 16, durationUs: 100_000, profile: 'cx', seed: 4 });
  report(t, '16-flow incast, cx', r);
  t.ok(r.jainSecondHalf >= 0.95, `Jain ${r.jainSecondHalf}`);
  t.ok(r.queueSecondHalf.p99Bytes <= 1.5 * KMAX);
});

t.test('the ConnectX profile with the firmware byte counter on does not drain an incast (why it is off)', async (t) => {
  const r = run({ flows: 16, durationUs: 50_000, profile: 'cx', overrides: { byteCounterBytes: CX_RPG_BYTE_RESET_BYTES }, seed: 4 });
  report(t, '16-flow incast, cx + byte counter', r);
  t.ok(r.queueSecondHalf.p99Bytes > 0.9 * 4 * 1024 * 1024, 'the queue keeps returning to its tail-drop limit');
  t.ok(r.drops > 100_000, `${r.drops} drops, against about 2 000 with the counter off`);
});

t.test('without congestion control the queue hits its limit and drops', async (t) => {
  const limit = 1024 * 1024;
  const r = run({ flows: 2, durationUs: 20_000, cc: false, queueLimitBytes: limit, seed: 5 });
  report(t, '2 flows, no CC', r);
  t.ok(r.queueMaxBytes >= limit - r.packetBytes, `queue reached ${r.queueMaxBytes} of ${limit}`);
  t.ok(r.drops > 0, `${r.drops} drops`);
  t.equal(r.marked, 0, 'marking ignored');
  t.equal(r.cnpsSent, 0);
  t.ok(r.secondHalfBps.reduce((a, b) => a + b, 0) >= 0.99 * 40e9, 'the bottleneck itself is saturated');
});

t.test('deterministic: the same seed gives the same run, another seed another', async (t) => {
  const a = run({ flows: 4, durationUs: 5_000, seed: 9 });
  const b = run({ flows: 4, durationUs: 5_000, seed: 9 });
  const c = run({ flows: 4, durationUs: 5_000, seed: 10 });
  t.same(a.deliveredBytes, b.deliveredBytes);
  t.equal(a.events, b.events);
  t.equal(a.marked, b.marked);
  t.not(JSON.stringify(a.deliveredBytes), JSON.stringify(c.deliveredBytes));
});

t.test('samples every interval, rates and queue as the RP and the switch see them', async (t) => {
  const times: number[] = [];
  let maxRate = 0;
  runDcqcnSim({
    flows: 3, durationUs: 1000, sampleIntervalUs: 10,
    onSample: (ts, rates, q) => {
      times.push(ts);
      for (const r of rates) maxRate = Math.max(maxRate, r);
      t.ok(q >= 0);
    },
  });
  t.equal(times.length, 101, '0, 10, …, 1000');
  t.ok(times.every((x, i) => i === 0 || Math.abs(x - times[i - 1]! - 10) < 1e-9));
  t.equal(maxRate, 40e9, 'flows start at line rate');
  t.throws(() => runDcqcnSim({ flows: 0, durationUs: 10 }), /flows/);
  t.throws(() => runDcqcnSim({ flows: 1, durationUs: 10, kminBytes: 10, kmaxBytes: 5 }), /Kmin/);
});

t.test('building blocks: RED curve, Jain, percentiles, RNG, event order', async (t) => {
  const red = { kminBytes: 100, kmaxBytes: 300, pMax: 0.1, limitBytes: 1000, marking: true };
  t.equal(redProbability(99, red), 0);
  t.equal(redProbability(200, red), 0.05);
  t.equal(redProbability(300, red), 1);
  t.equal(jainIndex([1, 1, 1, 1]), 1);
  t.equal(jainIndex([1, 0, 0, 0]), 0.25);
  t.equal(percentile([1, 2, 3, 4], 0.5), 2);
  t.equal(percentile([1, 2, 3, 4], 0.99), 4);
  const r1 = new Rng(42);
  const r2 = new Rng(42);
  const xs = Array.from({ length: 1000 }, () => r1.next());
  t.same(xs.slice(0, 5), Array.from({ length: 5 }, () => r2.next()));
  t.ok(xs.every((x) => x >= 0 && x < 1));
  const mean = xs.reduce((a, b) => a + b, 0) / xs.length;
  t.ok(Math.abs(mean - 0.5) < 0.05, `mean ${mean}`);
  const q = new EventQueue(2);
  const order: number[] = [];
  [5, 1, 3, 1, 2, 5].forEach((time, i) => q.push(time, 0, i));
  while (q.pop()) order.push(q.popArg);
  t.same(order, [1, 3, 4, 2, 0, 5], 'by time, ties in insertion order');
});

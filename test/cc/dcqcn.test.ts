/**
 * The reaction point's arithmetic against sequences of CNPs, timer expiries and sends whose
 * results are worked out by hand below (G = 1e9 bit/s; line rate 40 G throughout).
 */

import t from 'tap';
import { DcqcnRp } from '../../src/cc/dcqcn.js';
import { CX_PROFILE, PAPER_PROFILE } from '../../src/cc/profiles.js';
import { createCongestionControl, dcqcnParams } from '../../src/cc/controller.js';

const G = 1e9;
/** Equal up to float rounding (the sequences multiply and halve, never approximate). */
const close = (tt: { ok: (v: boolean, msg: string) => unknown }, got: number, want: number, msg: string): void => {
  tt.ok(Math.abs(got - want) <= Math.abs(want) * 1e-12 + 1e-6, `${msg}: ${got} ≈ ${want}`);
};

t.test('paper: a fresh flow runs at line rate and has nothing to wake up for', async (t) => {
  const rp = new DcqcnRp({ lineRateBps: 40 * G });
  t.equal(rp.rateBps(0), 40 * G);
  t.equal(rp.nextTimerAt(), undefined);
  t.equal(rp.state(1000).stage, 'line');
});

t.test('paper: two CNPs, five fast-recovery steps, then additive increase, then α decay into a third cut', async (t) => {
  const rp = new DcqcnRp({ lineRateBps: 40 * G, params: PAPER_PROFILE });
  const g = 1 / 256;
  // CNP at 0: R_T = 40 G, R_C = 40·(1 − 1/2) = 20 G, α = (1 − g)·1 + g = 1.
  rp.onCnp(0);
  let s = rp.state(0);
  t.equal(s.rateBps, 20 * G);
  t.equal(s.targetRateBps, 40 * G);
  t.equal(s.alpha, 1);
  t.equal(rp.nextTimerAt(), 55, 'the rate-increase timer runs from the cut');
  // CNP at 10, before any α period has passed: R_T = 20 G, R_C = 10 G, α stays 1.
  rp.onCnp(10);
  s = rp.state(10);
  t.equal(s.rateBps, 10 * G);
  t.equal(s.targetRateBps, 20 * G);
  t.equal(rp.nextTimerAt(), 65, 'restarted by the second cut');
  // Timer expiries at 65, 120, 175, 230, 285 (T = 1..5 ≤ F = 5): fast recovery halves the gap.
  const fr = [15, 17.5, 18.75, 19.375, 19.6875];
  fr.forEach((want, i) => {
    const at = 65 + 55 * i;
    const st = rp.state(at);
    t.equal(st.timerStage, i + 1);
    t.equal(st.stage, 'fast');
    close(t, st.rateBps, want * G, `R_C after fast-recovery step ${i + 1} at ${at} µs`);
    t.equal(st.targetRateBps, 20 * G);
  });
  // 340 (T = 6 > F, BC = 0): additive: R_T = 20 G + 40 M, R_C = (20.04 + 19.6875)/2 = 19.86375 G.
  s = rp.state(340);
  t.equal(s.stage, 'additive');
  close(t, s.targetRateBps, 20.04 * G, 'R_T after the first additive step');
  close(t, s.rateBps, 19.86375 * G, 'R_C after the first additive step');
  // 395 (T = 7): R_T = 20.08 G, R_C = (20.08 + 19.86375)/2 = 19.971875 G.
  s = rp.state(395);
  close(t, s.targetRateBps, 20.08 * G, 'R_T after the second additive step');
  close(t, s.rateBps, 19.971875 * G, 'R_C after the second additive step');
  // α decayed once per K = 55 µs since the CNP at 10: seven periods by 395.
  close(t, s.alpha, (1 - g) ** 7, 'α after seven quiet periods');
  // CNP at 400: α is still (1 − g)^7 (the eighth period ends at 450); R_T = R_C; R_C cut by α/2.
  rp.onCnp(400);
  s = rp.state(400);
  const a7 = (1 - g) ** 7;
  close(t, s.targetRateBps, 19.971875 * G, 'R_T = R_C at the cut');
  close(t, s.rateBps, 19.971875 * G * (1 - a7 / 2), 'R_C = R_C·(1 − α/2)');
  close(t, s.alpha, (1 - g) * a7 + g, 'α = (1 − g)α + g');
  t.equal(s.timerStage, 0);
  t.equal(rp.counters.cuts, 3);
  t.equal(rp.counters.fastRecovery, 5);
  t.equal(rp.counters.additive, 2);
});

t.test('paper: the byte counter drives stages too, and hyper increase grows by i·R_HAI', async (t) => {
  // F = 1 and B = 1000 bytes so that a handful of sends walks through every stage.
  const rp = new DcqcnRp({ lineRateBps: 40 * G, params: dcqcnParams('paper', { fastRecoverySteps: 1, byteCounterBytes: 1000 }) });
  rp.onCnp(0); // R_C 20 G, R_T 40 G
  rp.onCnp(1); // R_C 10 G, R_T 20 G, timer due at 56
  // Send at 2: BC = 1, T = 0, max = 1 ≤ F: fast recovery, R_C = 15 G.
  rp.onSend(2, 1000);
  let s = rp.state(2);
  t.equal(s.stage, 'fast');
  close(t, s.rateBps, 15 * G, 'fast recovery on the byte counter');
  // Send at 3: BC = 2, T = 0: max > F, min = 0: additive, R_T 20.04 G, R_C (20.04 + 15)/2 = 17.52 G.
  rp.onSend(3, 1000);
  s = rp.state(3);
  t.equal(s.stage, 'additive');
  close(t, s.rateBps, 17.52 * G, 'additive on the byte counter');
  // Timer at 56: T = 1, BC = 2, min = 1 = F: additive, R_T 20.08 G, R_C (20.08 + 17.52)/2 = 18.8 G.
  s = rp.state(56);
  t.equal(s.stage, 'additive');
  close(t, s.rateBps, 18.8 * G, 'additive on the timer');
  // Timer at 111: T = 2, BC = 2, min = 2 > F: hyper with i = 1: R_T 20.28 G, R_C 19.54 G.
  s = rp.state(111);
  t.equal(s.stage, 'hyper');
  close(t, s.targetRateBps, 20.28 * G, 'R_T += 1·R_HAI');
  close(t, s.rateBps, 19.54 * G, 'R_C after the first hyper step');
  // Send at 112: BC = 3, T = 2: i = 1 again: R_T 20.48 G, R_C (20.48 + 19.54)/2 = 20.01 G.
  rp.onSend(112, 1000);
  close(t, rp.state(112).rateBps, 20.01 * G, 'hyper on the byte counter');
  // Timer at 166: T = 3, BC = 3, i = 2: R_T 20.88 G, R_C (20.88 + 20.01)/2 = 20.445 G.
  s = rp.state(166);
  close(t, s.targetRateBps, 20.88 * G, 'R_T += 2·R_HAI');
  close(t, s.rateBps, 20.445 * G, 'R_C after the second-order hyper step');
  // 2999 more bytes than B: two more events, and 999 bytes carried toward the next one.
  rp.onSend(167, 2999);
  t.equal(rp.state(167).byteStage, 5);
});

t.test('paper: recovery stops at the line rate and the timer goes quiet', async (t) => {
  const rp = new DcqcnRp({ lineRateBps: 40 * G });
  rp.onCnp(0); // 20 G toward 40 G: each fast-recovery step halves a 20 G gap.
  const s = rp.state(55 * 80);
  t.equal(s.rateBps, 40 * G);
  t.equal(s.stage, 'line');
  t.equal(rp.nextTimerAt(), undefined);
});

t.test('paper: the rate never goes below the floor', async (t) => {
  const rp = new DcqcnRp({ lineRateBps: 40 * G, params: dcqcnParams('paper', { minRateBps: 6 * G }) });
  rp.onCnp(0); // 20 G
  rp.onCnp(1); // 10 G
  rp.onCnp(2); // 5 G → clamped to 6 G
  t.equal(rp.rateBps(2), 6 * G);
});

t.test('connectx: CNPs raise flags; the cut waits for the monitor period and α moves per 1 µs period', async (t) => {
  const rp = new DcqcnRp({ lineRateBps: 40 * G, params: CX_PROFILE });
  const g = 5 / 1024;
  const keep = 1 - g;
  // First CNP at 0.5: α = 1023/1024, the monitor grid starts at 0.5, the cut is due at 4.5.
  rp.onCnp(0.5);
  t.equal(rp.rateBps(4.4), 40 * G, 'no cut before the monitor boundary');
  t.equal(rp.nextTimerAt(), 4.5);
  // At 4.5, four α periods have ended: [0.5,1.5) saw the CNP, the other three did not.
  let alpha = keep * (1023 / 1024) + g;
  alpha *= keep ** 3;
  let s = rp.state(4.5);
  close(t, s.alpha, alpha, 'α at the first cut');
  // No clamp (no timer increase yet, CLAMP_TGT_RATE off): R_T stays 40 G; R_C = 40·max(1 − α/2, 0.5).
  close(t, s.rateBps, 40 * G * Math.max(1 - alpha / 2, 0.5), 'the first cut');
  t.equal(s.targetRateBps, 40 * G);
  const afterFirst = s.rateBps;
  // CNPs at 5.5 and 6.2 ask for one cut, due at the next boundary, 8.5.
  rp.onCnp(5.5);
  rp.onCnp(6.2);
  t.equal(rp.nextTimerAt(), 8.5);
  // α: [4.5,5.5) quiet; [5.5,6.5) saw CNPs; [6.5,7.5) and [7.5,8.5) quiet.
  alpha = keep * alpha;
  alpha = keep * alpha + g;
  alpha *= keep ** 2;
  s = rp.state(8.5);
  close(t, s.alpha, alpha, 'α at the second cut');
  close(t, s.rateBps, afterFirst * Math.max(1 - alpha / 2, 0.5), 'one cut for two CNPs');
  t.equal(rp.counters.cuts, 2);
  t.equal(rp.counters.cnps, 3);
  t.equal(s.targetRateBps, 40 * G, 'still unclamped: no timer increase between the cuts');
  // Timer at 8.5 + 300: T = 1 ≤ F = 1: fast recovery toward 40 G.
  const rc = s.rateBps;
  s = rp.state(308.5);
  t.equal(s.stage, 'fast');
  close(t, s.rateBps, (40 * G + rc) / 2, 'fast recovery');
  // A CNP now: after a timer increase the cut clamps R_T to R_C.
  const before = s.rateBps;
  rp.onCnp(309);
  s = rp.state(312.5);
  close(t, s.targetRateBps, before, 'clamped after a timer increase');
});

t.test('connectx: without a byte counter the timer alone walks fast, additive, hyper (+R_HAI each)', async (t) => {
  const rp = new DcqcnRp({ lineRateBps: 40 * G, params: dcqcnParams('cx', { minDecreaseFactorPercent: 0, initialAlpha: 1 }) });
  rp.onCnp(0);
  rp.onCnp(4.5);
  let s = rp.state(8);
  const rc0 = s.rateBps;
  const rt0 = s.targetRateBps;
  t.equal(rt0, 40 * G);
  // Cut at 8 (second boundary) — T resets; events at 308 (fast), 608 (additive), 908 and 1208 (hyper).
  s = rp.state(308);
  t.equal(s.stage, 'fast');
  const r1 = (rt0 + rc0) / 2;
  close(t, s.rateBps, r1, 'fast');
  s = rp.state(608);
  t.equal(s.stage, 'additive');
  close(t, s.targetRateBps, 40 * G, 'R_T capped at the line rate');
  close(t, s.rateBps, (40 * G + r1) / 2, 'additive');
  s = rp.state(908);
  t.equal(s.stage, 'hyper');
});

t.test('the factory: none ignores CNPs, dcqcn reacts', async (t) => {
  const none = createCongestionControl({ kind: 'none', lineRateBps: 10 * G });
  none.onCnp(0);
  t.equal(none.rateBps(0), 10 * G);
  t.equal(none.kind, 'fixed');
  const dc = createCongestionControl({ kind: 'dcqcn', lineRateBps: 10 * G, profile: 'cx' });
  dc.onCnp(0);
  dc.onTimer(4);
  t.equal(dc.kind, 'dcqcn');
  t.ok(dc.rateBps(4) < 10 * G);
  t.throws(() => new DcqcnRp({ lineRateBps: 10 * G, params: dcqcnParams('paper', { alphaGain: 0 }) }), /alphaGain/);
});

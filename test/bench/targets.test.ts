/**
 * The targets' verdicts on a run's rows (`bench/targets.ts`): what each target reads, and that a
 * failed or missing row never passes for a met target.
 */
import { readFileSync } from 'node:fs';
import t from 'tap';
import type { BenchRow } from '../../bench/harness.js';
import { latRowName } from '../../bench/latency.bench.js';
import { goodputRowName, heapRowName, QP_COUNTS } from '../../bench/qpscale.bench.js';
import { rcRowName } from '../../bench/rc.bench.js';
import { formatVerdicts, judgeTargets, TARGETS } from '../../bench/targets.js';

/** A recorded full run (`npm run bench -- --json`), its nulls back to NaN and undefined. */
function recorded(stamp: string): BenchRow[] {
  const raw = JSON.parse(readFileSync(new URL(`../../../bench/profiles/full-run-${stamp}.json`, import.meta.url), 'utf8')) as {
    name: string;
    value: number | null;
    unit: string;
    baseline: string | null;
    ratio: number | null;
  }[];
  return raw.map((r) => ({ name: r.name, value: r.value ?? NaN, unit: r.unit, ...(r.baseline !== null ? { baseline: r.baseline } : {}), ...(r.ratio !== null ? { ratio: r.ratio } : {}) }));
}

const verdictOf = (rows: readonly BenchRow[], prefix: string) => judgeTargets(rows).find((v) => v.target.name.startsWith(prefix))!;

t.test('each target reads the rows the suites name', (t) => {
  const byName = (prefix: string) => TARGETS.find((x) => x.name.startsWith(prefix))!.rows;
  for (const op of ['WRITE'] as const) for (const size of [4096, 1 << 20]) t.match(rcRowName(op, 4096, size), byName('RC WRITE'));
  for (const op of ['READ', 'SEND'] as const) {
    t.match(rcRowName(op, 4096, 4096), byName('RC READ'));
    t.notMatch(rcRowName(op, 1024, 4096), byName('RC READ'), 'MTU 1024 is not a target row');
  }
  t.notMatch(rcRowName('WRITE', 1024, 4096), byName('RC WRITE'));
  type LatCase = Parameters<typeof latRowName>[0];
  const pingPongs: LatCase[] = [
    { mode: 'SEND', size: 48, datagram: 64 },
    { mode: 'WRITE', size: 32, datagram: 64 },
    { mode: 'WRITE_WITH_IMM', size: 28, datagram: 64 },
  ];
  for (const c of pingPongs) {
    t.match(latRowName(c, 'median'), byName('ping-pong'));
    t.notMatch(latRowName(c, 'p99'), byName('ping-pong'), 'the p99 is reported, not a target');
  }
  for (const n of QP_COUNTS.filter((n) => n > 1)) {
    t.match(heapRowName(n), byName('< 4 KiB'));
    t.match(goodputRowName(n), byName('aggregate'));
  }
  // One QP is the baseline of the others; its own ratio is to the dgram blast.
  t.notMatch(goodputRowName(1), byName('aggregate'));
  t.end();
});

t.test('a recorded full run: the targets it met and the one it missed', (t) => {
  const rows = recorded('2026-12-07T2307');
  const v = judgeTargets(rows);
  t.same(
    v.map((x) => [x.target.name.split(' ')[0], x.rows.length, x.met]),
    [
      ['RC', 2, true],
      ['RC', 4, true],
      ['ping-pong', 4, true],
      // 14 rows: 7 paths at 2 MTUs; the opt-in scatter path read 1.27 and 1.19.
      ['ICRC', 14, false],
      ['<', 3, true],
      ['aggregate', 3, true],
    ],
  );
  const icrc = verdictOf(rows, 'ICRC');
  t.same(
    icrc.rows.filter((r) => r.met === false).map((r) => r.name),
    ['MTU 1024: icrcOfParts [bth, payload] (dgram scatter path)', 'MTU 4096: icrcOfParts [bth, payload] (dgram scatter path)'],
  );
  t.notOk(icrc.rows.some((r) => r.name.includes('JS ICRC')), 'the JavaScript fallback is not a target path');
  // The run at 22:12 missed the ping-pong (WRITE_WITH_IMM 1.62).
  const pp = verdictOf(recorded('2026-12-07T2212'), 'ping-pong');
  t.equal(pp.met, false);
  t.same(pp.rows.filter((r) => r.met === false).map((r) => r.name), ['rc ping-pong WRITE_WITH_IMM 28 B (64 B datagram): RTT median']);
  t.end();
});

t.test('a failed or missing row is never a pass', (t) => {
  const write = (ratio: number): BenchRow => ({ name: rcRowName('WRITE', 4096, 4096), value: 1, unit: 'Gbit/s', baseline: 'b', ratio });
  const big = (ratio: number): BenchRow => ({ name: rcRowName('WRITE', 4096, 1 << 20), value: 1, unit: 'Gbit/s', baseline: 'b', ratio });
  t.equal(verdictOf([write(2), big(2)], 'RC WRITE').met, true);
  t.equal(verdictOf([write(2), big(0.79)], 'RC WRITE').met, false, 'one row under the bound misses the target');
  t.equal(verdictOf([write(2), big(NaN)], 'RC WRITE').met, undefined, 'a failed row leaves it open');
  const { ratio: _, ...noRatio } = big(2);
  t.equal(verdictOf([write(2), noRatio], 'RC WRITE').met, undefined, 'a row without a ratio too');
  t.equal(verdictOf([write(0.5), big(NaN)], 'RC WRITE').met, false, 'a miss is a miss whatever else failed');
  t.equal(verdictOf([], 'RC WRITE').met, undefined, 'no row at all');
  // Bounds at the line: ≥ and ≤ hold at equality, "below" does not.
  t.equal(verdictOf([write(0.8), big(0.8)], 'RC WRITE').met, true);
  const heap = (value: number): BenchRow => ({ name: heapRowName(100), value, unit: 'B' });
  t.equal(verdictOf([heap(4095)], '< 4 KiB').met, true);
  t.equal(verdictOf([heap(4096)], '< 4 KiB').met, false);
  const text = formatVerdicts(judgeTargets([write(2), big(NaN), heap(5000)]));
  t.match(text, /^UNKNOWN RC WRITE .*: 2\.00–2\.00 over 1 row$/m);
  t.match(text, /^ +rc WRITE 1 MiB mtu 4096: goodput: no figure$/m);
  t.match(text, /^MISSED  < 4 KiB .*: 5000 B–5000 B over 1 row$/m);
  t.match(text, /^ +qpscale 100 RC QPs: heap per idle QP: 5000 B$/m);
  t.match(text, /^UNKNOWN ping-pong .*: no figure\n +no row of this run matches$/m);
  t.end();
});

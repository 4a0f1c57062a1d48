/**
 * `roce sim dcqcn` through `simCommand`: the CSV header and sampling, and an SVG that is
 * well-formed XML holding the expected series.
 */

import t from 'tap';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { simCommand } from '../../src/cli/sim.js';
import { CliError } from '../../src/cli/errors.js';

const dir = mkdtempSync(join(tmpdir(), 'roce-sim-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));

/** A small well-formedness check: balanced tags, quoted attributes, one root, escaped text. */
function checkXml(xml: string): { ok: boolean; why?: string; root?: string } {
  const body = xml.replace(/^<\?xml[^?]*\?>\s*/, '');
  const stack: string[] = [];
  let root: string | undefined;
  const tag = /<(\/?)([A-Za-z][\w:-]*)((?:\s+[\w:-]+="[^"<]*")*)\s*(\/?)>|<|&(?!(?:amp|lt|gt|quot|apos);)/g;
  let m: RegExpExecArray | null;
  while ((m = tag.exec(body))) {
    if (m[0] === '<') return { ok: false, why: `stray '<' at ${m.index}` };
    if (m[0] === '&') return { ok: false, why: `bare '&' at ${m.index}` };
    const [, close, name, , selfClose] = m;
    if (close) {
      if (stack.pop() !== name) return { ok: false, why: `mismatched </${name}> at ${m.index}` };
    } else {
      if (stack.length === 0) {
        if (root) return { ok: false, why: 'two roots' };
        root = name;
      }
      if (!selfClose) stack.push(name!);
    }
  }
  return stack.length === 0 && root ? { ok: true, root } : { ok: false, why: `unclosed ${stack.join(',')}` };
}

t.test('CSV: exact header, a rate row per flow and a queue row every 10 µs', async (t) => {
  const csv = join(dir, 'run.csv');
  const svg = join(dir, 'run.svg');
  const lines: string[] = [];
  const code = simCommand(['dcqcn', '--flows', '3', '--duration-ms', '2', '--csv', csv, '--svg', svg, '--seed', '7'], (l) => lines.push(l));
  t.equal(code, 0);
  t.match(lines.join('\n'), /jain 1–2 ms: [01]\.\d{4}/);
  t.match(lines.join('\n'), /queue 1–2 ms: median .*Kmin 5 KiB, Kmax 200 KiB/);
  const rows = readFileSync(csv, 'utf8').trimEnd().split('\n');
  t.equal(rows[0], 'time_us,kind,id,value');
  const times = new Map<number, string[]>();
  for (const row of rows.slice(1)) {
    const [ts, kind, id, value] = row.split(',');
    t.ok(kind === 'rate' || kind === 'queue', row);
    if (kind === 'rate') t.ok(['0', '1', '2'].includes(id!) && Number(value) >= 0 && Number(value) <= 40e9, row);
    else t.ok(id === 'bottleneck' && Number.isInteger(Number(value)), row);
    const k = Number(ts);
    times.set(k, [...(times.get(k) ?? []), `${kind}:${id}`]);
  }
  const ts = [...times.keys()].sort((a, b) => a - b);
  t.equal(ts[0], 0);
  t.equal(ts[ts.length - 1], 2000);
  t.ok(ts.every((x, i) => i === 0 || x - ts[i - 1]! <= 10 + 1e-9), 'sampled at least every 10 µs');
  t.ok([...times.values()].every((v) => v.length === 4 && v.includes('queue:bottleneck')), 'every instant: 3 rates and the queue');

  const xml = readFileSync(svg, 'utf8');
  const check = checkXml(xml);
  t.ok(check.ok, check.why ?? 'well-formed');
  t.equal(check.root, 'svg');
  t.match(xml, /xmlns="http:\/\/www\.w3\.org\/2000\/svg"/);
  for (const f of [0, 1, 2]) t.match(xml, new RegExp(`class="series rate" data-flow="${f}"`), `flow ${f} drawn`);
  t.match(xml, /class="series queue"/);
  t.match(xml, /id="kmin"/);
  t.match(xml, /id="kmax"/);
  t.match(xml, /rate \(Gb\/s\)/);
  t.match(xml, /queue \(KiB\)/);
  t.match(xml, /time \(ms\)/);
  t.match(xml, /id="legend"/);
});

t.test('--no-cc: the same scenario without control fills the queue', async (t) => {
  const lines: string[] = [];
  t.equal(simCommand(['dcqcn', '--flows', '2', '--duration-ms', '5', '--no-cc', '--queue-limit', '256kb'], (l) => lines.push(l)), 0);
  const text = lines.join('\n');
  t.match(text, /^dcqcn no-cc: 2 flows/);
  t.match(text, /0 marked, [1-9]\d* dropped/);
  t.match(text, /max over the run 25\d\.\d KiB/);
});

t.test('bad usage is a one-line CliError', async (t) => {
  const bad = (args: string[], re: RegExp): void => {
    let err: unknown;
    try {
      simCommand(args, () => {});
    } catch (e) {
      err = e;
    }
    t.ok(err instanceof CliError, `${args.join(' ')}: a CliError`);
    const msg = (err as Error | undefined)?.message ?? '';
    t.match(msg, re, args.join(' '));
    t.notMatch(msg, /\n/, 'one line');
  };
  bad(['dcqcn', '--duration-ms', '1'], /--flows is required/);
  bad(['dcqcn', '--flows', '0', '--duration-ms', '1'], /--flows must be an integer/);
  bad(['dcqcn', '--flows', '2', '--duration-ms', 'x'], /--duration-ms/);
  bad(['dcqcn', '--flows', '2', '--duration-ms', '1', '--profile', 'tcp'], /--profile must be paper or cx/);
  bad(['dcqcn', '--flows', '2', '--duration-ms', '1', '--line-rate', '40gbps'], /--line-rate/);
  bad(['dcqcn', '--flows', '2', '--duration-ms', '1', '--sample-us', '20'], /--sample-us/);
  bad(['tcp', '--flows', '2', '--duration-ms', '1'], /usage/);
  t.throws(() => simCommand(['dcqcn', '--flows', '1', '--duration-ms', '1', '--csv', join(dir, 'no/such/dir.csv')], () => {}), /cannot write/);
});

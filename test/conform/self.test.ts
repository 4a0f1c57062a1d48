// Against ourselves = against `roce serve`: the server runs as its own process on loopback, as
// users run it, and `roce conform --exchange roce` runs as another process against it. Every
// scripted case must pass, and the report must list them all; a short fuzzing run must end on
// time with a liveness check after every batch and no finding.
import t from 'tap';
import { spawn, execFile, type ChildProcess } from 'node:child_process';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { createInterface } from 'node:readline';
import { promisify } from 'node:util';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { CASES } from '../../src/conform/cases.js';
import type { RunReport } from '../../src/conform/runner.js';
import type { FuzzReport } from '../../src/conform/fuzz.js';
import { toHtml, toMarkdown } from '../../src/conform/report.js';

const main = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../src/cli/main.js');

/**
 * Cases where our own engine deviates, kept visible here as todo assertions instead of being
 * hidden (engine fixes land in src/core). None at present.
 */
const KNOWN_FINDINGS: Record<string, string> = {};

/** `roce serve` on 127.0.0.2, free ports; resolves with its UDP and TCP ports once it listens. */
async function startServe(dir: string): Promise<{ child: ChildProcess; udpPort: number; oobPort: number; output: () => string }> {
  const child = spawn(process.execPath, [main, 'serve', '--bind', '127.0.0.2', '--port', '0', '--oob-port', '0', '--dir', dir], { stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  child.stderr!.setEncoding('utf8').on('data', (d: string) => { output += d; });
  const ports = await new Promise<{ udpPort: number; oobPort: number }>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`roce serve did not report listening within 20 s: ${output}`)), 20_000);
    child.once('exit', (code) => reject(new Error(`roce serve exited ${code}: ${output}`)));
    createInterface({ input: child.stdout! }).on('line', (line) => {
      output += line + '\n';
      const m = /RoCEv2 UDP 127\.0\.0\.2:(\d+).*out-of-band TCP 127\.0\.0\.2:(\d+)/.exec(line);
      if (m) {
        clearTimeout(timer);
        resolve({ udpPort: Number(m[1]), oobPort: Number(m[2]) });
      }
    });
  });
  return { child, ...ports, output: () => output };
}

t.test('roce conform --exchange roce against a roce serve process: every case passes', async (t) => {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'conform-self-'));
  const serve = await startServe(dir);
  t.teardown(async () => {
    serve.child.kill('SIGTERM');
    await rm(dir, { recursive: true, force: true });
  });
  const report = path.join(dir, 'report.json');
  const t0 = Date.now();
  const { stdout } = await promisify(execFile)(process.execPath, [main, 'conform', '--peer', '127.0.0.2', '--exchange', 'roce', '--port', String(serve.oobPort),
    '--bind', '127.0.0.1', '--udp-port', '0', '--report', report, '--response-ms', '600', '--quiet-ms', '150',
    // A local ACK timeout of 134 ms on the server's probe QP: an implied-NAK resend is told from a
    // timer one even when this shared machine stalls the server for a while.
    '--peer-timeout', '15'], { timeout: 120_000 });
  const r = (JSON.parse(await readFile(report, 'utf8'))) as RunReport;
  t.comment(`${r.cases.length} cases in ${((Date.now() - t0) / 1000).toFixed(1)} s: ${JSON.stringify(r.counts)}`);
  t.equal(r.exchange, 'roce');
  t.same(r.cases.map((c) => c.id), CASES.map((c) => c.id), 'the report lists every case, in order');
  for (const c of r.cases) {
    const todo = KNOWN_FINDINGS[c.id];
    t.equal(c.verdict, 'pass', `${c.id}: ${c.observed}`, todo ? { todo } : {});
  }
  t.equal(r.counts.pass, CASES.length - Object.keys(KNOWN_FINDINGS).length, 'pass count');
  t.match(stdout, /^pass\s+psn-gap-nak-once/m, 'the CLI prints each verdict');
  t.ok(r.cases.every((c) => /IBTA/.test(c.rule)), 'every case names its IBTA rule');
  t.match(serve.output(), /probe: QP 0x/, 'the sessions went through the server\'s probe request');
  t.match(toHtml([r]), /psn-gap-nak-once/);
  t.match(toMarkdown([r]), /\| `psn-wrap` \|/);
});

t.test('roce conform --fuzz against a roce serve process: bounded, a liveness check per batch, no finding', async (t) => {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'conform-self-fuzz-'));
  const serve = await startServe(dir);
  t.teardown(async () => {
    serve.child.kill('SIGTERM');
    await rm(dir, { recursive: true, force: true });
  });
  const report = path.join(dir, 'fuzz.json');
  const t0 = Date.now();
  const { stdout } = await promisify(execFile)(process.execPath, [main, 'conform', '--fuzz', '--peer', '127.0.0.2', '--exchange', 'roce', '--port', String(serve.oobPort),
    '--bind', '127.0.0.1', '--udp-port', '0', '--count', '1000000', '--time-limit', '5', '--seed', '11', '--out', dir, '--report', report,
    '--response-ms', '400', '--quiet-ms', '30'], { timeout: 60_000 });
  const wall = Date.now() - t0;
  const r = JSON.parse(await readFile(report, 'utf8')) as FuzzReport;
  t.comment(stdout.trim().split('\n').filter((l) => l.startsWith('fuzz:')).join('\n'));
  t.same(r.findings.map((f) => f.detail), [], `no finding in ${r.tried} inputs`);
  t.ok(r.tried > 0 && r.liveness.checks === r.batches, `a liveness check after each of ${r.batches} batches`);
  t.equal(r.liveness.unexplainedFailures, 0, 'no unexplained liveness failure');
  t.ok(wall < 30_000, `bounded: ${(wall / 1000).toFixed(1)} s for --time-limit 5`);
});

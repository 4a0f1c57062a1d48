// `roce conform` against rdma_rxe: one guest, the full suite with the pingpong exchange
// (ibv_rc_pingpong server) and the perftest exchange (ib_write_bw and ib_read_bw servers),
// our side in the lab's namespace on 10.77.0.1. The tools are restarted whenever a case left
// their QP unusable (conform asks with "@@restart" on its stdout; we answer "ready" on its
// stdin once the new server listens). Every tool runs under a time bound: with retry_cnt 7
// rxe retransmits forever.
//
// Writes interop/conform-report.json and interop/CONFORMANCE.md. Needs root (interop/README.md);
// fails, never skips, when the lab cannot start.
import t from 'tap';
import { mkdtemp, readFile, writeFile } from 'node:fs/promises';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import os from 'node:os';
import path from 'node:path';
import { startLab, type BackgroundJob, type Guest, type Lab } from '../../interop/lab.js';
import type { CaseResult, RunReport } from '../../src/conform/runner.js';
import { toHtml, toJson, toMarkdown } from '../../src/conform/report.js';

const here = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(here, '../../..');
const CLI = path.resolve(here, '../../src/cli/main.js');
const t0 = Date.now();
let lab: Lab | undefined;

t.teardown(async () => {
  await lab?.stop();
  t.comment(`total wall time ${((Date.now() - t0) / 1000).toFixed(1)} s`);
});

async function waitListening(g: Guest, port: number): Promise<void> {
  const hex = port.toString(16).toUpperCase().padStart(4, '0');
  const r = await g.run(`i=0; until grep -q ':${hex} 00000000:0000 0A' /proc/net/tcp; do i=$((i+1)); [ $i -lt 150 ] || exit 1; sleep 0.1; done`, { timeoutMs: 30_000 });
  if (r.code !== 0) throw new Error(`nothing listens on ${g.ipv4}:${port}`);
}

interface Config {
  name: string;
  /** The server command in the guest. */
  server: string;
  args: string[];
}

async function runSuite(l: Lab, g: Guest, cfg: Config, outDir: string): Promise<{ report: RunReport; restarts: number; toolLog: string }> {
  let job: BackgroundJob | undefined;
  let toolLog = '';
  const start = async (): Promise<void> => {
    if (job) {
      await job.kill().catch(() => undefined);
      toolLog += (await job.wait()).stdout.slice(-400);
    }
    job = await g.spawn(cfg.server, { timeoutMs: 240_000 });
    await waitListening(g, 18515);
  };
  await start();
  const reportPath = path.join(outDir, `${cfg.name}.json`);
  const child = l.execHost([process.execPath, CLI, 'conform', '--peer', g.ipv4, '--bind', l.hostIpv4, '--control', 'stdio',
    '--report', reportPath, '--html', path.join(outDir, `${cfg.name}.html`), ...cfg.args], { stdio: ['pipe', 'pipe', 'pipe'] });
  let restarts = 0;
  let stderr = '';
  child.stderr?.setEncoding('utf8').on('data', (d: string) => { stderr += d; });
  const timer = setTimeout(() => child.kill('SIGKILL'), 200_000);
  let chain = Promise.resolve();
  createInterface({ input: child.stdout! }).on('line', (line) => {
    if (!line.startsWith('@@restart')) return;
    restarts++;
    chain = chain.then(async () => {
      await start();
      child.stdin!.write('ready\n');
    }).catch((e: Error) => {
      stderr += `restart failed: ${e.message}\n`;
      child.stdin!.write('ready\n');
    });
  });
  const code = await new Promise<number | null>((r) => child.on('close', r));
  clearTimeout(timer);
  await chain;
  if (job) {
    await job.kill().catch(() => undefined);
    toolLog += (await job.wait()).stdout.slice(-400);
  }
  if (code !== 0) throw new Error(`roce conform (${cfg.name}) exited ${code}: ${stderr.trim().slice(-2000)}`);
  const report = JSON.parse(await readFile(reportPath, 'utf8')) as RunReport;
  report.exchange = cfg.name;
  return { report, restarts, toolLog };
}

/** Why rxe answers as it does, for the cases where it does not do what the rule says. */
const RXE: Record<string, string> = {
  'retry-exhaustion':
    'rxe retransmitted the unacknowledged SEND far beyond 8 times (about every local ACK timeout, ' +
    'until the tool was restarted). ibv_rc_pingpong sets retry_cnt 7, and rxe\'s completer decrements the ' +
    'counter only when it is not 7 (`if (qp->comp.retry_cnt != 7) qp->comp.retry_cnt--` in rxe_comp.c), so ' +
    '7 means "retry forever". IBTA gives 7 that meaning only for the RNR retry count (rnr_retry, §9.7.5.2.8); ' +
    'for the transport retry counter (§9.7.6.1.3) 7 is 7 retries, after which the WQE completes with ' +
    'RETRY_EXC_ERR and the QP goes to Error. (Our engine copies rxe here for interop: core/time.ts RETRY_INFINITE; ' +
    'the reference target runs with retry_cnt 3, where it passes.)',
};

/** Figures of the fuzzing runs (not produced by this test; measured as described). */
const FUZZ_FIGURES = `## Fuzzing figures

Peer fuzzing (\`roce conform --fuzz\`) against our reference target over loopback, batches of 8 mutated
requests then a liveness check: about 80 inputs/s with a 30 ms settle time (the healthy target: no finding
in 1,592 inputs / 20 s, seed 7). With the planted fault of \`test/conform/planted.test.ts\` (a request with
reserved BTH bits set makes the target deaf on that QP) the first batch finds it; minimization leaves one
datagram differing from its valid template in one byte (BTH byte 8), and \`--replay\` reproduces it.

Our own receive path (\`test/conform/ingress-fuzz.test.ts\`, fast-check, fixed seeds, MemoryLink on a
VirtualClock): 10 s per mode in CI. A local run of 150 s per mode
(\`CONFORM_FUZZ_SECONDS=150 npx c8 --include 'src/core/**' --include 'src/runtime/**' node dist/test/conform/ingress-fuzz.test.js\`):

| mode | inputs | inputs/s | crashes | hangs | unaccounted datagrams | QPs replaced after a legitimate error |
| --- | --- | --- | --- | --- | --- | --- |
| ICRC verification off | 1,013,799 | 6,758 | 0 | 0 (slowest input 369 ms, timers included) | 0 | 206,414 |
| ICRC verification on | 1,290,953 | 8,606 | 0 | 0 (slowest 393 ms) | 0 | 131,666 |

Coverage of \`src/core\` + \`src/runtime\` from that run (c8, V8 coverage through the source maps): statements
and lines 80.6 %, branches 65.3 %, functions 78.6 %; responder.ts 81 % / 82 % branches, device.ts 93 %,
completer.ts 57 % (the fuzzer drives mostly the responder side).

Open finding from the ICRC-off run (a todo in the test): after the run, a SEND posted on the fuzzed QP can
end in RETRY_EXC_ERR although the peer's responder accepted it (its ePSN moved on), i.e. the requester side
no longer takes the peer's ACK. Single ghost ACKs / READ responses / atomic ACKs from a clean state do not
cause it; the state that does has not been minimized yet.
`;

function explain(r: RunReport, c: CaseResult): string | undefined {
  return RXE[`${r.exchange}/${c.id}`] ?? RXE[c.id];
}

t.test('conformance of rdma_rxe', async (t) => {
  lab = await startLab({ guests: 1, ipv6: false });
  const g = lab.guests[0]!;
  const out = await mkdtemp(path.join(os.tmpdir(), 'conform-rxe-'));
  t.comment(`lab up after ${((Date.now() - t0) / 1000).toFixed(1)} s; reports and pcaps in ${out}`);
  const configs: Config[] = [
    { name: 'pingpong', server: `ibv_rc_pingpong -d rxe0 -g ${g.gidIndexV4} -n 1000000`, args: ['--exchange', 'pingpong'] },
    { name: 'perftest-write', server: `ib_write_bw -d rxe0 -x ${g.gidIndexV4} -s 4096 -n 5 -F`, args: ['--exchange', 'perftest', '--verb', 'write'] },
    { name: 'perftest-read', server: `ib_read_bw -d rxe0 -x ${g.gidIndexV4} -s 4096 -n 5 -F`, args: ['--exchange', 'perftest', '--verb', 'read'] },
  ];
  const reports: RunReport[] = [];
  for (const cfg of configs) {
    const s0 = Date.now();
    const { report, restarts } = await runSuite(lab, g, cfg, out);
    reports.push(report);
    t.comment(`${cfg.name}: ${JSON.stringify(report.counts)} in ${((Date.now() - s0) / 1000).toFixed(1)} s, ${restarts} tool restarts`);
    t.equal(report.counts.error, 0, `${cfg.name}: no harness errors`);
    t.ok(report.counts.pass > 0, `${cfg.name}: cases ran`);
    for (const c of report.cases) t.ok(c.verdict !== 'not-applicable' || c.observed.length > 0, `${cfg.name}/${c.id}: ${c.verdict}`);
  }
  const missing = reports.flatMap((r) => r.cases.filter((c) => c.verdict !== 'pass' && c.verdict !== 'not-applicable' && !explain(r, c)).map((c) => `${r.exchange}/${c.id}`));
  t.same(missing, [], 'every deviation has an explanation');
  await writeFile(path.join(ROOT, 'interop/conform-report.json'), toJson(reports));
  await writeFile(path.join(out, 'all.html'), toHtml(reports, 'roce conform against rdma_rxe'));
  await writeFile(path.join(ROOT, 'interop/CONFORMANCE.md'), conformanceMd(reports, lab.accel));
});

function conformanceMd(reports: RunReport[], accel: string): string {
  const total = (k: keyof RunReport['counts']): number => reports.reduce((n, r) => n + r.counts[k], 0);
  return [
    '# Conformance of rdma_rxe (Soft-RoCE), as `roce conform` sees it',
    '',
    'Generated by `test/interop/conform.test.ts` (`sudo npm run test:interop`): one rxe guest of the',
    `lab (Debian kernel, ${accel}), our side on 10.77.0.1 crafting every packet. The raw results, with`,
    'the packets of every non-passing case in hex, are in `conform-report.json`. Verdicts: **pass**;',
    '**deviation** (rxe answered otherwise than the rule says); **peer-stopped** (no answer to a',
    'known-good request afterwards); **not-applicable** (the exchange cannot provide the precondition).',
    '',
    `Totals: pass ${total('pass')}, deviation ${total('deviation')}, peer-stopped ${total('peer-stopped')}, ` +
      `not-applicable ${total('not-applicable')}, error ${total('error')}.`,
    '',
    'Against our own reference target (`roce conform --serve-target`, `test/conform/self.test.ts`) every case',
    'passes.',
    '',
    'Not-applicable cases are the exchange\'s limits, not rxe\'s: ibv_rc_pingpong registers no memory for',
    'remote access and always has receives posted; a perftest server allows exactly its own verb, posts no',
    'receives and sends nothing of its own (so its requester cannot be tested); no rxe tool issues RDMA',
    'READs towards us (implied NAK). Each row says which.',
    '',
    toMarkdown(reports, explain),
    FUZZ_FIGURES,
  ].join('\n');
}

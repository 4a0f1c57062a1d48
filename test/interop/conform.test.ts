// `roce conform` against rdma_rxe: one guest, the full suite with the pingpong exchange
// (ibv_rc_pingpong server) and the perftest exchange (ib_write_bw, ib_read_bw and ib_atomic_bw
// servers), our side in the lab's namespace on 10.77.0.1; then `roce conform --fuzz` against
// the pingpong, ib_write_bw and ib_read_bw servers, 30 s each, with a liveness check after every
// batch. The tools are restarted whenever a case or a batch left their QP unusable (conform asks
// with "@@restart" on its stdout; we answer "ready" on its stdin once the new server listens).
// Every tool and every conform run has a time bound: with retry_cnt 7 rxe retransmits forever,
// and a conform that crashes or hangs fails the test. rxe not answering is a finding, reported.
//
// Writes interop/conform-report.json and interop/CONFORMANCE.md; reports, pcaps and the fuzz
// findings (replay file + pcap) go to interop/out/conform/. Needs root (interop/README.md);
// fails, never skips, when the lab cannot start.
import t from 'tap';
import { mkdir, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import path from 'node:path';
import { startLab, type BackgroundJob, type Guest, type Lab } from '../../interop/lab.js';
import type { CaseResult, RunReport } from '../../src/conform/runner.js';
import { toHtml, toMarkdown } from '../../src/conform/report.js';
import type { FuzzReport, ReplayFile } from '../../src/conform/fuzz.js';

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
  /** The tool's command in the guest. */
  server: string;
  args: string[];
  /** The tool is the client (it connects to us): started when conform asks, once it listens. */
  client?: boolean;
}

interface ConformRun {
  /** Exit code; null when the time bound killed it. */
  code: number | null;
  stdout: string;
  stderr: string;
  restarts: number;
  /** What the tool said when it had ended by itself before a restart (its QP's error completion, usually). */
  toolExits: string[];
}

/** The line of a tool's output that says why it ended: the first that mentions a failure or error, else the last. */
function exitReason(out: string): string {
  const lines = out.split('\n').map((l) => l.trim()).filter((l) => l !== '');
  return (lines.find((l) => /fail|error/i.test(l)) ?? lines.at(-1) ?? '(no output)').slice(0, 160);
}

/** Counts of the distinct reasons, most frequent first: "reason ×n; …". */
function tally(reasons: string[]): string {
  const m = new Map<string, number>();
  for (const r of reasons) m.set(r, (m.get(r) ?? 0) + 1);
  return [...m].sort((a, b) => b[1] - a[1]).map(([r, n]) => `"${r}" ×${n}`).join('; ') || 'none';
}

/** One `roce conform` process against the tool of `cfg`, restarting the tool on request, killed after `boundMs`. */
async function runConform(l: Lab, g: Guest, cfg: Config, extra: string[], boundMs: number): Promise<ConformRun> {
  let job: BackgroundJob | undefined;
  const toolExits: string[] = [];
  /** Ends the running tool; one that had ended by itself leaves its reason in `toolExits`. */
  const stop = async (j: BackgroundJob): Promise<void> => {
    const ended = await Promise.race([j.wait(), new Promise<undefined>((r) => setTimeout(() => r(undefined), 100))]).catch(() => undefined);
    if (ended) toolExits.push(exitReason(ended.stdout));
    else await j.kill().catch(() => undefined);
    await j.wait().catch(() => undefined);
  };
  const start = async (): Promise<void> => {
    if (job) await stop(job);
    // Its stderr too: where the tools say why they stopped.
    job = await g.spawn(`${cfg.server} 2>&1`, { timeoutMs: boundMs + 60_000 });
    if (!cfg.client) await waitListening(g, 18515);
  };
  if (!cfg.client) await start();
  const child = l.execHost([process.execPath, CLI, 'conform', '--peer', g.ipv4, '--bind', l.hostIpv4, '--control', 'stdio', ...cfg.args, ...extra],
    { stdio: ['pipe', 'pipe', 'pipe'] });
  let restarts = 0;
  let stderr = '';
  let stdout = '';
  child.stderr?.setEncoding('utf8').on('data', (d: string) => { stderr += d; });
  const timer = setTimeout(() => child.kill('SIGKILL'), boundMs);
  let chain = Promise.resolve();
  createInterface({ input: child.stdout! }).on('line', (line) => {
    stdout += line + '\n';
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
  const code = await new Promise<number | null>((r) => child.on('close', (c) => r(c)));
  clearTimeout(timer);
  await chain;
  if (job) await stop(job);
  return { code, stdout, stderr, restarts, toolExits };
}

async function runSuite(l: Lab, g: Guest, cfg: Config, outDir: string): Promise<{ report: RunReport; restarts: number; toolExits: string[] }> {
  const reportPath = path.join(outDir, `${cfg.name}.json`);
  const r = await runConform(l, g, cfg, ['--report', reportPath, '--html', path.join(outDir, `${cfg.name}.html`)], 200_000);
  if (r.code !== 0) throw new Error(`roce conform (${cfg.name}) exited ${r.code}: ${r.stderr.trim().slice(-2000)}`);
  const report = JSON.parse(await readFile(reportPath, 'utf8')) as RunReport;
  report.exchange = cfg.name;
  return { report, restarts: r.restarts, toolExits: r.toolExits };
}

/** Seconds of fuzzing per tool: three tools, about 90 s in all. */
const FUZZ_SECONDS = 30;

/**
 * Why rxe answers as it does, for the cases where it does not do what the rule says, with the
 * rxe source behind it (torvalds/linux, drivers/infiniband/sw/rxe; the lab runs Debian's 6.1
 * kernel). A deviation without an entry here fails the test.
 */
const RXE: Record<string, string> = {
  'retry-exhaustion':
    'rxe retransmitted the unacknowledged SEND far beyond 8 times (about every local ACK timeout, ' +
    'until the tool was restarted). ibv_rc_pingpong sets retry_cnt 7, and rxe\'s completer decrements the ' +
    'counter only when it is not 7: `rxe_comp.c` (torvalds/linux as stored at 06a7fcf), `rxe_completer()`, `case COMPST_ERROR_RETRY:` — ' +
    '`if (qp->comp.retry_cnt > 0) { if (qp->comp.retry_cnt != 7) qp->comp.retry_cnt--; … qp->req.need_retry = 1;` — ' +
    'so 7 means "retry forever" and the `else` branch (`wqe->status = IB_WC_RETRY_EXC_ERR; state = COMPST_ERROR;`) is ' +
    'never reached. `COMPST_RNR_RETRY` has the same `!= 7` test for `rnr_retry`, where IBTA gives 7 that meaning ' +
    '(§9.7.5.2.8); for the transport retry counter (§9.7.6.1.3) 7 is 7 retries, after which the WQE completes with ' +
    'RETRY_EXC_ERR and the QP goes to Error. (Our engine copies rxe here for interop: core/time.ts RETRY_INFINITE; ' +
    '`roce serve`\'s probe QP runs with retry_cnt 3, where the case passes.)',
  'short-first':
    'rxe acknowledged a FIRST packet carrying 8 bytes at a path MTU of 1024 and took it as the start of a ' +
    'message. The 6.1 kernel\'s `check_length()` in `rxe_resp.c` (the lines the fix below removes) tests the wrong field: ' +
    '`if ((pkt->opcode & RXE_START_MASK) && (pkt->opcode & RXE_END_MASK)) … else if ((pkt->opcode & RXE_START_MASK) || ' +
    '(pkt->opcode & RXE_MIDDLE_MASK)) { /* "first" or "middle" packets */ if (payload != mtu) return RESPST_ERR_LENGTH; }` — ' +
    '`pkt->opcode` is the 8-bit BTH opcode while `RXE_START_MASK` is `BIT(NUM_HDR_TYPES + 8)` in `rxe_opcode.h`, ' +
    'so every test is 0 and no length error is ever raised. The fix, "RDMA/rxe: Fix incorrect responder length ' +
    'checking" (linux-rdma, December 2022, `Fixes: 837a55847ead`), tests `pkt->mask` instead and, for a FIRST or ' +
    'MIDDLE packet whose payload is not the MTU, returns `RESPST_ERR_LENGTH` ("first or middle packet not mtu"), which ' +
    'rxe answers as class C (NAK Invalid Request, QP to Error); its comment cites IBA C9-92 for these checks. The lab\'s ' +
    '6.1 kernel behaves as without it. ' +
    'An RDMA WRITE FIRST of 8 bytes is refused all the same (`perftest-write` passes): `check_rkey()` checks WRITE ' +
    'lengths on its own — `if (pkt->mask & RXE_WRITE_MASK) { if (resid > mtu) { if (pktlen != mtu || bth_pad(pkt)) ' +
    '{ state = RESPST_ERR_LENGTH;` — so only SENDs slip through. The fuzzer found this first: a zero-length SEND, ' +
    'then an 8-byte SEND FIRST, both ACKed.',
  'ack-reserved-bit':
    'rxe took an ACK whose syndrome has the reserved bit 7 set (0x9f: bits 6..5 are 00, an ACK), for the last PSN of its ' +
    'outstanding SEND, as an error of that SEND, and its QP answered nothing more, without a NAK or anything else on the ' +
    'wire to say why. `rxe_hdr.h` (torvalds/linux as stored at 037dd13) defines `AETH_TYPE_MASK = 0xe0`, which takes in ' +
    'the reserved bit 7 with the type bits 6..5, so `check_ack()` in `rxe_comp.c` (as stored at 06a7fcf) finds ' +
    '`syn & AETH_TYPE_MASK` (0x80) to be none of `AETH_ACK`, `AETH_RNR_NAK`, `AETH_NAK` and returns `COMPST_ERROR` (the ' +
    '`default:` of its `IB_OPCODE_RC_ACKNOWLEDGE` case), where `rxe_completer()` completes the WQE (`do_complete()`) and ' +
    'calls `rxe_qp_error()`. Only an ACK that `check_psn()` sends on to `check_ack()` does this: one whose PSN is within ' +
    'the WQE at the head of the send queue (`COMPST_CHECK_ACK`); with the send queue empty, `get_wqe()` drops it ' +
    '(`COMPST_DONE`). Our engine reads the type from bits 6..5 only (`aethKind`, src/wire/aeth.ts) and passes the case.',
};

/** Our own receive path under fuzzing: measured by another test (ingress-fuzz.test.ts), as described. */
const INGRESS_FUZZ = `### Our own receive path

\`test/conform/ingress-fuzz.test.ts\` (fast-check, fixed seeds, MemoryLink on a VirtualClock): 10 s per
mode in CI. A local run of 150 s per mode
(\`CONFORM_FUZZ_SECONDS=150 TAP_TIMEOUT=0 node dist/test/conform/ingress-fuzz.test.js\`):

| mode | inputs | inputs/s | crashes | hangs | unaccounted datagrams | QPs replaced after a legitimate error |
| --- | --- | --- | --- | --- | --- | --- |
| ICRC verification off | 2,878,986 | 19,193 | 0 | 0 (slowest input 5.4 ms, timers included) | 0 | 586,169 |
| ICRC verification on | 4,026,300 | 26,842 | 0 | 0 (slowest 9.6 ms) | 0 | 410,367 |

Coverage of \`src/core\` + \`src/runtime\` (c8 through the source maps,
\`npx c8 --exclude-after-remap --include 'src/core/**' --include 'src/runtime/**' node dist/test/conform/ingress-fuzz.test.js\`):
a 5 s run per mode reaches statements and lines 79.2 %, branches 63.5 %, functions 75.5 %; a 150 s run per mode
of the previous revision reached 80.6 % / 65.3 % / 78.6 % (responder.ts 81 %, device.ts 93 %, completer.ts 57 %:
the fuzzer drives mostly the responder side).

After each run the test posts a SEND on the fuzzed QP and asserts that it completes. An earlier
RETRY_EXC_ERR there, minimized, needed no fuzz input at all: the in-memory test link with ICRC
verification off left the 4-byte ICRC field out, so every ACK parsed as truncated. The link now
keeps a zero ICRC field, and the assertion holds in both modes.
`;

/**
 * Why rxe did what a fuzz finding shows, once a finding has been looked at (its pcap and replay
 * file). A finding nobody has explained yet is reported as such and kept visible as a todo.
 */
const FUZZ_EXPLAINED: { match: (exchange: string, f: FuzzReport['findings'][number]) => boolean; why: string }[] = [
  {
    // The pingpong answers every SEND it accepts with one of its own, the WQE such an ACK can reach.
    match: (exchange, f) => exchange === 'pingpong' && f.kind === 'liveness' && f.file.datagrams.some((d) => reservedBitAck(d.hex)),
    why:
      'The batch holds an ACK whose syndrome has the reserved bit 7 set, for a PSN of the SEND ibv_rc_pingpong sends in ' +
      'reply to the SEND of the batch it accepted. rxe takes such an ACK as an error of the WQE it reaches and puts the QP ' +
      'in the Error state without a word on the wire: the `ack-reserved-bit` case shows it every time, and its explanation ' +
      'above gives the rxe source. In the batch the ACK reaches that WQE only when the pingpong has posted its reply before ' +
      'rxe\'s completer takes the ACK from its queue; otherwise it meets an empty send queue and is dropped, hence "not ' +
      'reproduced reliably". ibv_rc_pingpong then ends on a receive flushed by the QP error ("Failed status Work Request ' +
      'Flushed Error (5) for wr_id 1", among the tool\'s own exits this test lists for the run).',
  },
  {
    // The same WQE, reached by an ACKNOWLEDGE whose syndrome rxe takes as an error, bit 7 aside.
    match: (exchange, f) => exchange === 'pingpong' && f.kind === 'liveness' && f.file.datagrams.some((d) => d.icrc === 'good' && d.rebaseQp && erroringAck(d.hex)),
    why:
      'The batch holds, with a good ICRC, an ACKNOWLEDGE for the QP of ibv_rc_pingpong whose syndrome `check_ack()` in ' +
      '`rxe_comp.c` (as stored at 06a7fcf) takes as an error of the WQE it reaches: type bits 6..5 = 10, which IBTA reserves ' +
      '(`syn & AETH_TYPE_MASK` is none of `AETH_ACK`, `AETH_RNR_NAK`, `AETH_NAK`: its `default:` returns `COMPST_ERROR`, as ' +
      'for the reserved bit 7 above), or a NAK other than a PSN sequence error (Invalid Request, Remote Access, Remote ' +
      'Operational, and any other code as Remote Operational: `COMPST_ERROR` with that status, as IBTA has it for those ' +
      'NAKs). `rxe_completer()` then completes the WQE in error and calls `rxe_qp_error()`, with nothing on the wire. As ' +
      'with the ACK above, it reaches a WQE only when the pingpong has posted and sent its reply by the time rxe\'s ' +
      'completer takes it, hence "not reproduced reliably".',
  },
  {
    // The same WQE, reached by a response of another kind than a SEND's.
    match: (exchange, f) => exchange === 'pingpong' && f.kind === 'liveness' && f.file.datagrams.some((d) => d.icrc === 'good' && d.rebaseQp && responseOfAnotherKind(d.hex)),
    why:
      'The batch holds, with a good ICRC, an RDMA READ response or an ATOMIC ACKNOWLEDGE for the QP of ibv_rc_pingpong, ' +
      'which only ever sends SENDs. At the WQE of such a SEND, `check_ack()` in `rxe_comp.c` (as stored at 06a7fcf) returns ' +
      '`COMPST_ERROR` for each of them: a READ response MIDDLE or LAST with no READ under way (its sequence check), a FIRST, ' +
      'LAST or ONLY whose syndrome is not an ACK, any READ response for a WQE that is not a READ (with `IB_WC_FATAL_ERR`), ' +
      'and an ATOMIC ACKNOWLEDGE for a WQE that is not an atomic; `rxe_completer()` then completes the WQE in error and ' +
      'calls `rxe_qp_error()`, with nothing on the wire (a bad response, as IBTA has it: the `read-response-to-send` case ' +
      'shows it every time). As with the ACK above, the response reaches a WQE only when the pingpong has posted its reply ' +
      'by the time rxe\'s completer takes it, hence "not reproduced reliably".',
  },
];

/**
 * An RC RDMA READ response (opcodes 0x0d-0x10) or ATOMIC ACKNOWLEDGE (0x12) long enough for its headers (BTH, and
 * AETH but for the MIDDLE, and AtomicAckETH), `hex` a UDP payload without its ICRC: rxe checks header lengths first.
 */
function responseOfAnotherKind(hex: string): boolean {
  const op = Number.parseInt(hex.slice(0, 2), 16);
  const headers = op === 0x0e ? 12 : op >= 0x0d && op <= 0x10 ? 16 : op === 0x12 ? 28 : Infinity;
  return hex.length / 2 >= headers;
}

/**
 * An RC ACKNOWLEDGE (opcode 0x11) with its whole AETH whose syndrome, bit 7 clear, has the reserved type 10 or is a NAK
 * other than a PSN sequence error (0x60); `hex` a UDP payload without its ICRC.
 */
function erroringAck(hex: string): boolean {
  if (hex.length < 32 || hex.slice(0, 2) !== '11') return false;
  const syn = Number.parseInt(hex.slice(24, 26), 16);
  return (syn & 0xe0) === 0x40 || ((syn & 0xe0) === 0x60 && syn !== 0x60);
}

/** An RC ACKNOWLEDGE (opcode 0x11) whose AETH syndrome, the byte after the BTH, has bit 7 set; `hex` a UDP payload. */
function reservedBitAck(hex: string): boolean {
  return hex.length >= 26 && hex.slice(0, 2) === '11' && (Number.parseInt(hex.slice(24, 26), 16) & 0x80) !== 0;
}

function explainFinding(exchange: string, f: FuzzReport['findings'][number]): string | undefined {
  return FUZZ_EXPLAINED.find((e) => e.match(exchange, f))?.why;
}

function explain(r: RunReport, c: CaseResult): string | undefined {
  return RXE[`${r.exchange}/${c.id}`] ?? RXE[c.id];
}

t.test('the findings kept in interop/findings are each explained, each by its own explanation', async (t) => {
  const dir = path.join(ROOT, 'interop/findings');
  const names = (await readdir(dir)).filter((n) => n.endsWith('.replay.json')).sort();
  t.ok(names.length >= 2, `${names.length} kept findings`);
  const used = new Set<string>();
  for (const name of names) {
    const file = JSON.parse(await readFile(path.join(dir, name), 'utf8')) as ReplayFile;
    const why = explainFinding(file.exchange, { ...file.finding, datagrams: file.datagrams.length, reproduced: false, file });
    t.ok(why, `${name}: explained`);
    if (why) used.add(why);
  }
  t.equal(used.size, names.length, 'no two kept findings share an explanation');
});

t.test('conformance of rdma_rxe', async (t) => {
  lab = await startLab({ guests: 1, ipv6: false });
  const g = lab.guests[0]!;
  const out = path.join(ROOT, 'interop/out/conform');
  await rm(out, { recursive: true, force: true });
  await mkdir(out, { recursive: true });
  t.comment(`lab up after ${((Date.now() - t0) / 1000).toFixed(1)} s; reports, pcaps and findings in ${out}`);
  const hostIp = lab.hostIpv4;
  const pingpong = `ibv_rc_pingpong -d rxe0 -g ${g.gidIndexV4} -n 1000000`;
  // ib_atomic_bw takes no -s (8-byte operands); its buffer is still a page, as -s 4096 makes the others'.
  const perftest = (tool: string, size = '-s 4096'): string => `${tool} -d rxe0 -x ${g.gidIndexV4} ${size} -n 5 -F`;
  const configs: Config[] = [
    { name: 'pingpong', server: pingpong, args: ['--exchange', 'pingpong'] },
    { name: 'perftest-write', server: perftest('ib_write_bw'), args: ['--exchange', 'perftest', '--verb', 'write'] },
    { name: 'perftest-read', server: perftest('ib_read_bw'), args: ['--exchange', 'perftest', '--verb', 'read'] },
    { name: 'perftest-atomic', server: perftest('ib_atomic_bw', '-A FETCH_AND_ADD'), args: ['--exchange', 'perftest', '--verb', 'atomic'] },
    // The one rxe tool that issues RDMA READs towards us: for the implied-NAK case only.
    {
      name: 'perftest-reader', client: true, server: `ib_read_bw -d rxe0 -x ${g.gidIndexV4} -s 8 -n 100000 -F ${hostIp}`,
      args: ['--exchange', 'perftest-reader', '--case', 'implied-nak'],
    },
  ];
  const reports: RunReport[] = [];
  for (const cfg of configs) {
    const s0 = Date.now();
    const { report, restarts, toolExits } = await runSuite(lab, g, cfg, out);
    reports.push(report);
    t.comment(`${cfg.name}: ${JSON.stringify(report.counts)} in ${((Date.now() - s0) / 1000).toFixed(1)} s, ${restarts} tool restarts; the tool had ended by itself: ${tally(toolExits)}`);
    t.equal(report.counts.error, 0, `${cfg.name}: no harness errors`);
    t.ok(report.counts.pass > 0, `${cfg.name}: cases ran`);
    for (const c of report.cases) t.ok(c.verdict !== 'not-applicable' || c.observed.length > 0, `${cfg.name}/${c.id}: ${c.verdict}`);
  }
  const missing = reports.flatMap((r) => r.cases.filter((c) => c.verdict !== 'pass' && c.verdict !== 'not-applicable' && !explain(r, c)).map((c) => `${r.exchange}/${c.id}`));
  t.same(missing, [], 'every deviation has an explanation');

  // Fuzzing: bounded in time; the conform process must end by itself, with a report.
  const fuzzes: FuzzReport[] = [];
  const fuzzConfigs = configs.filter((c) => c.name === 'pingpong' || c.name === 'perftest-write' || c.name === 'perftest-read');
  for (const [i, cfg] of fuzzConfigs.entries()) {
    const s0 = Date.now();
    const dir = path.join(out, `fuzz-${cfg.name}`);
    await mkdir(dir, { recursive: true });
    const reportPath = path.join(dir, 'fuzz.json');
    const r = await runConform(lab, g, cfg, ['--fuzz', '--count', '1000000', '--time-limit', String(FUZZ_SECONDS), '--seed', String(i + 1),
      '--out', dir, '--report', reportPath, '--max-findings', '2', '--minimize-s', '30', '--quiet-ms', '100'], (FUZZ_SECONDS + 2 * 45 + 60) * 1000);
    t.not(r.code, null, `${cfg.name} fuzz: roce conform ended by itself (did not hang)`, { diag: { stdout: r.stdout.slice(-1500), stderr: r.stderr.slice(-1500) } });
    t.ok(r.code === 0 || r.code === 1, `${cfg.name} fuzz: exit ${r.code} (0 healthy, 1 findings), not a crash`, { diag: { stderr: r.stderr.slice(-2000) } });
    const f = JSON.parse(await readFile(reportPath, 'utf8')) as FuzzReport;
    f.exchange = cfg.name;
    fuzzes.push(f);
    t.comment(`${cfg.name} fuzz: ${f.tried} inputs in ${(f.durationMs / 1000).toFixed(1)} s, ${f.liveness.checks} liveness checks, ` +
      `${f.findings.length} findings, ${r.restarts} tool restarts (${((Date.now() - s0) / 1000).toFixed(1)} s); the tool had ended by itself: ${tally(r.toolExits)}`);
    t.equal(r.code === 1, f.findings.length > 0, `${cfg.name} fuzz: the exit code says whether there were findings`);
    t.ok(f.tried > 0 && f.liveness.checks === f.batches, `${cfg.name} fuzz: ${f.tried} inputs, a liveness check after each of ${f.batches} batches`);
    t.ok(f.durationMs - f.minimizeMs <= (FUZZ_SECONDS + 15) * 1000, `${cfg.name} fuzz: within its time limit (${(f.durationMs / 1000).toFixed(1)} s, ${(f.minimizeMs / 1000).toFixed(1)} s minimizing)`);
    for (const x of f.findings) {
      const saved = await Promise.all([x.replay, x.pcap].map((p) => (p ? stat(p).then(() => true, () => false) : false)));
      t.same(saved, [true, true], `${cfg.name} finding saved: ${x.replay ?? '?'}`);
      x.replay &&= path.relative(ROOT, x.replay);
      x.pcap &&= path.relative(ROOT, x.pcap);
    }
  }
  // rxe misbehaving is a finding to report, not a failure of this test; one not looked at yet stays visible.
  for (const f of fuzzes) {
    for (const x of f.findings) {
      t.ok(explainFinding(f.exchange, x), `${f.exchange} finding explained: ${x.kind}: ${x.detail}`, explainFinding(f.exchange, x) ? {} : { todo: 'a new fuzz finding: see its pcap and replay file' });
    }
  }

  await writeFile(path.join(ROOT, 'interop/conform-report.json'), JSON.stringify({ tool: 'roce conform', lab: lab.accel, suites: reports, fuzz: fuzzes }, null, 2) + '\n');
  await writeFile(path.join(out, 'all.html'), toHtml(reports, 'roce conform against rdma_rxe'));
  await writeFile(path.join(ROOT, 'interop/CONFORMANCE.md'), conformanceMd(reports, fuzzes, lab.accel));
});

/** The verdict letters of the per-case matrix. */
const MARK: Record<string, string> = { pass: 'pass', deviation: '**dev**', 'peer-stopped': '**stop**', 'not-applicable': 'n/a', error: '**err**' };

function matrixMd(reports: RunReport[]): string[] {
  const ids = reports[0]?.cases.map((c) => c.id) ?? [];
  // A run of a few cases only (perftest-reader) says nothing about the others.
  const never = ids.filter((id) => reports.every((r) => (r.cases.find((c) => c.id === id)?.verdict ?? 'not-applicable') === 'not-applicable'));
  return [
    `| case | ${reports.map((r) => `\`${r.exchange}\``).join(' | ')} |`,
    `| --- | ${reports.map(() => '---').join(' | ')} |`,
    ...ids.map((id) => `| \`${id}\` | ${reports.map((r) => MARK[r.cases.find((c) => c.id === id)?.verdict ?? ''] ?? '-').join(' | ')} |`),
    '',
    never.length
      ? `Cases no rxe exchange can run: ${never.map((x) => `\`${x}\``).join(', ')} (${never.length} of ${ids.length}); the rows below say why.`
      : `Every case ran against at least one rxe exchange (${ids.length} cases).`,
  ];
}

function fuzzMd(fuzzes: FuzzReport[]): string[] {
  const n = (x: number): string => x.toLocaleString('en-US');
  const out = [
    '## Fuzzing rxe',
    '',
    `\`roce conform --fuzz --exchange E --time-limit ${FUZZ_SECONDS} --seed N --quiet-ms 100\` against each tool: batches of 8`,
    'mutated valid requests (BTH fields to interesting values, bit flips, random bytes, PSN nudges,',
    'truncation, extension, 5 % with a bad ICRC), then a known-good request that must be answered',
    '(liveness) and a check that everything rxe sent was a well-formed packet for our QP (correctness).',
    'A liveness failure after rxe NAKed Invalid Request / Remote Access / Remote Operational error is the',
    'QP error IBTA demands (the tool is restarted and fuzzing goes on); any other failure is a finding,',
    'reproduced on a fresh session, minimized and saved as a replay file and a pcap under',
    '`interop/out/conform/` (`roce conform --replay FILE` plays it again).',
    '',
    '| exchange | seed | inputs | batches | fuzzing time | inputs/s | liveness checks | answered | QP error after a fatal NAK | unexplained | findings |',
    '| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |',
    ...fuzzes.map((f) => `| \`${f.exchange}\` | ${f.seed} | ${n(f.tried)} | ${n(f.batches)} | ${((f.durationMs - f.minimizeMs) / 1000).toFixed(1)} s | ` +
      `${f.inputsPerSecond} | ${n(f.liveness.checks)} | ${n(f.liveness.ok)} | ${n(f.liveness.explainedFailures)} | ${n(f.liveness.unexplainedFailures)} | ${f.findings.length} |`),
    '',
    'The throughput is the lab\'s: the guests run under TCG emulation here, and every QP error costs a',
    'restart of the tool in the guest.',
    '',
  ];
  const all = fuzzes.flatMap((f) => f.findings.map((x) => ({ f, x })));
  if (!all.length) {
    out.push('No finding: rxe answered the known-good request after every batch that did not end in a fatal NAK, and sent nothing malformed.', '');
    return out;
  }
  out.push('### Findings', '');
  for (const { f, x } of all) {
    const d = x.file.datagrams.map((g) => `\`${g.hex}\`${g.icrc === 'bad' ? ' (bad ICRC)' : ''}`).join(', ');
    out.push(`- \`${f.exchange}\`, ${x.kind}: ${x.detail}. ${x.datagrams} datagram(s) after minimization${x.reproduced ? '' : ' (not reproduced reliably)'}: ${d}. ` +
      `Replay \`${x.replay ?? '-'}\`, pcap \`${x.pcap ?? '-'}\`.`);
    out.push(`  ${explainFinding(f.exchange, x) ?? 'Not explained yet: the pcap and the replay file show what happened.'}`);
  }
  out.push('');
  return out;
}

function conformanceMd(reports: RunReport[], fuzzes: FuzzReport[], accel: string): string {
  const total = (k: keyof RunReport['counts']): number => reports.reduce((n, r) => n + r.counts[k], 0);
  return [
    '# Conformance of rdma_rxe (Soft-RoCE), as `roce conform` sees it',
    '',
    'Generated by `test/interop/conform.test.ts` (`sudo npm run test:interop`): one rxe guest of the',
    `lab (Debian kernel, ${accel}), our side on 10.77.0.1 crafting every packet. The raw results, with`,
    'the packets of every non-passing case in hex and the fuzzing figures, are in `conform-report.json`.',
    'Verdicts: **pass**; **deviation** (rxe answered otherwise than the rule says); **peer-stopped** (no',
    'answer to a known-good request afterwards); **not-applicable** (the exchange cannot provide the',
    'precondition).',
    '',
    `Totals: pass ${total('pass')}, deviation ${total('deviation')}, peer-stopped ${total('peer-stopped')}, ` +
      `not-applicable ${total('not-applicable')}, error ${total('error')}.`,
    '',
    'Against our own `roce serve` (`roce conform --exchange roce`, which asks the server for a probe QP',
    'through the transfer protocol; `test/conform/self.test.ts` runs both as processes) every case passes.',
    '',
    ...matrixMd(reports),
    '',
    'Not-applicable cases are the exchange\'s limits, not rxe\'s: ibv_rc_pingpong registers no memory for',
    'remote access and always has receives posted; a perftest server allows exactly its own verb on one',
    'region, posts no receives and sends nothing of its own (so its requester cannot be tested); of the',
    'rxe tools only the `ib_read_bw` client issues RDMA READs towards us, so `perftest-reader` (we play the',
    'perftest server, rxe\'s client reads our pretend buffer) runs the implied-NAK case only; and no tool',
    'registers a region without remote write on a QP that allows writes (`missing-access`). Each row says which.',
    '',
    toMarkdown(reports, explain),
    ...fuzzMd(fuzzes),
    '## Fuzzing ourselves',
    '',
    '`test/conform/planted.test.ts` plants a fault in `roce serve`\'s receive path (a request with reserved',
    'BTH bits set makes it deaf on that QP): the fuzzer finds it, minimizes it to one datagram differing',
    'from its valid template in one byte (BTH byte 8), and `roce conform --replay` reproduces it; the same',
    'seeded run against the healthy server finds nothing. `test/conform/self.test.ts` fuzzes a `roce serve`',
    'process for 5 s through the CLI: no finding, a liveness check after every batch.',
    '',
    INGRESS_FUZZ,
  ].join('\n');
}

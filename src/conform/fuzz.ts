/**
 * Mutation fuzzing of a peer: valid requests of the session, mutated field by field and byte by
 * byte (seeded), sent in batches; after each batch the peer must still answer a known-good
 * request (liveness) and everything it sent must be well-formed and addressed to us
 * (correctness). A batch that breaks either is a finding: it is reproduced on a fresh session,
 * minimized (fewest datagrams, then each mutated byte put back while the failure persists)
 * and saved as a replay file (JSON, datagrams in hex plus the session parameters) and a pcap.
 *
 * A liveness failure after the peer NAKed Invalid Request / Remote Access / Remote Operational
 * error is what IBTA demands (the QP goes to Error), not a finding: the fuzzer reconnects.
 *
 * Datagrams are stored without ICRC and "rebased": the destination QPN and the PSN are
 * rewritten for the session they are replayed in, when they were the session's own.
 */

import { NAK_CODE } from '../wire/aeth.js';
import { psnAdd, psnDiff } from '../wire/psn.js';
import { readU24, writeU24 } from '../wire/bytes.js';
import { Rng } from '../sim/rng.js';
import type { Exchange, PeerSession } from './exchange.js';
import { Prober, sleep, type IcrcChoice, type Rx } from './prober.js';
import { goodOp, liveness, SessionKeeper } from './runner.js';
import type { Timing } from './cases.js';
import { describeRx, isNak } from './describe.js';

export interface FuzzInput {
  /** The UDP payload without ICRC. */
  hex: string;
  icrc: IcrcChoice;
  /** Rewrite the BTH DestQP with the session's peer QPN on replay. */
  rebaseQp: boolean;
  /** Rewrite the BTH PSN as the session's next PSN plus this; null = leave as is. */
  psnDelta: number | null;
  /** The valid packet this one was mutated from (same encoding), for minimization. */
  template?: string;
}

export interface ReplayFile {
  kind: 'roce-conform-replay';
  version: 1;
  exchange: string;
  peer: string;
  seed: number;
  /** `session`: the peer gave no new session afterwards (its tool did not come back). */
  finding: { kind: 'liveness' | 'correctness' | 'session'; detail: string };
  session: { peerQpn: string; ourPsn: string; access: string[]; recvPosted: boolean };
  datagrams: FuzzInput[];
}

export interface FuzzOptions {
  prober: Prober;
  exchange: Exchange;
  seed: number;
  count: number;
  timeLimitS: number;
  batch?: number;
  timing: Timing;
  /** Where replay files and pcaps go (with writeFile). */
  outDir?: string;
  writeFile?: (path: string, data: Uint8Array | string) => Promise<void>;
  /** Stop after this many findings. Default 1. */
  maxFindings?: number;
  /**
   * Bounds on minimizing one finding: reproductions (each a fresh session, which against a
   * real tool means restarting it) and wall time. Default 80 and 60 s.
   */
  minimizeRuns?: number;
  minimizeS?: number;
  log?: (line: string) => void;
}

export interface FuzzReport {
  exchange: string;
  peer: string;
  seed: number;
  /** What was asked: at most `count` inputs, for at most `timeLimitS` (minimization aside). */
  count: number;
  timeLimitS: number;
  tried: number;
  batches: number;
  /** Known-good requests after a batch: answered, failed after a fatal NAK (the QP error IBTA demands), failed without one. */
  liveness: { checks: number; ok: number; explainedFailures: number; unexplainedFailures: number };
  reconnects: number;
  durationMs: number;
  /** Time spent reproducing and minimizing findings (inside durationMs). */
  minimizeMs: number;
  /** Inputs per second of fuzzing (minimization time excluded). */
  inputsPerSecond: number;
  findings: { kind: string; detail: string; datagrams: number; reproduced: boolean; replay?: string; pcap?: string; file: ReplayFile }[];
}

const FATAL_NAKS = [NAK_CODE.INVALID_REQUEST, NAK_CODE.REMOTE_ACCESS_ERROR, NAK_CODE.REMOTE_OPERATIONAL_ERROR];

const toHex = (b: Uint8Array): string => Buffer.from(b).toString('hex');
const fromHex = (s: string): Uint8Array => Uint8Array.from(Buffer.from(s, 'hex'));

const INTERESTING = [0, 1, 0x7f, 0x80, 0xff];

/** One mutated datagram from a template, `rng`-driven. */
export function mutate(rng: Rng, template: Uint8Array): { bytes: Uint8Array; icrc: IcrcChoice } {
  let b = Uint8Array.from(template);
  const pick = (n: number): number => Math.floor(rng.next() * n);
  const n = 1 + pick(3);
  for (let i = 0; i < n; i++) {
    const what = pick(8);
    if (b.length === 0) b = new Uint8Array(1);
    switch (what) {
      case 0: { // a BTH field to an interesting value
        const fields: [number, number][] = [[0, 1], [1, 1], [2, 2], [4, 1], [5, 3], [8, 1], [9, 3]];
        const [at, len] = fields[pick(fields.length)]!;
        const v = INTERESTING[pick(INTERESTING.length)]!;
        for (let k = 0; k < len && at + k < b.length; k++) b[at + k] = k === len - 1 ? v : v === 0 ? 0 : v === 1 ? 0 : v;
        break;
      }
      case 1: case 2: { // bit flip
        const at = pick(b.length);
        b[at] = b[at]! ^ (1 << pick(8));
        break;
      }
      case 3: case 4: // random byte
        b[pick(b.length)] = pick(256);
        break;
      case 5: // PSN nudged
        if (b.length >= 12) writeU24(b, 9, psnAdd(readU24(b, 9), pick(5) - 2));
        break;
      case 6: // truncate
        b = b.subarray(0, pick(b.length + 1));
        break;
      default: { // extend
        const extra = new Uint8Array(1 + pick(16));
        for (let k = 0; k < extra.length; k++) extra[k] = pick(256);
        const nb = new Uint8Array(b.length + extra.length);
        nb.set(b);
        nb.set(extra, b.length);
        b = nb;
      }
    }
  }
  return { bytes: Uint8Array.from(b), icrc: rng.next() < 0.05 ? 'bad' : 'good' };
}

function inputOf(p: Prober, bytes: Uint8Array, icrc: IcrcChoice, template: Uint8Array): FuzzInput {
  const rebaseQp = bytes.length >= 8 && readU24(bytes, 5) === p.peerQpn;
  let psnDelta: number | null = null;
  if (bytes.length >= 12) {
    const d = psnDiff(readU24(bytes, 9), p.nextPsn);
    if (Math.abs(d) < 64) psnDelta = d;
  }
  return { hex: toHex(bytes), icrc, rebaseQp, psnDelta, template: toHex(template) };
}

/** The bytes of an input for the current session. */
export function rebase(p: Prober, i: FuzzInput): Uint8Array {
  const b = fromHex(i.hex);
  if (i.rebaseQp && b.length >= 8) writeU24(b, 5, p.peerQpn);
  if (i.psnDelta !== null && b.length >= 12) writeU24(b, 9, psnAdd(p.nextPsn, i.psnDelta));
  return b;
}

/** Valid requests of the session to mutate. */
function templates(p: Prober, keeper: SessionKeeper): Uint8Array[] {
  const s = keeper.session!;
  const psn = p.nextPsn;
  const out = [Prober.bytes(goodOp(p, s, psn).pkt)];
  const m = s.memory;
  if (m && s.access.includes('write')) {
    out.push(Prober.bytes(p.request('RC_RDMA_WRITE_ONLY', { psn, reth: { va: m.va + 64n, rkey: m.rkey, dmaLength: 16 }, payload: new Uint8Array(16).fill(7) })));
  }
  if (m && s.access.includes('read')) out.push(Prober.bytes(p.request('RC_RDMA_READ_REQUEST', { psn, reth: { va: m.va, rkey: m.rkey, dmaLength: 32 } })));
  if (m && s.access.includes('atomic')) {
    out.push(Prober.bytes(p.request('RC_FETCH_ADD', { psn, atomicEth: { va: m.va + 128n, rkey: m.rkey, swapAdd: 1n, compare: 0n } })));
  }
  if (s.recvPosted) out.push(Prober.bytes(p.request('RC_SEND_ONLY', { psn, payload: new Uint8Array(5).fill(3) })));
  out.push(Prober.bytes(p.ack(psnAdd(p.peerPsn, -1))));
  return out;
}

/** What the oracle concluded about a batch. */
interface Verdict {
  broken: boolean;
  kind: 'liveness' | 'correctness';
  detail: string;
  /** The peer NAKed with a fatal code: its QP error is expected. */
  explained: boolean;
}

/** Liveness tallies, when the caller keeps them. */
type Tally = FuzzReport['liveness'];

async function judge(p: Prober, keeper: SessionKeeper, since: { rx: number }, t: Timing, tally?: Tally): Promise<Verdict> {
  await sleep(t.quietMs);
  const rx: Rx[] = p.received(since);
  const bad = rx.find((r) => r.icrcOk && (!r.parsed.ok || r.parsed.packet.bth.destQp !== p.ourQpn));
  if (bad) return { broken: true, kind: 'correctness', detail: `the peer sent ${describeRx(bad)} (not a well-formed packet for our QP)`, explained: false };
  catchUp(p, rx);
  const live = await liveness(p, keeper.session!, t);
  // A fatal NAK may also answer the liveness request itself: an input the peer accepted (a
  // SEND FIRST, say) can make the known-good request an opcode sequence error.
  const fatal = p.received(since).find((r) => FATAL_NAKS.some((c) => isNak(r, c)));
  if (tally) tally.checks++;
  if (live !== 'failed') {
    if (tally) tally.ok++;
    return { broken: false, kind: 'liveness', detail: live, explained: false };
  }
  if (fatal) {
    if (tally) tally.explainedFailures++;
    return { broken: false, kind: 'liveness', detail: `QP error after ${describeRx(fatal)}`, explained: true };
  }
  if (tally) tally.unexplainedFailures++;
  return { broken: true, kind: 'liveness', detail: 'the peer stopped answering a known-good request without any NAK explaining it', explained: false };
}

/**
 * Moves our next PSN past every request the peer's answers show it executed. Inputs at the
 * expected PSN are executed like any request, so the peer's ePSN may be ahead of ours; a
 * known-good request at a consumed PSN is a duplicate, and a duplicate READ for another range
 * is dropped by rxe without an answer (duplicate_request() in rxe_resp.c) — a false finding.
 */
function catchUp(p: Prober, rx: readonly Rx[]): void {
  for (const r of rx) {
    if (!r.icrcOk || !r.parsed.ok || !Prober.isResponse(r)) continue;
    const pk = r.parsed.packet;
    let next: number;
    if (pk.aeth && (pk.aeth.syndrome & 0x60) !== 0) {
      // RNR NAK or NAK: the PSN it carries is the one the peer waits for (fatal NAKs end the QP anyway).
      next = pk.bth.psn;
    } else {
      next = psnAdd(pk.bth.psn, 1);
    }
    // Within the window only: a wild PSN is no evidence.
    const d = psnDiff(next, p.nextPsn);
    if (d > 0 && d < 1024) p.nextPsn = next;
  }
}

async function sendAll(p: Prober, inputs: readonly FuzzInput[]): Promise<void> {
  for (const i of inputs) {
    p.sendBytes(rebase(p, i), i.icrc);
    await new Promise((r) => setImmediate(r));
  }
}

/** Replays `inputs` on a fresh session; true when the same kind of failure shows. */
async function reproduces(p: Prober, keeper: SessionKeeper, inputs: readonly FuzzInput[], kind: string, t: Timing): Promise<boolean> {
  if (!(await keeper.connect({}, 'reproduce'))) return false;
  const since = p.mark();
  await sendAll(p, inputs);
  const v = await judge(p, keeper, since, t);
  return v.broken && v.kind === kind;
}

/**
 * Fewest datagrams (ddmin-style), then each byte put back to the template's while it still
 * fails. Bounded by `runs` reproductions and the wall clock (`until`): against a real tool every
 * reproduction is a restart of the tool.
 */
async function minimize(
  p: Prober, keeper: SessionKeeper, inputs: FuzzInput[], kind: string, t: Timing, log: (l: string) => void, runs: number, until: number,
): Promise<FuzzInput[]> {
  let cur = inputs;
  let budget = runs;
  /** Takes one run from the budget; false when none is left. */
  const take = (): boolean => budget-- > 0 && Date.now() < until;
  // Singles first: most findings are one datagram.
  for (const i of cur) {
    if (!take()) break;
    if (await reproduces(p, keeper, [i], kind, t)) {
      cur = [i];
      break;
    }
  }
  let n = 2;
  let out = false;
  while (cur.length > 1 && !out) {
    const size = Math.ceil(cur.length / n);
    let reduced = false;
    for (let k = 0; k < cur.length; k += size) {
      if (!take()) {
        out = true;
        break;
      }
      const rest = [...cur.slice(0, k), ...cur.slice(k + size)];
      if (rest.length && (await reproduces(p, keeper, rest, kind, t))) {
        cur = rest;
        n = Math.max(n - 1, 2);
        reduced = true;
        break;
      }
    }
    if (!reduced && !out) {
      if (size === 1) break;
      n = Math.min(cur.length, n * 2);
    }
  }
  log(`minimized to ${cur.length} datagram(s)`);
  if (cur.length === 1 && cur[0]!.template) {
    const one = { ...cur[0]! };
    let b = fromHex(one.hex);
    const tpl = fromHex(one.template!);
    if (b.length > tpl.length && take()) {
      const cut = { ...one, hex: toHex(b.subarray(0, tpl.length)) };
      if (await reproduces(p, keeper, [cut], kind, t)) b = fromHex(cut.hex);
    }
    if (one.icrc !== 'good' && take()) {
      if (await reproduces(p, keeper, [{ ...one, hex: toHex(b), icrc: 'good' }], kind, t)) one.icrc = 'good';
    }
    for (let i = 0; i < Math.min(b.length, tpl.length); i++) {
      if (b[i] === tpl[i]) continue;
      if (!take()) break;
      const tryB = Uint8Array.from(b);
      tryB[i] = tpl[i]!;
      if (await reproduces(p, keeper, [{ ...one, hex: toHex(tryB) }], kind, t)) b = tryB;
    }
    cur = [{ ...one, hex: toHex(b) }];
  }
  return cur;
}

export async function fuzzPeer(o: FuzzOptions): Promise<FuzzReport> {
  const log = o.log ?? (() => undefined);
  const p = o.prober;
  const rng = new Rng(o.seed);
  const keeper = new SessionKeeper(p, o.exchange, log);
  const batch = o.batch ?? 8;
  const t0 = Date.now();
  const deadline = t0 + o.timeLimitS * 1000;
  const report: FuzzReport = {
    exchange: o.exchange.name, peer: `${p.peer.address}:${p.peer.port}`, seed: o.seed, count: o.count, timeLimitS: o.timeLimitS,
    tried: 0, batches: 0, liveness: { checks: 0, ok: 0, explainedFailures: 0, unexplainedFailures: 0 }, reconnects: 0, durationMs: 0,
    minimizeMs: 0, inputsPerSecond: 0, findings: [],
  };
  if (!(await keeper.connect({}, undefined))) throw new Error(`no session with the peer: ${keeper.lastError ?? '?'}`);
  const save = async (f: FuzzReport['findings'][number], pcap: Uint8Array): Promise<void> => {
    if (o.outDir && o.writeFile) {
      const base = `${o.outDir}/finding-${o.seed}-${report.findings.length + 1}`;
      await o.writeFile(`${base}.replay.json`, JSON.stringify(f.file, null, 2) + '\n');
      await o.writeFile(`${base}.pcap`, pcap);
      f.replay = `${base}.replay.json`;
      f.pcap = `${base}.pcap`;
    }
    report.findings.push(f);
  };
  const fileOf = (kind: ReplayFile['finding']['kind'], detail: string, s: PeerSession, datagrams: FuzzInput[]): ReplayFile => ({
    kind: 'roce-conform-replay', version: 1, exchange: o.exchange.name, peer: `${p.peer.address}:${p.peer.port}`, seed: o.seed,
    finding: { kind, detail },
    session: { peerQpn: '0x' + s.peerQpn.toString(16), ourPsn: '0x' + s.ourPsn.toString(16), access: s.access, recvPosted: s.recvPosted },
    datagrams,
  });
  while (report.tried < o.count && Date.now() < deadline) {
    const tpls = templates(p, keeper);
    const inputs: FuzzInput[] = [];
    for (let i = 0; i < batch && report.tried + inputs.length < o.count; i++) {
      const tpl = tpls[Math.floor(rng.next() * tpls.length)]!;
      const m = mutate(rng, tpl);
      inputs.push(inputOf(p, m.bytes, m.icrc, tpl));
    }
    const since = p.mark();
    const baseSession = keeper.session!;
    await sendAll(p, inputs);
    report.tried += inputs.length;
    report.batches++;
    const v = await judge(p, keeper, since, o.timing, report.liveness);
    if (v.explained) {
      report.reconnects++;
      if (await keeper.connect({}, 'QP error after a fatal NAK')) continue;
      // The peer gave no new session (its tool did not come back): that is a finding too, the
      // batch before it the only suspect. Nothing to minimize without a session.
      const detail = `no new session after ${v.detail}: ${keeper.lastError ?? 'exchange failed'}`;
      log(`batch ${report.batches}: ${detail}`);
      await save({ kind: 'session', detail, datagrams: inputs.length, reproduced: false, file: fileOf('session', detail, baseSession, inputs) }, p.pcap(since));
      break;
    }
    if (!v.broken) continue;
    const original = { from: since, until: p.log.length };
    log(`batch ${report.batches}: ${v.kind}: ${v.detail}; minimizing ${inputs.length} datagrams`);
    const m0 = Date.now();
    const min = (await reproduces(p, keeper, inputs, v.kind, o.timing))
      ? await minimize(p, keeper, inputs, v.kind, o.timing, log, o.minimizeRuns ?? 80, Date.now() + (o.minimizeS ?? 60) * 1000)
      : inputs;
    // One last reproduction, recorded for the pcap; when it does not show, the pcap is of the original batch.
    const pcapFrom = p.mark();
    const ok = await reproduces(p, keeper, min, v.kind, o.timing);
    report.minimizeMs += Date.now() - m0;
    const detail = v.detail + (ok ? '' : ' (did not reproduce reliably)');
    await save(
      { kind: v.kind, detail, datagrams: min.length, reproduced: ok, file: fileOf(v.kind, detail, baseSession, min) },
      ok ? p.pcap(pcapFrom) : p.pcap(original.from, original.until),
    );
    report.reconnects++;
    if (report.findings.length >= (o.maxFindings ?? 1)) break;
    if (!(await keeper.connect({}, 'after a finding'))) break;
  }
  await keeper.session?.close().catch(() => undefined);
  report.durationMs = Date.now() - t0;
  report.inputsPerSecond = Math.round((report.tried / Math.max(1, report.durationMs - report.minimizeMs)) * 1000);
  return report;
}

/** Replays a saved finding on a fresh session: does the failure show again? */
export async function replayFile(o: { prober: Prober; exchange: Exchange; file: ReplayFile; timing: Timing; log?: (l: string) => void }): Promise<{ reproduced: boolean; detail: string }> {
  const keeper = new SessionKeeper(o.prober, o.exchange, o.log ?? (() => undefined));
  if (!(await keeper.connect({}, undefined))) return { reproduced: false, detail: `no session: ${keeper.lastError ?? '?'}` };
  const since = o.prober.mark();
  await sendAll(o.prober, o.file.datagrams);
  const v = await judge(o.prober, keeper, since, o.timing);
  await keeper.session?.close().catch(() => undefined);
  return { reproduced: v.broken && v.kind === o.file.finding.kind, detail: v.broken ? `${v.kind}: ${v.detail}` : `peer healthy (${v.detail})` };
}

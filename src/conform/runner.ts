/**
 * Plays cases against a peer: session set-up through an exchange, one case at a time, a
 * liveness check after each (a known-good request must still be answered), and a fresh
 * exchange whenever the peer's QP is gone, which IBTA requires after class A/C/J errors and
 * retry exhaustion, and which is the only way on after a peer stopped answering.
 */

import { NAK_CODE } from '../wire/aeth.js';
import { psnAdd, psnDiff } from '../wire/psn.js';
import { parsePacket } from '../wire/packet.js';
import type { Exchange, PeerSession, SessionVariant } from './exchange.js';
import { Prober, sleep, type ReqOptions, type Rx } from './prober.js';
import { CASES, SUITES, type CaseCtx, type CaseDef, type GoodOp, type Outcome, type Timing, type Verdict } from './cases.js';
import { describeRx, hex, isAck, isNak } from './describe.js';

export interface PacketRecord {
  dir: 'tx' | 'rx';
  atMs: number;
  summary: string;
  hex: string;
}

export interface CaseResult {
  id: string;
  title: string;
  rule: string;
  expected: string;
  verdict: Verdict;
  observed: string;
  notes: string[];
  /** What the liveness check after the case found. */
  liveness: 'ok' | 'resynced' | 'reconnected' | 'failed' | 'skipped';
  durationMs: number;
  /** Relative path of the case's pcap (deviations, stops and errors). */
  pcap?: string;
  packets?: PacketRecord[];
}

export interface RunReport {
  tool: 'roce conform';
  exchange: string;
  peer: string;
  startedAt: string;
  durationMs: number;
  session?: { peerQpn: string; mtu: number; access: string[]; recvPosted: boolean; echoes: boolean; retryCnt?: number; timeout?: number; memory?: { rkey: string; va: string; length: number } };
  counts: Record<Verdict, number>;
  cases: CaseResult[];
}

export interface RunOptions {
  prober: Prober;
  exchange: Exchange;
  suite?: string;
  /** Case ids to run instead of a suite. */
  only?: readonly string[];
  timing?: Partial<Timing>;
  /** Where pcaps of failing cases go; undefined = keep packets only in the report. */
  pcapDir?: string;
  /** Name the pcaps get in the report (relative to the report). */
  pcapPrefix?: string;
  log?: (line: string) => void;
  /** Write a pcap: injected so that the runner stays free of the file system in tests. */
  writeFile?: (path: string, data: Uint8Array) => Promise<void>;
}

export const DEFAULT_TIMING: Timing = { responseMs: 1000, quietMs: 400 };

export function casesOf(suite: string | undefined, only: readonly string[] | undefined): CaseDef[] {
  const ids = only ?? SUITES[suite ?? 'all'];
  if (!ids) throw new Error(`unknown suite ${suite}; suites: ${Object.keys(SUITES).join(', ')}`);
  return ids.map((id) => {
    const c = CASES.find((x) => x.id === id);
    if (!c) throw new Error(`unknown case ${id}`);
    return c;
  });
}

/** A session holder: connects, reconnects (restarting the peer when the exchange can), and remembers the variant. */
export class SessionKeeper {
  session: PeerSession | undefined;
  variantKey = '';
  lastError: string | undefined;

  constructor(readonly p: Prober, readonly ex: Exchange, readonly log: (l: string) => void) {}

  async connect(v: SessionVariant, restart: string | undefined): Promise<PeerSession | undefined> {
    await this.session?.close().catch(() => undefined);
    this.session = undefined;
    for (let attempt = 0; attempt < 2; attempt++) {
      try {
        if (restart !== undefined && this.ex.restart) await this.ex.restart(restart);
        const s = await this.ex.connect(this.p.ourQpn, this.p.link.local.address, v);
        if (s.peerUdpPort !== undefined) this.p.peer.port = s.peerUdpPort;
        this.p.mtu = s.mtu;
        this.p.resetSession(s.peerQpn, s.ourPsn, s.peerPsn);
        this.session = s;
        this.variantKey = JSON.stringify(v);
        this.log(`session: peer QP ${hex(s.peerQpn)}, our PSN ${hex(s.ourPsn)}, peer PSN ${hex(s.peerPsn)}`);
        // The peer may need a moment between answering the exchange and moving its QP to RTR.
        await sleep(20);
        return s;
      } catch (e) {
        this.lastError = (e as Error).message;
        this.log(`exchange failed: ${this.lastError}`);
        restart ??= 'exchange failed';
      }
    }
    return undefined;
  }
}

/** The known-good request for a session. */
export function goodOp(p: Prober, s: PeerSession, psn: number, o: Partial<ReqOptions> = {}): GoodOp {
  const m = s.memory;
  if (s.recvPosted) {
    return { pkt: p.request('RC_SEND_ONLY', { payload: new Uint8Array(8).fill(0x5e), ...o, psn }), ok: (r) => isAck(r, psn), what: 'SEND' };
  }
  if (m && s.access.includes('write')) {
    return {
      pkt: p.request('RC_RDMA_WRITE_ONLY', { reth: { va: m.va, rkey: m.rkey, dmaLength: 8 }, payload: new Uint8Array(8).fill(0x5e), ...o, psn }),
      ok: (r) => isAck(r, psn), what: 'WRITE',
    };
  }
  if (m && s.access.includes('read')) {
    return {
      pkt: p.request('RC_RDMA_READ_REQUEST', { reth: { va: m.va, rkey: m.rkey, dmaLength: 8 }, ...o, psn }),
      ok: (r) => r.parsed.ok && r.parsed.info.name === 'RC_RDMA_READ_RESPONSE_ONLY' && r.parsed.packet.bth.psn === psn, what: 'READ',
    };
  }
  if (m && s.access.includes('atomic')) {
    return {
      pkt: p.request('RC_FETCH_ADD', { atomicEth: { va: m.va, rkey: m.rkey, swapAdd: 0n, compare: 0n }, ...o, psn }),
      ok: (r) => r.parsed.ok && r.parsed.info.name === 'RC_ATOMIC_ACKNOWLEDGE' && r.parsed.packet.bth.psn === psn, what: 'FetchAdd',
    };
  }
  // Nothing is allowed: a SEND still draws an answer (RNR NAK), which proves the QP is alive.
  return {
    pkt: p.request('RC_SEND_ONLY', { payload: new Uint8Array(8), ...o, psn }),
    ok: (r) => Prober.isResponse(r) && r.parsed.ok && r.parsed.packet.bth.psn === psn && !isNak(r, NAK_CODE.INVALID_REQUEST), what: 'SEND',
  };
}

/**
 * The liveness check: a known-good request at the next PSN must be answered. A NAK PSN
 * sequence error tells us the peer expects another PSN (a case moved it): we take its word and
 * retry once. Returns 'ok', 'resynced' or 'failed'.
 */
export async function liveness(p: Prober, s: PeerSession, t: Timing): Promise<'ok' | 'resynced' | 'failed'> {
  let resynced = false;
  for (let i = 0; i < 3; i++) {
    const psn = p.nextPsn;
    const op = goodOp(p, s, psn);
    const since = p.mark();
    p.send(op.pkt);
    const r = await p.waitFor((x) => Prober.isResponse(x), t.responseMs, since);
    if (!r) return 'failed';
    if (op.ok(r)) {
      // A SEND the peer did not answer with ACK (RNR) leaves the ePSN where it was.
      if (!(r.parsed.ok && r.parsed.packet.aeth && (r.parsed.packet.aeth.syndrome & 0x60) === 0x20)) p.nextPsn = psnAdd(psn, 1);
      return resynced ? 'resynced' : 'ok';
    }
    if (r.parsed.ok && isNak(r, NAK_CODE.PSN_SEQUENCE_ERROR)) {
      p.nextPsn = r.parsed.packet.bth.psn;
      resynced = true;
      continue;
    }
    // A re-ACK of a later PSN: our request was a duplicate, the peer accepted more than we counted.
    if (r.parsed.ok && isAck(r) && psnDiff(r.parsed.packet.bth.psn, psn) > 0) {
      p.nextPsn = psnAdd(r.parsed.packet.bth.psn, 1);
      resynced = true;
      continue;
    }
    // Duplicate or stray answers: look once more for ours.
    const again = await p.waitFor((x) => op.ok(x), t.responseMs / 2, since);
    if (again) {
      p.nextPsn = psnAdd(psn, 1);
      return resynced ? 'resynced' : 'ok';
    }
    return 'failed';
  }
  return 'failed';
}

class Ctx implements CaseCtx {
  readonly notes: string[] = [];
  readonly since: { log: number; rx: number };
  private waitSince: { log: number; rx: number };
  constructor(readonly p: Prober, readonly s: PeerSession, readonly t: Timing) {
    this.since = p.mark();
    this.waitSince = this.since;
  }

  fresh(): void {
    this.waitSince = this.p.mark();
  }

  goodOp(psn: number, o?: Partial<ReqOptions>): GoodOp {
    return goodOp(this.p, this.s, psn, o);
  }

  waitResponse(pred: (r: Rx) => boolean, ms = this.t.responseMs): Promise<Rx | undefined> {
    return this.p.waitFor(pred, ms, this.waitSince);
  }

  async quiet(ms = this.t.quietMs): Promise<Rx[]> {
    const from = this.p.mark();
    await sleep(ms);
    // Our own auto-ACK traffic and the peer's requests (echoes) are not answers to a case.
    return this.p.received(from).filter((r) => Prober.isResponse(r) || !r.parsed.ok || !r.icrcOk);
  }

  async probe(epsn: number): Promise<{ ok: boolean; observed: string }> {
    const probePsn = psnAdd(epsn, 1);
    const from = this.p.mark();
    this.p.send(this.goodOp(probePsn).pkt);
    const r = await this.p.waitFor((x) => Prober.isResponse(x), this.t.responseMs, from);
    if (r && isNak(r, NAK_CODE.PSN_SEQUENCE_ERROR, epsn)) return { ok: true, observed: `ePSN still ${hex(epsn)}` };
    if (r?.parsed.ok && r.parsed.packet.bth.psn === probePsn && !isNak(r, NAK_CODE.PSN_SEQUENCE_ERROR)) {
      this.p.nextPsn = psnAdd(probePsn, 1);
      return { ok: false, observed: `the peer accepted the probe at ${hex(probePsn)} (${describeRx(r)}): the dropped packet was executed` };
    }
    return { ok: false, observed: `probe at ${hex(probePsn)} drew ${r ? describeRx(r) : 'no answer'}` };
  }

  async write(off: number, data: Uint8Array): Promise<boolean> {
    const m = this.s.memory!;
    const psn = this.p.nextPsn;
    const from = this.p.mark();
    this.p.send(this.p.request('RC_RDMA_WRITE_ONLY', { psn, reth: { va: m.va + BigInt(off), rkey: m.rkey, dmaLength: data.length }, payload: data }));
    const r = await this.p.waitFor((x) => isAck(x, psn), this.t.responseMs, from);
    if (r) this.p.nextPsn = psnAdd(psn, 1);
    return r !== undefined;
  }

  async read(off: number, len: number, mem = this.s.memory): Promise<Uint8Array | undefined> {
    const m = mem!;
    const psn = this.p.nextPsn;
    const from = this.p.mark();
    this.p.send(this.p.request('RC_RDMA_READ_REQUEST', { psn, reth: { va: m.va + BigInt(off), rkey: m.rkey, dmaLength: len } }));
    const r = await this.p.waitFor((x) => x.parsed.ok && x.parsed.info.kind === 'readResponse' && x.parsed.packet.bth.psn === psn, this.t.responseMs, from);
    if (!r?.parsed.ok) return undefined;
    this.p.nextPsn = psnAdd(psn, Math.max(1, Math.ceil(len / this.s.mtu)));
    return Uint8Array.from(r.parsed.packet.payload);
  }

  note(s: string): void {
    this.notes.push(s);
  }
}

const emptyCounts = (): Record<Verdict, number> => ({ pass: 0, deviation: 0, 'peer-stopped': 0, 'not-applicable': 0, error: 0 });

export async function runConformance(o: RunOptions): Promise<RunReport> {
  const t: Timing = { ...DEFAULT_TIMING, ...(o.timing ?? {}) };
  const log = o.log ?? (() => undefined);
  const p = o.prober;
  const keeper = new SessionKeeper(p, o.exchange, log);
  const t0 = Date.now();
  const report: RunReport = {
    tool: 'roce conform', exchange: o.exchange.name, peer: `${p.peer.address}:${p.peer.port}`, startedAt: new Date(t0).toISOString(),
    durationMs: 0, counts: emptyCounts(), cases: [],
  };
  let needRestart: string | undefined;
  for (const def of casesOf(o.suite, o.only)) {
    const c0 = Date.now();
    const base = { id: def.id, title: def.title, rule: def.rule, expected: def.expected };
    const variant = def.variant?.(o.exchange.name) ?? {};
    const cannot = o.exchange.cannot(variant);
    if (cannot) {
      push({ ...base, verdict: 'not-applicable', observed: cannot, notes: [], liveness: 'skipped', durationMs: 0 });
      continue;
    }
    let s = keeper.session;
    if (!s || needRestart !== undefined || keeper.variantKey !== JSON.stringify(variant)) {
      s = await keeper.connect(variant, needRestart ?? (s ? 'new session variant' : undefined));
      needRestart = undefined;
    }
    if (!s) {
      push({ ...base, verdict: 'peer-stopped', observed: `no session with the peer: ${keeper.lastError ?? 'exchange failed'}`, notes: [], liveness: 'failed', durationMs: Date.now() - c0 });
      needRestart = 'exchange failed';
      continue;
    }
    if (!report.session) {
      report.session = {
        peerQpn: hex(s.peerQpn), mtu: s.mtu, access: s.access, recvPosted: s.recvPosted, echoes: s.echoes,
        ...(s.retryCnt !== undefined ? { retryCnt: s.retryCnt } : {}), ...(s.timeout !== undefined ? { timeout: s.timeout } : {}),
        ...(s.memory ? { memory: { rkey: hex(s.memory.rkey, 8), va: '0x' + s.memory.va.toString(16), length: s.memory.length } } : {}),
      };
    }
    const why = def.requires?.(s);
    if (why) {
      push({ ...base, verdict: 'not-applicable', observed: why, notes: [], liveness: 'skipped', durationMs: 0 });
      continue;
    }
    log(`case ${def.id}`);
    const ctx = new Ctx(p, s, t);
    let out: Outcome | { verdict: 'error'; observed: string };
    try {
      out = await def.run(ctx);
    } catch (e) {
      out = { verdict: 'error', observed: `harness error: ${(e as Error).message}` };
    }
    p.autoAck = true;
    let live: CaseResult['liveness'] = await liveness(p, s, t);
    const endLog = p.log.length;
    let result: CaseResult = { ...base, verdict: out.verdict, observed: out.observed, notes: ctx.notes, liveness: live, durationMs: 0 };
    if (live === 'failed') {
      if (def.fatal) {
        result.notes.push('the peer\'s QP stopped answering afterwards, as IBTA requires (QP in the Error state); reconnected');
      } else if (out.verdict !== 'error') {
        result.verdict = 'peer-stopped';
        result.observed = `${out.observed}; then the peer stopped answering (the liveness check got no answer)`;
      }
      needRestart = `${def.id}: the peer's QP stopped answering`;
      s = await keeper.connect({}, needRestart);
      needRestart = undefined;
      live = s ? 'reconnected' : 'failed';
      result.liveness = live;
    } else if (def.fatal && out.verdict === 'pass' && def.id !== 'retry-exhaustion') {
      result.verdict = 'deviation';
      result.observed = `${out.observed}; but the QP kept answering (IBTA: the QP goes to the Error state)`;
    }
    if (def.fatal && live !== 'failed' && s && keeper.variantKey === '{}' && live !== 'reconnected') {
      // The peer's QP is still up after a fatal case: start the next case on a fresh one anyway.
      needRestart = `${def.id}: fresh session after an error case`;
    }
    if (def.after && s && out.verdict !== 'error') {
      const actx = new Ctx(p, s, t);
      try {
        const a = await def.after(actx, { verdict: result.verdict === 'pass' ? 'pass' : 'deviation', observed: result.observed });
        if (result.verdict === 'pass' || (result.verdict === 'deviation' && a.verdict === 'deviation')) {
          result.verdict = a.verdict;
          result.observed = a.observed;
        }
        result.notes.push(...actx.notes);
      } catch (e) {
        result.notes.push(`after-check failed: ${(e as Error).message}`);
      }
    }
    result.durationMs = Date.now() - c0;
    if (result.verdict !== 'pass') result = await attachPackets(result, ctx.since.log, endLog);
    push(result);
    log(`  ${result.verdict}: ${result.observed}`);
  }
  await keeper.session?.close().catch(() => undefined);
  report.durationMs = Date.now() - t0;
  return report;

  function push(r: CaseResult): void {
    report.cases.push(r);
    report.counts[r.verdict]++;
  }

  async function attachPackets(r: CaseResult, from: number, until: number): Promise<CaseResult> {
    r.packets = p.log.slice(from, until).map((x) => ({
      dir: x.dir, atMs: Math.round(x.at * 10) / 10, summary: describeRx({ at: x.at, bytes: x.bytes, parsed: parseOf(x.bytes), icrcOk: true }),
      hex: Buffer.from(x.bytes).toString('hex'),
    }));
    if (o.pcapDir && o.writeFile) {
      const name = `${o.pcapPrefix ?? ''}${r.id}.pcap`;
      await o.writeFile(`${o.pcapDir}/${name}`, p.pcap({ log: from }, until));
      r.pcap = name;
    }
    return r;
  }
}

const parseOf = (b: Uint8Array): ReturnType<typeof parsePacket> => parsePacket(b);

/**
 * Congestion control inside the engine (src/core/cc-hooks.ts), on MemoryLink + FaultyLink and a
 * VirtualClock: the NP answers FECN-marked requests with CNPs at most once per interval per QP,
 * the CNPs reach the sender's RP and cut its rate, a fixed rate paces the requester, and with
 * `cc: 'none'` marks change nothing at all.
 */

import t from 'tap';
import { allocPd, createCq, openDevice, postSend, queryQpCc, regMr, type Qp } from '../../src/api/verbs.js';
import type { CcOption } from '../../src/core/cc-hooks.js';
import { FaultyLink } from '../../src/link/fault.js';
import type { PeerAddress } from '../../src/link/link.js';
import { MemoryLink } from '../../src/link/memory.js';
import { VirtualClock } from '../../src/runtime/clock.js';
import { CNP_OPCODE } from '../../src/wire/opcode.js';
import { ALL_ACCESS, bringUp, collect, makeQp, pattern, sha256, type Side } from '../helpers/engine.js';

interface Setup {
  clock: VirtualClock;
  a: Side;
  b: Side;
  /** CNPs the receiver put on the wire: time and DestQP. */
  cnps: { at: number; destQp: number }[];
}

/** Sender `a` (its requests FECN-marked at `fecnPct`) and receiver `b`. */
async function setup(o: { ccA?: CcOption; ccB?: CcOption; fecnPct?: number; seed?: number }): Promise<Setup> {
  const clock = new VirtualClock();
  const [la, lb] = MemoryLink.pair(clock, { latencyUs: 2 });
  const wa = new FaultyLink(la, clock, { seed: o.seed ?? 1, fecnPct: o.fecnPct ?? 0, direction: 'tx' });
  const cnps: Setup['cnps'] = [];
  const send = lb.send.bind(lb);
  lb.send = (dst: PeerAddress, srcPort: number, parts: readonly Uint8Array[]) => {
    const h = parts[0]!;
    if (h[0] === CNP_OPCODE) cnps.push({ at: clock.now(), destQp: (h[5]! << 16) | (h[6]! << 8) | h[7]! });
    send(dst, srcPort, parts);
  };
  const side = async (link: typeof wa | typeof lb, cc: CcOption | undefined): Promise<Side> => {
    const ctx = await openDevice(cc === undefined ? { address: link.local.address, link, clock } : { address: link.local.address, link, clock, cc });
    const pd = allocPd(ctx);
    return { ctx, pd, cq: createCq(ctx, { cqe: 4096 }) };
  };
  return { clock, a: await side(wa, o.ccA), b: await side(lb, o.ccB), cnps };
}

function connect(s: Setup, type: 'RC' | 'UC'): [Qp, Qp] {
  const qa = makeQp(s.a, type);
  const qb = makeQp(s.b, type);
  // A 67 ms ACK timeout, as on real links: a paced sender may wait for its rate longer than
  // the helpers' 4 ms between two packets, and only every few packets asks for an ACK.
  bringUp(qa, qb, s.b.ctx, { timeout: 14 }, 0x100, 0x200, ALL_ACCESS);
  bringUp(qb, qa, s.a.ctx, { timeout: 14 }, 0x200, 0x100, ALL_ACCESS);
  return [qa, qb];
}

/** RDMA WRITEs `bytes` from a to b in 64 KiB WRs; returns the virtual time it took and whether b holds it exactly. */
function write(s: Setup, qa: Qp, bytes: number, seed = 5): { us: number; exact: boolean } {
  const src = regMr(s.a.pd, pattern(bytes, seed), ALL_ACCESS);
  const dst = regMr(s.b.pd, new Uint8Array(bytes), ALL_ACCESS);
  const chunk = 64 * 1024;
  const start = s.clock.now();
  const n = Math.ceil(bytes / chunk);
  for (let i = 0; i < n; i++) {
    const len = Math.min(chunk, bytes - i * chunk);
    postSend(qa, { wrId: i, opcode: 'RDMA_WRITE', sgList: [src.sge(i * chunk, len)], rdma: { remoteAddr: dst.va(i * chunk), rkey: dst.rkey } });
  }
  const wcs = collect(s.clock, s.a.cq, n, 10_000_000);
  if (wcs.length !== n || !wcs.every((w) => w.status === 'SUCCESS')) throw new Error(`write: ${JSON.stringify(wcs.slice(0, 3))}`);
  const us = s.clock.now() - start;
  // UC completes when its last packet leaves; let it land.
  s.clock.advanceTo(s.clock.now() + 100);
  return { us, exact: sha256(dst.buffer) === sha256(src.buffer) };
}

t.test("cc 'none': FECN marks change nothing and no CNP is sent", async (t) => {
  const runs = [];
  for (const fecnPct of [0, 50]) {
    const s = await setup({ fecnPct });
    const [qa] = connect(s, 'RC');
    const r = write(s, qa, 1 << 20);
    runs.push({ us: r.us, exact: r.exact, a: s.a.ctx.counters, b: s.b.ctx.counters, cnps: s.cnps.length, cc: queryQpCc(qa) });
  }
  const [plain, marked] = runs;
  t.ok(plain!.exact && marked!.exact, 'byte-exact');
  t.equal(marked!.us, plain!.us, 'same completion time');
  t.equal(marked!.a.sentPkts, plain!.a.sentPkts, 'same packets');
  t.equal(marked!.b.cnpSent, 0, 'no CNP sent');
  t.equal(marked!.cnps, 0, 'no CNP on the wire');
  t.equal(marked!.a.cnpRcvd, 0);
  t.match(marked!.cc, { kind: 'none', rateBps: Infinity, cnpRcvd: 0 });
});

t.test('a fixed rate paces the requester', async (t) => {
  const rate = 1e9;
  const s = await setup({ ccA: { kind: 'fixed', rateBps: rate } });
  const [qa] = connect(s, 'RC');
  const bytes = 4 << 20;
  const r = write(s, qa, bytes);
  t.ok(r.exact, 'byte-exact');
  const goodput = (bytes * 8) / (r.us / 1e6);
  // Goodput is below the wire rate by the headers' share (~3 % at a 1 KiB MTU).
  t.ok(goodput < rate && goodput > 0.93 * rate, `goodput ${(goodput / 1e6).toFixed(1)} Mb/s at a 1 Gb/s limit`);
  t.match(queryQpCc(qa), { kind: 'fixed', rateBps: rate });
});

t.test('DCQCN without marks: line rate, no CNPs', async (t) => {
  const s = await setup({ ccA: { kind: 'dcqcn', lineRateBps: 10e9 }, ccB: 'dcqcn' });
  const [qa] = connect(s, 'RC');
  const r = write(s, qa, 2 << 20);
  t.ok(r.exact);
  t.equal(s.b.ctx.counters.cnpSent, 0);
  t.match(queryQpCc(qa), { kind: 'dcqcn', rateBps: 10e9, cnpRcvd: 0 });
  const goodput = ((2 << 20) * 8) / (r.us / 1e6);
  t.ok(goodput > 9e9, `goodput ${(goodput / 1e9).toFixed(2)} Gb/s`);
});

t.test('DCQCN with marks: CNPs per QP at most once per interval, the RP slows down', async (t) => {
  const line = 10e9;
  const unmarked = await setup({ ccA: { kind: 'dcqcn', lineRateBps: line }, ccB: 'dcqcn' });
  const base = write(unmarked, connect(unmarked, 'RC')[0], 4 << 20);

  const s = await setup({ ccA: { kind: 'dcqcn', lineRateBps: line }, ccB: 'dcqcn', fecnPct: 5 });
  const [rcA, rcB] = connect(s, 'RC');
  const [ucA, ucB] = connect(s, 'UC');
  const r1 = write(s, rcA, 4 << 20, 7);
  // Right after its transfer, before the timers bring it back.
  const rcState = queryQpCc(rcA);
  const r2 = write(s, ucA, 4 << 20, 8);
  const ucState = queryQpCc(ucA);
  t.ok(r1.exact && r2.exact, 'byte-exact under marking');
  t.equal(s.a.ctx.counters.retransPkts, 0, 'no retransmission');
  t.ok(r1.us > 1.5 * base.us, `marked transfer slower: ${r1.us.toFixed(0)} µs vs ${base.us.toFixed(0)} µs unmarked`);

  const minGap = 50; // the paper profile's N
  for (const [qa, qb, a] of [[rcA, rcB, rcState], [ucA, ucB, ucState]] as const) {
    const times = s.cnps.filter((c) => c.destQp === qa.qpNum).map((c) => c.at);
    t.ok(times.length > 2, `${qa.type}: ${times.length} CNPs to QP 0x${qa.qpNum.toString(16)}`);
    const gaps = times.slice(1).map((x, i) => x - times[i]!);
    t.ok(gaps.every((g) => g >= minGap), `${qa.type}: CNPs at least ${minGap} µs apart (min gap ${Math.min(...gaps).toFixed(1)} µs)`);
    const b = queryQpCc(qb);
    t.equal(a.cnpRcvd, times.length, `${qa.type}: every CNP reached the RP`);
    t.equal(b.cnpSent, times.length, `${qa.type}: the NP counts what it sent`);
    t.ok(b.markedRcvd > b.cnpSent, `${qa.type}: more marked packets (${b.markedRcvd}) than CNPs`);
    t.ok(a.rateBps < line / 2, `${qa.type}: rate cut to ${(a.rateBps / 1e9).toFixed(2)} Gb/s`);
    t.ok(a.dcqcn !== undefined && a.dcqcn.alpha > 0.1 && a.dcqcn.targetRateBps < line, `${qa.type}: α ${a.dcqcn?.alpha.toFixed(3)}, target ${((a.dcqcn?.targetRateBps ?? 0) / 1e9).toFixed(2)} Gb/s`);
  }
  t.equal(s.b.ctx.counters.cnpSent, s.cnps.length, 'device cnpSent = CNPs on the wire');
  t.equal(s.a.ctx.counters.cnpRcvd, s.cnps.length, 'device cnpRcvd = CNPs sent (a lossless link)');
});

t.test('each QP has its own CNP interval', async (t) => {
  // A 1 ms interval, longer than each transfer: a CNP to one QP must not suppress the other's.
  const s = await setup({ ccA: { kind: 'dcqcn', lineRateBps: 10e9 }, ccB: { kind: 'dcqcn', overrides: { minTimeBetweenCnpsUs: 1000 } }, fecnPct: 100 });
  const [q1] = connect(s, 'RC');
  const [q2] = connect(s, 'RC');
  write(s, q1, 256 << 10, 1);
  write(s, q2, 256 << 10, 2);
  const to1 = s.cnps.filter((c) => c.destQp === q1.qpNum).length;
  const to2 = s.cnps.filter((c) => c.destQp === q2.qpNum).length;
  t.ok(to1 >= 1 && to2 >= 1, `both QPs got CNPs (${to1}, ${to2})`);
});

t.test("device NP off ('dcqcn' with notificationPoint: false) sends nothing", async (t) => {
  const s = await setup({ ccA: 'dcqcn', ccB: { kind: 'dcqcn', notificationPoint: false }, fecnPct: 100 });
  const [qa] = connect(s, 'RC');
  t.ok(write(s, qa, 1 << 20).exact);
  t.equal(s.cnps.length, 0);
  t.equal(s.b.ctx.counters.cnpSent, 0);
});

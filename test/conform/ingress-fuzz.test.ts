// Our own receive path under fuzzing: mutated valid packets and random bytes fed into a
// device's ingress over a MemoryLink on a VirtualClock, with ICRC checking off (so mutations
// reach the transport) and on (the link computes a good ICRC over the mutated bytes, or a
// wrong one is kept). Checked: nothing throws, every datagram is accounted for by exactly one
// counter, timers always drain (no hang), and the QP stays usable, or went to Error for a
// reason IBTA gives and that a counter names.
//
// CONFORM_FUZZ_SECONDS sets the time per mode (default 10: 20 s in CI). The longer local run
// and its coverage: see interop/CONFORMANCE.md.
import t from 'tap';
import fc from 'fast-check';
import { allocPd, createCq, destroyQp, openDevice, postRecv, postSend, pollCq, regMr } from '../../src/api/verbs.js';
import type { Counters } from '../../src/core/counters.js';
import { MemoryLink } from '../../src/link/memory.js';
import { VirtualClock } from '../../src/runtime/clock.js';
import { emitPacket, packetLength, type RocePacket } from '../../src/wire/packet.js';
import { opcodeOf } from '../../src/wire/opcode.js';
import { ALL_ACCESS, connectPair, type Side } from '../helpers/engine.js';
import type { Qp } from '../../src/api/verbs.js';

const SECONDS = Number(process.env['CONFORM_FUZZ_SECONDS'] ?? 10);
const FATAL: (keyof Counters)[] = ['badOpcodeSeq', 'invalidRequest', 'rkeyViolation', 'badLength', 'remoteOpErr'];

interface World {
  clock: VirtualClock;
  la: MemoryLink;
  lb: MemoryLink;
  a: Side;
  b: Side;
  qa: Qp;
  qb: Qp;
  mrB: ReturnType<typeof regMr>;
  mrA: ReturnType<typeof regMr>;
  fresh: number;
}

async function world(icrc: boolean): Promise<World> {
  const clock = new VirtualClock();
  const [la, lb] = MemoryLink.pair(clock, { icrc });
  const side = async (link: MemoryLink): Promise<Side> => {
    const ctx = await openDevice({ address: link.local.address, link, clock });
    return { ctx, pd: allocPd(ctx), cq: createCq(ctx, { cqe: 4096 }) };
  };
  const a = await side(la);
  const b = await side(lb);
  const [qa, qb] = connectPair({ a, b }, 'RC', { retryCnt: 2, timeout: 10, rnrRetry: 1 });
  const mrB = regMr(b.pd, new Uint8Array(8192), ALL_ACCESS);
  const mrA = regMr(a.pd, new Uint8Array(8192), ALL_ACCESS);
  for (let i = 0; i < 512; i++) postRecv(qb, { wrId: i, sgList: [mrB.sge(4096, 4096)] });
  return { clock, la, lb, a, b, qa, qb, mrB, mrA, fresh: 0 };
}

/** New QPs on the same devices, after a mutant legitimately put one in the Error state. */
function fresh(w: World): void {
  destroyQp(w.qa);
  destroyQp(w.qb);
  [w.qa, w.qb] = connectPair({ a: w.a, b: w.b }, 'RC', { retryCnt: 2, timeout: 10, rnrRetry: 1 });
  for (let i = 0; i < 512; i++) postRecv(w.qb, { wrId: i, sgList: [w.mrB.sge(4096, 4096)] });
  w.fresh++;
}

/** A packet for the link: without ICRC for `send` to append one, or whole with a zero ICRC field for `sendRaw`. */
function bytesFor(p: RocePacket, forSend: boolean): Uint8Array {
  const b = new Uint8Array(packetLength(p));
  emitPacket(p, b, 0);
  return forSend ? b.subarray(0, b.length - 4) : b;
}

function templates(w: World): Uint8Array[] {
  const bytes = (p: RocePacket): Uint8Array => bytesFor(p, w.la.caps.icrcGenerate);
  const psn = w.qb.core.respPsn;
  const bth = (name: string, o: Partial<RocePacket['bth']> = {}): RocePacket['bth'] => ({
    opcode: opcodeOf(name), se: false, m: false, padCount: 0, tver: 0, pkey: 0xffff, fecn: false, becn: false, resv6: 0,
    destQp: w.qb.qpNum, ackReq: true, resv7: 0, psn, ...o,
  });
  const reth = { va: w.mrB.addr + 64n, rkey: w.mrB.rkey, dmaLength: 16 };
  const e = new Uint8Array(0);
  return [
    bytes({ bth: bth('RC_SEND_ONLY'), payload: new Uint8Array(16).fill(1), icrc: 0 }),
    bytes({ bth: bth('RC_SEND_FIRST'), payload: new Uint8Array(1024), icrc: 0 }),
    bytes({ bth: bth('RC_SEND_LAST_WITH_IMMEDIATE'), immDt: { data: 7 }, payload: new Uint8Array(8), icrc: 0 }),
    bytes({ bth: bth('RC_RDMA_WRITE_ONLY'), reth, payload: new Uint8Array(16).fill(2), icrc: 0 }),
    bytes({ bth: bth('RC_RDMA_WRITE_FIRST'), reth: { ...reth, dmaLength: 2048 }, payload: new Uint8Array(1024), icrc: 0 }),
    bytes({ bth: bth('RC_RDMA_READ_REQUEST'), reth: { ...reth, dmaLength: 3000 }, payload: e, icrc: 0 }),
    bytes({ bth: bth('RC_COMPARE_SWAP'), atomicEth: { va: w.mrB.addr + 128n, rkey: w.mrB.rkey, swapAdd: 1n, compare: 0n }, payload: e, icrc: 0 }),
    bytes({ bth: bth('RC_FETCH_ADD'), atomicEth: { va: w.mrB.addr + 136n, rkey: w.mrB.rkey, swapAdd: 1n, compare: 0n }, payload: e, icrc: 0 }),
    bytes({ bth: bth('RC_ACKNOWLEDGE', { ackReq: false }), aeth: { syndrome: 0x1f, msn: 0 }, payload: e, icrc: 0 }),
    bytes({ bth: bth('RC_RDMA_READ_RESPONSE_ONLY', { ackReq: false }), aeth: { syndrome: 0x1f, msn: 0 }, payload: new Uint8Array(8), icrc: 0 }),
    bytes({ bth: bth('UD_SEND_ONLY'), deth: { qkey: 0x11111111, srcQp: 5 }, payload: new Uint8Array(8), icrc: 0 }),
    bytes({ bth: bth('CNP', { ackReq: false }), payload: e, icrc: 0 }),
  ];
}

const mutation = fc.oneof(
  fc.record({ kind: fc.constant('flip' as const), at: fc.nat(), bit: fc.integer({ min: 0, max: 7 }) }),
  fc.record({ kind: fc.constant('set' as const), at: fc.nat(), v: fc.integer({ min: 0, max: 255 }) }),
  fc.record({ kind: fc.constant('cut' as const), at: fc.nat() }),
  fc.record({ kind: fc.constant('grow' as const), extra: fc.uint8Array({ minLength: 1, maxLength: 40 }) }),
);
const input = fc.oneof(
  { weight: 9, arbitrary: fc.record({ tpl: fc.nat(), muts: fc.array(mutation, { minLength: 1, maxLength: 4 }), badIcrc: fc.boolean() }) },
  { weight: 1, arbitrary: fc.record({ raw: fc.uint8Array({ maxLength: 300 }) }) },
);

function apply(tpl: Uint8Array, muts: readonly { kind: string; at?: number; bit?: number; v?: number; extra?: Uint8Array }[]): Uint8Array {
  let b = Uint8Array.from(tpl);
  for (const m of muts) {
    if (m.kind === 'grow') {
      const n = new Uint8Array(b.length + m.extra!.length);
      n.set(b);
      n.set(m.extra!, b.length);
      b = n;
    } else if (b.length === 0) {
      continue;
    } else if (m.kind === 'cut') b = b.subarray(0, m.at! % (b.length + 1));
    else if (m.kind === 'flip') b[m.at! % b.length] = b[m.at! % b.length]! ^ (1 << m.bit!);
    else b[m.at! % b.length] = m.v!;
  }
  return b;
}

// Device ingress: each datagram is either accepted (rcvdPkts), a CNP, or dropped for one reason
// (the responder's own drops come on top of rcvdPkts, so they are not in this sum).
const INGRESS_DROPS: (keyof Counters)[] = ['malformed', 'noQp', 'badTransport', 'badState', 'badPkey', 'badAddr', 'badQkey'];
const sumAccounted = (c: Counters): number => INGRESS_DROPS.reduce((n, k) => n + c[k], 0) + c.rcvdPkts + c.cnpRcvd;
const fatalCount = (c: Counters): number => FATAL.reduce((n, k) => n + c[k], 0);

for (const icrc of [false, true]) {
  t.test(`ingress fuzz, ICRC ${icrc ? 'on' : 'off'}`, async (t) => {
    const w = await world(icrc);
    let tried = 0;
    let reconnects = 0;
    let maxMs = 0;
    const t0 = Date.now();
    fc.assert(fc.property(input, (inp) => {
      if (w.qa.state === 'ERR' || w.qb.state === 'ERR') fresh(w);
      const dev = w.b.ctx.device;
      const s0 = w.la.counters.sent;
      const errBefore = w.qb.state === 'ERR';
      const c0 = { ...dev.counters };
      const d0 = { ...w.lb.drops };
      const r0 = w.lb.counters.received;
      const s = performance.now();
      if ('raw' in inp) {
        w.la.sendRaw(w.lb.local, w.la.local.port, Uint8Array.from(inp.raw));
      } else {
        const tpls = templates(w);
        const b = apply(tpls[inp.tpl % tpls.length]!, inp.muts);
        if (icrc && inp.badIcrc) {
          const f = w.la.frame(w.lb.local, w.la.local.port, [b]);
          if (f) {
            f.datagram[f.datagram.length - 1] = f.datagram[f.datagram.length - 1]! ^ 0x5a;
            w.la.sendRaw(w.lb.local, w.la.local.port, f.datagram);
          }
        } else if (icrc && b.length >= 12) {
          w.la.send(w.lb.local, w.la.local.port, [b]);
        } else {
          // ICRC off: the bytes already end in their (zero) ICRC field, or are too short for one.
          w.la.sendRaw(w.lb.local, w.la.local.port, b);
        }
      }
      // Drain: every timer chain must end (retries are bounded: retry 2, rnr 1).
      w.clock.run(120_000_000);
      maxMs = Math.max(maxMs, performance.now() - s);
      const c1 = dev.counters;
      const arrived = (w.lb.counters.received - r0) + (w.lb.drops.badIcrc - d0.badIcrc) + (w.lb.drops.tooShort - d0.tooShort) + (w.lb.drops.notRoce - d0.notRoce);
      const accounted = w.lb.counters.received - r0;
      if (arrived !== w.la.counters.sent - s0) throw new Error(`link saw ${arrived} datagrams for one sent (sent ${w.la.counters.sent}, lb ${JSON.stringify(w.lb.counters)} ${JSON.stringify(w.lb.drops)} la ${JSON.stringify(w.la.drops)} now ${w.clock.now()})`);
      if (sumAccounted(c1) - sumAccounted(c0) !== accounted) throw new Error(`device accounted ${sumAccounted(c1) - sumAccounted(c0)} for ${accounted}`);
      if (!errBefore && w.qb.state === 'ERR') {
        if (fatalCount(c1) === fatalCount(c0) && w.qb.core.stateReason.indexOf('retry') < 0) throw new Error(`QP to ERR without a counted reason: ${w.qb.core.stateReason}`);
      }
      pollCq(w.b.cq, 4096);
      pollCq(w.a.cq, 4096);
      tried++;
      return true;
    }), { seed: icrc ? 4242 : 4241, numRuns: 10_000_000, interruptAfterTimeLimit: SECONDS * 1000, markInterruptAsFailure: false });
    // The QP is usable: a WRITE from A completes, or B's QP is in ERR for a counted reason and a fresh pair works.
    reconnects = w.fresh;
    // A last input that was an accepted FIRST/MIDDLE leaves B's responder inside a message, where a
    // new ONLY is an invalid opcode sequence (class C, 9.7.4.1.3): QP to ERR, rightly. That pair has
    // done nothing wrong either; the checks below need one between messages.
    if (w.qb.state === 'ERR' || w.qa.state === 'ERR' || w.qb.core.responder.inMessage(w.qb.core)) fresh(w);
    // Usable, as a responder: a well-formed WRITE at its expected PSN lands in memory…
    pollCq(w.b.cq, 4096);
    const write = bytesFor({
      bth: { opcode: opcodeOf('RC_RDMA_WRITE_ONLY'), se: false, m: false, padCount: 0, tver: 0, pkey: 0xffff, fecn: false, becn: false, resv6: 0,
        destQp: w.qb.qpNum, ackReq: true, resv7: 0, psn: w.qb.core.respPsn },
      reth: { va: w.mrB.addr + 200n, rkey: w.mrB.rkey, dmaLength: 16 }, payload: new Uint8Array(16).fill(0x77), icrc: 0,
    }, true);
    w.la.send(w.lb.local, w.la.local.port, [write]);
    w.clock.run(120_000_000);
    t.ok(w.mrB.buffer.subarray(200, 216).every((x) => x === 0x77), 'a WRITE at the expected PSN is executed afterwards', { diag: { stateB: w.qb.state, reasonB: w.qb.core.stateReason, stateA: w.qa.state, reasonA: w.qa.core.stateReason } });
    // …and as a requester: a SEND to the untouched side completes.
    postRecv(w.qa, { wrId: 5, sgList: [w.mrA.sge(0, 64)] });
    postSend(w.qb, { wrId: 99, opcode: 'SEND', sgList: [w.mrB.sge(0, 16)] });
    w.clock.run(120_000_000);
    t.match(pollCq(w.b.cq, 4096).filter((x) => x.wrId === 99), [{ status: 'SUCCESS' }], 'a SEND from the fuzzed QP completes afterwards', { diag: { stateB: w.qb.state, reasonB: w.qb.core.stateReason, stateA: w.qa.state, reasonA: w.qa.core.stateReason, aRespPsn: w.qa.core.respPsn, bSq: w.qb.core.attrs.sqPsn, bCounters: w.b.ctx.counters } });
    const secs = (Date.now() - t0) / 1000;
    t.ok(tried > 100, `${tried} inputs in ${secs.toFixed(1)} s: ${Math.round(tried / secs)} inputs/s; slowest ${maxMs.toFixed(1)} ms; ${reconnects} QP pairs replaced after legitimate errors`);
    t.comment(`ingress fuzz ICRC ${icrc ? 'on' : 'off'}: ${tried} inputs, ${Math.round(tried / secs)}/s, slowest input ${maxMs.toFixed(1)} ms`);
  });
}

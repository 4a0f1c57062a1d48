/**
 * The application's code runs inside the engine: a link or trace printer inside every send, a
 * completion handler inside every completion. Any of them may move the QP (to ERR, to RESET and back
 * up, or destroy it). The engine then leaves the QP to that later change: it does not go on with
 * the request, the error transition, the timer or the packet it was in the middle of.
 */
import t from 'tap';
import { allocPd, closeDevice, createAh, createCq, destroyQp, modifyQp, openDevice, pollCq, postRecv, postSend, regMr, type Qp } from '../../src/api/verbs.js';
import { emptyDrops, type Link, type LinkCaps, type LinkRxHandler, type PeerAddress } from '../../src/link/link.js';
import { MemoryLink } from '../../src/link/memory.js';
import { describe as describePacket, TraceLink } from '../../src/link/trace.js';
import { VirtualClock } from '../../src/runtime/clock.js';
import { aethKind, NAK_CODE, nakSyndrome } from '../../src/wire/aeth.js';
import { ALL_ACCESS, bringUp, bth, collect, connectPair, EngineHarness, makeQp, memoryPair, PEER, PEER_QPN, pattern, type ConnectOptions, type MemPair, type Side } from '../helpers/engine.js';
import { concat } from '../link/helpers.js';
import { runChild } from '../helpers/child.js';

const E = 500; // the harness's expected PSN
/** The peer as a UD address handle (its GID unused here). */
const PEER_AH = { ...PEER, dgid: new Uint8Array(16) };

/** RESET → RTS again, as an application reconnecting would. */
function reconnect(h: EngineHarness, at: number, sqPsn: number): void {
  const q = h.qp;
  q.modify(at, { qpState: 'INIT', pkeyIndex: 0, portNum: 1, qpAccessFlags: ALL_ACCESS });
  q.modify(at, { qpState: 'RTR', ahAttr: PEER, pathMtu: 256, destQpNum: PEER_QPN, rqPsn: E, maxDestRdAtomic: 4, minRnrTimer: 12 });
  q.modify(at, { qpState: 'RTS', sqPsn, timeout: 10, retryCnt: 3, rnrRetry: 3, maxRdAtomic: 4 });
}

t.test('a request behind READ responses whose send moved the QP is not executed', async (t) => {
  for (const next of ['ERR', 'RESET'] as const) {
    for (const kind of ['WRITE', 'FETCH_ADD', 'SEND', 'READ'] as const) {
      // RESET sets the expected PSN to 0: the requests carry PSN 0, so that only the state stops them.
      const psn = next === 'RESET' ? 0 : E;
      const h = new EngineHarness('RC', { sqPsnB: psn });
      const src = h.mr(pattern(600, 7));
      const dst = h.mr(64);
      h.qp.postRecv(0, [{ wrId: 9, sgList: [dst.sge(0, 64)] }]);
      // Its three responses wait for the QP's next run; the next request sends them first.
      h.send({ bth: bth('RC_RDMA_READ_REQUEST', psn, { ackReq: true }), reth: { va: src.va(0), rkey: src.rkey, dmaLength: 600 } });
      let moved = false;
      h.onTransmit = () => {
        if (moved) return;
        moved = true;
        h.qp.modify(0, { qpState: next });
      };
      const p2 = next === 'RESET' ? 0 : psn + 3;
      if (kind === 'WRITE') h.send({ bth: bth('RC_RDMA_WRITE_ONLY', p2, { ackReq: true }), reth: { va: dst.va(0), rkey: dst.rkey, dmaLength: 8 }, payload: pattern(8, 3) });
      if (kind === 'FETCH_ADD') h.send({ bth: bth('RC_FETCH_ADD', p2), atomicEth: { va: dst.va(8), rkey: dst.rkey, swapAdd: 5n, compare: 0n } });
      if (kind === 'SEND') h.send({ bth: bth('RC_SEND_ONLY', p2, { ackReq: true }), payload: pattern(8, 3) });
      if (kind === 'READ') h.send({ bth: bth('RC_RDMA_READ_REQUEST', p2, { ackReq: true }), reth: { va: src.va(0), rkey: src.rkey, dmaLength: 100 } });
      const out = h.poll();
      t.same(h.names(out), [`RDMA_READ_RESPONSE_FIRST@${psn}`], `${next}, then a ${kind}: only the response whose send moved the QP went out`);
      t.same([...dst.buffer.subarray(0, 16)], new Array(16).fill(0), `${next}, then a ${kind}: memory untouched`);
      t.equal(h.qp.state, next);
      t.equal(h.qp.respJobs.length, 0, `${next}, then a ${kind}: no READ job left`);
      t.equal(h.counters.badState, 1, `${next}, then a ${kind}: the request counted as dropped for the QP's state`);
      if (next === 'RESET') {
        // A job left on the QP used to make pollAt() answer "at once" for ever in INIT, where poll
        // sends nothing: the device ran the QP again and again at one instant.
        h.qp.modify(0, { qpState: 'INIT', pkeyIndex: 0, portNum: 1, qpAccessFlags: ALL_ACCESS });
        t.equal(h.qp.pollAt(), undefined, `RESET, then a ${kind}, then INIT: nothing to run`);
      }
    }
  }
});

t.test("the engine's error transition gives way to a state a hook set during the error's own packet or completion", async (t) => {
  const reinit = (h: EngineHarness): boolean => {
    try {
      h.qp.modify(0, { qpState: 'INIT', pkeyIndex: 0, portNum: 1, qpAccessFlags: ALL_ACCESS });
      return true;
    } catch {
      return false;
    }
  };
  // The responder's class C NAK (a MIDDLE with no FIRST), whose send the link's hook answers with RESET.
  {
    const h = new EngineHarness('RC');
    h.onTransmit = () => {
      if (h.qp.state !== 'RESET') h.qp.modify(0, { qpState: 'RESET' });
    };
    h.send({ bth: bth('RC_SEND_MIDDLE', E), payload: pattern(256) });
    t.equal(h.qp.state, 'RESET', 'responder NAK: the QP stays in the RESET the hook chose, not ERR');
    t.same(h.events.map((e) => e.type), [], 'responder NAK: no QP_FATAL for a QP the application reset');
    t.ok(reinit(h), 'responder NAK: RESET → INIT is accepted');
  }
  // The requester's local protection error (an unknown L_Key): the error completion's handler resets.
  {
    const h = new EngineHarness('RC');
    h.scq.onCompletion = (q) => {
      if (q.shift()!.status !== 'SUCCESS' && h.qp.state !== 'RESET') h.qp.modify(0, { qpState: 'RESET' });
    };
    h.qp.postSend(0, [{ wrId: 1, opcode: 'SEND', sgList: [{ addr: 0n, length: 8, lkey: 0xdead }] }]);
    h.poll();
    t.equal(h.qp.state, 'RESET', 'local error: RESET stands');
    t.same(h.events.map((e) => e.type), [], 'local error: no QP_FATAL');
    t.ok(reinit(h), 'local error: RESET → INIT is accepted');
  }
  // The completer's remote access NAK: the error completion's handler resets.
  {
    const h = new EngineHarness('RC');
    const m = h.mr(64);
    h.scq.onCompletion = (q) => {
      if (q.shift()!.status !== 'SUCCESS' && h.qp.state !== 'RESET') h.qp.modify(0, { qpState: 'RESET' });
    };
    h.qp.postSend(0, [{ wrId: 1, opcode: 'RDMA_WRITE', sgList: [m.sge(0, 8)], rdma: { remoteAddr: 0n, rkey: 1 } }]);
    h.poll();
    h.send({ bth: bth('RC_ACKNOWLEDGE', 100), aeth: { syndrome: nakSyndrome(NAK_CODE.REMOTE_ACCESS_ERROR), msn: 0 } });
    t.equal(h.qp.state, 'RESET', 'remote access NAK: RESET stands');
    t.same(h.events.map((e) => e.type), [], 'remote access NAK: no QP_FATAL');
    t.ok(reinit(h), 'remote access NAK: RESET → INIT is accepted');
  }
  // UD: a local length error moves the QP to SQE, unless its completion's handler moved it first
  // (ERR → SQE and RESET → SQE are no transitions at all).
  for (const want of ['ERR', 'RESET'] as const) {
    const h = new EngineHarness('UD');
    const m = h.mr(8192);
    h.scq.onCompletion = (q) => {
      if (q.shift()!.status !== 'SUCCESS' && h.qp.state !== want) h.qp.modify(0, { qpState: want });
    };
    h.qp.postSend(0, [{ wrId: 1, opcode: 'SEND', sgList: [m.sge(0, 8000)], ud: { ah: PEER_AH, remoteQpn: 0x22, remoteQkey: 0x11111111 } }]);
    h.poll();
    t.equal(h.qp.state, want, `UD length error, handler → ${want}: ${want} stands`);
  }
  // UD: the completion before the failing WR's resets, reopens and posts a good SEND, which takes the
  // failing WR's record from the free list: the error belongs to the old WR, not to the new one.
  {
    const h = new EngineHarness('UD');
    const m = h.mr(8192);
    const ud = { ah: PEER_AH, remoteQpn: 0x22, remoteQkey: 0x11111111 };
    const seen: [number, string][] = [];
    h.scq.onCompletion = (q) => {
      const wc = q.shift()!;
      seen.push([Number(wc.wrId), wc.status]);
      if (wc.wrId !== 1) return;
      h.qp.modify(0, { qpState: 'RESET' });
      h.qp.modify(0, { qpState: 'INIT', pkeyIndex: 0, portNum: 1, qkey: 0x11111111 });
      h.qp.modify(0, { qpState: 'RTR' });
      h.qp.modify(0, { qpState: 'RTS', sqPsn: 0 });
      h.qp.postSend(0, [{ wrId: 3, opcode: 'SEND', sgList: [m.sge(0, 8)], ud }]);
    };
    h.qp.postSend(0, [{ wrId: 1, opcode: 'SEND', sgList: [m.sge(0, 8)], ud }, { wrId: 2, opcode: 'SEND', sgList: [m.sge(0, 8000)], ud }]);
    h.poll();
    h.poll();
    t.same(seen, [[1, 'SUCCESS'], [3, 'SUCCESS']], 'the new SEND completes as sent; the reset took the failing WR');
    t.equal(h.qp.state, 'RTS', 'and the reopened QP is not moved to SQE');
  }
});

t.test('a state change whose pending ACK send moved the QP first leaves the later change standing', async (t) => {
  const withAckPending = (): EngineHarness => {
    const h = new EngineHarness('RC');
    const dst = h.mr(1024);
    h.qp.postRecv(0, [{ wrId: 1, sgList: [dst.sge(0, 1024)] }, { wrId: 2, sgList: [dst.sge(0, 1024)] }]);
    h.send({ bth: bth('RC_SEND_ONLY', E, { ackReq: true }), payload: pattern(10) });
    h.rcq.poll(4);
    return h;
  };
  {
    const h = withAckPending();
    h.onTransmit = () => {
      if (h.qp.state === 'RTS') h.qp.modify(0, { qpState: 'ERR' });
    };
    h.qp.modify(0, { qpState: 'SQD' });
    t.equal(h.qp.state, 'ERR', 'SQD asked, ERR set by the ACK send: ERR');
    t.throws(() => h.qp.modify(0, { qpState: 'RTS' }), 'and the QP cannot go back to RTS');
  }
  {
    const h = withAckPending();
    h.onTransmit = () => {
      if (h.qp.state === 'RTS') h.qp.modify(0, { qpState: 'RESET' });
    };
    h.qp.modify(0, { qpState: 'ERR' });
    t.equal(h.qp.state, 'RESET', 'ERR asked, RESET set by the ACK send: RESET');
  }
});

t.test("a send's hook that resets the QP leaves no ACK timer behind: a reconnected QP does not retransmit at once", async (t) => {
  for (const next of ['ERR', 'RESET'] as const) {
    const h = new EngineHarness('RC');
    const m = h.mr(64);
    let moved = false;
    h.onTransmit = () => {
      if (moved) return;
      moved = true;
      h.qp.modify(0, { qpState: next });
    };
    h.qp.postSend(0, [{ wrId: 1, opcode: 'SEND', sgList: [m.sge(0, 8)] }]);
    h.poll(0);
    t.equal(h.qp.pollAt(), undefined, `${next} in the send: no timer to run`);
    if (next === 'ERR') continue;
    reconnect(h, 10, 7000);
    h.qp.postSend(2_000_000, [{ wrId: 2, opcode: 'SEND', sgList: [m.sge(0, 8)] }]);
    t.same(h.names(h.poll(2_000_000)), ['SEND_ONLY@7000!'], 'the first SEND of the new connection goes out once');
    t.equal(h.counters.ackTimeouts, 0, 'no ACK timeout');
    t.equal(h.counters.retransPkts, 0, 'no retransmission');
  }
  // A completion's handler moves the QP to ERR while one ACK retires the first of three SENDs.
  const h = new EngineHarness('RC');
  const m = h.mr(64);
  h.qp.postSend(0, [1, 2, 3].map((wrId) => ({ wrId, opcode: 'SEND' as const, sgList: [m.sge(0, 8)] })));
  h.poll(0);
  h.scq.onCompletion = () => {
    if (h.qp.state === 'RTS') h.qp.modify(0, { qpState: 'ERR' });
  };
  h.send({ bth: bth('RC_ACKNOWLEDGE', 100), aeth: { syndrome: 0x1f, msn: 1 } }, 5);
  t.equal(h.qp.pollAt(), undefined, 'ERR from a completion: no timer to run');
  t.same(h.scq.poll(8).map((w) => [Number(w.wrId), w.status]), [[1, 'SUCCESS'], [2, 'WR_FLUSH_ERR'], [3, 'WR_FLUSH_ERR']]);
});

t.test("a receive completion's handler that moves the QP: the ACK of that request goes out first, the moved QP sends none", async (t) => {
  for (const next of ['RESET', 'ERR'] as const) {
    for (const op of ['RC_SEND_ONLY', 'RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE'] as const) {
      const h = new EngineHarness('RC');
      const dst = h.mr(1024);
      h.qp.postRecv(0, [{ wrId: 1, sgList: [dst.sge(0, 1024)] }]);
      let sentAtChange = -1;
      h.rcq.onCompletion = (q) => {
        q.shift();
        if (h.qp.state === next) return;
        h.qp.modify(0, { qpState: next });
        sentAtChange = h.wire.length;
      };
      const body = op === 'RC_SEND_ONLY' ? { payload: pattern(100) } : { reth: { va: dst.va(0), rkey: dst.rkey, dmaLength: 8 }, immDt: { data: 7 }, payload: pattern(8) };
      h.send({ bth: bth(op, E, { ackReq: true }), ...body });
      t.equal(sentAtChange, 1, `${op}, handler → ${next}: the ACK left with the state change`);
      const acks = h.take();
      t.same(acks.map((p) => `${h.names([p])[0]} msn=${p.aeth!.msn}`), ['ACKNOWLEDGE@500 msn=1'], `${op}, handler → ${next}: one ACK, of that request`);
      t.equal(h.qp.pollAt(), undefined, `${op}, handler → ${next}: nothing left to run`);
      t.same(h.poll(), [], `${op}, handler → ${next}: its run sends nothing`);
    }
  }
});

t.test('a NAK or atomic ACK behind a pending ACK whose send moved the QP is not sent', async (t) => {
  for (const next of ['RESET', 'ERR'] as const) {
    for (const second of ['a sequence NAK', 'an RNR NAK', 'an atomic ACK'] as const) {
      const h = new EngineHarness('RC');
      const dst = h.mr(1024);
      h.qp.postRecv(0, [{ wrId: 1, sgList: [dst.sge(0, 1024)] }]);
      h.send({ bth: bth('RC_SEND_ONLY', E, { ackReq: true }), payload: pattern(10) });
      h.onTransmit = () => {
        if (h.qp.state !== next) h.qp.modify(0, { qpState: next });
      };
      if (second === 'a sequence NAK') h.send({ bth: bth('RC_SEND_ONLY', E + 5, { ackReq: true }), payload: pattern(10) });
      if (second === 'an RNR NAK') h.send({ bth: bth('RC_SEND_ONLY', E + 1, { ackReq: true }), payload: pattern(10) });
      if (second === 'an atomic ACK') h.send({ bth: bth('RC_FETCH_ADD', E + 1), atomicEth: { va: dst.va(8), rkey: dst.rkey, swapAdd: 5n, compare: 0n } });
      const out = h.take();
      t.same(out.map((p) => `${h.names([p])[0]}/${aethKind(p.aeth!.syndrome)}`), ['ACKNOWLEDGE@500/ACK'], `${next} at the pending ACK, then ${second}: only that ACK`);
      t.equal(h.qp.state, next);
    }
  }
});

t.test('destroyQp from inside one of the QP\'s own sends: nothing more leaves it', async (t) => {
  const clock = new VirtualClock();
  const [la, lb] = MemoryLink.pair(clock, { latencyUs: 2 });
  const hooks = { a: (_line: string): void => undefined, b: (_line: string): void => undefined };
  const side = async (link: TraceLink): Promise<{ ctx: Awaited<ReturnType<typeof openDevice>>; pd: ReturnType<typeof allocPd>; cq: ReturnType<typeof createCq> }> => {
    const ctx = await openDevice({ address: link.local.address, link, clock });
    return { ctx, pd: allocPd(ctx), cq: createCq(ctx, { cqe: 256 }) };
  };
  const a = await side(new TraceLink(la, (l) => hooks.a(l)));
  const b = await side(new TraceLink(lb, (l) => hooks.b(l)));
  const o = { pathMtu: 256 as const };
  const qa = makeQp(a, 'RC', o);
  const qb = makeQp(b, 'RC', o);
  bringUp(qa, qb, b.ctx, o, 0x100, 0x200, ALL_ACCESS);
  bringUp(qb, qa, a.ctx, o, 0x200, 0x100, ALL_ACCESS);
  const src = regMr(b.pd, pattern(8192, 5), ALL_ACCESS);
  const dst = regMr(a.pd, new Uint8Array(8192), ALL_ACCESS);
  // The responder: B is destroyed at the first of its 32 READ responses.
  let after = -1;
  hooks.b = (line) => {
    if (!line.startsWith('tx')) return;
    if (after >= 0) after++;
    else if (line.includes('READ_RESPONSE')) {
      destroyQp(qb);
      after = 0;
    }
  };
  postSend(qa, { wrId: 1, opcode: 'RDMA_READ', sgList: [dst.sge(0, 8192)], rdma: { remoteAddr: src.va(0), rkey: src.rkey } });
  clock.run(50_000);
  t.equal(after, 0, 'no READ response after the one whose send destroyed the QP');
  // The requester: A is destroyed at the first packet of a 32-packet SEND.
  after = -1;
  hooks.a = (line) => {
    if (!line.startsWith('tx')) return;
    if (after >= 0) after++;
    else {
      destroyQp(qa);
      after = 0;
    }
  };
  postSend(qa, { wrId: 2, opcode: 'SEND', sgList: [dst.sge(0, 8192)] });
  clock.run(50_000);
  t.equal(after, 0, 'no request packet after the one whose send destroyed the QP');
  hooks.a = () => undefined;
  hooks.b = () => undefined;
});

/**
 * A link pair whose `send` hands each datagram to the peer's receive handler at once, from inside the
 * sender's send (`sync`), or one clock hop later as MemoryLink does (`async`, the control). `pass`
 * may drop a datagram, `onSend` sees each one before it leaves. No ICRC: both ends check none.
 */
const ICRC_PLACE = new Uint8Array(4); // left zero: neither end checks it

class DirectLink implements Link {
  readonly caps: LinkCaps = { family: 4, icrcGenerate: false, icrcVerify: 'off', maxDatagram: 65507 };
  readonly drops = emptyDrops();
  peer!: DirectLink;
  pass: (datagram: Uint8Array) => boolean = () => true;
  onSend: () => void = () => undefined;
  private handler: LinkRxHandler | undefined;
  private batchEnd: ((last: boolean) => void) | undefined;
  /** `batchEnds`: each datagram is a receive batch of its own, whose end the peer's device is told. */
  constructor(private readonly clock: VirtualClock, readonly local: PeerAddress, private readonly sync: boolean, private readonly batchEnds = false) {}

  static pair(clock: VirtualClock, sync: boolean, batchEnds = false): [DirectLink, DirectLink] {
    const a = new DirectLink(clock, { address: '10.0.0.1', port: 4791 }, sync, batchEnds);
    const b = new DirectLink(clock, { address: '10.0.0.2', port: 4791 }, sync, batchEnds);
    a.peer = b;
    b.peer = a;
    return [a, b];
  }

  onReceive(handler: LinkRxHandler): void {
    this.handler = handler;
  }

  onReceiveBatchEnd(fn: (last: boolean) => void): void {
    if (this.batchEnds) this.batchEnd = fn;
  }

  send(_dst: PeerAddress, srcPort: number, parts: readonly Uint8Array[]): void {
    const d = concat([...parts, ICRC_PLACE]);
    this.onSend();
    if (!this.pass(d)) return;
    const meta = { src: { address: this.local.address, port: srcPort }, icrc: 'unchecked' as const, ce: false, at: this.clock.now() };
    const deliver = (): void => {
      this.peer.handler?.(d, meta);
      this.peer.batchEnd?.(true);
    };
    if (this.sync) deliver();
    else this.clock.at(this.clock.now() + 2, deliver);
  }

  async close(): Promise<void> {
    this.handler = undefined;
  }
}

async function directPair(sync: boolean, o: { retryCnt?: number; timeout?: number; batchEnds?: boolean } = {}): Promise<{ clock: VirtualClock; la: DirectLink; lb: DirectLink; a: Side; b: Side; qa: Qp; qb: Qp }> {
  const clock = new VirtualClock();
  const [la, lb] = DirectLink.pair(clock, sync, o.batchEnds);
  const side = async (link: DirectLink): Promise<Side> => {
    const ctx = await openDevice({ address: link.local.address, link, clock });
    return { ctx, pd: allocPd(ctx), cq: createCq(ctx, { cqe: 256 }) };
  };
  const a = await side(la);
  const b = await side(lb);
  const c = { pathMtu: 256 as const, ...o };
  const qa = makeQp(a, 'RC', c);
  const qb = makeQp(b, 'RC', c);
  bringUp(qa, qb, b.ctx, c, 0x100, 0x200, ALL_ACCESS);
  bringUp(qb, qa, a.ctx, c, 0x200, 0x100, ALL_ACCESS);
  return { clock, la, lb, a, b, qa, qb };
}

t.test('a link that delivers at once: answers that come back inside the request\'s own send leave the send queue in order', async (t) => {
  for (const sync of [false, true]) {
    const how = sync ? 'at once' : 'a hop later';
    // An atomic's ACK retires it inside its own send: the WRs behind it are sent each in turn.
    {
      const p = await directPair(sync);
      const src = regMr(p.a.pd, pattern(4096, 3), ALL_ACCESS);
      const dst = regMr(p.b.pd, new Uint8Array(4096), ALL_ACCESS);
      for (let i = 0; i < 2; i++) postRecv(p.qb, { wrId: 100 + i, sgList: [dst.sge(i * 1024, 1024)] });
      postSend(p.qa, [
        { wrId: 1, opcode: 'ATOMIC_FETCH_AND_ADD', sgList: [src.sge(3000, 8)], atomic: { remoteAddr: dst.va(3000), rkey: dst.rkey, compareAdd: 1n } },
        { wrId: 2, opcode: 'SEND', sgList: [src.sge(0, 100)] },
        { wrId: 3, opcode: 'SEND', sgList: [src.sge(500, 100)] },
      ]);
      t.same(collect(p.clock, p.a.cq, 3, 2_000_000).map((w) => [Number(w.wrId), w.status]), [[1, 'SUCCESS'], [2, 'SUCCESS'], [3, 'SUCCESS']], `${how}: the atomic and both SENDs complete`);
      t.same(collect(p.clock, p.b.cq, 2, 1).map((w) => [Number(w.wrId), w.byteLen]), [[100, 100], [101, 100]]);
      t.same([...dst.buffer.subarray(0, 100)], [...src.buffer.subarray(0, 100)], `${how}: the first receive holds the first SEND`);
      t.same([...dst.buffer.subarray(1024, 1124)], [...src.buffer.subarray(500, 600)], `${how}: the second, the second`);
      t.equal(p.a.ctx.device.counters.ackTimeouts, 0, `${how}: no ACK timer ran out`);
      t.equal(p.qa.core.pollAt(), undefined, `${how}: nothing left for the QP to run, no ACK timer`);
    }
    // A lone atomic answered inside its own send: no ACK timer is left for it.
    {
      const p = await directPair(sync);
      const src = regMr(p.a.pd, new Uint8Array(8), ALL_ACCESS);
      const dst = regMr(p.b.pd, new Uint8Array(8), ALL_ACCESS);
      postSend(p.qa, { wrId: 1, opcode: 'ATOMIC_FETCH_AND_ADD', sgList: [src.sge(0, 8)], atomic: { remoteAddr: dst.va(0), rkey: dst.rkey, compareAdd: 1n } });
      t.same(collect(p.clock, p.a.cq, 1, 2_000_000).map((w) => [Number(w.wrId), w.status]), [[1, 'SUCCESS']], `${how}: a lone atomic completes`);
      t.equal(p.qa.core.pollAt(), undefined, `${how}: and leaves no ACK timer`);
    }
    // The first ACK is lost; the timer resends SEND 1, and the duplicate ACK, answered inside that
    // resend, retires both SENDs: a third posted afterwards is sent and completes.
    {
      const p = await directPair(sync);
      let acks = 0;
      p.lb.pass = (d) => !(describePacket(d).startsWith('RC_ACKNOWLEDGE') && acks++ === 0);
      const src = regMr(p.a.pd, pattern(4096, 3), ALL_ACCESS);
      const dst = regMr(p.b.pd, new Uint8Array(4096), ALL_ACCESS);
      for (let i = 0; i < 3; i++) postRecv(p.qb, { wrId: 100 + i, sgList: [dst.sge(i * 1024, 1024)] });
      postSend(p.qa, [{ wrId: 1, opcode: 'SEND', sgList: [src.sge(0, 100)] }, { wrId: 2, opcode: 'SEND', sgList: [src.sge(100, 100)] }]);
      t.same(collect(p.clock, p.a.cq, 2, 2_000_000).map((w) => Number(w.wrId)), [1, 2], `${how}, ACK lost: both SENDs complete after the resend`);
      postSend(p.qa, { wrId: 3, opcode: 'SEND', sgList: [src.sge(200, 100)] });
      t.same(collect(p.clock, p.a.cq, 1, 2_000_000).map((w) => [Number(w.wrId), w.status]), [[3, 'SUCCESS']], `${how}, ACK lost: the SEND posted next is sent and completes`);
      t.same(collect(p.clock, p.b.cq, 3, 1).map((w) => Number(w.wrId)), [100, 101, 102]);
      t.same([...dst.buffer.subarray(2048, 2148)], [...src.buffer.subarray(200, 300)], `${how}, ACK lost: the third receive holds the third SEND`);
    }
  }
});

t.test('a hook that changes attributes, or goes to SQD and back, leaves the work in hand to go on', async (t) => {
  for (const variant of ['completion handler, RTS → RTS', 'completion handler, SQD → RTS', 'send hook, RTS → RTS'] as const) {
    // The peer is gone: both SENDs run out of retries, and the QP fails.
    const p = await directPair(false, { retryCnt: 1, timeout: 8 });
    p.la.pass = () => false;
    const src = regMr(p.a.pd, pattern(4096, 3), ALL_ACCESS);
    let done = false;
    const touch = (): void => {
      if (done) return;
      done = true;
      if (variant.includes('SQD')) {
        modifyQp(p.qa, { qpState: 'SQD' });
        modifyQp(p.qa, { qpState: 'RTS' });
      } else {
        modifyQp(p.qa, { qpState: 'RTS', minRnrTimer: 3 });
      }
    };
    if (variant.startsWith('completion')) p.a.cq.core.onCompletion = touch;
    else p.la.onSend = touch;
    postSend(p.qa, [{ wrId: 1, opcode: 'SEND', sgList: [src.sge(0, 100)] }, { wrId: 2, opcode: 'SEND', sgList: [src.sge(0, 100)] }]);
    t.same(collect(p.clock, p.a.cq, 2, 60_000_000).map((w) => [Number(w.wrId), w.status]), [[1, 'RETRY_EXC_ERR'], [2, 'WR_FLUSH_ERR']], `${variant}: the retries run out as without it`);
    t.equal(p.qa.core.state, 'ERR', `${variant}: the QP fails`);
  }
});

t.test("a state observer that moves the QP finds the state's work done: ERR's flush completions come before its RESET", async (t) => {
  const flushed = (h: EngineHarness): number[][] => [h.scq, h.rcq].map((cq) => cq.poll(8).map((w) => Number(w.wrId)));
  for (const how of ['modify', 'a local protection error'] as const) {
    const h = new EngineHarness('RC');
    const m = h.mr(64);
    h.qp.postRecv(0, [10, 11].map((wrId) => ({ wrId, sgList: [m.sge(0, 64)] })));
    const seen: string[] = [];
    h.onStateChange = (from, to) => {
      seen.push(`${from}=>${to}`);
      if (to === 'ERR') h.qp.modify(0, { qpState: 'RESET' });
    };
    if (how === 'modify') {
      h.qp.postSend(0, [1, 2].map((wrId) => ({ wrId, opcode: 'SEND' as const, sgList: [m.sge(0, 8)] })));
      h.poll(0);
      h.qp.modify(0, { qpState: 'ERR' });
    } else {
      h.qp.postSend(0, [{ wrId: 1, opcode: 'SEND', sgList: [{ addr: 0n, length: 8, lkey: 0xdead }] }, { wrId: 2, opcode: 'SEND', sgList: [m.sge(0, 8)] }]);
      h.poll(0);
    }
    t.same(flushed(h), [[1, 2], [10, 11]], `${how}: every send and receive WR completed before the observer's RESET`);
    t.same(seen, ['RTS=>ERR', 'ERR=>RESET'], `${how}: the observer saw both changes, in order`);
    t.equal(h.qp.state, 'RESET');
  }
});

t.test("a completion handler that reconnects the QP during ERR's flush: the new connection's work requests are not flushed", async (t) => {
  for (const which of ['send', 'receive'] as const) {
    const h = new EngineHarness('RC');
    const m = h.mr(64);
    h.qp.postRecv(0, [10, 11].map((wrId) => ({ wrId, sgList: [m.sge(0, 64)] })));
    h.qp.postSend(0, [1, 2].map((wrId) => ({ wrId, opcode: 'SEND' as const, sgList: [m.sge(0, 8)] })));
    h.poll(0);
    const done: string[] = [];
    let reconnected = false;
    const handler = (q: typeof h.scq): void => {
      const w = q.shift()!;
      done.push(`${w.wrId}/${w.status}`);
      if (reconnected || q !== (which === 'send' ? h.scq : h.rcq)) return;
      reconnected = true;
      h.qp.modify(0, { qpState: 'RESET' });
      reconnect(h, 0, 7000);
      h.qp.postRecv(0, [{ wrId: 20, sgList: [m.sge(0, 64)] }]);
      h.qp.postSend(0, [{ wrId: 3, opcode: 'SEND', sgList: [m.sge(0, 8)] }]);
    };
    h.scq.onCompletion = handler;
    h.rcq.onCompletion = handler;
    const seen: string[] = [];
    h.onStateChange = (from, to) => seen.push(`${from}=>${to}`);
    h.qp.modify(0, { qpState: 'ERR' });
    t.equal(h.qp.state, 'RTS', `${which}: the handler's RTS stands`);
    t.same(seen, ['RTS=>ERR', 'ERR=>RESET', 'RESET=>INIT', 'INIT=>RTR', 'RTR=>RTS'], `${which}: an observer saw every change, in order`);
    const want = which === 'send' ? ['1/WR_FLUSH_ERR'] : ['1/WR_FLUSH_ERR', '2/WR_FLUSH_ERR', '10/WR_FLUSH_ERR'];
    t.same(done, want, `${which}: flushed up to the handler's RESET, which took the rest; the new WRs not flushed`);
    t.same(h.names(h.poll(1)), ['SEND_ONLY@7000!'], `${which}: the new SEND goes out`);
    h.send({ bth: bth('RC_SEND_ONLY', E, { ackReq: true }), payload: pattern(8) }, 2);
    t.same(done.slice(want.length), ['20/SUCCESS'], `${which}: a SEND from the peer lands in the new receive`);
  }
});

/**
 * One SEND (wrId 1) from A to a receive (wrId 11) posted at B, whose first receive completion runs
 * `once` from inside B's engine.
 */
async function sendToReceiveHandler(o: ConnectOptions, once: (p: MemPair, qb: Qp) => void): Promise<MemPair> {
  const p = await memoryPair();
  const [qa, qb] = connectPair(p, 'RC', o);
  const src = regMr(p.a.pd, pattern(64), ALL_ACCESS);
  const dst = regMr(p.b.pd, new Uint8Array(64), ALL_ACCESS);
  postRecv(qb, { wrId: 11, sgList: [dst.sge(0, 64)] });
  let done = false;
  p.b.cq.core.onCompletion = () => {
    if (done) return;
    done = true;
    once(p, qb);
  };
  postSend(qa, { wrId: 1, opcode: 'SEND', sgList: [src.sge(0, 8)] });
  return p;
}

t.test("closeDevice from a receive completion's handler: the ACK of the message it completed still goes out", async (t) => {
  for (const how of ['closeDevice', 'destroyQp'] as const) {
    const p = await sendToReceiveHandler({ timeout: 8, retryCnt: 2 }, (p, qb) => {
      if (how === 'closeDevice') void closeDevice(p.b.ctx);
      else destroyQp(qb);
    });
    p.clock.run(5_000_000);
    t.same(pollCq(p.b.cq, 4).map((w) => `${w.wrId}:${w.status}`), ['11:SUCCESS'], `${how}: delivered`);
    t.same(pollCq(p.a.cq, 4).map((w) => `${w.wrId}:${w.status}`), ['1:SUCCESS'], `${how}: and acknowledged`);
    t.equal(p.a.ctx.counters.retransPkts, 0, `${how}: nothing resent`);
  }
});

t.test('a link that delivers at once and ends a receive batch at each datagram: the device runs its ready QPs from inside their own run', async (t) => {
  // Each SEND's completion posts two more, on other QPs: the peer's answer to a batch runs the
  // device's ready queue from inside a send the same queue's run made.
  const p = await directPair(true, { batchEnds: true });
  const c = { pathMtu: 256 as const };
  const qa = [p.qa];
  const qb = [p.qb];
  for (let i = 1; i < 5; i++) {
    const x = makeQp(p.a, 'RC', c);
    const y = makeQp(p.b, 'RC', c);
    bringUp(x, y, p.b.ctx, c, 0x100, 0x200, ALL_ACCESS);
    bringUp(y, x, p.a.ctx, c, 0x200, 0x100, ALL_ACCESS);
    qa.push(x);
    qb.push(y);
  }
  const src = regMr(p.a.pd, pattern(256), ALL_ACCESS);
  const dst = regMr(p.b.pd, new Uint8Array(256), ALL_ACCESS);
  qb.forEach((q, i) => postRecv(q, { wrId: 100 + i, sgList: [dst.sge(i * 16, 16)] }));
  const send = (i: number): void => postSend(qa[i]!, { wrId: i, opcode: 'SEND', sgList: [src.sge(i * 16, 16)] });
  const seen: number[] = [];
  p.a.cq.core.onCompletion = (cq) => {
    for (const wc of cq.poll(100)) {
      const id = Number(wc.wrId);
      seen.push(id);
      if (id === 0) [1, 2].forEach(send);
      if (id === 1) [3, 4].forEach(send);
    }
  };
  send(0);
  t.doesNotThrow(() => p.clock.run(1_000_000));
  t.same([...seen].sort(), [0, 1, 2, 3, 4], 'every SEND completed');
  t.same(dst.buffer.subarray(0, 80), src.buffer.subarray(0, 80), 'each in its receive');
  t.ok(qa.every((q) => !q.core.queued), 'no QP left waiting in no queue');

  // A failing post on B's other QP, made from inside A's send: A's QP does not take B's error.
  const e = await directPair(true, { batchEnds: true });
  const x = makeQp(e.b, 'RC', c);
  const y = makeQp(e.a, 'RC', c);
  bringUp(x, y, e.a.ctx, c, 0x200, 0x100, ALL_ACCESS);
  bringUp(y, x, e.b.ctx, c, 0x100, 0x200, ALL_ACCESS);
  const big = regMr(e.a.pd, pattern(1024), ALL_ACCESS);
  postRecv(e.qb, { wrId: 11, sgList: [regMr(e.b.pd, new Uint8Array(1024), ALL_ACCESS).sge(0, 1024)] });
  let posted = false;
  e.b.cq.core.onCompletion = (cq) => {
    for (const wc of cq.poll(10)) {
      if (Number(wc.wrId) !== 11 || posted) continue;
      posted = true;
      postSend(x, { wrId: 99, opcode: 'SEND', sgList: [{ addr: 0n, length: 8, lkey: 0xdead }] });
    }
  };
  postSend(e.qa, { wrId: 1, opcode: 'SEND', sgList: [big.sge(0, 1024)] }); // four packets
  e.clock.run(1_000_000);
  t.equal(x.core.state, 'ERR', "B's QP fails on its bad L_Key");
  t.equal(e.qa.core.state, 'RTS', "A's QP, whose send that post was made inside, does not");
  t.same(pollCq(e.a.cq, 4).map((w) => `${w.wrId}:${w.status}`), ['1:SUCCESS']);
});

t.test('code of the application that throws from inside the engine: the exception reaches the caller, and the device goes on', async (t) => {
  t.test('a UD send completion handler, in a run of several QPs: the QPs after it still send', async (t) => {
    const p = await memoryPair();
    const cqT = createCq(p.a.ctx, { cqe: 64 });
    const ud = (s: Side): Qp => {
      const q = makeQp(s, 'UD');
      bringUp(q, q, s.ctx, {}, 0x100, 0, 0);
      return q;
    };
    const u = [ud({ ...p.a, cq: cqT }), ud(p.a), ud(p.a), ud(p.a), ud(p.a), ud(p.a)];
    const rx = ud(p.b);
    const mrB = regMr(p.b.pd, new Uint8Array(64 * 1024), ALL_ACCESS);
    for (let i = 0; i < 64; i++) postRecv(rx, { wrId: i, sgList: [mrB.sge(i * 1024, 1024)] });
    const src = regMr(p.a.pd, pattern(64), ALL_ACCESS);
    const ah = createAh(p.a.pd, { address: p.b.ctx.address, port: p.b.ctx.port });
    const send = (q: Qp, id: number): void => postSend(q, { wrId: id, opcode: 'SEND', sgList: [src.sge(0, 16)], ud: { ah, remoteQpn: rx.qpNum, remoteQkey: 0x11111111 } });
    let thrown = false;
    cqT.core.onCompletion = () => {
      if (thrown) return;
      thrown = true;
      throw new Error('handler bug');
    };
    // More WRs on the first QP than one run sends: the run that threw leaves it some.
    const many = Array.from({ length: 40 }, (_, k) => 1000 + k);
    for (const id of many) send(u[0]!, id);
    send(u[1]!, 2);
    t.throws(() => p.clock.run(100_000), /handler bug/, 'the handler\'s exception comes out of the run');
    p.clock.run(100_000);
    t.same(pollCq(cqT, 64).map((w) => Number(w.wrId)), many, 'the QP whose handler threw went on with the WRs it had left');
    t.same(pollCq(p.a.cq, 8).map((w) => Number(w.wrId)), [2], 'the QP after it in the run sent its WR');
    // The ready queue's two arrays are still apart: a run whose completion posts to two more QPs.
    let fired = false;
    p.a.cq.core.onCompletion = (cq) => {
      if (fired || cq.length === 0) return;
      fired = true;
      send(u[4]!, 40);
      send(u[5]!, 50);
    };
    send(u[2]!, 20);
    send(u[3]!, 30);
    t.doesNotThrow(() => p.clock.run(100_000));
    t.same(pollCq(p.a.cq, 8).map((w) => Number(w.wrId)).sort(), [20, 30, 40, 50], 'every later WR completed');
    t.equal(pollCq(p.b.cq, 64).length, 45, 'and every datagram arrived');
  });

  t.test("a link's send during the device's timer: the other QPs whose deadline came still run", async (t) => {
    const p = await memoryPair();
    const [qa1, qb1] = connectPair(p, 'RC');
    const [qa2, qb2] = connectPair(p, 'RC');
    const src = regMr(p.a.pd, pattern(64), ALL_ACCESS);
    const dst = regMr(p.b.pd, new Uint8Array(256), ALL_ACCESS);
    const link = p.links[0]!;
    const inner = link.send.bind(link);
    let armed = false;
    link.send = (d, s, parts) => {
      inner(d, s, parts);
      if (!armed) return;
      armed = false;
      throw new Error('hook bug');
    };
    postSend(qa1, { wrId: 1, opcode: 'SEND', sgList: [src.sge(0, 8)] });
    postSend(qa2, { wrId: 2, opcode: 'SEND', sgList: [src.sge(8, 8)] });
    p.clock.run(4); // no receive posted: both RNR NAKed, both resent at one deadline
    postRecv(qb1, { wrId: 11, sgList: [dst.sge(0, 64)] });
    postRecv(qb2, { wrId: 12, sgList: [dst.sge(64, 64)] });
    armed = true;
    t.throws(() => p.clock.run(5_000_000), /hook bug/);
    p.clock.run(5_000_000);
    t.same(pollCq(p.a.cq, 8).map((w) => `${w.wrId}:${w.status}`).sort(), ['1:SUCCESS', '2:SUCCESS'], 'both SENDs completed');
  });

  t.test('a receive completion handler: the ACK of what it completed still goes out', async (t) => {
    const p = await sendToReceiveHandler({ timeout: 14 }, () => {
      throw new Error('handler bug');
    });
    t.throws(() => p.clock.run(1_000), /handler bug/);
    p.clock.run(1_000);
    t.same(pollCq(p.a.cq, 4).map((w) => `${w.wrId}:${w.status}`), ['1:SUCCESS'], 'acknowledged within a millisecond, no ACK timeout');
    t.equal(p.a.ctx.counters.ackTimeouts, 0);
  });
});

t.test('on a real clock, a post\'s run (a microtask) that throws: the exception is uncaught, and every QP posted after it runs', async (t) => {
  // In a child process: an exception from a microtask is the process's uncaught exception.
  const { code, out } = await runChild(new URL('./posted-throw-process.js', import.meta.url));
  t.equal(code, 0, 'the child exits normally');
  const r = JSON.parse(out) as { uncaught: string[]; done: string[]; received: number };
  t.same(r.uncaught, ['hook bug'], 'the send\'s exception, once');
  t.same(r.done, ['0:SUCCESS', '1:SUCCESS', '2:SUCCESS', '3:SUCCESS', '4:SUCCESS'], 'every QP sent its SEND, those posted from inside a send too');
  t.equal(r.received, 5, 'and every datagram arrived');
});

import t from 'tap';
import { cmMadBytes, cmMadHeader, cmTimeoutUs, CM_REJ_REASON, gidOfIp, parseCmMad, rdmaCmServiceId, reqPrivateData, cmaHeaderFor, type CmKind, type CmPath } from '../../src/cm/messages.js';
import { CmAgent, type CmAction, type CmAgentOptions, type CmState, type QpTransition } from '../../src/cm/state.js';
import { hexOf, rpingFirstRequestPsn, rpingMads } from './rping.js';

type Side = 'A' | 'B';
const other = (s: Side): Side => (s === 'A' ? 'B' : 'A');
const LATENCY = 10;
const PKT_LIFE = 2 * cmTimeoutUs(16);
/** How long an agent waits for an answer from a peer with CM response timeout 20 (rdma_cm's). */
const WAIT20 = cmTimeoutUs(20) + PKT_LIFE;
const SERVICE = rdmaCmServiceId(7174);

function seq(...ids: number[]): () => number {
  let i = 0;
  return () => ids[i++ % ids.length]!;
}

interface Sent {
  at: number;
  from: Side;
  kind: CmKind;
  bytes: Uint8Array;
  dropped: boolean;
}

/** Two agents joined by a fake UD wire that serializes every MAD and may lose any of them. */
class Wire {
  now = 0;
  readonly agents: Record<Side, CmAgent<Side>>;
  readonly sent: Sent[] = [];
  readonly events: Record<Side, Extract<CmAction<Side>, { event: unknown }>[]> = { A: [], B: [] };
  readonly qp: Record<Side, QpTransition[]> = { A: [], B: [] };
  private inflight: { at: number; to: Side; bytes: Uint8Array }[] = [];
  drop: (kind: CmKind, from: Side, nth: number) => boolean = () => false;

  constructor(a: Partial<CmAgentOptions> = {}, b: Partial<CmAgentOptions> = {}) {
    this.agents = {
      A: new CmAgent<Side>({ caGuid: 0xaaaan, random: seq(0x11111111, 0x11112222), ...a }),
      B: new CmAgent<Side>({ caGuid: 0xbbbbn, random: seq(0x22222222, 0x22223333), ...b }),
    };
  }

  apply(from: Side, actions: CmAction<Side>[]): void {
    for (const a of actions) {
      if ('send' in a) {
        if (a.to !== other(from)) throw new Error(`${from} sent to ${a.to}`);
        const bytes = cmMadBytes(a.send);
        const nth = this.sent.filter((s) => s.from === from && s.kind === a.send.msg.kind).length;
        const dropped = this.drop(a.send.msg.kind, from, nth);
        this.sent.push({ at: this.now, from, kind: a.send.msg.kind, bytes, dropped });
        if (!dropped) this.inflight.push({ at: this.now + LATENCY, to: other(from), bytes });
      } else if ('modifyQp' in a) {
        this.qp[from].push(a.modifyQp);
      } else {
        this.events[from].push(a);
      }
    }
  }

  /** Runs deliveries and timers up to `until` (µs). */
  run(until = this.now + 600e6): void {
    for (;;) {
      const times = [...this.inflight.map((m) => m.at), this.agents.A.nextTimeout(), this.agents.B.nextTimeout()].filter(
        (x): x is number => x !== undefined,
      );
      if (times.length === 0) return;
      const next = Math.min(...times);
      if (next > until) return;
      this.now = next;
      const due = this.inflight.filter((m) => m.at <= next);
      this.inflight = this.inflight.filter((m) => m.at > next);
      for (const m of due) this.apply(m.to, this.agents[m.to].onMad(this.now, m.bytes, other(m.to)));
      for (const s of ['A', 'B'] as const) {
        const at = this.agents[s].nextTimeout();
        if (at !== undefined && at <= this.now) this.apply(s, this.agents[s].onTimer(this.now));
      }
    }
  }

  kinds(from?: Side): string[] {
    return this.sent.filter((s) => from === undefined || s.from === from).map((s) => `${s.from}:${s.kind}${s.dropped ? '(lost)' : ''}`);
  }

  eventNames(s: Side): string[] {
    return this.events[s].map((e) => e.event);
  }
}

const PATH: CmPath = {
  localLid: 0xffff, remoteLid: 0xffff, localGid: gidOfIp('10.77.0.3'), remoteGid: gidOfIp('10.77.0.2'), flowLabel: 0,
  packetRate: 0, trafficClass: 0, hopLimit: 64, sl: 0, subnetLocal: false, localAckTimeout: 19,
};

/** A connects to B's listener; B accepts every connect-request as it arrives. */
function connectAndAccept(w: Wire, opts: { accept?: boolean; maxCmRetries?: number } = {}): number {
  w.agents.B.listen(SERVICE);
  const { connId, actions } = w.agents.A.connect(w.now, {
    peer: 'B', serviceId: SERVICE, localQpn: 0x11, startingPsn: 0x100, primaryPath: PATH,
    privateData: reqPrivateData(cmaHeaderFor('10.77.0.3', 50000, '10.77.0.2'), new Uint8Array([0xab])),
    ...(opts.maxCmRetries !== undefined ? { maxCmRetries: opts.maxCmRetries } : {}),
  });
  w.apply('A', actions);
  if (opts.accept !== false) {
    const origApply = w.apply.bind(w);
    w.apply = (from, acts) => {
      origApply(from, acts);
      for (const a of acts) {
        if ('event' in a && a.event === 'connect-request' && from === 'B') origApply('B', w.agents.B.accept(w.now, a.connId, { localQpn: 0x22, startingPsn: 0x200 }));
      }
    };
  }
  return connId;
}

const bId = (w: Wire): number => w.agents.B.connections()[0]!;

t.test('connect, accept, RTU: both sides established, QPs moved, one TransactionID', (t) => {
  const w = new Wire();
  const a = connectAndAccept(w);
  w.run(1e6);
  t.same(w.kinds(), ['A:REQ', 'B:REP', 'A:RTU']);
  t.equal(w.agents.A.state(a), 'ESTABLISHED');
  t.equal(w.agents.B.state(bId(w)), 'ESTABLISHED');
  t.same(w.eventNames('A'), ['rep', 'established']);
  t.same(w.eventNames('B'), ['connect-request', 'established']);
  const cr = w.events.B[0]!;
  if (cr.event !== 'connect-request') return t.fail(cr.event);
  t.equal(cr.serviceId, SERVICE);
  t.same(cr.cma && { ...cr.cma, srcIp: hexOf(cr.cma.srcIp) }, { majorVersion: 0, minorVersion: 0, ipVersion: 4, srcPort: 50000, srcIp: '000000000000000000000000' + '0a4d0003', dstIp: cr.cma?.dstIp });
  t.equal(cr.userData[0], 0xab);
  t.same(w.qp.A.map((q) => q.state), ['RTR', 'RTS']);
  t.same(w.qp.B.map((q) => q.state), ['RTR', 'RTS']);
  // Each side's Starting PSN is what its own receive queue expects; it sends from the peer's.
  t.match(w.qp.A[0], { destQpn: 0x22, rqPsn: 0x100, pathMtu: 1024 });
  t.match(w.qp.A[1], { sqPsn: 0x200, timeout: 19, retryCnt: 7, rnrRetry: 7 });
  t.match(w.qp.B[0], { destQpn: 0x11, rqPsn: 0x200, pathMtu: 1024, hopLimit: 64 });
  t.same(hexOf((w.qp.B[0] as { remoteGid: Uint8Array }).remoteGid), hexOf(gidOfIp('10.77.0.3')), 'B reaches A at the REQ\'s local GID');
  t.match(w.qp.B[1], { sqPsn: 0x100 });
  const tids = w.sent.map((s) => (parseCmMad(s.bytes) as { ok: true; mad: { header: { transactionId: bigint } } }).mad.header.transactionId);
  t.same(new Set(tids).size, 1, 'REP and RTU reuse the REQ\'s TransactionID');
  t.end();
});

t.test('a lost REQ is resent after the CM response timeout, same bytes', (t) => {
  const w = new Wire();
  w.drop = (k, _f, n) => k === 'REQ' && n === 0;
  const a = connectAndAccept(w);
  w.run();
  t.same(w.kinds(), ['A:REQ(lost)', 'A:REQ', 'B:REP', 'A:RTU']);
  t.ok(Math.abs(w.sent[1]!.at - WAIT20) < 1e-3, 'resent 4.096 µs × 2^20 + 2 × packet life time later');
  t.same(w.sent[1]!.bytes, w.sent[0]!.bytes);
  t.equal(w.agents.A.state(a), 'ESTABLISHED');
  t.end();
});

t.test('a silent peer: Max CM Retries resends, then a timeout event and IDLE', (t) => {
  const w = new Wire();
  w.drop = () => true;
  const a = connectAndAccept(w);
  w.run();
  t.equal(w.kinds('A').length, 16, 'the REQ and 15 resends (rdma_cm\'s Max CM Retries)');
  t.ok(w.kinds('A').every((k) => k === 'A:REQ(lost)'));
  t.same(w.eventNames('A'), ['timeout']);
  t.match(w.events.A[0], { event: 'timeout', message: 'REQ', connId: a });
  t.ok(Math.abs(w.now - 16 * WAIT20) < 1e-3, 'after 16 response timeouts');
  t.equal(w.agents.A.state(a), 'IDLE');
  t.same(w.agents.A.connections(), []);
  t.equal(w.agents.A.nextTimeout(), undefined);
  t.end();
});

t.test('the REQ\'s Max CM Retries bounds the resends', (t) => {
  const w = new Wire();
  w.drop = () => true;
  connectAndAccept(w, { maxCmRetries: 2 });
  w.run();
  t.equal(w.kinds('A').length, 3);
  t.same(w.eventNames('A'), ['timeout']);
  t.end();
});

t.test('no listener: REJ Invalid Service ID (8), the active side sees rejected', (t) => {
  const w = new Wire();
  const { connId, actions } = w.agents.A.connect(0, { peer: 'B', serviceId: rdmaCmServiceId(9999), localQpn: 1, startingPsn: 1, primaryPath: PATH });
  w.apply('A', actions);
  w.run();
  t.same(w.kinds(), ['A:REQ', 'B:REJ']);
  const rej = parseCmMad(w.sent[1]!.bytes);
  t.match(rej, { ok: true, mad: { msg: { kind: 'REJ', reason: 8, messageRejected: 0, localCommId: 0, remoteCommId: connId } } });
  t.match(w.events.A, [{ event: 'rejected', reason: CM_REJ_REASON.INVALID_SERVICE_ID, reasonName: 'Invalid Service ID' }]);
  t.equal(w.agents.A.state(connId), 'IDLE');
  t.same(w.agents.B.connections(), []);
  t.equal(w.agents.A.nextTimeout(), undefined, 'no more REQ resends');
  t.end();
});

t.test('consumer reject (28) with private data', (t) => {
  const w = new Wire();
  const a = connectAndAccept(w, { accept: false });
  w.run(100);
  t.same(w.eventNames('B'), ['connect-request']);
  w.apply('B', w.agents.B.reject(w.now, bId(w), CM_REJ_REASON.CONSUMER_REJECT, new Uint8Array([1, 2, 3])));
  w.run();
  t.match(w.events.A, [{ event: 'rejected', reason: 28, reasonName: 'Consumer Reject', messageRejected: 0 }]);
  const ev = w.events.A[0]!;
  if (ev.event === 'rejected') t.same([...ev.privateData.subarray(0, 4)], [1, 2, 3, 0]);
  t.equal(w.agents.A.state(a), 'IDLE');
  t.same(w.agents.B.connections(), []);
  t.end();
});

t.test('a lost RTU: the REP is resent, the active side answers it with the RTU again', (t) => {
  const w = new Wire();
  w.drop = (k, _f, n) => k === 'RTU' && n === 0;
  const a = connectAndAccept(w);
  w.run();
  t.same(w.kinds(), ['A:REQ', 'B:REP', 'A:RTU(lost)', 'B:REP', 'A:RTU']);
  t.equal(w.agents.A.state(a), 'ESTABLISHED');
  t.equal(w.agents.B.state(bId(w)), 'ESTABLISHED');
  t.same(w.eventNames('A'), ['rep', 'established'], 'the repeated REP raises nothing');
  t.end();
});

t.test('a lost RTU, but traffic arrives: communication established', (t) => {
  const w = new Wire();
  w.drop = (k) => k === 'RTU';
  connectAndAccept(w);
  w.run(1000);
  const b = bId(w);
  t.equal(w.agents.B.state(b), 'REP_SENT');
  w.apply('B', w.agents.B.established(w.now, b));
  t.equal(w.agents.B.state(b), 'ESTABLISHED');
  t.same(w.eventNames('B'), ['connect-request', 'established']);
  t.equal(w.agents.B.nextTimeout(), undefined, 'no REP resend pending');
  t.same(w.agents.B.established(w.now, b), [], 'a second one is a no-op');
  t.end();
});

t.test('the passive side times out waiting for the RTU', (t) => {
  const w = new Wire();
  w.drop = (k) => k === 'RTU';
  connectAndAccept(w);
  w.run();
  t.equal(w.kinds('B').length, 16);
  t.same(w.eventNames('B'), ['connect-request', 'timeout']);
  t.match(w.events.B[1], { message: 'REP' });
  t.same(w.agents.B.connections(), []);
  t.end();
});

t.test('MRA: the passive side asks for more time; the active side waits the service timeout', (t) => {
  const w = new Wire();
  const a = connectAndAccept(w, { accept: false });
  w.run(100);
  const b = bId(w);
  w.apply('B', w.agents.B.mra(w.now, b, 24));
  t.equal(w.agents.B.state(b), 'MRA_REQ_SENT');
  w.run(WAIT20 + 1000);
  t.equal(w.agents.A.state(a), 'MRA_REQ_RCVD');
  t.same(w.eventNames('A'), ['mra']);
  t.same(w.kinds('A'), ['A:REQ'], 'no resend within the normal response timeout');
  w.apply('B', w.agents.B.accept(w.now, b, { localQpn: 0x22, startingPsn: 0x200 }));
  w.run();
  t.equal(w.agents.A.state(a), 'ESTABLISHED');
  t.same(w.kinds(), ['A:REQ', 'B:MRA', 'B:REP', 'A:RTU']);
  t.end();
});

t.test('MRA then silence: resends resume after the service timeout', (t) => {
  const w = new Wire();
  connectAndAccept(w, { accept: false, maxCmRetries: 1 });
  w.run(100);
  w.apply('B', w.agents.B.mra(w.now, bId(w), 10));
  w.drop = () => true;
  w.run();
  const reqs = w.sent.filter((s) => s.from === 'A');
  t.equal(reqs.length, 2);
  t.ok(reqs[1]!.at < WAIT20, 'the short service timeout replaced the response timeout');
  t.same(w.eventNames('A'), ['mra', 'timeout']);
  t.end();
});

t.test('a repeated REQ while MRA_REQ_SENT is answered with the MRA again', (t) => {
  const w = new Wire();
  w.drop = (k, _f, n) => k === 'MRA' && n === 0;
  connectAndAccept(w, { accept: false });
  w.run(100);
  w.apply('B', w.agents.B.mra(w.now, bId(w), 24));
  w.run(WAIT20 + 1000);
  t.same(w.kinds(), ['A:REQ', 'B:MRA(lost)', 'A:REQ', 'B:MRA']);
  t.same(w.eventNames('B'), ['connect-request'], 'the repeated REQ is not a new connection');
  t.end();
});

t.test('a repeated REQ while the consumer has not answered: the agent sends an MRA itself', (t) => {
  const w = new Wire({}, { mraServiceTimeout: 22 });
  const a = connectAndAccept(w, { accept: false });
  w.run(WAIT20 + 1000);
  const b = bId(w);
  t.same(w.kinds(), ['A:REQ', 'A:REQ', 'B:MRA'], 'the first REQ waits for the consumer; the second gets an MRA');
  t.equal(w.agents.B.state(b), 'MRA_REQ_SENT');
  const mra = parseCmMad(w.sent[2]!.bytes);
  t.match(mra.ok && mra.mad.msg, { kind: 'MRA', serviceTimeout: 22, messageMraed: 0 });
  t.equal(w.agents.A.state(a), 'MRA_REQ_RCVD');
  // The active side now waits 4.096 µs × 2^22 + 2 × packet life (≈18 s), far past its usual ≈4.8 s.
  w.run(w.now + cmTimeoutUs(22));
  t.same(w.kinds('A'), ['A:REQ', 'A:REQ'], 'no REQ resent within the MRA\'s service timeout');
  t.same(w.eventNames('B'), ['connect-request'], 'the repeated REQ is not a new connection');
  w.apply('B', w.agents.B.accept(w.now, b, { localQpn: 0x22, startingPsn: 0x200 }));
  w.run();
  t.equal(w.agents.A.state(a), 'ESTABLISHED');
  t.end();
});

t.test('a repeated REQ after the REP was sent is answered with the REP again, at once', (t) => {
  const w = new Wire();
  w.drop = (k, _f, n) => k === 'REP' && n === 0;
  const a = connectAndAccept(w);
  w.run(WAIT20 + 1000);
  t.same(w.kinds().slice(0, 4), ['A:REQ', 'B:REP(lost)', 'A:REQ', 'B:REP']);
  const reps = w.sent.filter((s) => s.kind === 'REP');
  t.same(hexOf(reps[1]!.bytes), hexOf(reps[0]!.bytes), 'the same REP, same TransactionID');
  t.equal(reps[1]!.at, w.sent[2]!.at + LATENCY, 'answered when the REQ arrived, not at B\'s own resend timer');
  t.equal(w.agents.A.state(a), 'ESTABLISHED');
  t.equal(w.agents.B.state(bId(w)), 'ESTABLISHED');
  t.same(w.eventNames('B'), ['connect-request', 'established']);
  t.end();
});

t.test('active side: REP held for the consumer, MRA for the REP, then RTU', (t) => {
  const w = new Wire({ autoRtu: false });
  const a = connectAndAccept(w);
  w.run(100);
  t.equal(w.agents.A.state(a), 'REP_RCVD');
  w.apply('A', w.agents.A.mra(w.now, a, 22));
  t.equal(w.agents.A.state(a), 'MRA_REP_SENT');
  w.run(w.now + 100);
  t.equal(w.agents.B.state(bId(w)), 'MRA_REP_RCVD');
  w.apply('A', w.agents.A.rtu(w.now, a));
  w.run();
  t.equal(w.agents.B.state(bId(w)), 'ESTABLISHED');
  t.same(w.kinds(), ['A:REQ', 'B:REP', 'A:MRA', 'A:RTU']);
  t.end();
});

t.test('active side rejects the REP', (t) => {
  const w = new Wire({ autoRtu: false });
  const a = connectAndAccept(w);
  w.run(100);
  w.apply('A', w.agents.A.reject(w.now, a, CM_REJ_REASON.INSUFFICIENT_RESP_RESOURCES));
  w.run();
  t.match(w.events.B, [{ event: 'connect-request' }, { event: 'rejected', reason: 27, messageRejected: 1 }]);
  t.same(w.agents.A.connections(), []);
  t.same(w.agents.B.connections(), []);
  t.end();
});

for (const side of ['A', 'B'] as const) {
  t.test(`disconnect from ${side === 'A' ? 'the active' : 'the passive'} side: DREQ, DREP, TIMEWAIT, closed`, (t) => {
    const w = new Wire({ timewaitUs: 1000 }, { timewaitUs: 1000 });
    const a = connectAndAccept(w);
    w.run(1000);
    const id = side === 'A' ? a : bId(w);
    w.apply(side, w.agents[side].disconnect(w.now, id));
    t.equal(w.agents[side].state(id), 'DREQ_SENT');
    w.run(w.now + 100);
    const peer = other(side);
    t.same(w.kinds().slice(3), [`${side}:DREQ`, `${peer}:DREP`]);
    t.equal(w.agents[side].state(id), 'TIMEWAIT');
    t.same(w.eventNames(side).slice(-1), ['disconnected']);
    t.same(w.eventNames(peer).slice(-2), ['disconnect-request', 'disconnected']);
    t.same(w.qp[side].slice(-1), [{ state: 'ERR' }]);
    t.same(w.qp[peer].slice(-1), [{ state: 'ERR' }]);
    const dreq = parseCmMad(w.sent[3]!.bytes);
    const drep = parseCmMad(w.sent[4]!.bytes);
    if (dreq.ok && drep.ok) {
      t.equal(drep.mad.header.transactionId, dreq.mad.header.transactionId, 'DREP echoes the DREQ\'s TransactionID');
      t.equal((dreq.mad.msg as { remoteQpn: number }).remoteQpn, side === 'A' ? 0x22 : 0x11, 'DREQ names the receiver\'s QPN');
    }
    w.run();
    t.same(w.eventNames(side).slice(-1), ['closed']);
    t.same(w.eventNames(peer).slice(-1), ['closed']);
    t.same(w.agents.A.connections(), []);
    t.same(w.agents.B.connections(), []);
    t.end();
  });
}

t.test('a lost DREP: the DREQ is resent and answered again from TIMEWAIT', (t) => {
  const w = new Wire();
  w.drop = (k, _f, n) => k === 'DREP' && n === 0;
  const a = connectAndAccept(w);
  w.run(1000);
  w.apply('A', w.agents.A.disconnect(w.now, a));
  w.run(w.now + WAIT20 + 1000);
  t.same(w.kinds().slice(3), ['A:DREQ', 'B:DREP(lost)', 'A:DREQ', 'B:DREP']);
  t.equal(w.agents.A.state(a), 'TIMEWAIT');
  t.same(w.agents.B.connections(), [], 'B had left TIMEWAIT: it answered the stray DREQ all the same');
  t.same(w.eventNames('B').filter((e) => e === 'disconnected'), ['disconnected'], 'one disconnected event');
  t.end();
});

t.test('DREQ to a silent peer: timeout, then TIMEWAIT anyway', (t) => {
  const w = new Wire({ timewaitUs: 5 });
  const a = connectAndAccept(w);
  w.run(1000);
  w.drop = () => true;
  w.apply('A', w.agents.A.disconnect(w.now, a));
  w.run();
  t.equal(w.kinds('A').filter((k) => k.includes('DREQ')).length, 16);
  t.same(w.eventNames('A').slice(-3), ['timeout', 'disconnected', 'closed']);
  t.match(w.events.A.at(-3), { message: 'DREQ' });
  t.end();
});

t.test('both sides disconnect at once', (t) => {
  const w = new Wire();
  const a = connectAndAccept(w);
  w.run(1000);
  const b = bId(w);
  w.apply('A', w.agents.A.disconnect(w.now, a));
  w.apply('B', w.agents.B.disconnect(w.now, b));
  w.run(w.now + 1000);
  t.equal(w.agents.A.state(a), 'TIMEWAIT');
  t.equal(w.agents.B.state(b), 'TIMEWAIT');
  t.same(w.kinds().slice(3).sort(), ['A:DREP', 'A:DREQ', 'B:DREP', 'B:DREQ']);
  t.end();
});

t.test('autoDrep off: the consumer answers the DREQ', (t) => {
  const w = new Wire({}, { autoDrep: false });
  const a = connectAndAccept(w);
  w.run(1000);
  w.apply('A', w.agents.A.disconnect(w.now, a));
  w.run(w.now + 100);
  const b = bId(w);
  t.equal(w.agents.B.state(b), 'DREQ_RCVD');
  w.apply('B', w.agents.B.disconnect(w.now, b));
  w.run(w.now + 100);
  t.equal(w.agents.A.state(a), 'TIMEWAIT');
  t.equal(w.agents.B.state(b), 'TIMEWAIT');
  t.end();
});

t.test('misuse is a CmStateError; garbage and strays are dropped', (t) => {
  const w = new Wire();
  const a = connectAndAccept(w, { accept: false });
  t.throws(() => w.agents.A.disconnect(0, a), { code: 'ERR_CM_STATE' });
  t.throws(() => w.agents.A.accept(0, a, { localQpn: 1, startingPsn: 1 }), { code: 'ERR_CM_STATE' });
  t.throws(() => w.agents.A.rtu(0, 12345), { code: 'ERR_CM_STATE' });
  t.same(w.agents.A.onMad(0, new Uint8Array(10), 'B'), []);
  t.same(w.agents.A.onMad(0, new Uint8Array(256), 'B'), []);
  const stray = cmMadBytes({ header: cmMadHeader('RTU', 1n), msg: { kind: 'RTU', localCommId: 5, remoteCommId: 6, privateData: new Uint8Array(0) } });
  t.same(w.agents.A.onMad(0, stray, 'B'), [], 'an RTU for no connection');
  t.end();
});

t.test('replaying rping: our two agents send the capture\'s five MADs byte for byte', (t) => {
  const cap = rpingMads();
  // rxe's client (10.77.0.3, CA GUID …0003) and server (10.77.0.2, …0002); Linux's hi_tid was 2.
  const w = new Wire(
    { caGuid: 0x505400fffe770003n, random: seq(0xa15cee99), tidHigh: 2 },
    { caGuid: 0x505400fffe770002n, random: seq(0x2818cbea), tidHigh: 2 },
  );
  w.agents.B.listen(rdmaCmServiceId(7174));
  const path: CmPath = { ...PATH, flowLabel: 0x93903 };
  const { connId, actions } = w.agents.A.connect(0, {
    peer: 'B', serviceId: rdmaCmServiceId(7174), localQpn: 0x11, startingPsn: 0x9da108, primaryPath: path,
    privateData: reqPrivateData(cmaHeaderFor('10.77.0.3', 0xcf63, '10.77.0.2')),
  });
  w.apply('A', actions);
  w.run(50);
  w.apply('B', w.agents.B.accept(w.now, bId(w), { localQpn: 0x11, startingPsn: 0x31ede7 }));
  w.run(100);
  w.apply('A', w.agents.A.disconnect(w.now, connId));
  w.run(200);
  t.same(w.kinds(), ['A:REQ', 'B:REP', 'A:RTU', 'A:DREQ', 'B:DREP']);
  w.sent.forEach((s, i) => t.equal(hexOf(s.bytes), hexOf(cap[i]!.mad), `${s.kind} = frame ${cap[i]!.frame}`));
  const states: CmState[] = [w.agents.A.state(connId), w.agents.B.state(bId(w))];
  t.same(states, ['TIMEWAIT', 'TIMEWAIT']);
  t.end();
});

t.test('Starting PSNs as rxe uses them: each side sends from the PSN the other announced (rping.pcap)', (t) => {
  const cap = rpingMads();
  const reqMad = parseCmMad(cap[0]!.mad);
  const repMad = parseCmMad(cap[1]!.mad);
  if (!reqMad.ok || reqMad.mad.msg.kind !== 'REQ' || !repMad.ok || repMad.mad.msg.kind !== 'REP') return t.fail('frames 4 and 5 are the REQ and the REP');
  const req = reqMad.mad.msg;
  const rep = repMad.mad.msg;
  const client = cap[0]!.src;
  const server = cap[0]!.dst;
  // What rxe did on the wire with those two numbers.
  const clientFirst = rpingFirstRequestPsn(client);
  const serverFirst = rpingFirstRequestPsn(server);
  t.equal(clientFirst, rep.startingPsn, 'the active side\'s first request carries the REP\'s Starting PSN');
  t.equal(serverFirst, req.startingPsn, 'the passive side\'s first request carries the REQ\'s Starting PSN');
  // Our passive agent, fed the captured REQ and accepting with the captured REP's PSN.
  const b = new CmAgent<string>({ caGuid: 0x505400fffe770002n, random: seq(0x2818cbea) });
  b.listen(req.serviceId);
  const cr = b.onMad(0, cap[0]!.mad, client);
  const bConn = cr[0]!.connId;
  const bQp = b.accept(1, bConn, { localQpn: rep.localQpn, startingPsn: rep.startingPsn, rtsOnAccept: true })
    .flatMap((a) => ('modifyQp' in a ? [a.modifyQp] : []));
  t.match(bQp, [{ state: 'RTR', rqPsn: clientFirst }, { state: 'RTS', sqPsn: serverFirst }]);
  // Our active agent, having sent the captured REQ's PSN, fed the captured REP.
  const a = new CmAgent<string>({ caGuid: 0x505400fffe770003n, random: seq(rep.remoteCommId) });
  a.connect(0, {
    peer: server, serviceId: req.serviceId, localQpn: req.localQpn, startingPsn: req.startingPsn, primaryPath: req.primaryPath,
    privateData: req.privateData,
  });
  const aQp = a.onMad(2, cap[1]!.mad, server).flatMap((x) => ('modifyQp' in x ? [x.modifyQp] : []));
  t.match(aQp, [{ state: 'RTR', rqPsn: serverFirst }, { state: 'RTS', sqPsn: clientFirst }]);
  t.end();
});

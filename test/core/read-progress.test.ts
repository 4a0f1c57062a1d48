/**
 * The ACK timer during a long RDMA READ response stream (IBTA 9.7.6.1: the transport timer
 * measures how long the oldest outstanding request goes without progress), and the re-request
 * after a lost READ response (9.7.5.1.2 area: once per gap).
 *
 * The peer is modelled after rdma_rxe 6.1 (rxe_resp.c): it answers requests strictly in order,
 * streaming a READ to its end before it looks at the next request, so a re-request for a gap
 * waits behind the rest of the stream it was sent for, and is then answered by a replay from
 * the requested PSN. Responses come every 100 µs, so one stream lasts several ACK timeouts.
 */
import t from 'tap';
import { ackSyndrome } from '../../src/wire/aeth.js';
import { ackTimeoutUs } from '../../src/core/time.js';
import type { RocePacket } from '../../src/wire/packet.js';
import { EngineHarness, bth, pattern } from '../helpers/engine.js';

const S = 100; // the harness's first send PSN
const MTU = 256;
const NPKTS = 200;
const STEP = 100; // µs between two responses
const TIMEOUT = ackTimeoutUs(10)!; // the harness's timeout 10: 4.2 ms, the stream lasts 20 ms

interface Run {
  h: EngineHarness;
  data: Uint8Array;
  dst: ReturnType<EngineHarness['mr']>;
  /** Every READ request the QP sent, in order. */
  requests: RocePacket[];
}

function start(): Run {
  const h = new EngineHarness('RC', { retryCnt: 7 });
  const dst = h.mr(NPKTS * MTU);
  const data = pattern(NPKTS * MTU, 9);
  h.qp.postSend(0, [{ wrId: 1, opcode: 'RDMA_READ', sgList: [dst.sge()], rdma: { remoteAddr: 0x10000n, rkey: 9 } }]);
  const run: Run = { h, data, dst, requests: [] };
  tick(run);
  return run;
}

/** Runs the QP's due work (timers, sends) at the current time and records READ requests. */
function tick(r: Run): void {
  for (const p of r.h.poll()) if (p.reth) r.requests.push(p);
}

/** The response with PSN S + k, as the responder builds it; a replay starts with MIDDLE/LAST. */
function respond(r: Run, k: number, at: number): void {
  const last = k === NPKTS - 1;
  const name = k === 0 ? 'RC_RDMA_READ_RESPONSE_FIRST' : last ? 'RC_RDMA_READ_RESPONSE_LAST' : 'RC_RDMA_READ_RESPONSE_MIDDLE';
  const aeth = k === 0 || last ? { aeth: { syndrome: ackSyndrome(), msn: 1 } } : {};
  r.h.send({ bth: bth(name, S + k), ...aeth, payload: r.data.subarray(k * MTU, (k + 1) * MTU) }, at);
  tick(r);
}

/** Delivers responses `from`..end one every STEP µs, except the PSN offsets in `lost`; returns the time after. */
function stream(r: Run, from: number, t0: number, lost: (k: number) => boolean = () => false): number {
  let now = t0;
  for (let k = from; k < NPKTS; k++) {
    now += STEP;
    r.h.now = now;
    tick(r); // timers due before this response arrives
    if (!lost(k)) respond(r, k, now);
  }
  return now;
}

t.test('an in-order stream longer than the ACK timeout: no timeout, no re-request', async (t) => {
  const r = start();
  t.ok(NPKTS * STEP > 4 * TIMEOUT, 'the stream lasts several timeouts');
  stream(r, 0, 0);
  t.equal(r.requests.length, 1, 'the one READ request');
  t.equal(r.h.counters.ackTimeouts, 0);
  t.match(r.h.scq.poll(2), [{ wrId: 1, status: 'SUCCESS', byteLen: NPKTS * MTU }]);
  t.same(r.dst.buffer, r.data);
});

t.test('a lost response mid-stream: one re-request for the gap while the rest streams, then the replay completes', async (t) => {
  const r = start();
  // Responses 20..29 are lost (a receive buffer overrun); the other 170 keep coming for 17 ms.
  let now = stream(r, 0, 0, (k) => k >= 20 && k < 30);
  t.equal(r.h.counters.ackTimeouts, 0, 'responses to the outstanding READ keep coming: the timer never runs out');
  t.same(r.requests.map((p) => [p.bth.psn, p.reth!.dmaLength]), [[S, NPKTS * MTU], [S + 20, (NPKTS - 20) * MTU]],
    'one re-request, from the gap, not one per out-of-order response nor per timeout');
  // The peer answers the re-request after its stream: the replay from PSN S + 20.
  now = stream(r, 20, now);
  t.equal(r.requests.length, 2, 'nothing re-requested during the replay');
  t.match(r.h.scq.poll(2), [{ wrId: 1, status: 'SUCCESS', byteLen: NPKTS * MTU }]);
  t.same(r.dst.buffer, r.data);
  t.equal(r.h.counters.ackTimeouts, 0);
  void now;
});

t.test('a second gap in the replay: one more re-request, from that gap', async (t) => {
  const r = start();
  let now = stream(r, 0, 0, (k) => k >= 20 && k < 30);
  now = stream(r, 20, now, (k) => k === 120);
  t.same(r.requests.map((p) => p.bth.psn), [S, S + 20, S + 120]);
  now = stream(r, 120, now);
  t.match(r.h.scq.poll(2), [{ wrId: 1, status: 'SUCCESS' }]);
  t.same(r.dst.buffer, r.data);
  void now;
});

t.test('the re-request itself lost: the timer runs out one timeout after the last response, and asks again', async (t) => {
  const r = start();
  const end = stream(r, 0, 0, (k) => k >= 20 && k < 30);
  t.equal(r.requests.length, 2);
  // Nothing more arrives: the peer never saw the re-request.
  r.h.now = end + TIMEOUT - 10;
  tick(r);
  t.equal(r.requests.length, 2, 'not before a whole timeout without a response');
  r.h.now = end + TIMEOUT + 10;
  tick(r);
  t.equal(r.h.counters.ackTimeouts, 1);
  t.same(r.requests.map((p) => p.bth.psn), [S, S + 20, S + 20], 'asked again from the gap');
  stream(r, 20, r.h.now);
  t.match(r.h.scq.poll(2), [{ wrId: 1, status: 'SUCCESS' }]);
  t.same(r.dst.buffer, r.data);
});

t.test('duplicates of answered responses do not hold the timer', async (t) => {
  const r = start();
  let now = 0;
  for (let k = 0; k < 5; k++) {
    now += STEP;
    r.h.now = now;
    tick(r);
    respond(r, k, now);
  }
  const last = now;
  // From here on only a stale response (PSN before comp PSN) arrives: no progress.
  while (r.h.counters.ackTimeouts === 0 && now < last + 3 * TIMEOUT) {
    now += STEP;
    r.h.now = now;
    tick(r);
    if (r.h.counters.ackTimeouts === 0) respond(r, 2, now);
  }
  t.equal(r.h.counters.ackTimeouts, 1);
  t.ok(now - last <= TIMEOUT + STEP, `timed out ${now - last} µs after the last new response (timeout ${TIMEOUT} µs)`);
  t.same(r.requests.map((p) => p.bth.psn), [S, S + 5]);
});

t.test('a replay of an earlier re-request, stale by now, holds the timer while it advances: no re-request per timeout behind it', async (t) => {
  const r = start();
  /** Responses `from` … `to - 1`, one every STEP µs from `t0`; returns the time after. */
  const deliver = (from: number, to: number, t0: number): number => {
    let now = t0;
    for (let k = from; k < to; k++) {
      now += STEP;
      r.h.now = now;
      tick(r);
      respond(r, k, now);
    }
    return now;
  };
  /**
   * Lets the ACK timer run out (it is decided one run after its deadline) and returns the time
   * after; `times` is its length in timeouts (it doubles after a timeout without progress).
   */
  const timeout = (t0: number, times = 1): number => {
    r.h.now = t0 + times * TIMEOUT + STEP;
    tick(r);
    r.h.now += STEP;
    tick(r);
    return r.h.now;
  };
  // Responses 0..19 arrive, the rest of the stream is lost; two timeouts pass before the peer
  // answers anything else, so two re-requests from the gap wait at the peer (rxe answers in order).
  let now = deliver(0, 20, 0);
  now = timeout(now);
  now = timeout(now, 2);
  t.same(r.requests.map((p) => p.bth.psn), [S, S + 20, S + 20], 'two timeouts, two re-requests from the gap');
  // The replay of the first: 20..99 arrive, the rest is lost; a timeout later the QP asks from 100.
  now = deliver(20, 100, now);
  now = timeout(now);
  t.same(r.requests.map((p) => p.bth.psn), [S, S + 20, S + 20, S + 100], 'then once from 100');
  const timeouts = r.h.counters.ackTimeouts;
  // The replay of the second: 20..99 are stale by now (80 responses, two timeouts long), then 100.. are new.
  t.ok(80 * STEP > 1.5 * TIMEOUT, 'the stale part outlasts a timeout');
  now = deliver(20, NPKTS, now);
  t.equal(r.h.counters.ackTimeouts, timeouts, 'no timeout while the stale replay advances');
  t.same(r.requests.map((p) => p.bth.psn), [S, S + 20, S + 20, S + 100], 'nothing more was re-requested');
  t.match(r.h.scq.poll(2), [{ wrId: 1, status: 'SUCCESS', byteLen: NPKTS * MTU }]);
  t.same(r.dst.buffer, r.data);
});

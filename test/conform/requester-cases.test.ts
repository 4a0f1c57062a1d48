/**
 * The requester cases (ack-reserved-bit, read-response-to-send, ack-timeout, retry-exhaustion) against `roce serve`'s server in-process:
 * they hold back their ACKs on purpose, so what they leave behind, and what they take for the
 * peer's answer, must not depend on when a late copy of an earlier request arrives.
 */
import t from 'tap';
import type { Rx } from '../../src/conform/prober.js';
import { runConformance } from '../../src/conform/runner.js';
import { UdpLink } from '../../src/link/udp.js';
import { bench, FAST } from './helpers.js';

const requestsWithPsn = (rxs: Rx[], psn: number): Rx[] =>
  rxs.filter((x) => x.parsed.ok && x.parsed.info.request && x.parsed.packet.bth.psn === psn);

t.test('ack-timeout ACKs the retransmission it waited for: the peer sends its request twice, not more', async (t) => {
  const b = await bench();
  t.teardown(() => b.close());
  const from = b.prober.mark();
  const r = await runConformance({ prober: b.prober, exchange: b.exchange(), only: ['ack-timeout'], timing: FAST });
  const c = r.cases[0]!;
  t.equal(c.verdict, 'pass', c.observed);
  const psn = Number.parseInt(/psn 0x([0-9a-f]+)/.exec(c.observed)![1]!, 16);
  // The case's quiet time covers the peer's next timeout, so a third copy would be seen.
  t.equal(requestsWithPsn(b.prober.received(from), psn).length, 2, 'the request and one retransmission');
});

/** An RC RDMA READ RESPONSE ONLY (opcode 0x10). */
const readResponseOnly = (d: Uint8Array): boolean => d.length >= 16 && d[0] === 0x10;

t.test('read-response-to-send: the server takes a READ response for its SEND as a bad response, and its QP stops', async (t) => {
  const b = await bench();
  t.teardown(() => b.close());
  const from = b.prober.mark();
  const r = await runConformance({ prober: b.prober, exchange: b.exchange(), only: ['read-response-to-send'], timing: FAST });
  const c = r.cases[0]!;
  t.equal(c.verdict, 'pass', c.observed);
  t.equal(c.liveness, 'reconnected', 'the QP stopped answering, and a fresh session was made');
  t.ok(b.prober.log.slice(from.log).some((e) => e.dir === 'tx' && readResponseOnly(e.bytes)), 'the prober sent a READ response');
  const psn = Number.parseInt(/psn 0x([0-9a-f]+)/.exec(c.observed)![1]!, 16);
  t.equal(requestsWithPsn(b.prober.received(from), psn).length, 1, 'the SEND it reached was not sent again');
});

t.test('read-response-to-send reports a peer that drops the response: its request is sent again', async (t) => {
  const b = await bench({ rxFilter: (d) => !readResponseOnly(d) });
  t.teardown(() => b.close());
  const r = await runConformance({ prober: b.prober, exchange: b.exchange(), only: ['read-response-to-send'], timing: FAST });
  const c = r.cases[0]!;
  t.equal(c.verdict, 'deviation', c.observed);
  t.match(c.observed, /request sent again \d+ ms later .*the response ignored/);
  t.equal(c.liveness, 'ok', 'the QP kept answering');
});

t.test('retry-exhaustion counts the request it provoked, not a late copy of an earlier one', async (t) => {
  const b = await bench();
  t.teardown(() => b.close());
  // Another sender on the server's address, for the late copy.
  const late = await UdpLink.open({ address: '127.0.0.2', port: 0, warn: () => undefined });
  t.teardown(() => late.close());
  const from = b.prober.mark();
  let injected = 0;
  const r = await runConformance({
    prober: b.prober, exchange: b.exchange(), only: ['ack-timeout', 'retry-exhaustion'], timing: FAST,
    log: (line) => {
      if (line !== 'case retry-exhaustion') return;
      // The earlier case's request, acknowledged since, arrives again as the case starts.
      const earlier = b.prober.received(from).find((x) => x.parsed.ok && x.parsed.info.request);
      if (!earlier) return;
      late.send(b.prober.link.local, late.local.port, [earlier.bytes.subarray(0, earlier.bytes.length - 4)]);
      injected++;
    },
  });
  t.equal(injected, 1, 'a late copy was sent');
  const [ackTimeout, exhaustion] = r.cases;
  t.equal(ackTimeout!.verdict, 'pass', ackTimeout!.observed);
  t.equal(exhaustion!.verdict, 'pass', exhaustion!.observed);
});

/** An RC ACK whose AETH syndrome has the reserved bit 7 set. */
const reservedBitAck = (d: Uint8Array): boolean => d.length >= 16 && d[0] === 0x11 && (d[12]! & 0x80) !== 0;

t.test('ack-reserved-bit: the server takes an ACK with syndrome bit 7 set as the ACK it is, and sends its request once', async (t) => {
  const b = await bench();
  t.teardown(() => b.close());
  const from = b.prober.mark();
  const r = await runConformance({ prober: b.prober, exchange: b.exchange(), only: ['ack-reserved-bit'], timing: FAST });
  const c = r.cases[0]!;
  t.equal(c.verdict, 'pass', c.observed);
  t.equal(c.liveness, 'ok', 'the server answers afterwards');
  t.ok(b.prober.log.slice(from.log).some((e) => e.dir === 'tx' && reservedBitAck(e.bytes)), 'the prober sent an ACK with bit 7 set');
  const psn = Number.parseInt(/ACK psn 0x([0-9a-f]+)/.exec(c.observed)![1]!, 16);
  t.equal(requestsWithPsn(b.prober.received(from), psn).length, 1, 'the acknowledged request was not sent again');
});

t.test('ack-reserved-bit reports a peer that does not take the ACK: its request is sent again', async (t) => {
  // The fault: the server never sees an ACK whose syndrome has bit 7 set, as if it dropped it.
  const b = await bench({ rxFilter: (d) => !reservedBitAck(d) });
  t.teardown(() => b.close());
  const r = await runConformance({ prober: b.prober, exchange: b.exchange(), only: ['ack-reserved-bit'], timing: FAST });
  const c = r.cases[0]!;
  t.equal(c.verdict, 'deviation', c.observed);
  t.match(c.observed, /sent again \d+ ms later, the ACK not taken/);
});

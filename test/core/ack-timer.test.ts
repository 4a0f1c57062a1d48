/**
 * The ACK timer against input that is already there (IBTA 9.7.6.1: progress restarts the
 * timer). A runtime runs the QP when its deadline passes, and Node runs expired timers before
 * it reads the sockets, so under load the timer can run out with the ACK that answers it
 * already waiting in the receive buffer. The QP decides the timeout on the run after the one
 * that saw the deadline pass, which the runtime makes after reading that input.
 */
import t from 'tap';
import { ackSyndrome } from '../../src/wire/aeth.js';
import { ackTimeoutUs } from '../../src/core/time.js';
import { ASAP } from '../../src/core/qp.js';
import { EngineHarness, bth, pattern } from '../helpers/engine.js';

const S = 100; // the harness's first send PSN
const TIMEOUT = ackTimeoutUs(10)!;

/** Posts one SEND and returns what went out. */
function sendOne(h: EngineHarness): string[] {
  const mr = h.mr(pattern(64));
  h.qp.postSend(0, [{ wrId: 1, opcode: 'SEND', sgList: [mr.sge(0, 64)] }]);
  return h.names(h.poll(0));
}

t.test('an ACK read after the timer ran out, before the deferred decision: no retry', async (t) => {
  const h = new EngineHarness('RC');
  t.same(sendOne(h), ['SEND_ONLY@100!']);
  const late = Math.ceil(TIMEOUT) + 50;
  // The timer's run: the deadline has passed, the ACK is not read yet.
  h.qp.poll(late);
  t.same(h.take(), [], 'nothing resent on the run that sees the deadline pass');
  t.equal(h.qp.pollAt(), ASAP, 'the QP asks for the next run at once');
  t.equal(h.counters.ackTimeouts, 0);
  // The I/O the runtime reads before that run: the ACK.
  h.send({ bth: bth('RC_ACKNOWLEDGE', S), aeth: { syndrome: ackSyndrome(), msn: 1 } }, late);
  t.same(h.poll(late), [], 'the next run resends nothing');
  t.equal(h.counters.ackTimeouts, 0, 'no timeout counted');
  t.match(h.scq.poll(2), [{ wrId: 1, status: 'SUCCESS' }]);
});

t.test('no input in between: the timeout happens on the next run', async (t) => {
  const h = new EngineHarness('RC');
  t.same(sendOne(h), ['SEND_ONLY@100!']);
  const late = Math.ceil(TIMEOUT) + 50;
  h.qp.poll(late);
  t.same(h.take(), []);
  h.qp.poll(late);
  t.same(h.names(h.take()), ['SEND_ONLY@100!'], 'resent');
  t.equal(h.counters.ackTimeouts, 1);
});

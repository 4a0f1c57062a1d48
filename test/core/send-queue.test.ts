/**
 * The send queue a QP keeps in its own fields (qp.ts): a ring with absolute indices that grows when
 * full, wraps, completes in posting order, and refuses a list that would overflow `maxSendWr` without
 * queueing any of it (IBTA 11.4.1.1).
 */
import t from 'tap';
import { QueueFullError } from '../../src/core/errors.js';
import type { SendWr } from '../../src/core/types.js';
import { ackSyndrome } from '../../src/wire/aeth.js';
import { EngineHarness, bth } from '../helpers/engine.js';

const S = 100; // the harness's first send PSN
const ack = (psn: number) => ({ bth: bth('RC_ACKNOWLEDGE', psn), aeth: { syndrome: ackSyndrome(), msn: 0 } });

function sends(h: EngineHarness, ids: number[]): SendWr[] {
  const mr = h.mr(16);
  return ids.map((wrId) => ({ wrId, opcode: 'SEND' as const, sgList: [mr.sge(0, 10)] }));
}

const range = (from: number, n: number): number[] => Array.from({ length: n }, (_, i) => from + i);

t.test('the send queue grows, wraps and completes in order; a full one refuses a list whole', async (t) => {
  const h = new EngineHarness('RC', { cap: { maxSendWr: 6 } });
  const q = h.qp;
  q.postSend(h.now, sends(h, range(1, 6)));
  t.equal(q.sqLength, 6, 'six posted: past the ring\'s first capacity of four');
  t.throws(() => q.postSend(h.now, sends(h, [7])), QueueFullError, 'a seventh is refused');
  t.equal(q.sqLength, 6, 'and not queued');
  t.same(h.names(h.poll()), range(0, 6).map((i) => `SEND_ONLY@${S + i}!`), 'all six sent, in order');

  h.send(ack(S + 2));
  t.same(h.scq.poll(10).map((w) => w.wrId), [1, 2, 3], 'an ACK of the third completes the first three, in order');
  t.equal(q.sqHead, 3);
  t.equal(q.sqAt(2), undefined, 'a completed index is gone');
  t.equal(q.sqAt(3)?.wrId, 4, 'the oldest left');
  t.equal(q.sqAt(q.sqEnd), undefined, 'nothing past the tail');

  t.throws(() => q.postSend(h.now, sends(h, range(7, 4))), QueueFullError, 'three queued and four more: refused');
  t.equal(q.sqLength, 3, 'none of the four queued');
  q.postSend(h.now, sends(h, range(7, 3)));
  t.equal(q.sqEnd, 9, 'indices 3 to 8: the last one wraps in a ring of eight');
  t.same(h.names(h.poll()), range(6, 3).map((i) => `SEND_ONLY@${S + i}!`));
  h.send(ack(S + 8));
  t.same(h.scq.poll(10).map((w) => w.wrId), range(4, 6), 'the rest, in posting order');
  t.equal(q.sqLength, 0);

  // One at a time, many laps of the ring.
  const done: number[] = [];
  for (let id = 10; id < 40; id++) {
    q.postSend(h.now, sends(h, [id]));
    h.poll();
    h.send(ack(S + id - 1));
    done.push(...h.scq.poll(2).map((w) => Number(w.wrId)));
  }
  t.same(done, range(10, 30), 'thirty more, each completed in turn');
  t.equal(q.sqLength, 0);
  t.equal(q.sqPeek(), undefined);
});

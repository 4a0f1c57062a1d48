/**
 * When a posted send runs (src/runtime/device.ts, `posted`): on a real clock, before the event loop
 * turns — in a microtask after the posting code — so a reply posted in answer to a completion
 * leaves in the same turn; several posts of one stretch share that run; a post from inside a
 * completion hook still waits for the engine that called it to return; and the microtask runs only
 * the posted QPs, not the ready queue, whose QPs wait for the turn's input to be read — unless the
 * application posts to one of them too.
 */
import t from 'tap';
import { allocPd, closeDevice, createCq, openDevice, pollCq, postSend, regMr, type Context, type Qp } from '../../src/api/verbs.js';
import type { SendWr } from '../../src/core/types.js';
import { MemoryLink } from '../../src/link/memory.js';
import { SystemClock } from '../../src/runtime/clock.js';
import { ALL_ACCESS, connectPair, type Side } from '../helpers/engine.js';

/**
 * The QPs' ACK timeout is 4 s (exponent 20): over a link whose every delivery is a millisecond timer,
 * a shorter one could retransmit before the ACK arrives, and the tests count datagrams sent.
 */
const QP_OPTS = { timeout: 20 };

interface SystemPair {
  a: Side;
  b: Side;
  la: MemoryLink;
  /** An 8-byte RDMA WRITE from a's memory into b's. */
  wr: (wrId: number) => SendWr;
  close: () => Promise<void>;
}

/** Two devices on a real clock over a memory link, with a region each for `wr`. */
async function systemPair(): Promise<SystemPair> {
  const clock = new SystemClock();
  const [la, lb] = MemoryLink.pair(clock, { latencyUs: 0 });
  const side = async (link: MemoryLink): Promise<Side> => {
    const ctx: Context = await openDevice({ address: link.local.address, link, clock });
    return { ctx, pd: allocPd(ctx), cq: createCq(ctx, { cqe: 256 }) };
  };
  const a = await side(la);
  const b = await side(lb);
  const mr = regMr(a.pd, new Uint8Array(64), ALL_ACCESS);
  const target = regMr(b.pd, new Uint8Array(64), ALL_ACCESS);
  return {
    a, b, la,
    wr: (wrId) => ({ wrId, opcode: 'RDMA_WRITE', sgList: [mr.sge(0, 8)], rdma: { remoteAddr: target.va(0), rkey: target.rkey } }),
    close: async () => Promise.all([closeDevice(a.ctx), closeDevice(b.ctx)]).then(() => undefined),
  };
}

const turn = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));
const pause = (): Promise<void> => new Promise((resolve) => setTimeout(resolve, 1));

/** Successful completions' wrIds from `side`'s CQ until `n` have come or 2 s have passed. */
async function completions(side: Side, n: number): Promise<number[]> {
  const done: number[] = [];
  const until = Date.now() + 2000;
  while (done.length < n && Date.now() < until) {
    await pause();
    for (const wc of pollCq(side.cq, 8)) if (wc.status === 'SUCCESS') done.push(Number(wc.wrId));
  }
  return done;
}
const microtask = (): Promise<void> => new Promise((resolve) => queueMicrotask(resolve));

/**
 * Gives `qp` a WRITE (`wrId`) the way a receive or a timer gives a QP work, without a post: a kick,
 * which puts it in the device's ready queue for the next turn.
 */
function queueForNextTurn(p: SystemPair, qp: Qp, wrId: number): void {
  const device = p.a.ctx.device;
  qp.core.postSendOne(device.now(), p.wr(wrId));
  device.kick(qp.core);
}

t.test('a send posted by the application leaves before the event loop turns', async (t) => {
  const p = await systemPair();
  t.teardown(p.close);
  const [qa] = connectPair(p, 'RC', QP_OPTS);
  await turn();
  const before = p.la.counters.sent;
  postSend(qa, p.wr(1));
  t.equal(p.la.counters.sent, before, 'not inside postSend itself');
  await microtask();
  t.equal(p.la.counters.sent, before + 1, 'on the link after the posting code, with no event-loop turn');

  // Four posts in one stretch: one run, all four on the link before the loop turns.
  for (let i = 0; i < 4; i++) postSend(qa, p.wr(10 + i));
  await microtask();
  t.equal(p.la.counters.sent, before + 5, 'the four posts of one stretch sent together');

  t.same(await completions(p.a, 5), [1, 10, 11, 12, 13], 'every one completes, in order');
});

t.test('a post from a completion hook waits for the engine that called the hook', async (t) => {
  const p = await systemPair();
  t.teardown(p.close);
  const [qa] = connectPair(p, 'RC', QP_OPTS);
  const write = (wrId: number): void => postSend(qa, p.wr(wrId));
  let sentInHook = -1;
  let sentAfterPostInHook = -1;
  p.a.cq.core.onCompletion = () => {
    if (sentInHook >= 0) return;
    sentInHook = p.la.counters.sent;
    write(2); // called from the completer, inside the device's receive
    sentAfterPostInHook = p.la.counters.sent;
  };
  await turn();
  write(1);
  const done = await completions(p.a, 2);
  t.ok(sentInHook >= 1, 'the hook ran');
  t.equal(sentAfterPostInHook, sentInHook, 'nothing sent from inside the engine');
  t.same(done, [1, 2], 'the WRITE posted from the hook still goes out and completes');
});

t.test('the microtask runs the posted QPs only; a QP already in the ready queue waits for the next turn', async (t) => {
  const p = await systemPair();
  t.teardown(p.close);
  const [qa] = connectPair(p, 'RC', QP_OPTS);
  const [qb] = connectPair(p, 'RC', QP_OPTS);
  await turn();
  const before = p.la.counters.sent;
  queueForNextTurn(p, qb, 1);
  postSend(qa, p.wr(2));
  await microtask();
  t.equal(p.la.counters.sent, before + 1, "the posted QP's WRITE only, before the loop turns");
  await turn();
  t.equal(p.la.counters.sent, before + 2, "the kicked QP's on the next turn");
  t.same((await completions(p.a, 2)).sort(), [1, 2], 'both complete');
});

t.test('a post to a QP already in the ready queue runs it in the microtask; its ready entry is then skipped', async (t) => {
  const p = await systemPair();
  t.teardown(p.close);
  const [qb] = connectPair(p, 'RC', QP_OPTS);
  await turn();
  const before = p.la.counters.sent;
  // As a QP whose ACK waits for the answer to a receive batch.
  queueForNextTurn(p, qb, 1);
  postSend(qb, p.wr(2));
  await microtask();
  t.equal(p.la.counters.sent, before + 2, 'both WRITEs leave before the loop turns');
  await turn();
  t.equal(p.la.counters.sent, before + 2, 'the ready entry sends nothing more');
  t.same(await completions(p.a, 2), [1, 2], 'both complete, in order');
});

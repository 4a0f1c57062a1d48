/**
 * Child of reentry.test.ts: on a real clock, a post runs its QP in a microtask (`Device.posted`). A
 * link whose send throws in that run makes an uncaught exception; then two QPs are posted in one
 * turn, and the first one's send posts to two more while the second still waits in the same run.
 * Prints, as one JSON line, the exceptions the process's `uncaughtException` handler saw and the
 * send completions; exits 0.
 */
import { allocPd, closeDevice, createAh, createCq, openDevice, pollCq, postRecv, postSend, regMr, type Qp } from '../../src/api/verbs.js';
import { MemoryLink } from '../../src/link/memory.js';
import { SystemClock } from '../../src/runtime/clock.js';
import { ALL_ACCESS, bringUp, makeQp, pattern, type Side } from '../helpers/engine.js';

const clock = new SystemClock();
const [la, lb] = MemoryLink.pair(clock, { latencyUs: 2 });
const side = async (link: MemoryLink): Promise<Side> => {
  const ctx = await openDevice({ address: link.local.address, link, clock });
  return { ctx, pd: allocPd(ctx), cq: createCq(ctx, { cqe: 256 }) };
};
const a = await side(la);
const b = await side(lb);
const ud = (s: Side): Qp => {
  const q = makeQp(s, 'UD');
  bringUp(q, q, s.ctx, {}, 0x100, 0, 0);
  return q;
};
const tx = [ud(a), ud(a), ud(a), ud(a), ud(a)];
const rx = ud(b);
const mrB = regMr(b.pd, new Uint8Array(32 * 1024), ALL_ACCESS);
for (let i = 0; i < 32; i++) postRecv(rx, { wrId: i, sgList: [mrB.sge(i * 1024, 1024)] });
const src = regMr(a.pd, pattern(64), ALL_ACCESS);
const ah = createAh(a.pd, { address: b.ctx.address, port: b.ctx.port });
const send = (q: Qp, id: number): void => postSend(q, { wrId: id, opcode: 'SEND', sgList: [src.sge(0, 16)], ud: { ah, remoteQpn: rx.qpNum, remoteQkey: 0x11111111 } });

const uncaught: string[] = [];
process.on('uncaughtException', (e) => uncaught.push(e.message));
const inner = la.send.bind(la);
let hook: 'throw' | 'post' | 'none' = 'throw';
la.send = (dst, srcPort, parts) => {
  inner(dst, srcPort, parts);
  const h = hook;
  hook = 'none';
  if (h === 'throw') throw new Error('hook bug');
  if (h === 'post') {
    send(tx[3]!, 3);
    send(tx[4]!, 4);
  }
};
send(tx[0]!, 0);
setTimeout(() => {
  hook = 'post';
  send(tx[1]!, 1);
  send(tx[2]!, 2);
  setTimeout(() => {
    const done = pollCq(a.cq, 16).map((w) => `${w.wrId}:${w.status}`).sort();
    console.log(JSON.stringify({ uncaught, done, received: pollCq(b.cq, 16).length }));
    void Promise.all([closeDevice(a.ctx), closeDevice(b.ctx)]);
  }, 200);
}, 20);

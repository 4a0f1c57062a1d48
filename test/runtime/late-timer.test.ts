/**
 * The ACK timer on a real clock over real UDP, when the event loop was held up past the deadline
 * while the ACK came in. Node runs expired timers before it reads the sockets; the device reads
 * what is waiting (Link.readWaiting) before it runs the QPs whose deadline has come, so the ACK
 * counts as the progress it is (IBTA 9.7.6.1) and nothing is resent. The responder is a process
 * of its own, whose loop is not held up.
 */
import t from 'tap';
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { allocPd, closeDevice, createCq, createQp, modifyQp, openDevice, postSend, regMr } from '../../src/api/verbs.js';
import { ackTimeoutUs } from '../../src/core/time.js';
import { ACCESS } from '../../src/core/types.js';

const TIMEOUT = 10; // 4.2 ms
/** Held up for this long: several deadlines, and far more than a loopback round trip. */
const STALL_MS = 6 * (ackTimeoutUs(TIMEOUT)! / 1000);
/** One message per QP: a QP's first round trip gives it the RTT estimate that would stretch its timer. */
const QPS = 4;

for (const batchIo of [true, false]) {
  t.test(`${batchIo ? 'recvmmsg' : 'dgram'} path: an ACK that came while the loop was held past the deadline still counts`, async (t) => {
    const script = fileURLToPath(new URL('./ack-peer-process.js', import.meta.url));
    const child = spawn(process.execPath, [script, String(QPS), String(batchIo)], { stdio: ['pipe', 'pipe', 'inherit'] });
    t.teardown(() => {
      if (child.exitCode === null) child.kill();
    });
    const lines = createInterface({ input: child.stdout });
    const line = (): Promise<string> => new Promise((r) => lines.once('line', r));
    const peer = JSON.parse(await line()) as { port: number; qpns: number[]; psn: number; rkey: number; va: string };

    const ctx = await openDevice({ address: '127.0.0.1', port: 0, udp: { batchIo } });
    t.teardown(() => closeDevice(ctx));
    const pd = allocPd(ctx);
    const cq = createCq(ctx, { cqe: 16 });
    const src = regMr(pd, new Uint8Array(64).fill(7), ACCESS.LOCAL_WRITE);
    const qps = peer.qpns.map(() => createQp(pd, { type: 'RC', sendCq: cq, recvCq: cq, sqSigAll: true }));
    const psn = 0x2200;
    child.stdin.write(JSON.stringify({ port: ctx.port, qpns: qps.map((q) => q.qpNum), psn }) + '\n');
    qps.forEach((qp, i) => {
      modifyQp(qp, { qpState: 'INIT', pkeyIndex: 0, portNum: 1, qpAccessFlags: 0 });
      modifyQp(qp, { qpState: 'RTR', ahAttr: { address: '127.0.0.1', port: peer.port }, pathMtu: 1024, destQpNum: peer.qpns[i]!, rqPsn: peer.psn, maxDestRdAtomic: 1, minRnrTimer: 12 });
      modifyQp(qp, { qpState: 'RTS', sqPsn: psn, timeout: TIMEOUT, retryCnt: 7, rnrRetry: 7, maxRdAtomic: 1 });
    });
    t.equal(await line(), 'ready');

    for (const [i, qp] of qps.entries()) {
      postSend(qp, { wrId: i, opcode: 'RDMA_WRITE', sgList: [src.sge(0, 64)], rdma: { remoteAddr: BigInt(peer.va), rkey: peer.rkey } });
      // The WRITE leaves in a microtask; then the loop is held while the peer answers.
      await new Promise((r) => setImmediate(r));
      const until = Date.now() + STALL_MS;
      while (Date.now() < until) {
        // held: the deadline passes, the ACK waits in the socket
      }
      const wc = await cq.next({ timeoutMs: 5000 });
      t.equal(wc.status, 'SUCCESS', `QP ${i}: completed`);
    }
    const c = ctx.counters;
    t.equal(c.ackTimeouts, 0, 'no ACK timeout');
    t.equal(c.retransPkts, 0, 'nothing resent');
    child.stdin.end();
  });
}

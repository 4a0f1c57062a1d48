/**
 * Two devices in two processes over real UDP (127.0.0.1): RDMA WRITE 1 MiB, SEND_WITH_IMM,
 * the peer's sha256 back by SEND, an RDMA READ of the whole region, and a clean exit.
 */
import t from 'tap';
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import {
  allocPd, closeDevice, createCq, createQp, modifyQp, openDevice, postRecv, postSend, regMr,
} from '../../src/api/verbs.js';
import { ACCESS } from '../../src/core/types.js';
import { pattern } from '../helpers/engine.js';

t.test('RC between two processes', async (t) => {
  const script = fileURLToPath(new URL('./peer-process.js', import.meta.url));
  const child = spawn(process.execPath, [script], { stdio: ['pipe', 'pipe', 'pipe'], env: { ...process.env, NODE_NO_WARNINGS: '1' } });
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const exited = new Promise<number | null>((r) => child.on('exit', (code) => r(code)));
  t.teardown(() => {
    if (child.exitCode === null) child.kill();
  });
  const lines = createInterface({ input: child.stdout });
  const server = JSON.parse(await new Promise<string>((r) => lines.once('line', r))) as { port: number; qpn: number; psn: number; rkey: number; va: string };

  const access = ACCESS.LOCAL_WRITE | ACCESS.REMOTE_WRITE | ACCESS.REMOTE_READ;
  const ctx = await openDevice({ address: '127.0.0.1', port: 0 });
  t.teardown(() => closeDevice(ctx));
  const pd = allocPd(ctx);
  const cq = createCq(ctx, { cqe: 16 });
  const qp = createQp(pd, { type: 'RC', sendCq: cq, recvCq: cq, sqSigAll: true });
  const data = regMr(pd, pattern(1 << 20, 99), access);
  const back = regMr(pd, new Uint8Array(1 << 20), access);
  const msg = regMr(pd, new Uint8Array(128), access);
  const psn = 0x123456;
  child.stdin.write(JSON.stringify({ port: ctx.port, qpn: qp.qpNum, psn }) + '\n');
  modifyQp(qp, { qpState: 'INIT', pkeyIndex: 0, portNum: 1, qpAccessFlags: access });
  modifyQp(qp, { qpState: 'RTR', ahAttr: { address: '127.0.0.1', port: server.port }, pathMtu: 1024, destQpNum: server.qpn, rqPsn: server.psn, maxDestRdAtomic: 4, minRnrTimer: 12 });
  modifyQp(qp, { qpState: 'RTS', sqPsn: psn, timeout: 14, retryCnt: 7, rnrRetry: 7, maxRdAtomic: 4 });
  postRecv(qp, { wrId: 50, sgList: [msg.sge(0, 128)] });

  const remote = { remoteAddr: BigInt(server.va), rkey: server.rkey };
  postSend(qp, [
    { wrId: 1, opcode: 'RDMA_WRITE', sgList: [data.sge()], rdma: remote },
    { wrId: 2, opcode: 'SEND_WITH_IMM', immData: 0xc0ffee, sgList: [msg.sge(0, 4)] },
  ]);
  const wcs = await cq.wait(3, { timeoutMs: 20_000 });
  t.same(wcs.map((w) => [w.wrId, w.status]).sort(), [[1, 'SUCCESS'], [2, 'SUCCESS'], [50, 'SUCCESS']].sort());
  const digest = new TextDecoder().decode(msg.buffer.subarray(0, 64));
  t.equal(digest, createHash('sha256').update(data.buffer).digest('hex'), 'the peer holds exactly what was written');

  postSend(qp, { wrId: 3, opcode: 'RDMA_READ', sgList: [back.sge()], rdma: remote });
  t.match(await cq.next({ timeoutMs: 20_000 }), { wrId: 3, status: 'SUCCESS', byteLen: 1 << 20 });
  t.same(Buffer.from(back.buffer), Buffer.from(data.buffer), 'RDMA READ brings it back byte-exact');

  postSend(qp, { wrId: 4, opcode: 'SEND', sgList: [msg.sge(64, 3)] });
  t.match(await cq.next({ timeoutMs: 20_000 }), { wrId: 4, status: 'SUCCESS' });
  t.equal(await exited, 0, `server exits cleanly (${stderr.trim()})`);
});

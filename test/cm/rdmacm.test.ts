/**
 * The RDMA CM end to end over UDP loopback: QP1 in the device, the librdmacm-shaped API and
 * `roce rping` against itself (IPv4 on 127.0.0.1 → 127.0.0.2, IPv6 on ::1 with two ports),
 * rejection (no listener, consumer reject), a silent peer (REQ resends, then `unreachable`), and
 * disconnect from either side.
 */

import t from 'tap';
import dgram from 'node:dgram';
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { createCq, openDevice, postRecv, postSend, type Context } from '../../src/api/verbs.js';
import { GSI_QPN } from '../../src/cm/gsi.js';
import { parseCmMad, rdmaCmServiceId, parseCmaHeader, type CmReq } from '../../src/cm/messages.js';
import { createEventChannel, CM_STATUS_TIMEDOUT, type RdmaCmEvent, type RdmaCmId } from '../../src/cm/rdmacm.js';
import { fillPing, runRping } from '../../src/cli/rping.js';
import { FIRST_QPN } from '../../src/core/limits.js';
import { GSI_QKEY } from '../../src/wire/constants.js';
import { parsePacket } from '../../src/wire/packet.js';

const ROOT = join(import.meta.dirname, '../../..');
const CLI = join(ROOT, 'dist/src/cli/main.js');

/** Two devices on 127.0.0.1 and 127.0.0.2 sharing one UDP port, as RoCE peers share 4791. */
async function v4Pair(): Promise<[Context, Context]> {
  const a = await openDevice({ address: '127.0.0.1', port: 0 });
  const b = await openDevice({ address: '127.0.0.2', port: a.port });
  return [a, b];
}

/** Two devices on ::1: one address, so each has its own port and is told the other's. */
async function v6Pair(): Promise<[Context, Context]> {
  const a = await openDevice({ address: '::1', port: 0 });
  const b = await openDevice({ address: '::1', port: 0 });
  return [a, b];
}

const closeAll = async (...c: Context[]): Promise<void> => {
  for (const x of c) await x.close();
};

t.test('QP1 is reserved at open; the allocator never hands out 0 or 1', async (t) => {
  const ctx = await openDevice({ address: '127.0.0.1', port: 0 });
  t.teardown(() => ctx.close());
  const gsi = ctx.device.qp(GSI_QPN);
  t.ok(gsi, 'QP 1 exists');
  t.equal(gsi!.type, 'UD');
  t.equal(gsi!.state, 'RTS');
  t.equal(gsi!.attrs.qkey, GSI_QKEY, 'GSI Q_Key');
  t.equal(ctx.device.qp(0), undefined, 'no QP 0 (RoCE has no SMI)');
  const pd = ctx.allocPd();
  const cq = createCq(ctx, { cqe: 4 });
  const first = pd.createQp({ type: 'RC', sendCq: cq, recvCq: cq });
  t.equal(first.qpNum, FIRST_QPN, 'the first user QP is 0x11');
  // Force the allocator to its end: it wraps to FIRST_QPN (skipping used numbers), never to 0 or 1.
  (ctx.device as unknown as { nextQpn: number }).nextQpn = 0xffffff;
  const last = pd.createQp({ type: 'RC', sendCq: cq, recvCq: cq });
  const wrapped = pd.createQp({ type: 'RC', sendCq: cq, recvCq: cq });
  t.equal(last.qpNum, 0xffffff);
  t.equal(wrapped.qpNum, FIRST_QPN + 1, 'wraps to FIRST_QPN and skips the one in use');
  t.throws(() => ctx.device.createQp({ type: 'UD', pd: pd.core, sendCq: cq.core, recvCq: cq.core, sqSigAll: false, qpn: 1, cap: { maxSendWr: 1, maxRecvWr: 1, maxSendSge: 1, maxRecvSge: 1, maxInlineData: 0 } }), /not a free special QPN/);
});

for (const family of [4, 6] as const) {
  t.test(`rping: our client against our server, IPv${family}`, async (t) => {
    const [a, b] = family === 4 ? await v4Pair() : await v6Pair();
    t.teardown(() => closeAll(a, b));
    // IPv6: both on ::1, so each side says where the other's RoCE stack listens.
    const peerOfA = family === 6 ? { peerRocePort: b.port } : {};
    const peerOfB = family === 6 ? { peerRocePort: a.port } : {};
    const sOut: string[] = [];
    const cOut: string[] = [];
    const sErr: string[] = [];
    let listening!: () => void;
    const up = new Promise<void>((r) => (listening = r));
    const server = runRping({
      server: true, address: b.address, ctx: b, verbose: true, onListening: listening, stepTimeoutMs: 10_000,
      out: (l) => sOut.push(l), err: (l) => sErr.push(l), ...peerOfB,
    });
    await up;
    const client = await runRping({
      server: false, address: b.address, ctx: a, count: 5, size: 64, verbose: true, validate: true, stepTimeoutMs: 10_000,
      out: (l) => cOut.push(l), err: () => undefined, ...peerOfA,
    });
    const s = await server;
    t.same(client, { code: 0, pings: 5 }, 'client: 5 pings, clean exit');
    t.same(s, { code: 0, pings: 5 }, 'server: 5 pings served, clean exit on the client\'s disconnect');
    const want = Array.from({ length: 5 }, (_, i) => {
      const buf = new Uint8Array(64);
      fillPing(buf, i, 65 + i);
      return Buffer.from(buf.subarray(0, 63)).toString('latin1');
    });
    t.same(cOut, want.map((w) => `ping data: ${w}`), 'client prints what the server wrote back');
    t.same(sOut, want.map((w) => `server ping data: ${w}`), 'server prints what it read');
    t.equal(cOut[0], 'ping data: rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr', 'rping\'s exact text');
    t.ok(sErr.includes('server DISCONNECT EVENT...'));
    t.equal(a.device.gsi.counters.dropped + b.device.gsi.counters.dropped, 0, 'no MAD dropped');
  });
}

/** Connects a client id on `a` to a listener on `b`; returns both ends once established. */
async function connected(a: Context, b: Context, port: number, rocePorts?: { a: number; b: number }) {
  const cha = createEventChannel(a, rocePorts ? { peerPort: rocePorts.b } : {});
  const chb = createEventChannel(b, rocePorts ? { peerPort: rocePorts.a } : {});
  const listener = chb.createId();
  listener.listen(port);
  const pda = a.allocPd();
  const pdb = b.allocPd();
  const cqa = a.createCq({ cqe: 16 });
  const cqb = b.createCq({ cqe: 16 });
  let server: RdmaCmId | undefined;
  let reqEvent: RdmaCmEvent | undefined;
  const serverUp = new Promise<RdmaCmId>((resolve, reject) => {
    listener.once('connect_request', (ev: RdmaCmEvent) => {
      reqEvent = ev;
      server = ev.id;
      ev.id.createQp(pdb, { sendCq: cqb, recvCq: cqb });
      const est = ev.id.waitFor('established', 10_000);
      ev.id.accept({ privateData: Uint8Array.of(9, 8, 7) });
      est.then(() => resolve(ev.id), reject);
    });
  });
  const client = cha.createId();
  const est = client.waitFor('established', 10_000);
  client.connect({ address: b.address, port, qp: { pd: pda, sendCq: cqa, recvCq: cqa }, privateData: Uint8Array.of(1, 2, 3) });
  const estEv = await est;
  await serverUp;
  return { client, server: server!, listener, estEv, reqEvent: reqEvent!, cqa, cqb, pda, pdb };
}

t.test('connect: private data both ways, QPs connected to each other, SEND across', async (t) => {
  const [a, b] = await v4Pair();
  t.teardown(() => closeAll(a, b));
  const c = await connected(a, b, 9001);
  t.same([...c.reqEvent.privateData.subarray(0, 4)], [1, 2, 3, 0], 'REQ user data after the IP CM header (56 bytes)');
  t.equal(c.reqEvent.privateData.length, 56);
  t.equal(c.server.remoteAddress, '127.0.0.1', 'peer address from the IP CM header');
  t.equal(c.server.remotePort, c.client.localPort, 'peer rdma_cm port from the IP CM header');
  t.same([...c.estEv.privateData.subarray(0, 3)], [9, 8, 7], 'REP private data reaches the client');
  t.equal(c.client.qp!.state, 'RTS');
  t.equal(c.server.qp!.state, 'RTS');
  const qa = c.client.qp!.core.attrs;
  const qb = c.server.qp!.core.attrs;
  t.equal(qa.destQpNum, c.server.qp!.qpNum);
  t.equal(qb.destQpNum, c.client.qp!.qpNum);
  t.equal(qa.pathMtu, 1024, 'path MTU rdma_cm picks on Ethernet');
  t.equal(qa.dest?.address, '127.0.0.2');
  t.equal(qb.dest?.address, '127.0.0.1', 'the passive side\'s destination is the REQ\'s GID');
  t.equal(qa.timeout, 19, 'local ACK timeout of the REQ');
  // Starting PSNs as Linux's CM uses them: each names what its sender's receive queue expects.
  t.equal(c.client.qp!.core.query().sqPsn, c.server.startingPsn, 'the active side sends from the REP\'s starting PSN');
  t.equal(c.server.qp!.core.query().sqPsn, c.client.startingPsn, 'the passive side sends from the REQ\'s starting PSN');
  t.equal(c.client.qp!.core.query().rqPsn, c.client.startingPsn);
  t.equal(c.server.qp!.core.query().rqPsn, c.server.startingPsn);
  t.equal(qa.maxRdAtomic, 1);
  t.equal(qb.maxDestRdAtomic, 1);
  const rmr = c.pdb.regMr(new Uint8Array(8), 1);
  const smr = c.pda.regMr(Uint8Array.of(0xde, 0xad, 0xbe, 0xef), 0);
  postRecv(c.server.qp!, { wrId: 1, sgList: [rmr.sge()] });
  postSend(c.client.qp!, { wrId: 2, opcode: 'SEND', sendFlags: 2, sgList: [smr.sge()] });
  const wc = await c.cqb.next({ timeoutMs: 5000 });
  t.match(wc, { status: 'SUCCESS', opcode: 'RECV', byteLen: 4 });
  t.same([...rmr.buffer.subarray(0, 4)], [0xde, 0xad, 0xbe, 0xef]);
});

for (const who of ['client', 'server'] as const) {
  t.test(`disconnect from the ${who}: both sides get disconnected, QPs go to ERR`, async (t) => {
    const [a, b] = await v4Pair();
    t.teardown(() => closeAll(a, b));
    const c = await connected(a, b, 9002);
    const dc = c.client.waitFor('disconnected', 5000);
    const ds = c.server.waitFor('disconnected', 5000);
    (who === 'client' ? c.client : c.server).disconnect();
    const [ec, es] = await Promise.all([dc, ds]);
    t.equal(ec.status, 0);
    t.equal(es.status, 0);
    t.equal(c.client.qp!.state, 'ERR');
    t.equal(c.server.qp!.state, 'ERR');
    t.equal(c.client.cmState, 'TIMEWAIT');
    t.equal(c.server.cmState, 'TIMEWAIT');
    // A second disconnect (what rping does after the DISCONNECTED event) is harmless.
    c.client.disconnect();
    c.server.disconnect();
  });
}

t.test('IPv6 connect and disconnect on ::1', async (t) => {
  const [a, b] = await v6Pair();
  t.teardown(() => closeAll(a, b));
  const c = await connected(a, b, 9003, { a: a.port, b: b.port });
  t.equal(c.server.remoteAddress, '::1');
  t.equal(c.client.qp!.state, 'RTS');
  const ds = c.server.waitFor('disconnected', 5000);
  c.client.disconnect();
  await ds;
  t.equal(c.server.qp!.state, 'ERR');
});

t.test('no listener: REJ, reason 8 (invalid service ID)', async (t) => {
  const [a, b] = await v4Pair();
  t.teardown(() => closeAll(a, b));
  const ch = createEventChannel(a);
  const id = ch.createId();
  const pd = a.allocPd();
  const cq = a.createCq({ cqe: 4 });
  const rej = id.waitFor('rejected', 5000);
  id.connect({ address: b.address, port: 4321, qp: { pd, sendCq: cq, recvCq: cq } });
  const ev = await rej;
  t.equal(ev.status, 8);
  t.equal(ev.reason, 'Invalid Service ID');
  t.equal(id.cmState, 'IDLE');
  t.equal(id.qp!.state, 'INIT', 'the QP never left INIT');
});

t.test('the listener rejects: REJ, reason 28, with its private data', async (t) => {
  const [a, b] = await v4Pair();
  t.teardown(() => closeAll(a, b));
  const listener = createEventChannel(b).createId();
  listener.listen(9004);
  listener.on('connect_request', (ev: RdmaCmEvent) => ev.id.reject(Uint8Array.of(0x42)));
  const id = createEventChannel(a).createId();
  const pd = a.allocPd();
  const cq = a.createCq({ cqe: 4 });
  const rej = id.waitFor('rejected', 5000);
  id.connect({ address: b.address, port: 9004, qp: { pd, sendCq: cq, recvCq: cq } });
  const ev = await rej;
  t.equal(ev.status, 28);
  t.equal(ev.privateData[0], 0x42);
});

t.test('a slow accept: the listener sends an MRA, the client waits past its REQ timeout, then connects', async (t) => {
  const [a, b] = await v4Pair();
  t.teardown(() => closeAll(a, b));
  // Short CM timeouts so the test is quick: the client would resend its REQ after
  // 4.096 µs × 2^12 + 2 × 4.096 µs × 2^8 ≈ 19 ms and give up after 2 resends (≈60 ms).
  const cha = createEventChannel(a, { agent: { packetLifeTime: 8 } });
  const chb = createEventChannel(b, { agent: { packetLifeTime: 8 } });
  const listener = chb.createId();
  // MRA after 5 ms, asking for 4.096 µs × 2^20 ≈ 4.3 s.
  listener.listen(9005, { mraAfterMs: 5, mraServiceTimeout: 20 });
  const pda = a.allocPd();
  const pdb = b.allocPd();
  const cqa = a.createCq({ cqe: 4 });
  const cqb = b.createCq({ cqe: 4 });
  const states: string[] = [];
  listener.once('connect_request', (ev: RdmaCmEvent) => {
    ev.id.createQp(pdb, { sendCq: cqb, recvCq: cqb });
    // Accept long after the client would have given up without the MRA.
    setTimeout(() => {
      states.push(ev.id.cmState);
      ev.id.accept();
    }, 400);
  });
  const client = cha.createId();
  const est = client.waitFor('established', 10_000);
  client.connect({ address: b.address, port: 9005, qp: { pd: pda, sendCq: cqa, recvCq: cqa }, cmResponseTimeout: 12, maxCmRetries: 2 });
  await new Promise((r) => setTimeout(r, 200));
  t.equal(client.cmState, 'MRA_REQ_RCVD', 'the client got the MRA');
  await est;
  t.same(states, ['MRA_REQ_SENT'], 'the listener had sent the MRA before accepting');
  t.equal(client.qp!.state, 'RTS');
});

t.test('silent peer: the REQ is resent Max CM Retries times, then unreachable (ETIMEDOUT)', async (t) => {
  const a = await openDevice({ address: '127.0.0.1', port: 0 });
  const silent = dgram.createSocket('udp4');
  await new Promise<void>((r) => silent.bind(a.port, '127.0.0.3', r));
  t.teardown(async () => {
    silent.close();
    await a.close();
  });
  const reqs: CmReq[] = [];
  const tids = new Set<bigint>();
  silent.on('message', (m) => {
    const p = parsePacket(m, 0, m.length);
    if (!p.ok || p.packet.bth.destQp !== 1) return;
    t.equal(p.packet.deth?.qkey, GSI_QKEY);
    t.equal(p.packet.deth?.srcQp, 1);
    t.equal(p.packet.bth.pkey, 0xffff);
    const r = parseCmMad(p.packet.payload);
    if (r.ok && r.mad.msg.kind === 'REQ') {
      reqs.push(r.mad.msg);
      tids.add(r.mad.header.transactionId);
    }
  });
  // Short CM timeouts: 4.096 µs × 2^10 ≈ 4 ms response time, packet life time ≈ 1 ms.
  const ch = createEventChannel(a, { agent: { packetLifeTime: 8 } });
  const id = ch.createId();
  const pd = a.allocPd();
  const cq = a.createCq({ cqe: 4 });
  const started = Date.now();
  // The retries take ~25 ms of protocol time; the bounds below only prove the attempt ends (no
  // hang) on a loaded 2-core machine, they do not time the protocol.
  const unreachable = id.waitFor('unreachable', 30_000);
  id.connect({ address: '127.0.0.3', port: 7174, qp: { pd, sendCq: cq, recvCq: cq }, cmResponseTimeout: 10, maxCmRetries: 3 });
  const ev = await unreachable;
  const ms = Date.now() - started;
  t.equal(ev.status, CM_STATUS_TIMEDOUT);
  t.ok(ms < 20_000, `gave up in bounded time (${ms} ms)`);
  await new Promise((r) => setTimeout(r, 50));
  t.equal(reqs.length, 4, 'the REQ and 3 resends');
  t.equal(tids.size, 1, 'resends keep the TransactionID');
  const req = reqs[0]!;
  t.equal(req.serviceId, rdmaCmServiceId(7174), 'service ID 0x0000000001061c06');
  t.equal(req.maxCmRetries, 3);
  t.equal(req.remoteCmResponseTimeout, 10);
  t.equal(req.localQpn, id.qp!.qpNum);
  t.equal(req.primaryPath.localLid, 0xffff);
  t.equal(req.primaryPath.flowLabel, (id.localPort * 31 + 7174) & 0xfffff, 'rdma_cm\'s RoCEv2 flow label');
  const cma = parseCmaHeader(req.privateData);
  t.ok(cma.ok);
  if (cma.ok) t.match(cma.header, { ipVersion: 4, srcPort: id.localPort });
  t.equal(id.cmState, 'IDLE');
  t.equal(id.qp!.state, 'ERR');
});

t.test('roce rping as processes: usage errors, then client and server over loopback', async (t) => {
  const run = (args: string[]): Promise<{ code: number | null; out: string; err: string }> =>
    new Promise((resolve) => {
      const p = spawn(process.execPath, [CLI, 'rping', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
      let out = '';
      let err = '';
      p.stdout.setEncoding('utf8').on('data', (d: string) => (out += d));
      p.stderr.setEncoding('utf8').on('data', (d: string) => (err += d));
      const timer = setTimeout(() => p.kill('SIGKILL'), 30_000);
      p.on('close', (code) => {
        clearTimeout(timer);
        resolve({ code, out, err });
      });
    });
  t.equal((await run(['-a', '127.0.0.1'])).code, 2, 'neither -s nor -c');
  t.equal((await run(['-c'])).code, 2, 'client without -a');
  t.equal((await run(['-c', '-a', '127.0.0.2', '-S', '10'])).code, 2, '-S below rping\'s minimum');
  // A port for both stacks: free on 127.0.0.2 now (the kernel picks it), then shared.
  const probe = dgram.createSocket('udp4');
  const port = await new Promise<number>((r) => probe.bind(0, '127.0.0.2', () => r(probe.address().port)));
  probe.close();
  const srv = spawn(process.execPath, [CLI, 'rping', '-s', '-a', '127.0.0.2', '-v', '-d', '-S', '100', '-p', '7175', '--roce-port', String(port)], { stdio: ['ignore', 'pipe', 'pipe'] });
  let sOut = '';
  srv.stdout.setEncoding('utf8');
  await new Promise<void>((resolve) => {
    srv.stdout.on('data', (d: string) => {
      sOut += d;
      if (sOut.includes('rdma_listen')) resolve();
    });
  });
  const sDone = new Promise<number | null>((r) => srv.on('close', r));
  const refused = await run(['-c', '-a', '127.0.0.2', '-I', '127.0.0.1', '-p', '7199', '--roce-port', String(port), '-C', '1']);
  t.equal(refused.code, 3, 'nobody listens on that rdma_cm port: exit 3');
  t.match(refused.err, /cma event RDMA_CM_EVENT_REJECTED, error 8/);
  const c = await run(['-c', '-a', '127.0.0.2', '-I', '127.0.0.1', '-p', '7175', '--roce-port', String(port), '-C', '3', '-v', '-V', '-S', '100']);
  t.equal(c.code, 0, c.err);
  t.match(c.out, /^ping data: rdma-ping-0: ABCD.*\nping data: rdma-ping-1: BCDE.*\nping data: rdma-ping-2: CDEF.*\n$/);
  t.equal(await sDone, 0);
  t.match(sOut, /server ping data: rdma-ping-2: CDEF/);
});

/**
 * Over real UDP on loopback (batched I/O, GSO and GRO): a reply leaves together with the ACK of the
 * request it answers, as one GSO train (the reply first, the shorter ACK last), so a ping-pong costs
 * one datagram's way through the kernel per direction and not two — whether the reply is posted
 * from a receive's completion (SEND) or from a loop that polls memory for an RDMA WRITE. Each side's
 * link counts the trains it read whole.
 */
import t, { type Test } from 'tap';
import { allocPd, closeDevice, createCq, openDevice, postRecv, postSend, regMr, type Context, type Qp } from '../../src/api/verbs.js';
import { UdpLink } from '../../src/link/udp.js';
import { ALL_ACCESS, bringUp, makeQp, type Side } from '../helpers/engine.js';

const ROUNDS = 20;
const WAIT = { timeoutMs: 5000 };

async function side(watch: 'addon' | 'poll'): Promise<Side & { link: UdpLink }> {
  const link = await UdpLink.open({ address: '127.0.0.1', port: 0, watch });
  const ctx: Context = await openDevice({ address: '127.0.0.1', link });
  return { link, ctx, pd: allocPd(ctx), cq: createCq(ctx, { cqe: 64 }) };
}

/** Two sides over UDP, one RC QP each, connected; unsignaled sends. */
type UdpSide = Awaited<ReturnType<typeof side>>;

async function pair(t: Test, watch: 'addon' | 'poll'): Promise<{ a: UdpSide; b: UdpSide; qa: Qp; qb: Qp }> {
  const a = await side(watch);
  const b = await side(watch);
  t.equal(a.link.startup.watch, watch, `the link reads on the ${watch} watch`);
  t.teardown(() => Promise.all([closeDevice(a.ctx), closeDevice(b.ctx)]).then(() => undefined));
  const qa: Qp = makeQp(a, 'RC', { sqSigAll: false });
  const qb: Qp = makeQp(b, 'RC', { sqSigAll: false });
  bringUp(qa, qb, b.ctx, { timeout: 14 }, 0x10, 0x20, ALL_ACCESS);
  bringUp(qb, qa, a.ctx, { timeout: 14 }, 0x20, 0x10, ALL_ACCESS);
  return { a, b, qa, qb };
}

// Both ways a link learns its socket is readable (UdpLinkOptions.watch): each must let the application's
// reply join the batch's answer.
for (const watch of ['addon', 'poll'] as const) {
  t.test(`${watch} watch: a reply posted from a completion leaves in one train with the ACK of the request it answers`, async (t) => {
    // Unsignaled sends: the only completions are the receives, which is what each side waits for.
    const { a, b, qa, qb } = await pair(t, watch);
    t.equal(a.link.startup.gro, true, 'UDP_GRO on the requester');
    t.equal(b.link.startup.gro, true, 'UDP_GRO on the responder');
    const ma = regMr(a.pd, new Uint8Array(128), ALL_ACCESS);
    const mb = regMr(b.pd, new Uint8Array(128), ALL_ACCESS);
    const msg = 48;

    // The responder echoes every message from inside its completion's promise reaction.
    const echo = (async () => {
      for (let i = 0; i < ROUNDS; i++) {
        postRecv(qb, { wrId: i, sgList: [mb.sge(64, msg)] });
        const wc = await b.cq.next(WAIT);
        if (wc.status !== 'SUCCESS') throw new Error(`responder: ${wc.status}`);
        postSend(qb, { wrId: i, opcode: 'SEND', sgList: [mb.sge(64, msg)] });
      }
    })();
    const trainsBefore = a.link.counters.groTrains;
    for (let i = 0; i < ROUNDS; i++) {
      postRecv(qa, { wrId: i, sgList: [ma.sge(64, msg)] });
      ma.buffer.fill(i + 1, 0, msg);
      postSend(qa, { wrId: i, opcode: 'SEND', sgList: [ma.sge(0, msg)] });
      const wc = await a.cq.next(WAIT);
      t.equal(wc.status, 'SUCCESS');
      if (ma.buffer[64] !== i + 1) t.fail(`round ${i}: echo carries ${ma.buffer[64]}`);
    }
    await echo;
    const trains = a.link.counters.groTrains - trainsBefore;
    // Every echo after the first (whose ACK may leave before the application has reacted to a
    // completion it has not yet awaited) arrives with its ACK.
    t.ok(trains >= ROUNDS - 1, `${trains} of ${ROUNDS} echoes arrived in one train with their ACK`);
    t.equal(a.ctx.counters.retransPkts + b.ctx.counters.retransPkts, 0, 'nothing retransmitted');
  });

  t.test(`${watch} watch: a WRITE posted by a loop that polls memory leaves in one train with the ACK of the WRITE it answers`, async (t) => {
    const { a, b, qa, qb } = await pair(t, watch);
    const ma = regMr(a.pd, new Uint8Array(64), ALL_ACCESS);
    const mb = regMr(b.pd, new Uint8Array(64), ALL_ACCESS);
    // As ib_write_lat: each side spins on the last byte of its buffer (one look per event-loop turn)
    // for the peer's sequence number, then WRITEs its own into the peer's buffer. No completions.
    const spinFor = (m: typeof ma, seq: number): Promise<void> => new Promise((resolve, reject) => {
      const until = Date.now() + 5000;
      const look = (): void => {
        if (m.buffer[31] === seq) return resolve();
        if (Date.now() > until) return reject(new Error(`WRITE ${seq} not seen`));
        setImmediate(look);
      };
      look();
    });
    const write = (qp: Qp, from: typeof ma, to: typeof mb, seq: number): void => {
      from.buffer[63] = seq;
      postSend(qp, { wrId: seq, opcode: 'RDMA_WRITE', sgList: [from.sge(32, 32)], rdma: { remoteAddr: to.va(0), rkey: to.rkey } });
    };
    const ponger = (async () => {
      for (let i = 1; i <= ROUNDS; i++) {
        await spinFor(mb, i);
        write(qb, mb, ma, i);
      }
    })();
    const trainsBefore = a.link.counters.groTrains;
    for (let i = 1; i <= ROUNDS; i++) {
      write(qa, ma, mb, i);
      await spinFor(ma, i);
    }
    await ponger;
    const trains = a.link.counters.groTrains - trainsBefore;
    t.ok(trains >= ROUNDS - 1, `${trains} of ${ROUNDS} replies arrived in one train with their ACK`);
    t.equal(a.ctx.counters.retransPkts + b.ctx.counters.retransPkts, 0, 'nothing retransmitted');
  });
}

/**
 * Two devices over real UDP on 127.0.0.1 (two ports, one process): every operation each
 * transport allows, at every path MTU, for message sizes 0, 1, MTU−1, MTU, MTU+1 and 1 MiB.
 * Data must land byte-exact (and nothing past it), and completions must carry the right
 * opcode, length, immediate, invalidated R_Key, source QP and flags.
 */
import t from 'tap';
import {
  allocPd, closeDevice, createCq, modifyQp, openDevice, postRecv, postSend, regMr, type Context, type Qp,
} from '../../src/api/verbs.js';
import { WC_FLAGS, type QpType, type WorkCompletion, type WrOpcode } from '../../src/core/types.js';
import type { MemoryRegion } from '../../src/core/mr.js';
import { ALL_ACCESS, bringUp, makeQp, pattern, type Side } from '../helpers/engine.js';

const MTUS = [256, 512, 1024, 2048, 4096] as const;
const MiB = 1 << 20;
const GUARD = 64;
const WAIT = { timeoutMs: 20_000 };

async function side(mtu: number): Promise<Side> {
  const ctx = await openDevice({ address: '127.0.0.1', port: 0, mtu });
  return { ctx, pd: allocPd(ctx), cq: createCq(ctx, { cqe: 1024 }) };
}

function connect(a: Side, b: Side, type: QpType, mtu: number): [Qp, Qp] {
  const qa = makeQp(a, type, { sqSigAll: false });
  const qb = makeQp(b, type, { sqSigAll: false });
  const o = { pathMtu: mtu as 256, timeout: 12, qkey: 0x11111111 };
  bringUp(qa, qb, b.ctx, o, 0x10, 0x20, ALL_ACCESS);
  bringUp(qb, qa, a.ctx, o, 0x20, 0x10, ALL_ACCESS);
  return [qa, qb];
}

const OPS: Record<QpType, WrOpcode[]> = {
  RC: ['SEND', 'SEND_WITH_IMM', 'SEND_WITH_INV', 'RDMA_WRITE', 'RDMA_WRITE_WITH_IMM', 'RDMA_READ'],
  UC: ['SEND', 'SEND_WITH_IMM', 'RDMA_WRITE', 'RDMA_WRITE_WITH_IMM'],
  UD: ['SEND', 'SEND_WITH_IMM'],
};

const consumesRecv = (op: WrOpcode): boolean => op.startsWith('SEND') || op === 'RDMA_WRITE_WITH_IMM';

t.test('UDP loopback: every op × transport × MTU × size', async (t) => {
  for (const mtu of MTUS) {
    const a = await side(mtu);
    const b = await side(mtu);
    t.teardown(() => Promise.all([closeDevice(a.ctx), closeDevice(b.ctx)]).then(() => undefined));
    const src = regMr(a.pd, pattern(MiB + GUARD, mtu), ALL_ACCESS);
    const dstA = regMr(a.pd, new Uint8Array(MiB + GUARD), ALL_ACCESS);
    const dstB = regMr(b.pd, new Uint8Array(MiB + GUARD + 40), ALL_ACCESS);
    const remoteSrc = regMr(b.pd, pattern(MiB + GUARD, mtu + 1), ALL_ACCESS);
    let wrId = 1;

    for (const type of ['RC', 'UC', 'UD'] as const) {
      let [qa, qb] = connect(a, b, type, mtu);
      const ah = a.pd.createAh({ address: '127.0.0.1', port: b.ctx.port });
      for (const op of OPS[type]) {
        for (const size of [0, 1, mtu - 1, mtu, mtu + 1, MiB]) {
          const name = `${type} ${op} mtu=${mtu} size=${size}`;
          dstA.buffer.fill(0);
          dstB.buffer.fill(0);
          const ud = type === 'UD';
          const tooBig = ud && size > mtu;
          const isRead = op === 'RDMA_READ';
          const local = isRead ? dstA : src;
          const target: MemoryRegion = isRead ? remoteSrc : dstB;
          let invMr: MemoryRegion | undefined;
          const id = wrId++;
          if (consumesRecv(op) && !tooBig) {
            postRecv(qb, { wrId: 10_000 + id, sgList: [dstB.sge(0, ud ? size + 40 : size)] });
          }
          const imm = (0x01020304 + id) >>> 0;
          const wr = {
            wrId: id, opcode: op, sendFlags: 2 /* SIGNALED */, sgList: [local.sge(0, size)],
            ...(op.endsWith('_IMM') ? { immData: imm } : {}),
            ...(op === 'SEND_WITH_INV' ? { invalidateRkey: (invMr = regMr(b.pd, new Uint8Array(8), ALL_ACCESS)).rkey } : {}),
            ...(op.startsWith('RDMA') ? { rdma: { remoteAddr: target.va(0), rkey: target.rkey } } : {}),
            ...(ud ? { ud: { ah, remoteQpn: qb.qpNum, remoteQkey: 0x80000000 } } : {}),
          };
          postSend(qa, wr);
          const swc = await a.cq.next(WAIT).catch((e: Error) => {
            throw new Error(`${name}: ${e.message}; ${dump(qa, qb, a, b)}`);
          });
          if (tooBig) {
            // A UD message larger than the MTU cannot be sent (LOC_LEN_ERR); the QP enters SQE.
            t.equal(swc.status, 'LOC_LEN_ERR', `${name}: LOC_LEN_ERR`);
            t.equal(qa.state, 'SQE', `${name}: SQE`);
            modifyQp(qa, { qpState: 'RTS' });
            continue;
          }
          const ok = checkSend(t, swc, name, id, op, size, imm);
          let rwc: WorkCompletion | undefined;
          if (consumesRecv(op)) {
            rwc = await b.cq.next(WAIT).catch((e: Error) => {
              throw new Error(`${name} (receive): ${e.message}; ${dump(qa, qb, a, b)}`);
            });
            checkRecv(t, rwc, name, op, size, imm, qa.qpNum, ud, invMr, a.ctx);
            if (ud) {
              // GRH area: 20 zero bytes, then the sender's IPv4 header (rxe's layout).
              const g = dstB.buffer;
              const grhOk = g.subarray(0, 20).every((x) => x === 0) && g[20] === 0x45 && g[29] === 17 &&
                g.subarray(32, 36).join('.') === '127.0.0.1' && g.subarray(36, 40).join('.') === '127.0.0.1';
              if (!grhOk) t.fail(`${name}: GRH area ${Buffer.from(g.subarray(0, 40)).toString('hex')}`);
            }
          }
          // Data: exact, and nothing written past it.
          const got = isRead ? dstA.buffer : op === 'RDMA_WRITE' || op === 'RDMA_WRITE_WITH_IMM' || !ud ? dstB.buffer : dstB.buffer.subarray(40);
          const want = isRead ? remoteSrc.buffer : src.buffer;
          if (type === 'UC' && op === 'RDMA_WRITE') {
            // UC completes on transmission and a plain WRITE raises nothing at the target: wait
            // (bounded) for the data to land.
            await until(() => Buffer.compare(got.subarray(0, size), want.subarray(0, size)) === 0, 5000);
          }
          const same = Buffer.compare(got.subarray(0, size), want.subarray(0, size)) === 0;
          const clean = got.subarray(size, size + GUARD).every((x) => x === 0);
          if (!same || !clean || !ok) t.fail(`${name}: data ${same ? 'ok' : 'WRONG'}, guard ${clean ? 'clean' : 'OVERWRITTEN'}`);
          else t.pass(`${name}: byte-exact`);
          if (qa.state !== 'RTS') [qa, qb] = connect(a, b, type, mtu);
        }
      }
      if (type === 'RC') {
        // Atomics: CmpSwap then FetchAdd on an aligned word; the old value comes back.
        const word = regMr(b.pd, new Uint8Array(16), ALL_ACCESS);
        const dv = new DataView(word.buffer.buffer, word.buffer.byteOffset, 16);
        dv.setBigUint64(8, 0x1111n, true);
        const res = regMr(a.pd, new Uint8Array(8), ALL_ACCESS);
        const rv = new DataView(res.buffer.buffer, res.buffer.byteOffset, 8);
        postSend(qa, { wrId: 900, opcode: 'ATOMIC_CMP_AND_SWP', sendFlags: 2, sgList: [res.sge(0, 8)], atomic: { remoteAddr: word.va(8), compareAdd: 0x1111n, swap: 0x2222n, rkey: word.rkey } });
        let w = await a.cq.next(WAIT);
        t.match(w, { status: 'SUCCESS', opcode: 'COMP_SWAP', byteLen: 8 }, `RC CAS mtu=${mtu}`);
        t.equal(rv.getBigUint64(0, true), 0x1111n, 'CAS returns the old value');
        t.equal(dv.getBigUint64(8, true), 0x2222n, 'CAS swapped');
        postSend(qa, { wrId: 901, opcode: 'ATOMIC_FETCH_AND_ADD', sendFlags: 2, sgList: [res.sge(0, 8)], atomic: { remoteAddr: word.va(8), compareAdd: 5n, rkey: word.rkey } });
        w = await a.cq.next(WAIT);
        t.match(w, { status: 'SUCCESS', opcode: 'FETCH_ADD', byteLen: 8 }, `RC FAA mtu=${mtu}`);
        t.equal(rv.getBigUint64(0, true), 0x2222n, 'FAA returns the old value');
        t.equal(dv.getBigUint64(8, true), 0x2227n, 'FAA added');
      }
    }
    t.equal(a.ctx.counters.retryExceeded, 0);
    await closeDevice(a.ctx);
    await closeDevice(b.ctx);
  }
});

function checkSend(t: Asserts, wc: WorkCompletion, name: string, id: number, op: WrOpcode, size: number, imm: number): boolean {
  const want = {
    wrId: id, status: 'SUCCESS', byteLen: size,
    opcode: op.startsWith('SEND') ? 'SEND' : op === 'RDMA_READ' ? 'RDMA_READ' : 'RDMA_WRITE',
    wcFlags: op.endsWith('_IMM') ? WC_FLAGS.WITH_IMM : 0,
  };
  void imm;
  const ok = Object.entries(want).every(([k, v]) => (wc as unknown as Record<string, unknown>)[k] === v);
  if (!ok) t.same(wc, { ...wc, ...want }, `${name}: send completion`);
  return ok;
}

function checkRecv(
  t: Asserts, wc: WorkCompletion, name: string, op: WrOpcode, size: number, imm: number, srcQp: number, ud: boolean,
  invMr: MemoryRegion | undefined, from: Context,
): void {
  const want: Record<string, unknown> = {
    status: 'SUCCESS',
    opcode: op === 'RDMA_WRITE_WITH_IMM' ? 'RECV_RDMA_WITH_IMM' : 'RECV',
    byteLen: ud ? size + 40 : size,
    wcFlags: (ud ? WC_FLAGS.GRH : 0) | (op.endsWith('_IMM') ? WC_FLAGS.WITH_IMM : 0) | (op === 'SEND_WITH_INV' ? WC_FLAGS.WITH_INV : 0),
    srcQp: ud ? srcQp : 0,
  };
  if (op.endsWith('_IMM')) want['immData'] = imm;
  if (invMr) want['invalidatedRkey'] = invMr.rkey;
  const ok = Object.entries(want).every(([k, v]) => (wc as unknown as Record<string, unknown>)[k] === v);
  if (!ok) t.same(wc, { ...wc, ...want }, `${name}: receive completion`);
  if (invMr && !invMr.rkeyInvalidated) t.fail(`${name}: R_Key not invalidated`);
  void from;
}

function dump(qa: Qp, qb: Qp, a: Side, b: Side): string {
  const q = (x: Qp): unknown => ({
    qpn: x.qpNum, state: x.state, reqPsn: x.core.reqPsn, compPsn: x.core.compPsn, respPsn: x.core.respPsn,
    sq: x.core.sqLength, rq: x.core.rq.length, pollAt: x.core.pollAt(),
  });
  const nz = (c: object): object => Object.fromEntries(Object.entries(c).filter(([, v]) => v !== 0));
  return JSON.stringify({ now: a.ctx.device.now(), qa: q(qa), qb: q(qb), a: nz(a.ctx.counters), b: nz(b.ctx.counters), la: a.ctx.device.link.drops, lb: b.ctx.device.link.drops });
}

async function until(cond: () => boolean, ms: number): Promise<void> {
  const end = Date.now() + ms;
  while (!cond() && Date.now() < end) await new Promise((r) => setTimeout(r, 1));
}

interface Asserts {
  same(a: unknown, b: unknown, m: string): unknown;
  fail(m: string): unknown;
}

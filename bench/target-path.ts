/**
 * The target's side of the QP scale workload without sockets: RDMA WRITE ONLY packets of 4 KiB, each
 * asking for an ACK, fed to a device's receive handler in batches of 32 (as `UdpLink` hands over a
 * `recvmmsg` batch and then answers it), round-robin over N connected RC QPs. The link under the
 * device is a stub whose `send` does what the batched `UdpLink.send` does before the socket: copy the
 * parts into the send ring, and write the ICRCs of a queue's datagrams at its flush, one call per 64
 * datagrams or at the batch's end (`IcrcFlowKey.trains`; a tree older than that computes each datagram's
 * ICRC at its send, as its link did). What is measured is then the stack's own cost
 * per packet, which the two-process QP scale bench dilutes with the kernel's (the `recvmmsg` copy,
 * the loopback) and the receive ICRC, the same at one QP and at 10,000.
 *
 *   node dist/bench/target-path.js [--qps 1,10000] [--rounds 7] [--ms 800] [TREE ...]
 *   taskset -c 1 node dist/bench/target-path.js --interleave [--qps 1] [--rounds 80] [--ms 40] TREE ...
 *
 * Each round runs every QP count on every tree (a checkout built with `npx tsc`; default this one),
 * each in a fresh process pinned to CPU 1 where `taskset` can, so the builds see the same moment of a
 * shared machine. Prints the median ns per packet, the median per-round extra cost of N QPs over one,
 * and with two trees the median per-round B/A ratio.
 */

import { execFileSync } from 'node:child_process';
import { dirname, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import type * as Verbs from '../src/api/verbs.js';
import type { Link, LinkRxHandler, PeerAddress } from '../src/link/link.js';
import type * as Icrc from '../src/wire/icrc.js';
import type * as Clock from '../src/runtime/clock.js';
import { writeU24 } from '../src/wire/bytes.js';
import { median } from './harness.js';
import { canPin } from './procs.js';

const SIZE = 4096;
const BATCH = 32;
/** Receive slots the packets are written into, reused in turn like a receive ring's. */
const SLOTS = 64;
const OP_RC_RDMA_WRITE_ONLY = 0x0a;

/** A device over a stub link, built from one tree's modules (see the file comment), and N RC QPs in RTS. */
export interface StubSide {
  v: typeof Verbs;
  ctx: Verbs.Context;
  cq: Verbs.Cq;
  mr: ReturnType<typeof Verbs.regMr>;
  qps: Verbs.Qp[];
  /** The device's receive handler and its batch-end hook, as the stub link was given them. */
  rx: LinkRxHandler;
  answer: (last: boolean) => void;
  /** Writes the ICRCs of what is queued, as the batched link's flush does. */
  flush: () => void;
  /** Datagrams sent so far. */
  sent: () => number;
  /** The peer the QPs are connected to. */
  peer: PeerAddress;
}

/** Opens a device over the stub link with `n` RC QPs connected to QPNs 0x100 + i; `onSend` sees each datagram's first part. */
export async function stubSide(tree: string, n: number, onSend?: (head: Uint8Array) => void): Promise<StubSide> {
  const dist = pathToFileURL(resolve(tree, 'dist/src')).href;
  const v = (await import(`${dist}/api/verbs.js`)) as typeof Verbs;
  const { icrcOfUdpPayload, IcrcFlowKey } = (await import(`${dist}/wire/icrc.js`)) as typeof Icrc;
  const { SystemClock } = (await import(`${dist}/runtime/clock.js`)) as typeof Clock;
  // The device's clock, which the receive times are read on, as a UdpLink's are: one reading per
  // batch (the `at` the caller passes), not one per packet.
  const clock = new SystemClock();
  const self: PeerAddress = { address: '10.0.0.2', port: 4791 };
  const peer: PeerAddress = { address: '10.0.0.1', port: 4791 };
  const info = { family: 4 as const, srcAddr: new Uint8Array([10, 0, 0, 2]), dstAddr: new Uint8Array([10, 0, 0, 1]), srcPort: 4791, dstPort: 4791, ipId: 0, ipFlagsFrag: 0x4000 };
  // The send ring: datagrams laid out one after another, wrapping; a queue of up to 64 of them.
  const ring = new Uint8Array(1 << 20);
  const QUEUE = 64;
  const desc = new Int32Array(3 * QUEUE);
  const key = (IcrcFlowKey as typeof IcrcFlowKey | undefined) !== undefined ? new IcrcFlowKey(info) : undefined;
  const atFlush = typeof key?.trains === 'function';
  let queued = 0;
  let tail = 0;
  const flush = (): void => {
    if (queued > 0) key!.trains(ring, desc, 0, queued);
    queued = 0;
  };
  let handler: LinkRxHandler | undefined;
  let batchEnd: ((last: boolean) => void) | undefined;
  let sent = 0;
  const link: Link = {
    rxClock: clock,
    caps: { family: 4, icrcGenerate: true, icrcVerify: 'recover', maxDatagram: 9000 },
    local: self,
    drops: { badIcrc: 0, tooShort: 0, notRoce: 0, injectedLoss: 0, sendError: 0, closed: 0 },
    send(_dst, _srcPort, parts) {
      onSend?.(parts[0]!);
      let len = 4;
      for (let i = 0; i < parts.length; i++) len += parts[i]!.length;
      if (tail + len > ring.length) tail = 0;
      const at = tail;
      tail += len;
      let o = at;
      for (let i = 0; i < parts.length; i++) {
        ring.set(parts[i]!, o);
        o += parts[i]!.length;
      }
      if (atFlush) {
        desc[queued] = at;
        desc[QUEUE + queued] = len;
        desc[2 * QUEUE + queued] = len;
        if (++queued === QUEUE) flush();
      } else {
        const c = icrcOfUdpPayload(info, ring.subarray(at, at + len));
        ring[o] = c;
        ring[o + 1] = c >>> 8;
        ring[o + 2] = c >>> 16;
        ring[o + 3] = c >>> 24;
      }
      sent++;
    },
    onReceive(h) {
      handler = h;
    },
    onReceiveBatchEnd(fn) {
      batchEnd = fn;
    },
    close: async () => undefined,
  };
  const ctx = await v.openDevice({ address: self.address, link, clock, mtu: 4096 });
  const pd = v.allocPd(ctx);
  const cq = v.createCq(ctx, { cqe: 256 });
  const mr = v.regMr(pd, new Uint8Array(SIZE), 0x7);
  // The default caps, as the QP scale bench's QPs have.
  const cap = {};
  const qps: Verbs.Qp[] = [];
  for (let i = 0; i < n; i++) {
    const qp = v.createQp(pd, { type: 'RC', sendCq: cq, recvCq: cq, sqSigAll: true, cap });
    v.modifyQp(qp, { qpState: 'INIT', pkeyIndex: 0, portNum: 1, qpAccessFlags: 0x7 });
    v.modifyQp(qp, { qpState: 'RTR', ahAttr: peer, pathMtu: 4096, destQpNum: 0x100 + i, rqPsn: 0, maxDestRdAtomic: 16, minRnrTimer: 1 });
    v.modifyQp(qp, { qpState: 'RTS', sqPsn: 0, timeout: 14, retryCnt: 7, rnrRetry: 7, maxRdAtomic: 16 });
    qps.push(qp);
  }
  if (handler === undefined || batchEnd === undefined) throw new Error('the device did not register its receive handlers');
  return { v, ctx, cq, mr, qps, rx: handler, answer: batchEnd, flush, sent: () => sent, peer };
}

/**
 * The target's side for one tree and QP count, fed WRITE ONLY packets: the returned function feeds it
 * for about `ms` and gives ns per packet, having checked that every packet was accepted and answered.
 */
async function targetRunner(tree: string, n: number): Promise<(ms: number) => { nsPerPacket: number; packets: number }> {
  const { ctx, mr, qps, rx, answer, flush, sent: sentCount, peer } = await stubSide(tree, n);
  const qpns = Int32Array.from(qps, (q) => q.qpNum);
  // Slots of one buffer, as a receive ring's are (src/link/mmsg.ts, `RxRing`).
  const len = 12 + 16 + SIZE + 4;
  const ringMemory = new ArrayBuffer(SLOTS * len);
  const slots: Uint8Array[] = [];
  for (let s = 0; s < SLOTS; s++) {
    const b = new Uint8Array(ringMemory, s * len, len);
    const dv = new DataView(ringMemory, s * len, len);
    b[0] = OP_RC_RDMA_WRITE_ONLY;
    dv.setUint16(2, 0xffff);
    b[8] = 0x80; // AckReq
    dv.setBigUint64(12, mr.va(0));
    dv.setUint32(20, mr.rkey);
    dv.setUint32(24, SIZE);
    slots.push(b);
  }
  const psn = new Int32Array(n);
  let next = 0;
  let slot = 0;
  const batch = (): void => {
    const at = ctx.device.now();
    for (let k = 0; k < BATCH; k++) {
      const b = slots[slot]!;
      slot = (slot + 1) % SLOTS;
      const q = qpns[next]!;
      const p = psn[next]!;
      psn[next] = (p + 1) & 0xffffff;
      next = next + 1 === n ? 0 : next + 1;
      writeU24(b, 5, q); // BTH DestQP
      writeU24(b, 9, p); // BTH PSN
      rx(b, { src: peer, icrc: 'ok', ce: false, at });
    }
    answer(false);
    flush();
  };
  return (ms: number) => {
    const sent0 = sentCount();
    const c0 = ctx.device.snapshot();
    let packets = 0;
    const t0 = performance.now();
    const end = t0 + ms;
    while (performance.now() < end) {
      for (let j = 0; j < 16; j++) batch();
      packets += 16 * BATCH;
    }
    const t1 = performance.now();
    const c1 = ctx.device.snapshot();
    // Every packet must have been accepted and answered: one ACK per batch with one QP, one per packet with many.
    const executed = c1.rcvdPkts - c0.rcvdPkts;
    const acks = sentCount() - sent0;
    if (executed !== packets || acks < packets / BATCH || (n >= BATCH && acks !== packets)) {
      throw new Error(`target-path: ${packets} packets fed, ${executed} accepted, ${acks} ACKs`);
    }
    return { nsPerPacket: ((t1 - t0) * 1e6) / packets, packets };
  };
}

/** One process, one tree, one QP count: ns per packet over `ms`, after a warm-up. */
async function child(tree: string, n: number, ms: number): Promise<void> {
  const run = await targetRunner(tree, n);
  run(Math.min(400, ms));
  process.stdout.write(`${JSON.stringify(run(ms))}\n`);
}

/**
 * `--interleave`: every tree's target (or the side `runner` makes: `initiator-path.ts` passes the
 * initiator's) in this one process, windows of `ms` alternated tree by tree for `rounds` rounds, the
 * order reversed every other round, so that the builds see the same moments of a VM whose speed swings
 * by 2× from one second to the next (separate processes, a second each, do not). Prints each tree's
 * median ns per packet and its median per-window ratio to the first tree's. The tree loaded second
 * reads faster (bench/README.md): compare a pair in both orders.
 */
export async function interleaved(
  trees: string[], n: number, rounds: number, ms: number,
  runner: (tree: string, n: number) => Promise<(ms: number) => { nsPerPacket: number } | Promise<{ nsPerPacket: number }>> = targetRunner,
  warmupMs = 500,
): Promise<void> {
  const runs: ((ms: number) => { nsPerPacket: number } | Promise<{ nsPerPacket: number }>)[] = [];
  for (const tree of trees) runs.push(await runner(tree, n));
  for (const run of runs) await run(warmupMs);
  const got: number[][] = trees.map(() => []);
  for (let r = 0; r < rounds; r++) {
    const order = r % 2 === 0 ? [...runs.keys()] : [...runs.keys()].reverse();
    for (const i of order) got[i]!.push((await runs[i]!(ms)).nsPerPacket);
  }
  console.log(`${rounds} rounds of ${ms} ms per tree in one process, ${n.toLocaleString('en-US')} QP${n === 1 ? '' : 's'}; ns per packet`);
  const first = got[0]!;
  trees.forEach((tree, i) => {
    const xs = got[i]!;
    console.log(`${tree}: median ${median(xs).toFixed(0)}, over the first tree paired ${median(xs.map((x, k) => x / first[k]!)).toFixed(3)}`);
  });
}

/** A turn of the event loop: the posts' QP runs (microtasks), the ready QPs' run (an immediate). */
export const turn = (): Promise<void> => new Promise((r) => setImmediate(r));

/** BTH + AETH + ICRC. */
const ACK_LEN = 20;
const OP_RC_ACKNOWLEDGE = 0x11;

/**
 * A plain ACK to `destQp` as rxe sends it (the default P_Key, an ACK with unlimited credit), for a
 * harness to hand to a device's receive handler: its PSN (byte 9) and MSN (byte 13) are the caller's
 * to write; its ICRC field is left zero (the stub link does not check it).
 */
export function stubAck(destQp = 0): Uint8Array {
  const b = new Uint8Array(ACK_LEN);
  b[0] = OP_RC_ACKNOWLEDGE;
  b[2] = 0xff;
  b[3] = 0xff;
  writeU24(b, 5, destQp);
  b[12] = 0x1f;
  return b;
}

/**
 * Runs `script --child TREE --qps N --ms MS` for every round, tree and QP count, each a fresh process
 * pinned to CPU 1 where it can be, and prints the medians (`what` names the workload). A child prints
 * `{ nsPerPacket }` as its last line. Shared with `initiator-path.ts`.
 */
export function runPaired(script: string, what: string, trees: string[], counts: number[], rounds: number, ms: number): void {
  const pin = canPin(1);
  const got = new Map<string, number[]>();
  for (let r = 0; r < rounds; r++) {
    for (const tree of trees) {
      for (const n of counts) {
        const args = [script, '--child', tree, '--qps', String(n), '--ms', String(ms)];
        const out = pin ? execFileSync('taskset', ['-c', '1', process.execPath, ...args]) : execFileSync(process.execPath, args);
        const { nsPerPacket } = JSON.parse(out.toString().trim().split('\n').pop()!) as { nsPerPacket: number };
        const key = `${tree}\t${n}`;
        if (!got.has(key)) got.set(key, []);
        got.get(key)!.push(nsPerPacket);
      }
    }
  }
  const at = (tree: string, n: number): number[] => got.get(`${tree}\t${n}`)!;
  console.log(`${rounds} rounds of ${ms} ms${pin ? ', pinned to CPU 1' : ''}; ${what}; ns per packet`);
  for (const tree of trees) {
    const one = counts.includes(1) ? at(tree, 1) : undefined;
    for (const n of counts) {
      const xs = at(tree, n);
      let line = `${tree} ${n.toLocaleString('en-US')} QP${n === 1 ? '' : 's'}: median ${median(xs).toFixed(0)} (rounds ${xs.map((x) => x.toFixed(0)).join(' ')})`;
      if (one !== undefined && n !== 1) {
        line += `; over 1 QP, paired: +${median(xs.map((x, i) => x - one[i]!)).toFixed(0)} ns, ratio ${median(xs.map((x, i) => one[i]! / x)).toFixed(3)}`;
      }
      console.log(line);
    }
  }
  if (trees.length === 2) {
    for (const n of counts) {
      const a = at(trees[0]!, n);
      const b = at(trees[1]!, n);
      console.log(`${n.toLocaleString('en-US')} QP${n === 1 ? '' : 's'}: B/A paired ${median(b.map((x, i) => x / a[i]!)).toFixed(3)}`);
    }
  }
}

/** The command line both harnesses take: `--child TREE` in a child, else `[--qps] [--rounds] [--ms] [TREE ...]`. */
export async function pathMain(script: string, what: string, child: (tree: string, n: number, ms: number) => Promise<void>): Promise<void> {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      child: { type: 'string' },
      qps: { type: 'string', default: '1,10000' },
      rounds: { type: 'string', default: '7' },
      ms: { type: 'string', default: '800' },
    },
  });
  if (values.child !== undefined) {
    await child(values.child, Number(values.qps), Number(values.ms));
  } else {
    const trees = positionals.length > 0 ? positionals.map((t) => resolve(t)) : [resolve(dirname(script), '../..')];
    runPaired(script, what, trees, values.qps.split(',').map(Number), Number(values.rounds), Number(values.ms));
  }
}

const me = fileURLToPath(import.meta.url);
if (process.argv[1] !== undefined && resolve(process.argv[1]) === me) {
  if (process.argv.includes('--interleave')) {
    const { values, positionals } = parseArgs({
      allowPositionals: true,
      options: { interleave: { type: 'boolean' }, qps: { type: 'string', default: '1' }, rounds: { type: 'string', default: '80' }, ms: { type: 'string', default: '40' } },
    });
    await interleaved(positionals.length > 0 ? positionals.map((t) => resolve(t)) : [resolve(dirname(me), '../..')], Number(values.qps), Number(values.rounds), Number(values.ms));
  } else {
    await pathMain(me, `WRITE ONLY ${SIZE} B with AckReq, batches of ${BATCH}`, child);
  }
}

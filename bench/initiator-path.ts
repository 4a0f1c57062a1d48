/**
 * The initiator's side of the QP scale workload without sockets, as `target-path.ts` is the target's:
 * 128 RDMA WRITEs of 4 KiB outstanding in total, each new one posted on the next of N connected RC QPs
 * (`postSend`, as the bench's initiator does), over the same stub link. The target is played here: each
 * batch of 32 WRITEs the device sent is answered as the stack's responder answers a receive batch, one
 * ACK per QP for the last of its WRITEs in the batch (so one ACK per batch with one QP, one per WRITE
 * with many), handed to the device's receive handler and then its batch end; the completions are
 * polled and as many WRITEs posted again. What is measured is the stack's own cost per message on the
 * initiator, without the kernel's, at 1 QP and at N.
 *
 *   node dist/bench/initiator-path.js [--qps 1,10000] [--rounds 7] [--ms 800] [TREE ...]
 *   taskset -c 1 node dist/bench/initiator-path.js --interleave [--qps 10000] [--rounds 40] [--ms 100] TREE ...
 *
 * Rounds, trees and the figures printed are as in `target-path.ts`. With `--interleave` every tree runs
 * in this one process, windows alternated as there; a window starts with `DEPTH` WRITEs posted and ends
 * with all of them completed (untimed), so that a tree waiting its turn has nothing in flight.
 */

import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import type { WorkCompletion } from '../src/core/types.js';
import { readU24, writeU24 } from '../src/wire/bytes.js';
import { interleaved, pathMain, stubAck, stubSide, turn } from './target-path.js';

const SIZE = 4096;
const DEPTH = 128;
const BATCH = 32;
const OP_RC_RDMA_WRITE_ONLY = 0x0a;
const WARMUP_MS = 1500;
/** The peer's QPNs: the stub side connects QP i to 0x100 + i. */
const PEER_QPN_BASE = 0x100;

/**
 * The initiator's side for one tree and QP count: the returned function runs it for about `ms` with
 * `DEPTH` WRITEs outstanding, then lets them all complete, and gives ns per message of the window.
 */
async function initiatorRunner(tree: string, n: number): Promise<(ms: number) => Promise<{ nsPerPacket: number; packets: number }>> {
  // The WRITEs the device sent, in order: the index of their QP and their PSN.
  const RING = 1 << 12;
  const sentQp = new Int32Array(RING);
  const sentPsn = new Int32Array(RING);
  let sentTail = 0;
  let sentHead = 0;
  let foreign = 0;
  const side = await stubSide(tree, n, (h) => {
    if (h[0] !== OP_RC_RDMA_WRITE_ONLY) {
      foreign++;
      return;
    }
    const at = sentTail++ & (RING - 1);
    sentQp[at] = readU24(h, 5) - PEER_QPN_BASE;
    sentPsn[at] = readU24(h, 9);
  });
  const { v, ctx, cq, mr, qps, rx, answer, flush, peer } = side;
  const qpns = Int32Array.from(qps, (q) => q.qpNum);
  const msn = new Int32Array(n);
  // Per QP, the last WRITE of the batch being answered (its place in the batch + 1; 0: none).
  const lastInBatch = new Int32Array(n);
  const slots: Uint8Array[] = [];
  for (let s = 0; s < 2 * BATCH; s++) slots.push(stubAck());
  const wr = { wrId: 1, opcode: 'RDMA_WRITE' as const, sgList: [mr.sge(0, SIZE)], rdma: { remoteAddr: 0x7f00_0000_0000n, rkey: 0x1234 } };
  let rr = 0;
  let posting = true;
  let posted = 0;
  const post = (k: number): void => {
    if (!posting) return;
    posted += k;
    for (let j = 0; j < k; j++) {
      v.postSend(qps[rr]!, wr);
      rr = rr + 1 === n ? 0 : rr + 1;
    }
  };
  let completed = 0;
  // Completions copied into records kept for the run (`pollInto`), or a tree's new objects where its
  // CQ has no `pollInto` (a build from before it).
  let wcs: WorkCompletion[] = [];
  const poll = typeof cq.pollInto === 'function' ? (): number => cq.pollInto(wcs, DEPTH) : (): number => (wcs = cq.poll(DEPTH)).length;
  /** Answers the next batch of sent WRITEs, then polls the completions and posts as many again. */
  const round = (): void => {
    const from = sentHead;
    const to = Math.min(sentTail, from + BATCH);
    for (let i = from; i < to; i++) lastInBatch[sentQp[i & (RING - 1)]!] = i - from + 1;
    const at = ctx.device.now();
    let s = 0;
    for (let i = from; i < to; i++) {
      const q = sentQp[i & (RING - 1)]!;
      if (lastInBatch[q] !== i - from + 1) {
        msn[q] = (msn[q]! + 1) & 0xffffff;
        continue;
      }
      lastInBatch[q] = 0;
      const m = (msn[q] = (msn[q]! + 1) & 0xffffff);
      const b = slots[s++]!;
      const qpn = qpns[q]!;
      const psn = sentPsn[i & (RING - 1)]!;
      writeU24(b, 5, qpn); // BTH DestQP
      writeU24(b, 9, psn); // BTH PSN
      writeU24(b, 13, m); // AETH MSN
      rx(b, { src: peer, icrc: 'ok', ce: false, at });
    }
    sentHead = to;
    answer(false);
    flush();
    const got = poll();
    for (let i = 0; i < got; i++) if (wcs[i]!.status !== 'SUCCESS') throw new Error(`initiator-path: completion ${wcs[i]!.status}`);
    completed += got;
    post(got);
  };
  const runFor = async (window: number): Promise<void> => {
    const end = performance.now() + window;
    while (performance.now() < end) {
      for (let j = 0; j < 16; j++) {
        round();
        // A turn of the event loop, as the bench's initiator gets between two receive batches: the
        // posts' QP runs (microtasks), the ready QPs' run (an immediate) and the device's timer, which
        // retires the ACK deadlines that went stale (without it their heap would only grow).
        await turn();
      }
    }
  };
  return async (ms: number) => {
    posting = true;
    post(DEPTH);
    await turn();
    const c0 = completed;
    const s0 = sentTail;
    const t0 = performance.now();
    await runFor(ms);
    const t1 = performance.now();
    const msgs = completed - c0;
    // Then every WRITE in flight completes, untimed: a window leaves nothing behind.
    posting = false;
    const end = performance.now() + 5000;
    while (completed < posted && performance.now() < end) {
      round();
      await turn();
    }
    // WRITEs completed, all of them in the end, none sent that was not posted, nothing else sent.
    if (msgs === 0 || completed !== posted || foreign > 0 || sentTail !== posted || sentTail - s0 < msgs) {
      throw new Error(`initiator-path: ${msgs} completed in the window, ${completed} of ${posted} posted in all, ${sentTail} sent, ${foreign} unexpected packets`);
    }
    return { nsPerPacket: ((t1 - t0) * 1e6) / msgs, packets: msgs };
  };
}

/** One process, one tree, one QP count: ns per message over `ms`, after a warm-up. */
async function child(tree: string, n: number, ms: number): Promise<void> {
  const run = await initiatorRunner(tree, n);
  // A longer warm-up than the target's: with 10,000 QPs each send queue grows on its first posts and
  // the code settles only after every QP has carried a few messages (the first 400 ms read twice the
  // steady cost).
  await run(WARMUP_MS);
  process.stdout.write(`${JSON.stringify(await run(ms))}\n`);
}

const me = fileURLToPath(import.meta.url);
if (process.argv.includes('--interleave')) {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: { interleave: { type: 'boolean' }, qps: { type: 'string', default: '10000' }, rounds: { type: 'string', default: '40' }, ms: { type: 'string', default: '100' } },
  });
  const trees = positionals.length > 0 ? positionals.map((t) => resolve(t)) : [resolve(dirname(me), '../..')];
  await interleaved(trees, Number(values.qps), Number(values.rounds), Number(values.ms), initiatorRunner, WARMUP_MS);
} else {
  await pathMain(me, `WRITE ${SIZE} B, ${DEPTH} outstanding round-robin, answered ${BATCH} at a time`, child);
}

/**
 * What the initiator's device pays for one plain ACK, the answer each message gets when every QP has
 * one in flight (the QP scale workload from 100 QPs up): N connected RC QPs over the stub link of
 * `target-path.ts`, each with WRITEs of 4 KiB sent and outstanding; then, round-robin over the QPs, the
 * ACK of each QP's oldest WRITE is handed to the device's receive handler, and the completions are
 * polled. Only that loop is timed: parse, QP lookup and checks, the completer, the completion, the
 * QP's next deadline. With one QP it is the same ACK per message, not the coalesced one a single QP gets
 * in the QP scale bench.
 *
 *   node dist/bench/ack-path.js [--qps 1,100,10000] [--rounds 7] [--ms 800] [TREE ...]
 *
 * Rounds, trees and the figures printed are as in `target-path.ts` (ns per ACK).
 */

import { fileURLToPath } from 'node:url';
import { writeU24 } from '../src/wire/bytes.js';
import { pathMain, stubAck, stubSide, turn } from './target-path.js';

const SIZE = 4096;
/** WRITEs outstanding in all, spread over the QPs (at least one each). */
const OUTSTANDING = 128;
const WARMUP_MS = 1000;

async function child(tree: string, n: number, ms: number): Promise<void> {
  const { v, ctx, cq, mr, qps, rx, answer, flush, sent, peer } = await stubSide(tree, n);
  const perQp = Math.max(1, Math.floor(OUTSTANDING / n));
  const acks = qps.map((q) => stubAck(q.qpNum));
  const wr = { wrId: 1, opcode: 'RDMA_WRITE' as const, sgList: [mr.sge(0, SIZE)], rdma: { remoteAddr: 0x7f00_0000_0000n, rkey: 0x1234 } };
  let psn = 0; // every QP starts at PSN 0 and sends one packet per WRITE
  let acked = 0;
  let timeNs = 0;
  /** Posts `perQp` WRITEs on every QP, lets them leave, then times their ACKs, oldest first on each QP. */
  const rep = async (): Promise<void> => {
    for (let k = 0; k < perQp; k++) for (const q of qps) v.postSend(q, wr);
    // A QP sends a bounded number of packets per run (MAX_PKTS_PER_POLL), then waits a turn.
    for (let turns = 0; sent() < (psn + perQp) * n; turns++) {
      if (turns === 1000) throw new Error(`ack-path: ${sent()} sent for ${(psn + perQp) * n} posted`);
      await turn();
    }
    flush();
    const meta = { src: peer, icrc: 'ok' as const, ce: false, at: ctx.device.now() };
    const t0 = performance.now();
    let polled = 0;
    for (let k = 0; k < perQp; k++, psn++) {
      for (let i = 0; i < n; i++) {
        const b = acks[i]!;
        writeU24(b, 9, psn); // BTH PSN
        writeU24(b, 13, psn + 1); // AETH MSN
        rx(b, meta);
        if ((i & 63) === 63) polled += cq.poll(256).length;
      }
      answer(false);
      polled += cq.poll(256).length;
    }
    timeNs += (performance.now() - t0) * 1e6;
    if (polled !== perQp * n) throw new Error(`ack-path: ${polled} completions for ${perQp * n} ACKs`);
    acked += polled;
    await turn();
  };
  const runFor = async (window: number): Promise<void> => {
    const end = performance.now() + window;
    while (performance.now() < end) await rep();
  };
  await runFor(WARMUP_MS);
  acked = 0;
  timeNs = 0;
  await runFor(ms);
  process.stdout.write(`${JSON.stringify({ nsPerPacket: timeNs / acked, packets: acked })}\n`);
}

const me = fileURLToPath(import.meta.url);
await pathMain(me, `the ACK of each QP's oldest WRITE of ${SIZE} B, ${OUTSTANDING} outstanding in all`, child);

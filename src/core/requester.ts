/**
 * The requester: turns send WQEs into request packets.
 *
 * Read first: IBTA Vol. 1 §9.4 (request packets: opcode sequences, RETH/ImmDt/IETH/DETH
 * placement), §9.5 (packet sequencing, 24-bit PSN), §9.7.1–9.7.2 (requester PSN rules, AckReq),
 * §10.8.3.3 (fence), §11.4.1.1 (post send). rdma_rxe: rxe_req.c.
 *
 * What it does, in rxe's order for each WQE: state allows new work → fence → outstanding
 * READ/atomic limit (maxRdAtomic) → local SGE checks → PSN window (RC: at most
 * MAX_UNACKED_PSNS unacknowledged) → pick the opcode from the table by (transport, verb,
 * position in message) → build headers into a reused buffer and hand the link
 * [headers, payload views into the MR, pad]. AckReq goes on the last packet of each message and
 * on at least every MAX_PKT_PER_ACK-th packet.
 *
 * Emission is deterministic in the WQE: packet k of a WQE always has PSN firstPsn + k and covers
 * bytes [k·mtu, (k+1)·mtu). That makes go-back-N a cursor move (`rewind`), which replaces rxe's
 * save_state/rollback_state and retry_first_write_send replay.
 */

import { psnAdd, psnDiff, psnLt } from '../wire/psn.js';
import { OPCODE } from '../wire/opcode.js';
import { padFor } from '../wire/packet.js';
import type { EngineContext } from './context.js';
import { blankFields, clearParts, PAD, SHARED_HEADER_BUILDER } from './headers.js';
import { DEVICE_LIMITS, MAX_PKT_PER_ACK, MAX_UNACKED_PSNS } from './limits.js';
import { gather, regionsStillHeld, resolveSges } from './mr.js';
import type { Psn, QpType, WcStatus, WrOpcode } from './types.js';
import type { SendWqe } from './wqe.js';

type Pos = 'FIRST' | 'MIDDLE' | 'LAST' | 'ONLY';

function opName(op: WrOpcode, pos: Pos): string {
  switch (op) {
    case 'SEND': return `SEND_${pos}`;
    case 'SEND_WITH_IMM': return pos === 'LAST' || pos === 'ONLY' ? `SEND_${pos}_WITH_IMMEDIATE` : `SEND_${pos}`;
    case 'SEND_WITH_INV': return pos === 'LAST' || pos === 'ONLY' ? `SEND_${pos}_WITH_INVALIDATE` : `SEND_${pos}`;
    case 'RDMA_WRITE': return `RDMA_WRITE_${pos}`;
    case 'RDMA_WRITE_WITH_IMM': return pos === 'LAST' || pos === 'ONLY' ? `RDMA_WRITE_${pos}_WITH_IMMEDIATE` : `RDMA_WRITE_${pos}`;
    case 'RDMA_READ': return 'RDMA_READ_REQUEST';
    case 'ATOMIC_CMP_AND_SWP': return 'COMPARE_SWAP';
    case 'ATOMIC_FETCH_AND_ADD': return 'FETCH_ADD';
  }
}

/** Which verbs each transport carries (rxe_wr_opcode_info / IBTA table 38). */
export const WR_OPCODES_FOR: Readonly<Record<QpType, readonly WrOpcode[]>> = {
  RC: ['SEND', 'SEND_WITH_IMM', 'SEND_WITH_INV', 'RDMA_WRITE', 'RDMA_WRITE_WITH_IMM', 'RDMA_READ', 'ATOMIC_CMP_AND_SWP', 'ATOMIC_FETCH_AND_ADD'],
  UC: ['SEND', 'SEND_WITH_IMM', 'RDMA_WRITE', 'RDMA_WRITE_WITH_IMM'],
  UD: ['SEND', 'SEND_WITH_IMM'],
};

/**
 * The request opcode table: [transport][verb][position] → BTH opcode. Built once from OPCODE; nested
 * so that a lookup per packet builds no string key.
 */
const NEXT_OPCODE: Record<string, Record<string, Record<string, number>>> = {};
for (const t of ['RC', 'UC', 'UD'] as const) {
  const byOp: Record<string, Record<string, number>> = (NEXT_OPCODE[t] = {});
  for (const op of WR_OPCODES_FOR[t]) {
    const byPos: Record<string, number> = (byOp[op] = {});
    for (const pos of ['FIRST', 'MIDDLE', 'LAST', 'ONLY'] as const) {
      const v = OPCODE[`${t}_${opName(op, pos)}`];
      if (v !== undefined) byPos[pos] = v;
    }
  }
}

export function requestOpcode(type: QpType, op: WrOpcode, pos: Pos): number {
  const v = NEXT_OPCODE[type]?.[op]?.[pos];
  if (v === undefined) throw new RangeError(`no ${type} opcode for ${op} ${pos}`);
  return v;
}

export function isReadOrAtomic(op: WrOpcode): boolean {
  return op === 'RDMA_READ' || op === 'ATOMIC_CMP_AND_SWP' || op === 'ATOMIC_FETCH_AND_ADD';
}

/** Why the requester is not sending; `undefined` means it can send now. */
export type RequesterBlock = 'empty' | 'state' | 'fence' | 'rdAtomic' | 'window';

export interface EmitResult {
  sent: number;
  /** A WQE failed a local check; the QP completes it with this status and leaves RTS. */
  error?: { wqe: SendWqe; status: WcStatus } | undefined;
  /** At least one packet that expects a response went out (RC): the ACK timer should run. */
  expectsResponse: boolean;
}

// Scratch shared by every QP, as the header builder is (its comment says why that is safe): with
// thousands of QPs taking turns, a record and a list of each QP's own were cold at every packet.
const REQUEST_FIELDS = blankFields();
const REQUEST_PARTS: Uint8Array[] = [];
/**
 * `emit`'s answer, one record for every requester, read by the caller before anything can emit
 * again: a run per message with thousands of QPs made a fresh one per message, and one per
 * requester was cold.
 */
const EMIT_RESULT: EmitResult = { sent: 0, expectsResponse: false, error: undefined };

function emitResult(sent: number, expectsResponse: boolean, error: EmitResult['error']): EmitResult {
  const r = EMIT_RESULT;
  r.sent = sent;
  r.expectsResponse = expectsResponse;
  r.error = error;
  return r;
}

/** The requester's state (rxe `struct rxe_req_info`), held in the QP's record as rxe embeds it. */
export interface RequesterState {
  /** Next PSN to send. */
  reqPsn: Psn;
  /** Absolute SQ index of the WQE the requester works on. */
  reqCursor: number;
  /** Started READ/atomic WQEs not yet completed (IBTA: at most maxRdAtomic). */
  reqRdAtomic: number;
  /** One past the highest PSN ever sent: anything below it is a retransmission (read by the QP's ACK timer). */
  reqHighPsn: Psn;
  /** Packets since the last AckReq (rxe noack_pkts). */
  reqNoackPkts: number;
  /** Absolute index of the oldest WQE in the send queue. */
  readonly sqHead: number;
  /**
   * One past the newest posted WQE: the send queue's tail, kept beside the cursor so that a QP
   * with nothing to send (a responder-only QP, asked at every poll) does not read its queue.
   */
  readonly sqEnd: number;
  /** The send WQE at absolute index `abs`, if still queued. */
  sqAt(abs: number): SendWqe | undefined;
}

/**
 * The engine. It keeps no state of its own: each call gets the QP's `RequesterState` and the
 * context to send through (the QP, or a pacer's wrapper of it). With thousands of QPs, a requester
 * object per QP was one more cold cache line per message; one instance serves every QP.
 */
export class Requester {
  reset(s: RequesterState, sqPsn: Psn, sqHead: number): void {
    s.reqPsn = sqPsn;
    s.reqHighPsn = sqPsn;
    s.reqCursor = sqHead;
    s.reqRdAtomic = 0;
    s.reqNoackPkts = 0;
  }

  /** The same checks `emit` makes, without side effects; drives `pollAt`. */
  blocked(s: RequesterState, ctx: EngineContext, compPsn: Psn): RequesterBlock | undefined {
    if (s.reqCursor >= s.sqEnd) return 'empty';
    if (s.reqCursor < s.sqHead) s.reqCursor = s.sqHead;
    const wqe = s.sqAt(s.reqCursor);
    if (!wqe) return 'empty';
    if (wqe.state === 'posted') {
      if (ctx.state !== 'RTS') return 'state';
      if (wqe.fence && s.reqRdAtomic > 0) return 'fence';
      if (wqe.readOrAtomic && s.reqRdAtomic >= ctx.attrs.maxRdAtomic) return 'rdAtomic';
    } else if (ctx.state !== 'RTS' && ctx.state !== 'SQD') {
      return 'state';
    }
    if (ctx.type === 'RC' && psnDiff(s.reqPsn, compPsn) >= MAX_UNACKED_PSNS) return 'window';
    return undefined;
  }

  /** Sends up to `budget` packets. */
  emit(s: RequesterState, ctx: EngineContext, compPsn: Psn, budget: number): EmitResult {
    // Counted in locals, and written into the shared record only on the way out: a link that
    // delivers at once can run another QP's emit from inside `sendOne` (the peer answers, and a
    // completion's handler posts), which writes that record too.
    let sent = 0;
    let expectsResponse = false;
    while (sent < budget) {
      if (this.blocked(s, ctx, compPsn) !== undefined) break;
      const wqe = s.sqAt(s.reqCursor)!;
      if (wqe.state === 'pending' || wqe.state === 'done') {
        s.reqCursor++;
        continue;
      }
      if (wqe.state === 'posted') {
        const status = this.start(s, ctx, wqe);
        if (status !== undefined) return emitResult(sent, expectsResponse, { wqe, status });
      } else if (wqe.inlineData === undefined && !wqe.readOrAtomic && !regionsStillHeld(ctx.mrs, wqe)) {
        // The rest of a message (or a resend of it) from a region deregistered since it started.
        return emitResult(sent, expectsResponse, { wqe, status: 'LOC_PROT_ERR' });
      }
      this.sendOne(s, ctx, wqe);
      sent++;
      if (ctx.type === 'RC') expectsResponse = true;
    }
    return emitResult(sent, expectsResponse, undefined);
  }

  /**
   * Starts a WQE: resolves its local memory (IBTA 10.7.2.2: L_Key, PD, bounds, LOCAL_WRITE for
   * READ/atomic targets), checks lengths, and assigns its PSNs. Returns an error status on failure.
   */
  private start(s: RequesterState, ctx: EngineContext, wqe: SendWqe): WcStatus | undefined {
    const mtu = ctx.type === 'UD' ? ctx.attrs.portMtu : ctx.attrs.pathMtu;
    if (wqe.length > DEVICE_LIMITS.maxMsgSize) return 'LOC_LEN_ERR';
    if (ctx.type === 'UD' && wqe.length > mtu) return 'LOC_LEN_ERR';
    if (wqe.inlineData) {
      wqe.segments = [wqe.inlineData];
    } else {
      const segs = resolveSges(ctx.mrs, ctx.pd, wqe.sges, wqe.readOrAtomic);
      if (!segs) return 'LOC_PROT_ERR';
      wqe.segments = segs;
      wqe.mrEpoch = ctx.mrs.deregistrations;
    }
    if (wqe.opcode === 'ATOMIC_CMP_AND_SWP' || wqe.opcode === 'ATOMIC_FETCH_AND_ADD') {
      if (wqe.length !== 8) return 'LOC_LEN_ERR';
      wqe.npkts = 1;
    } else {
      wqe.npkts = Math.max(1, Math.ceil(wqe.length / mtu));
    }
    // A message of several packets from one whole region: the packets' views come from the
    // region's table, the same ones each time the buffer is sent again.
    wqe.region = undefined;
    if (wqe.npkts > 1 && !wqe.readOrAtomic && wqe.sges.length === 1 && wqe.segments.length === 1) {
      const mr = ctx.mrs.byLkey(wqe.sges[0]!.lkey);
      if (mr !== undefined && mr.wholeList === wqe.segments) wqe.region = mr;
    }
    // Normally a no-op. After a go-back-N the completer may retire a WQE whose resend had not
    // finished; its PSNs up to highPsn are spent, and a new WQE must not reuse them.
    s.reqPsn = s.reqHighPsn;
    wqe.firstPsn = s.reqPsn;
    wqe.lastPsn = psnAdd(s.reqPsn, wqe.npkts - 1);
    wqe.nextPkt = 0;
    wqe.readPlaced = 0;
    wqe.state = 'processing';
    if (wqe.readOrAtomic) {
      wqe.holdsRdAtomic = true;
      s.reqRdAtomic++;
    }
    return undefined;
  }

  private sendOne(s: RequesterState, ctx: EngineContext, wqe: SendWqe): void {
    const f = REQUEST_FIELDS;
    const parts = REQUEST_PARTS;
    clearParts(parts);
    const k = wqe.nextPkt;
    const psn = psnAdd(wqe.firstPsn, k);
    f.psn = psn;
    f.destQp = ctx.type === 'UD' ? wqe.remoteQpn : ctx.attrs.destQpNum;
    f.se = false;
    f.padCount = 0;
    const dst = ctx.type === 'UD' ? wqe.ah! : ctx.attrs.dest!;
    const mtu = ctx.type === 'UD' ? ctx.attrs.portMtu : ctx.attrs.pathMtu;

    if (wqe.opcode === 'RDMA_READ') {
      // One request for the rest of the data; it occupies a PSN per response packet (9.7.2).
      const off = k * mtu;
      f.opcode = requestOpcode(ctx.type, 'RDMA_READ', 'ONLY');
      f.ackReq = true;
      // The WQE's own bigint for a first request: a sum would make two per READ.
      f.va = off === 0 ? wqe.remoteAddr : wqe.remoteAddr + BigInt(off);
      f.rkey = wqe.rkey;
      f.dmaLength = wqe.length - off;
      parts.push(SHARED_HEADER_BUILDER.build(f));
      wqe.nextPkt = wqe.npkts;
      wqe.state = 'pending';
      s.reqCursor++;
      this.finishPacket(s, ctx, dst, psn, wqe.npkts - k);
      return;
    }
    if (wqe.opcode === 'ATOMIC_CMP_AND_SWP' || wqe.opcode === 'ATOMIC_FETCH_AND_ADD') {
      f.opcode = requestOpcode(ctx.type, wqe.opcode, 'ONLY');
      f.ackReq = true;
      f.va = wqe.remoteAddr;
      f.rkey = wqe.rkey;
      // CmpSwap: swap data, compare data; FetchAdd: add data in the swap/add field (9.3.4).
      f.swapAdd = wqe.opcode === 'ATOMIC_CMP_AND_SWP' ? wqe.swap : wqe.compareAdd;
      f.compare = wqe.opcode === 'ATOMIC_CMP_AND_SWP' ? wqe.compareAdd : 0n;
      parts.push(SHARED_HEADER_BUILDER.build(f));
      wqe.nextPkt = 1;
      wqe.state = 'pending';
      s.reqCursor++;
      this.finishPacket(s, ctx, dst, psn, 1);
      return;
    }

    const off = k * mtu;
    const len = Math.min(mtu, wqe.length - off);
    const last = k === wqe.npkts - 1;
    const pos: Pos = wqe.npkts === 1 ? 'ONLY' : k === 0 ? 'FIRST' : last ? 'LAST' : 'MIDDLE';
    f.opcode = requestOpcode(ctx.type, wqe.opcode, pos);
    const end = last;
    // AckReq: end of message, or MAX_PKT_PER_ACK packets without one (rxe's noack_pkts).
    f.ackReq = end || ++s.reqNoackPkts >= MAX_PKT_PER_ACK;
    if (f.ackReq) s.reqNoackPkts = 0;
    f.se = end && wqe.solicited;
    f.padCount = padFor(len);
    if (k === 0 && (wqe.opcode === 'RDMA_WRITE' || wqe.opcode === 'RDMA_WRITE_WITH_IMM')) {
      f.va = wqe.remoteAddr;
      f.rkey = wqe.rkey;
      f.dmaLength = wqe.length;
    }
    if (end && wqe.immData !== undefined) f.immData = wqe.immData;
    if (end && wqe.invalidateRkey !== undefined) f.invRkey = wqe.invalidateRkey;
    if (ctx.type === 'UD') {
      // IBTA 10.2.5 / C10-15: a Q_Key with the high bit set means "use the QP's own".
      f.qkey = (wqe.remoteQkey & 0x80000000) !== 0 ? ctx.attrs.qkey : wqe.remoteQkey >>> 0;
      f.srcQp = ctx.qpn;
    }
    parts.push(SHARED_HEADER_BUILDER.build(f));
    if (len > 0) {
      const region = wqe.region;
      if (region !== undefined) parts.push(region.viewAt(off, len));
      else gather(wqe.segments!, off, len, parts);
    }
    if (f.padCount) parts.push(PAD[f.padCount]!);
    wqe.nextPkt = k + 1;
    if (end) {
      wqe.state = ctx.type === 'RC' ? 'pending' : 'done';
      s.reqCursor++;
    }
    this.finishPacket(s, ctx, dst, psn, 1);
  }

  /**
   * Accounts for the packet in `REQUEST_PARTS`, then sends it. The WQE and the cursors are brought up
   * to date before the send, which is the last thing done: a link that delivers at once brings the
   * answer in from inside it, and the completer may then retire the WQE (back to the free list) and
   * move the send queue's head.
   */
  private finishPacket(s: RequesterState, ctx: EngineContext, dst: { address: string; port: number }, psn: Psn, span: number): void {
    if (psnLt(psn, s.reqHighPsn)) ctx.counters.retransPkts++;
    const next = psnAdd(psn, span);
    if (psnLt(s.reqHighPsn, next)) s.reqHighPsn = next;
    s.reqPsn = next;
    ctx.transmit(dst, REQUEST_PARTS);
    // Emptied at once, not at the next packet: a QP that sends rarely (one of thousands) would
    // otherwise keep its last payload view alive long enough to be promoted, every time.
    clearParts(REQUEST_PARTS);
  }

  /**
   * Go-back-N (IBTA 9.7.5.1, C9-126 area): resend from `from`. Every started WQE at or after
   * `from` is re-emitted from the packet that carries `from`; a READ is re-requested for the
   * rest of its data. WQEs not yet started are unaffected.
   */
  rewind(s: RequesterState, from: Psn): void {
    s.reqPsn = from;
    s.reqNoackPkts = 0;
    let cursor: number | undefined;
    for (let i = s.sqHead; i < s.sqEnd; i++) {
      const w = s.sqAt(i)!;
      if (w.state === 'posted') break;
      if (w.state === 'done') continue;
      if (psnLt(w.lastPsn, from)) continue; // entirely acknowledged; the completer will retire it
      const k = psnDiff(from, w.firstPsn) > 0 ? psnDiff(from, w.firstPsn) : 0;
      w.nextPkt = k;
      w.state = 'processing';
      if (cursor === undefined) cursor = i;
    }
    s.reqCursor = cursor ?? Math.max(s.reqCursor, s.sqHead);
  }
}

/** The one requester: it keeps no state of its own. */
export const REQUESTER = new Requester();

/**
 * The completer: consumes responses (ACK, NAK, RDMA READ response, ATOMIC ACK) and the ACK
 * timer, retires send WQEs in order, and decides on retries.
 *
 * Read first: IBTA Vol. 1 §9.7.5 (requester: responses, implied acknowledgement C9-115..C9-119,
 * NAK handling, retry and RNR counters), §9.9.2 (requester error classes), §10.7.3.1 (signaled
 * completions; errors always complete). rdma_rxe: rxe_comp.c (`check_psn`, `check_ack`,
 * `do_read`, `do_atomic`, `complete_ack`, the ERROR_RETRY and RNR_RETRY states).
 *
 * It never touches the requester. It returns what should happen — go back to a PSN, wait for
 * an RNR timer, fail the QP — and the QP applies it.
 *
 * Its state lives in the QP's record (`CompleterState`), as rxe's `struct rxe_comp_info` is
 * embedded in `struct rxe_qp`: the completer reads it for every response, and an object of its own
 * was one more cold cache line per message with thousands of QPs. The class holds no state; one
 * instance serves every QP.
 */

import { aethKind, aethValue, NAK_CODE } from '../wire/aeth.js';
import type { OpcodeInfo } from '../wire/opcode.js';
import { OPCODE } from '../wire/opcode.js';
import type { RocePacket } from '../wire/packet.js';
import { psnAdd, psnDiff } from '../wire/psn.js';
import type { EngineContext } from './context.js';
import { regionsStillHeld, scatter } from './mr.js';
import { RETRY_INFINITE, rnrTimerUs, type Micros } from './time.js';
import type { Psn, WcStatus } from './types.js';
import type { SendWqe } from './wqe.js';

export type CompleterAction =
  /** Nothing for the QP to do (the packet was stale, a duplicate, or ignored). */
  | { kind: 'none' }
  /** The completer made progress (completed WQEs or advanced its PSN): restart the ACK timer. */
  | { kind: 'progress' }
  /** Go-back-N from `from`. */
  | { kind: 'retry'; from: Psn }
  /** RNR NAK: resend from `from` after `delayUs`. */
  | { kind: 'rnrWait'; from: Psn; delayUs: Micros }
  /** The head WQE failed: complete it with `status`, then the QP goes to ERR. */
  | { kind: 'fatal'; wqe: SendWqe; status: WcStatus; vendorErr: number };

const NONE: CompleterAction = { kind: 'none' };
const PROGRESS: CompleterAction = { kind: 'progress' };
const RC_READ_RESPONSE_MIDDLE = OPCODE['RC_RDMA_READ_RESPONSE_MIDDLE']!;
const RC_READ_RESPONSE_LAST = OPCODE['RC_RDMA_READ_RESPONSE_LAST']!;
const RC_ACKNOWLEDGE = OPCODE['RC_ACKNOWLEDGE']!;


/** The completer's state (rxe `struct rxe_comp_info`), held in the QP's record. */
export interface CompleterState {
  /** The oldest PSN not yet acknowledged (rxe comp.psn). */
  compPsn: Psn;
  /** The read response sequence in progress: the last READ response FIRST/MIDDLE opcode, or -1. */
  compOpcode: number;
  compRetryCnt: number;
  compRnrRetry: number;
  /** A NAK- or timeout-driven retry is under way with no progress since (rxe started_retry). */
  compStartedRetry: boolean;
  /** The PSN of the last response older than comp PSN, or -1 (see onResponse). */
  compStaleReadPsn: number;
}

/** What the completer works on: the QP as its engines see it, and the completer's state in it. */
export interface CompleterContext extends EngineContext, CompleterState {
  /** The oldest WQE of the send queue, if any. */
  sqPeek(): SendWqe | undefined;
  /** Removes the head WQE, posts its completion and frees its read slot. */
  retireWqe(wqe: SendWqe): void;
}

export class Completer {
  reset(ctx: CompleterState, sqPsn: Psn, retryCnt: number, rnrRetry: number): void {
    ctx.compPsn = sqPsn;
    ctx.compOpcode = -1;
    ctx.compRetryCnt = retryCnt;
    ctx.compRnrRetry = rnrRetry;
    ctx.compStartedRetry = false;
    ctx.compStaleReadPsn = -1;
  }

  private resetRetryCounters(ctx: CompleterContext): void {
    ctx.compRetryCnt = ctx.attrs.retryCnt;
    ctx.compRnrRetry = ctx.attrs.rnrRetry;
    ctx.compStartedRetry = false;
    ctx.compStaleReadPsn = -1;
  }

  private advanceTo(ctx: CompleterState, psn: Psn): void {
    if (psnDiff(psn, ctx.compPsn) > 0) ctx.compPsn = psn;
  }

  /**
   * The usual answer with one message in flight per QP, taken without the general path: a plain ACK
   * (syndrome `syn`) of exactly the head WQE's last PSN, in order, with no READ response sequence
   * under way. It retires the WQE and returns true, as `onResponse` would with PROGRESS; anything else
   * returns false having changed nothing, and goes to `onResponse`. A coalesced ACK (one PSN for
   * several WQEs) is not this case: it retires them in `onResponse`'s loop.
   */
  ackOfHead(ctx: CompleterContext, psn: Psn, syn: number): boolean {
    if ((syn & 0x60) !== 0 || ctx.compOpcode !== -1) return false; // a NAK or RNR NAK; a READ under way
    const wqe = ctx.sqPeek();
    if (wqe === undefined || psn !== wqe.lastPsn || wqe.readOrAtomic || (wqe.state !== 'pending' && wqe.state !== 'processing') ||
        psnDiff(psn, ctx.compPsn) < 0) return false;
    this.resetRetryCounters(ctx);
    ctx.compPsn = psnAdd(psn, 1);
    ctx.retireWqe(wqe);
    return true;
  }

  /** Processes one response packet. */
  onResponse(ctx: CompleterContext, pkt: RocePacket, info: OpcodeInfo): CompleterAction {
    let progressed = false;
    const psn = pkt.bth.psn;
    for (;;) {
      const wqe = ctx.sqPeek();
      // get_wqe: a response with nothing outstanding is a ghost (late duplicate or a confused peer).
      if (!wqe || wqe.state === 'posted' || wqe.state === 'done') {
        ctx.counters.unexpectedResponse++;
        return progressed ? PROGRESS : NONE;
      }
      // check_psn: a response beyond this WQE acknowledges it implicitly (C9-115) — unless it is
      // a READ/atomic, whose own response must have been lost: retry.
      if (psnDiff(psn, wqe.lastPsn) > 0) {
        // 'processing' here means a go-back-N resend of the WQE is under way: the peer has all
        // of it all the same. (rxe ignores the ACK and waits for its resend to be re-ACKed, which
        // never comes when the peer finished and went away: a pingpong tool that got its last
        // message destroys its QP.)
        if (wqe.state !== 'pending' && wqe.state !== 'processing') {
          ctx.counters.unexpectedResponse++;
          return progressed ? PROGRESS : NONE;
        }
        if (wqe.readOrAtomic) {
          const a = this.errorRetry(ctx, wqe, false);
          return a.kind === 'none' && progressed ? PROGRESS : a;
        }
        this.advanceTo(ctx, psnAdd(wqe.lastPsn, 1));
        ctx.compOpcode = -1;
        this.resetRetryCounters(ctx);
        ctx.retireWqe(wqe);
        progressed = true;
        continue;
      }
      const diff = psnDiff(psn, ctx.compPsn);
      if (diff < 0) {
        // Older than anything outstanding: a duplicate ACK or a replayed response.
        ctx.counters.staleResponse++;
        // During a retry, the responder may still be replaying an earlier re-request of this READ
        // (it answers in order, a stream to its end), whose data we have since received. It is
        // working through our requests: while such a replay advances, the timer restarts, as for
        // responses past a gap. Otherwise every timeout during a long replay queued one more replay
        // behind it, faster than the responder could send them: against rxe under load, a 1 MiB
        // READ at MTU 256 re-requested every 67 ms for minutes and never completed. A response
        // repeated without advancing still does not hold the timer.
        if (ctx.compStartedRetry && info.kind === 'readResponse' && wqe.opcode === 'RDMA_READ' &&
            psnDiff(psn, wqe.firstPsn) >= 0 && (ctx.compStaleReadPsn < 0 || psnDiff(psn, ctx.compStaleReadPsn) > 0)) {
          ctx.compStaleReadPsn = psn;
          return PROGRESS;
        }
        ctx.compStaleReadPsn = psn;
        return progressed ? PROGRESS : NONE;
      }
      if (diff > 0 && wqe.readOrAtomic) {
        // READ responses must arrive in order; a gap means one was lost. Re-request from the
        // gap now rather than at the ACK timeout, once per gap (as a PSN sequence NAK would).
        ctx.counters.staleResponse++;
        const a = this.errorRetry(ctx, wqe, false);
        // Already re-requested: the responder is still streaming this READ (it answers requests
        // in order, so the re-request waits behind the stream), and the timer measures time
        // without a response to the oldest request (9.7.6.1). Restart it, or it runs out
        // mid-stream and queues another full replay at every timeout.
        if (a.kind === 'none' && info.kind === 'readResponse') return PROGRESS;
        return a.kind === 'none' && progressed ? PROGRESS : a;
      }
      const a = this.checkAck(ctx, wqe, pkt, info);
      return a.kind === 'none' && progressed ? PROGRESS : a;
    }
  }

  /** check_ack and what follows it, for the head WQE and a response at or after comp PSN. */
  private checkAck(ctx: CompleterContext, wqe: SendWqe, pkt: RocePacket, info: OpcodeInfo): CompleterAction {
    const psn = pkt.bth.psn;
    // Read response sequence (C9-118): the response at the WQE's first PSN starts the data
    // (FIRST/ONLY); any later one continues it (MIDDLE/LAST) — also after a retry from the
    // middle, where the responder replays from the requested PSN. Decided by position, not by
    // the previous opcode, so a replay needs no special case.
    if (info.kind === 'readResponse' && wqe.opcode === 'RDMA_READ') {
      const atStart = psn === wqe.firstPsn;
      if (atStart !== info.start || (ctx.compOpcode !== -1 && info.start)) {
        ctx.counters.badOpcodeSeq++;
        return NONE;
      }
    } else if (ctx.compOpcode !== -1 && pkt.bth.opcode !== RC_READ_RESPONSE_MIDDLE && pkt.bth.opcode !== RC_READ_RESPONSE_LAST &&
               !(pkt.bth.opcode === RC_ACKNOWLEDGE && aethKind(pkt.aeth!.syndrome) !== 'ACK')) {
      // Inside a READ's responses only the next one, or a NAK that ends them (the responder found
      // the region gone: rxe's check_ack lets an ACKNOWLEDGE through there for its NAK code).
      ctx.counters.badOpcodeSeq++;
      return NONE;
    }

    switch (info.kind) {
      case 'readResponse': {
        if (pkt.aeth && aethKind(pkt.aeth.syndrome) !== 'ACK') {
          ctx.counters.unexpectedResponse++;
          return NONE;
        }
        if (wqe.opcode !== 'RDMA_READ') return fatal(wqe, 'BAD_RESP_ERR', 0);
        this.resetRetryCounters(ctx);
        const mtu = ctx.attrs.pathMtu;
        const off = psnDiff(psn, wqe.firstPsn) * mtu;
        const expect = Math.min(mtu, wqe.length - off);
        const len = pkt.payload.length;
        // Every response but the last carries exactly one MTU (C9-121 area); anything else is a bad response.
        if (len > expect || (!info.end && len !== expect)) return fatal(wqe, 'BAD_RESP_ERR', 0);
        // The sink deregistered since the READ was posted (rxe's do_read: copy_data finds no region).
        if (len > 0 && !regionsStillHeld(ctx.mrs, wqe)) return fatal(wqe, 'LOC_PROT_ERR', 0);
        if (len > 0 && !scatter(wqe.segments!, off, pkt.payload)) return fatal(wqe, 'LOC_LEN_ERR', 0);
        wqe.readPlaced = off + len;
        ctx.compPsn = psnAdd(psn, 1);
        if (!info.end) {
          ctx.compOpcode = pkt.bth.opcode;
          return PROGRESS;
        }
        ctx.compOpcode = -1;
        if (psn !== wqe.lastPsn || wqe.readPlaced !== wqe.length) return fatal(wqe, 'BAD_RESP_ERR', 0);
        ctx.retireWqe(wqe);
        return PROGRESS;
      }
      case 'atomicAck': {
        if (!pkt.aeth || aethKind(pkt.aeth.syndrome) !== 'ACK') {
          ctx.counters.unexpectedResponse++;
          return NONE;
        }
        if (wqe.opcode !== 'ATOMIC_CMP_AND_SWP' && wqe.opcode !== 'ATOMIC_FETCH_AND_ADD') return fatal(wqe, 'BAD_RESP_ERR', 0);
        this.resetRetryCounters(ctx);
        if (!regionsStillHeld(ctx.mrs, wqe)) return fatal(wqe, 'LOC_PROT_ERR', 0);
        // The original value lands in the local buffer in host (little-endian) order, as libibverbs does.
        const orig = new Uint8Array(8);
        new DataView(orig.buffer).setBigUint64(0, pkt.atomicAckEth!.originalData, true);
        if (!scatter(wqe.segments!, 0, orig)) return fatal(wqe, 'LOC_LEN_ERR', 0);
        ctx.compPsn = psnAdd(psn, 1);
        ctx.retireWqe(wqe);
        return PROGRESS;
      }
      case 'ack': {
        const syn = pkt.aeth!.syndrome;
        switch (aethKind(syn)) {
          case 'ACK':
            if (wqe.readOrAtomic) {
              // A plain ACK cannot answer a READ or atomic; treat as stale.
              ctx.counters.staleResponse++;
              return NONE;
            }
            this.resetRetryCounters(ctx);
            ctx.compPsn = psnAdd(psn, 1);
            // Also while a resend is under way ('processing'): this ACK covers the whole message,
            // and once comp PSN is past it no later response could retire it.
            if ((wqe.state === 'pending' || wqe.state === 'processing') && psn === wqe.lastPsn) ctx.retireWqe(wqe);
            return PROGRESS;
          case 'RNR_NAK': {
            ctx.counters.rcvRnr++;
            // PSNs before the refused one are implicitly acknowledged.
            ctx.compPsn = psn;
            if (ctx.compRnrRetry === 0) {
              ctx.counters.rnrRetryExceeded++;
              return fatal(wqe, 'RNR_RETRY_EXC_ERR', syn);
            }
            if (ctx.compRnrRetry !== RETRY_INFINITE) ctx.compRnrRetry--;
            return { kind: 'rnrWait', from: psn, delayUs: rnrTimerUs(aethValue(syn)) };
          }
          case 'NAK':
            switch (aethValue(syn)) {
              case NAK_CODE.PSN_SEQUENCE_ERROR:
                // Everything before the NAK'd PSN arrived (C9-116): advance, then go back to it.
                // A NAK that moves the PSN forward is progress, so it may start a new retry; a
                // repeated NAK for the gap already being retried is ignored (rxe started_retry).
                if (psnDiff(psn, ctx.compPsn) > 0) {
                  ctx.compPsn = psn;
                  ctx.compStartedRetry = false;
                }
                ctx.counters.rcvSeqErr++;
                return this.errorRetry(ctx, wqe, false);
              case NAK_CODE.INVALID_REQUEST:
                return fatal(wqe, 'REM_INV_REQ_ERR', syn);
              case NAK_CODE.REMOTE_ACCESS_ERROR:
                return fatal(wqe, 'REM_ACCESS_ERR', syn);
              case NAK_CODE.REMOTE_OPERATIONAL_ERROR:
                return fatal(wqe, 'REM_OP_ERR', syn);
              case NAK_CODE.INVALID_RD_REQUEST:
                return fatal(wqe, 'REM_INV_RD_REQ_ERR', syn);
              default:
                return fatal(wqe, 'REM_OP_ERR', syn);
            }
          default:
            ctx.counters.unexpectedResponse++;
            return NONE;
        }
      }
      default:
        ctx.counters.unexpectedResponse++;
        return NONE;
    }
  }

  /**
   * rxe's ERROR_RETRY: spend one retry (7 = forever) and go back to the oldest unacknowledged
   * PSN; out of retries, fail the head WQE with RETRY_EXC_ERR. A second NAK while a retry is
   * already under way, with no progress since, is ignored (only the timer may retry again).
   */
  errorRetry(ctx: CompleterContext, head: SendWqe | undefined, timeout: boolean): CompleterAction {
    if (ctx.compStartedRetry && !timeout) return NONE;
    if (ctx.compRetryCnt > 0) {
      if (ctx.compRetryCnt !== RETRY_INFINITE) ctx.compRetryCnt--;
      ctx.compStartedRetry = true;
      ctx.compOpcode = -1;
      ctx.counters.compRetry++;
      return { kind: 'retry', from: ctx.compPsn };
    }
    ctx.counters.retryExceeded++;
    if (!head) return NONE;
    return fatal(head, 'RETRY_EXC_ERR', 0);
  }

  /** The local ACK timer fired with requests outstanding (IBTA 9.7.6.1.3). */
  onTimeout(ctx: CompleterContext): CompleterAction {
    ctx.counters.ackTimeouts++;
    return this.errorRetry(ctx, ctx.sqPeek(), true);
  }
}

function fatal(wqe: SendWqe, status: WcStatus, vendorErr: number): CompleterAction {
  return { kind: 'fatal', wqe, status, vendorErr };
}

/** The one completer: it keeps no state of its own. */
export const COMPLETER = new Completer();

/**
 * The responder: validates request packets, executes them into registered memory, and answers
 * (ACK, NAK, RNR NAK, RDMA READ responses, ATOMIC ACKs).
 *
 * Read first: IBTA Vol. 1 §9.7.3–9.7.4 (responder: PSN checks, duplicates C9-104..C9-112,
 * ACK generation and coalescing, RNR), §9.7.5.2 (MSN), §9.9.3 (responder error classes A–J and
 * their NAKs), §9.8 (UC: no ACKs, abandon on a gap), §9.8.4 / §10.2.5 (UD, Q_Key), §8.3 (GRH).
 * rdma_rxe: rxe_resp.c.
 *
 * The pipeline runs in rxe's order, one small function per check:
 *
 *   checkPsn → checkOpSeq → checkOpValid → checkResource → checkLength → checkRkey
 *            → execute → complete → acknowledge
 *
 * Each check returns `undefined` to go on or a `Verdict` saying what to do instead; every
 * error verdict names its IBTA class. `handle` turns verdicts into packets, counters and, for
 * class A/C/J errors, a `fatal` outcome that the QP applies (→ ERR).
 */

import { ackSyndrome, NAK_CODE, nakSyndrome, rnrNakSyndrome } from '../wire/aeth.js';
import { OPCODE, opcodeInfo, type OpcodeInfo } from '../wire/opcode.js';
import { padFor, type RocePacket } from '../wire/packet.js';
import { psnAdd, psnDiff } from '../wire/psn.js';
import { ipv4Checksum, parseIpAddress } from '../wire/frame.js';
import { AETH_LEN, BTH_LEN, DEFAULT_PKEY } from '../wire/constants.js';
import type { EngineContext, RxInfo } from './context.js';
import type { CounterName } from './counters.js';
import { newWorkCompletion } from './cq.js';
import { blankFields, clearParts, PAD, SHARED_HEADER_BUILDER } from './headers.js';
import { regionsStillHeld, resolveSges, scatter, type MemoryRegion, type RemoteVa } from './mr.js';
import { ACCESS, WC_FLAGS, type Psn, type WcStatus } from './types.js';
import { releaseRecvWqe, type RecvWqe, type WorkQueue } from './wqe.js';

/** What the QP must do after a request. */
export type ResponderOutcome = { kind: 'ok' } | { kind: 'fatal'; reason: string };

const OK: ResponderOutcome = { kind: 'ok' };

/** A check's decision when the packet cannot simply proceed. */
type Verdict =
  /** Drop silently (UC/UD class D/E, or an already-NAKed gap), counting why. */
  | { v: 'drop'; counter: CounterName | undefined; abandon: boolean }
  /** RC class B: NAK PSN sequence error, once per gap. */
  | { v: 'nakSeq' }
  /** Duplicate (C9-104): re-ACK, replay a READ, or resend an ATOMIC ACK. */
  | { v: 'duplicate' }
  /** RC class B: no receive WQE, RNR NAK. UC/UD: drop. */
  | { v: 'rnr' }
  /** RC class C (and A, J): NAK, complete the receive WQE in error, QP to ERR. */
  | { v: 'fatal'; nak: number; status: WcStatus; counter: CounterName; why: string }
  /** UC/UD length error on a receive (class D): complete the receive WQE with LOC_LEN_ERR, drop. */
  | { v: 'localLength' };

type Check = Verdict | undefined;

/** An RDMA READ or atomic the responder remembers, to answer duplicates (C9-110 area). */
export interface Resource {
  kind: 'read' | 'atomic';
  firstPsn: Psn;
  lastPsn: Psn;
  /** The request's VA as its 32-bit halves: a READ's is read off the RETH without making a BigInt. */
  vaHi: number;
  vaLo: number;
  length: number;
  rkey: number;
  origValue: bigint;
}

/** A resource's VA as the bigint the requests carry. */
function resourceVa(res: Resource): bigint {
  return (BigInt(res.vaHi) << 32n) | BigInt(res.vaLo);
}

/** `respRecvSegments` of a QP with no SEND in progress. */
export const NO_SEGMENTS: readonly Uint8Array[] = Object.freeze([]);

/** READ response packets still to send (taken from, and given back to, `JOBS`). */
export interface ReadJob {
  res: Resource;
  mr: MemoryRegion;
  psn: Psn;
  /** Byte offset in the MR buffer of the next response's data. */
  off: number;
  resid: number;
  /** True until the first response of this job went out. */
  fresh: boolean;
  /** Response opcodes depend on where the job starts: a replay from the middle starts with MIDDLE/LAST. */
  fromStart: boolean;
}

const OP = OPCODE as Readonly<Record<string, number>>;
const RC_ACK = OP['RC_ACKNOWLEDGE']!;
const RC_ATOMIC_ACK = OP['RC_ATOMIC_ACKNOWLEDGE']!;
const RESP_FIRST = OP['RC_RDMA_READ_RESPONSE_FIRST']!;
const RESP_MIDDLE = OP['RC_RDMA_READ_RESPONSE_MIDDLE']!;
const RESP_LAST = OP['RC_RDMA_READ_RESPONSE_LAST']!;
const RESP_ONLY = OP['RC_RDMA_READ_RESPONSE_ONLY']!;

/** The GRH area at the start of every UD receive buffer (IBTA 11.4.1.2). */
export const GRH_LEN = 40;

/** The empty job list every responder starts with (frozen: a push onto it throws rather than leaks). */
export const NO_JOBS: ReadJob[] = Object.freeze([]) as unknown as ReadJob[];

/** What a job given back holds, so that the free list keeps no region or resource reachable. */
const NO_RESOURCE: Resource = newResource();

function newResource(): Resource {
  return { kind: 'read', firstPsn: 0, lastPsn: 0, vaHi: 0, vaLo: 0, length: 0, rkey: 0, origValue: 0n };
}

/**
 * READ jobs given back, shared by every QP of the process as the WQEs' free lists are (wqe.ts): a job
 * made per READ was 40 B of garbage at the target. Bounded: a burst of jobs beyond it is left to the
 * collector.
 */
const JOBS: ReadJob[] = [];
const JOBS_KEPT = 1024;

function takeJob(res: Resource, mr: MemoryRegion, psn: Psn, off: number, resid: number): ReadJob {
  let j = JOBS.pop();
  if (j === undefined) j = { res, mr, psn, off, resid, fresh: true, fromStart: false };
  j.res = res;
  j.mr = mr;
  j.psn = psn;
  j.off = off;
  j.resid = resid;
  j.fresh = true;
  j.fromStart = psn === res.firstPsn;
  return j;
}

/** A job off its QP's list, back to the free list, holding nothing of its QP's. */
function releaseJob(j: ReadJob): void {
  j.res = NO_RESOURCE;
  j.mr = EMPTY_MR;
  if (JOBS.length < JOBS_KEPT) JOBS.push(j);
}

// Scratch shared by every QP of the process, as the header builder is (its comment says why that is
// safe): with thousands of QPs taking turns, a record and a list of each QP's own were cold in cache
// at every packet.
/** The record every receive completion is built in (`completeRecv`): the CQ copies it at once. */
const RECV_WC = newWorkCompletion();
const RESPONSE_FIELDS = blankFields();
const RESPONSE_PARTS: Uint8Array[] = [];
/**
 * A plain ACK's headers, BTH and AETH, written in place over a template (the default P_Key, no flags):
 * with thousands of QPs every message is answered by an ACK of its own, and the header builder's
 * generic pass over the opcode's headers cost more than the sixteen bytes it writes. Shared, as the
 * builder's scratch is: a link consumes the parts before `send` returns.
 */
const ACK_HEADERS = new Uint8Array(BTH_LEN + AETH_LEN);
ACK_HEADERS[0] = RC_ACK;
ACK_HEADERS[2] = DEFAULT_PKEY >>> 8;
ACK_HEADERS[3] = DEFAULT_PKEY & 0xff;
const ACK_PARTS: readonly Uint8Array[] = [ACK_HEADERS];

/**
 * The responder's state, held in the QP record (`QueuePair`) as rxe keeps `qp->resp` in `struct
 * rxe_qp`: with thousands of QPs taking turns, an object of its own behind the QP was one more
 * dependent, cold load per request (bench/PROFILE.md). The engine below keeps no state of its own.
 */
export interface ResponderState {
  /** Expected PSN of the next new request (ePSN). */
  respPsn: Psn;
  /** Message sequence number: completed messages, 24 bits (9.7.5.2). */
  respMsn: number;
  /** Opcode of the last accepted packet, or -1 between messages. */
  respOpcode: number;
  /** RC: a PSN sequence NAK was sent for the current gap (NAK once per gap, C9-106 area). */
  respSentPsnNak: boolean;
  /** UC: drop packets until the next message start. */
  respDropMsg: boolean;
  /**
   * The SEND in progress: the receive WQE it fills (undefined between messages), that WQE's memory,
   * and how far the message has filled it. In fields for the reason the WRITE's are (below): a record
   * per message was 47 B of garbage per 4 KiB SEND at the target.
   */
  respRecvWqe: RecvWqe | undefined;
  respRecvSegments: readonly Uint8Array[];
  respRecvOffset: number;
  // The RDMA WRITE in progress, in fields rather than an object of its own: with thousands of QPs
  // taking turns, a fresh object per message stored into the QP was a write-barrier entry on another
  // page at every message, and the 64-bit VA it advanced two BigInts per packet. The first packet
  // checks the R_Key over the whole message (as rxe's check_rkey does with the RETH's length), so the
  // rest need only where they go: the region and a byte offset into it.
  /** A WRITE message is in progress (its first packet was accepted, its last not yet). */
  respWriting: boolean;
  /** Its R_Key, its DMA length, and the bytes still to come. */
  respWriteRkey: number;
  respWriteLength: number;
  respWriteResid: number;
  /** The region it writes into (undefined for a zero-length WRITE), and where its next packet goes. */
  respWriteMr: MemoryRegion | undefined;
  respWriteOff: number;
  /**
   * A coalesced ACK (IBTA 9.7.4.1.x, C9-99 area: an ACK for PSN n acknowledges every request up to
   * n, so a responder may answer several AckReq packets with one). The ACK an AckReq packet asks for
   * is held until the QP's next poll (the end of the current receive batch, one event-loop turn) and
   * replaced by a later one; the PSN and MSN are those the ACK would have carried at once. Any
   * other response (NAK, duplicate ACK, READ response, ATOMIC ACK) sends it first, so ACKs still
   * leave in PSN order and never acknowledge a READ before its responses.
   */
  respAckPending: boolean;
  respAckPsn: Psn;
  respAckMsn: number;
  /**
   * READ responses waiting to go out. `NO_JOBS`, shared, until the first READ: asked on every poll,
   * it then reads a hot array rather than each QP's own, cold with thousands of QPs.
   */
  respJobs: ReadJob[];
  /** READ/atomic resources, grown on use up to `respResCap` (maxDestRdAtomic), then a ring. */
  respResources: Resource[];
  respResCap: number;
  respResHead: number;
}

/** What the responder asks of its QP beyond sending. */
export interface ResponderHost {
  /**
   * A class C error found outside a request's own checks (a READ's region gone while its responses
   * go out): QP → ERR, unless its state changed since `epoch`.
   */
  responderFailed(reason: string, epoch: number): void;
}

/** What the responder works on: the QP, its state and its context. */
export type ResponderQp = EngineContext & ResponderState & ResponderHost;

/**
 * The engine: one instance serves every QP (`RESPONDER`); each call gets the QP, which is its
 * state and the context it sends through.
 */
export class Responder {
  reset(qp: ResponderQp, rqPsn: Psn, maxDestRdAtomic: number): void {
    qp.respPsn = rqPsn;
    qp.respMsn = 0;
    qp.respOpcode = -1;
    qp.respSentPsnNak = false;
    qp.respDropMsg = false;
    this.endRecv(qp);
    this.endWrite(qp);
    // Grown on use: most QPs never see a READ or atomic, and an idle QP should cost little.
    qp.respResources = [];
    qp.respResCap = Math.max(0, maxDestRdAtomic);
    qp.respResHead = 0;
    this.dropJobs(qp);
    qp.respAckPending = false;
  }

  /** Inside a multi-packet SEND or WRITE: only its MIDDLE/LAST packets are valid next (9.7.3.2). */
  inMessage(qp: ResponderState): boolean {
    if (qp.respOpcode === -1) return false;
    const prev = opcodeInfo(qp.respOpcode);
    return prev !== undefined && !prev.end && (prev.kind === 'send' || prev.kind === 'write');
  }

  /** No SEND in progress; its WQE and memory are let go. */
  private endRecv(qp: ResponderState): void {
    qp.respRecvWqe = undefined;
    qp.respRecvSegments = NO_SEGMENTS;
    qp.respRecvOffset = 0;
  }

  private endWrite(qp: ResponderState): void {
    qp.respWriting = false;
    qp.respWriteMr = undefined;
  }

  /** Drops the message in progress (QP reset/error). */
  abandon(qp: ResponderState): void {
    this.endRecv(qp);
    this.endWrite(qp);
    qp.respOpcode = -1;
    this.dropJobs(qp);
  }

  /** No READ responses left to send: the jobs go back to the free list. */
  private dropJobs(qp: ResponderState): void {
    const jobs = qp.respJobs;
    for (let i = 0; i < jobs.length; i++) releaseJob(jobs[i]!);
    qp.respJobs = NO_JOBS;
  }

  // ---------------------------------------------------------------------------------------
  // The pipeline

  onRequest(qp: ResponderQp, rq: WorkQueue<RecvWqe>, pkt: RocePacket, info: OpcodeInfo, rx: RxInfo): ResponderOutcome {
    // rxe answers one request at a time: a READ's responses all go out before the next request
    // is looked at. Sending what is left first keeps responses in PSN order and keeps a later
    // WRITE from changing memory a READ has not yet returned.
    if (qp.respJobs.length > 0) {
      const epoch = qp.stateEpoch;
      this.flushReads(qp);
      // A hook moved the QP from inside a response's send (to ERR or RESET, say): the request
      // arrived for the state the QP has left, and is dropped (and counted) as the device drops one for ERR.
      if (qp.stateEpoch !== epoch) {
        qp.counters.badState++;
        return OK;
      }
    }
    const verdict =
      this.checkPsn(qp, pkt, info) ??
      this.checkOpSeq(qp, info) ??
      this.checkOpValid(qp, info) ??
      this.checkResource(qp, rq, info) ??
      this.checkLength(qp, pkt, info) ??
      this.checkRkey(qp, pkt, info);
    if (verdict) return this.handle(qp, rq, pkt, info, verdict);
    return this.execute(qp, rq, pkt, info, rx);
  }

  /** 9.7.3.1 / rxe check_psn. */
  private checkPsn(qp: ResponderQp, pkt: RocePacket, info: OpcodeInfo): Check {
    const psn = pkt.bth.psn;
    switch (qp.type) {
      case 'RC': {
        const d = psnDiff(psn, qp.respPsn);
        if (d > 0) {
          // Class B: PSN sequence error. NAK the first packet of a gap only; the rest are dropped.
          if (qp.respSentPsnNak) return { v: 'drop', counter: undefined, abandon: false };
          qp.respSentPsnNak = true;
          qp.counters.outOfSeqReq++;
          return { v: 'nakSeq' };
        }
        if (d < 0) {
          qp.counters.dupReq++;
          return { v: 'duplicate' };
        }
        qp.respSentPsnNak = false;
        return undefined;
      }
      case 'UC':
        // 9.8.3: UC has no retransmission. After a gap, drop everything up to the next message
        // start, which resynchronises the PSN.
        if (qp.respDropMsg || psn !== qp.respPsn) {
          if (info.start) {
            if (qp.respOpcode !== -1) this.abandonUc(qp);
            qp.respDropMsg = false;
            qp.respPsn = psn;
            return undefined;
          }
          if (!qp.respDropMsg) this.abandonUc(qp);
          qp.respDropMsg = true;
          return { v: 'drop', counter: 'outOfSeqReq', abandon: false };
        }
        return undefined;
      default:
        return undefined;
    }
  }

  /** UC: the message in progress is abandoned; its receive WQE is reused by the next message. */
  private abandonUc(qp: ResponderQp): void {
    if (qp.respOpcode !== -1) qp.counters.ucDroppedMsg++;
    this.endRecv(qp);
    this.endWrite(qp);
    qp.respOpcode = -1;
  }

  /** 9.7.3.2 / rxe check_op_seq: FIRST, MIDDLE* , LAST of one kind, or ONLY. */
  private checkOpSeq(qp: ResponderQp, info: OpcodeInfo): Check {
    if (qp.type === 'UD') return undefined;
    const prev = qp.respOpcode === -1 ? undefined : info.transport === qp.type ? opcodeInfo(qp.respOpcode) : undefined;
    const inMsg = prev !== undefined && !prev.end && (prev.kind === 'send' || prev.kind === 'write');
    if (inMsg) {
      const continues = !info.start && info.kind === prev.kind;
      if (continues) return undefined;
      if (qp.type === 'RC') {
        // Class C: missing LAST (an unexpected opcode inside a message).
        return fatalVerdict(NAK_CODE.INVALID_REQUEST, 'REM_INV_REQ_ERR', 'badOpcodeSeq', 'opcode out of sequence (missing LAST)');
      }
      // UC (class D1): abandon the partial message; a new start is taken as the next message.
      qp.counters.badOpcodeSeq++;
      this.abandonUc(qp);
      if (info.start) return undefined;
      qp.respDropMsg = true;
      return { v: 'drop', counter: undefined, abandon: false };
    }
    if (!info.start && (info.kind === 'send' || info.kind === 'write')) {
      if (qp.type === 'RC') {
        // Class C: missing FIRST.
        return fatalVerdict(NAK_CODE.INVALID_REQUEST, 'REM_INV_REQ_ERR', 'badOpcodeSeq', 'opcode out of sequence (missing FIRST)');
      }
      qp.respDropMsg = true;
      return { v: 'drop', counter: 'badOpcodeSeq', abandon: false };
    }
    return undefined;
  }

  /** rxe check_op_valid: the QP's access flags allow the operation (C9-92 area). */
  private checkOpValid(qp: ResponderQp, info: OpcodeInfo): Check {
    const f = qp.attrs.accessFlags;
    if (qp.type === 'RC') {
      if ((info.kind === 'readRequest' && !(f & ACCESS.REMOTE_READ)) ||
          (info.kind === 'write' && !(f & ACCESS.REMOTE_WRITE)) ||
          (info.kind === 'atomic' && !(f & ACCESS.REMOTE_ATOMIC))) {
        // Class C: the QP does not accept this operation: NAK Invalid Request.
        return fatalVerdict(NAK_CODE.INVALID_REQUEST, 'REM_INV_REQ_ERR', 'invalidRequest', `QP access flags forbid ${info.name}`);
      }
      if (info.kind !== 'send' && info.kind !== 'write' && info.kind !== 'readRequest' && info.kind !== 'atomic') {
        return fatalVerdict(NAK_CODE.INVALID_REQUEST, 'REM_INV_REQ_ERR', 'invalidRequest', `unsupported opcode ${info.name}`);
      }
    } else if (qp.type === 'UC' && info.kind === 'write' && !(f & ACCESS.REMOTE_WRITE)) {
      qp.respDropMsg = true;
      return { v: 'drop', counter: 'invalidRequest', abandon: true };
    }
    return undefined;
  }

  /** rxe check_resource: a receive WQE for messages that consume one; READ/atomic resources. */
  private checkResource(qp: ResponderQp, rq: WorkQueue<RecvWqe>, info: OpcodeInfo): Check {
    if (info.kind === 'readRequest' || info.kind === 'atomic') {
      // Class C: the requester exceeded the responder's resources (maxDestRdAtomic = 0).
      if (qp.attrs.maxDestRdAtomic <= 0) {
        return fatalVerdict(NAK_CODE.INVALID_REQUEST, 'REM_INV_REQ_ERR', 'invalidRequest', 'no READ/atomic resources (maxDestRdAtomic 0)');
      }
      return undefined;
    }
    const needsWqe = info.kind === 'send' ? info.start : info.consumesRecv && info.end;
    if (needsWqe && qp.respRecvWqe === undefined) {
      const wqe = rq.peek();
      if (!wqe) return { v: 'rnr' };
      if (!wqe.segments) {
        const segs = resolveSges(qp.mrs, qp.pd, wqe.sges, true);
        // Class A: a malformed receive WQE (bad L_Key): remote operational error.
        if (!segs) return fatalVerdict(NAK_CODE.REMOTE_OPERATIONAL_ERROR, 'LOC_PROT_ERR', 'remoteOpErr', 'receive WQE has a bad L_Key');
        wqe.segments = segs;
        wqe.mrEpoch = qp.mrs.deregistrations;
      }
      qp.respRecvWqe = wqe;
      qp.respRecvSegments = wqe.segments;
      qp.respRecvOffset = 0;
    }
    return undefined;
  }

  /** rxe check_length: per-position payload rules (C9-88 area) and the 2^31 message limit. */
  private checkLength(qp: ResponderQp, pkt: RocePacket, info: OpcodeInfo): Check {
    const mtu = qp.type === 'UD' ? qp.attrs.portMtu : qp.attrs.pathMtu;
    const n = pkt.payload.length;
    let bad = false;
    if (info.payload) {
      if (info.start && info.end) bad = n > mtu;
      else if (info.start || info.position === 'middle') bad = n !== mtu;
      else if (info.end) bad = n === 0 || n > mtu;
    }
    if (pkt.reth && pkt.reth.dmaLength > 0x80000000) bad = true;
    if (!bad) return undefined;
    if (qp.type === 'RC') return fatalVerdict(NAK_CODE.INVALID_REQUEST, 'REM_INV_REQ_ERR', 'badLength', `bad payload length ${n} for ${info.name}`);
    // UC/UD class D: drop the message.
    if (qp.type === 'UC') qp.respDropMsg = true;
    return { v: 'drop', counter: 'badLength', abandon: qp.type === 'UC' };
  }

  /** rxe check_rkey: R_Key, PD, access right and bounds (C9-88..C9-91), atomic alignment. */
  private checkRkey(qp: ResponderQp, pkt: RocePacket, info: OpcodeInfo): Check {
    if (info.kind === 'write') {
      const reth = pkt.reth;
      if (reth) {
        qp.respWriting = true;
        qp.respWriteRkey = reth.rkey;
        qp.respWriteLength = reth.dmaLength;
        qp.respWriteResid = reth.dmaLength;
        qp.respWriteMr = undefined;
        qp.respWriteOff = 0;
        if (reth.dmaLength === 0) return undefined; // a zero-length WRITE needs no valid R_Key (9.4.4)
        const r = qp.mrs.remote(qp.pd, reth.rkey, ACCESS.REMOTE_WRITE, reth, reth.dmaLength);
        if (!r.ok) return this.rkeyFault(qp, `WRITE ${r.fault} rkey=0x${reth.rkey.toString(16)}`);
        qp.respWriteMr = r.mr;
        qp.respWriteOff = r.offset;
      } else {
        if (!qp.respWriting) return fatalVerdict(NAK_CODE.INVALID_REQUEST, 'REM_INV_REQ_ERR', 'invalidRequest', 'WRITE continuation without a WRITE in progress');
        // The range was checked whole at the first packet; what may have changed since is the key:
        // the region deregistered, or its R_Key invalidated (a SEND with Invalidate between).
        const gone = qp.respWriteMr?.remoteKeyGone;
        if (gone !== undefined) return this.rkeyFault(qp, `WRITE ${gone} rkey=0x${qp.respWriteRkey.toString(16)}`);
      }
      const mtu = qp.attrs.pathMtu;
      const n = pkt.payload.length;
      const resid = qp.respWriteResid;
      if (resid > mtu ? n !== mtu : n !== resid) {
        if (qp.type === 'RC') return fatalVerdict(NAK_CODE.INVALID_REQUEST, 'REM_INV_REQ_ERR', 'badLength', `WRITE payload ${n}, ${resid} left`);
        qp.respDropMsg = true;
        return { v: 'drop', counter: 'badLength', abandon: true };
      }
      return undefined;
    }
    if (info.kind === 'readRequest') {
      const r = pkt.reth!;
      if (r.dmaLength === 0) return undefined;
      const l = qp.mrs.remote(qp.pd, r.rkey, ACCESS.REMOTE_READ, r, r.dmaLength);
      if (!l.ok) return this.rkeyFault(qp, `READ ${l.fault} rkey=0x${r.rkey.toString(16)}`);
      return undefined;
    }
    if (info.kind === 'atomic') {
      const a = pkt.atomicEth!;
      const l = qp.mrs.remote(qp.pd, a.rkey, ACCESS.REMOTE_ATOMIC, a, 8);
      if (!l.ok) return this.rkeyFault(qp, `atomic ${l.fault} rkey=0x${a.rkey.toString(16)}`);
      // Class C: atomics need an 8-byte aligned address (9.4.5); rxe NAKs Invalid Request.
      if ((a.va & 7n) !== 0n) return fatalVerdict(NAK_CODE.INVALID_REQUEST, 'REM_INV_REQ_ERR', 'invalidRequest', 'misaligned atomic');
      return undefined;
    }
    return undefined;
  }

  private rkeyFault(qp: ResponderQp, why: string): Verdict {
    if (qp.type === 'RC') return fatalVerdict(NAK_CODE.REMOTE_ACCESS_ERROR, 'REM_ACCESS_ERR', 'rkeyViolation', why);
    // UC, no SRQ: class E, drop the message silently.
    qp.respDropMsg = true;
    return { v: 'drop', counter: 'rkeyViolation', abandon: true };
  }

  /** rxe execute + do_complete + acknowledge. */
  private execute(qp: ResponderQp, rq: WorkQueue<RecvWqe>, pkt: RocePacket, info: OpcodeInfo, rx: RxInfo): ResponderOutcome {
    switch (info.kind) {
      case 'send': {
        // A receive buffer deregistered since its message began: the same class A error as a bad
        // L_Key at the first packet (rxe: copy_data fails, RESPST_ERR_MALFORMED_WQE).
        const rw = qp.respRecvWqe;
        if (rw !== undefined && !regionsStillHeld(qp.mrs, rw)) {
          return this.handle(qp, rq, pkt, info, fatalVerdict(NAK_CODE.REMOTE_OPERATIONAL_ERROR, 'LOC_PROT_ERR', 'remoteOpErr', 'receive WQE\'s region deregistered'));
        }
        if (qp.type === 'UD') {
          // The receive buffer starts with the 40-byte GRH area: an IPv4 packet's header goes
          // at offset 20 (the first 20 bytes zero), an IPv6 header fills all 40 (as rxe does).
          const grh = buildGrh(rx);
          if (!scatter(qp.respRecvSegments, 0, grh)) return this.handle(qp, rq, pkt, info, { v: 'localLength' });
          qp.respRecvOffset = GRH_LEN;
        }
        if (!scatter(qp.respRecvSegments, qp.respRecvOffset, pkt.payload)) {
          if (qp.type === 'RC') {
            return this.handle(qp, rq, pkt, info, fatalVerdict(NAK_CODE.INVALID_REQUEST, 'LOC_LEN_ERR', 'badLength', 'message longer than the receive WQE'));
          }
          return this.handle(qp, rq, pkt, info, { v: 'localLength' });
        }
        qp.respRecvOffset += pkt.payload.length;
        break;
      }
      case 'write': {
        const n = pkt.payload.length;
        if (n > 0) {
          const mr = qp.respWriteMr;
          if (mr === undefined) return this.handle(qp, rq, pkt, info, this.rkeyFault(qp, 'WRITE target vanished'));
          mr.buffer.set(pkt.payload, qp.respWriteOff);
          qp.respWriteOff += n;
        }
        qp.respWriteResid -= n;
        break;
      }
      case 'readRequest':
        return this.startRead(qp, pkt);
      case 'atomic':
        return this.doAtomic(qp, pkt, info);
      default:
        break;
    }

    if (info.invalidate) {
      // Class J: the R_Key to invalidate does not exist (or is not invalidatable).
      if (!qp.mrs.invalidate(qp.pd, pkt.ieth!.rkey)) {
        return this.handle(qp, rq, pkt, info, fatalVerdict(NAK_CODE.INVALID_REQUEST, 'REM_INV_REQ_ERR', 'invalidRequest', 'invalid R_Key to invalidate'));
      }
    }
    if (info.end) qp.respMsn = (qp.respMsn + 1) & 0xffffff;
    qp.respPsn = psnAdd(pkt.bth.psn, 1);
    qp.respOpcode = info.end ? -1 : pkt.bth.opcode;
    // Acknowledge (9.7.4.1): RC answers packets with AckReq (the requester sets it on the last
    // packet of a message and every MAX_PKT_PER_ACK); the answers to one receive batch are
    // coalesced into the last one (see `ackPending`). Noted before the receive completion, whose
    // handler may move the QP: the state change then sends it first, as for any ACK it finds due.
    if (qp.type === 'RC' && pkt.bth.ackReq) {
      qp.respAckPending = true;
      qp.respAckPsn = pkt.bth.psn;
      qp.respAckMsn = qp.respMsn;
    }
    // WRITE with immediate reports the RETH length, so the WRITE state outlives its last packet
    // until the receive completion is built.
    if (info.consumesRecv && info.end) this.completeRecv(qp, rq, pkt, info, 'SUCCESS');
    if (info.end && info.kind === 'write') this.endWrite(qp);
    return OK;
  }

  private completeRecv(qp: ResponderQp, rq: WorkQueue<RecvWqe>, pkt: RocePacket, info: OpcodeInfo, status: WcStatus): void {
    const inProgress = qp.respRecvWqe;
    const received = qp.respRecvOffset;
    this.endRecv(qp);
    const wqe = inProgress ?? rq.peek();
    if (!wqe) return;
    rq.shift();
    const isWriteImm = info.kind === 'write';
    let flags = 0;
    // Built in the one scratch record: `postRecvCompletion` copies it into the CQ's ring at once.
    const wc = RECV_WC;
    wc.wrId = wqe.wrId;
    wc.status = status;
    wc.opcode = isWriteImm ? 'RECV_RDMA_WITH_IMM' : 'RECV';
    wc.vendorErr = 0;
    wc.byteLen = status !== 'SUCCESS' ? 0 : isWriteImm ? (qp.respWriting ? qp.respWriteLength : 0) : (inProgress !== undefined ? received : 0);
    wc.qpNum = qp.qpn;
    wc.srcQp = pkt.deth?.srcQp ?? 0;
    wc.wcFlags = 0;
    wc.pkeyIndex = 0;
    wc.immData = undefined;
    wc.invalidatedRkey = undefined;
    if (status === 'SUCCESS') {
      if (qp.type === 'UD') flags |= WC_FLAGS.GRH;
      if (pkt.immDt) {
        flags |= WC_FLAGS.WITH_IMM;
        wc.immData = pkt.immDt.data;
      }
      if (pkt.ieth) {
        flags |= WC_FLAGS.WITH_INV;
        wc.invalidatedRkey = pkt.ieth.rkey;
      }
      wc.wcFlags = flags;
      qp.counters.rdmaRecvs++;
    }
    qp.postRecvCompletion(wc);
    releaseRecvWqe(wqe);
  }

  private startRead(qp: ResponderQp, pkt: RocePacket): ResponderOutcome {
    const r = pkt.reth!;
    const mtu = qp.attrs.pathMtu;
    const npkts = Math.max(1, Math.ceil(r.dmaLength / mtu));
    // C9-148: a READ counts as a completed message as soon as it is accepted.
    qp.respMsn = (qp.respMsn + 1) & 0xffffff;
    const res = this.nextResource(qp);
    res.kind = 'read';
    res.firstPsn = pkt.bth.psn;
    res.lastPsn = psnAdd(pkt.bth.psn, npkts - 1);
    res.vaHi = r.vaHi ?? Number(r.va >> 32n);
    res.vaLo = r.vaLo ?? Number(r.va & 0xffff_ffffn);
    res.length = r.dmaLength;
    res.rkey = r.rkey;
    res.origValue = 0n;
    qp.respPsn = psnAdd(pkt.bth.psn, npkts);
    qp.respOpcode = -1;
    this.queueRead(qp, res, pkt.bth.psn, r, r.dmaLength);
    return OK;
  }

  private queueRead(qp: ResponderQp, res: Resource, psn: Psn, at: RemoteVa, len: number): boolean {
    let mr: MemoryRegion | undefined;
    let off = 0;
    if (len > 0) {
      const l = qp.mrs.remote(qp.pd, res.rkey, ACCESS.REMOTE_READ, at, len);
      if (!l.ok) return false;
      mr = l.mr;
      off = l.offset;
    }
    if (qp.respJobs === NO_JOBS) qp.respJobs = [];
    qp.respJobs.push(takeJob(res, mr ?? EMPTY_MR, psn, off, len));
    return true;
  }

  private doAtomic(qp: ResponderQp, pkt: RocePacket, info: OpcodeInfo): ResponderOutcome {
    const a = pkt.atomicEth!;
    const l = qp.mrs.remote(qp.pd, a.rkey, ACCESS.REMOTE_ATOMIC, a, 8);
    if (!l.ok) return OK; // checked by checkRkey
    // Host-order (little-endian) 64-bit operand, as the CPU behind a real HCA sees it.
    const dv = new DataView(l.mr.buffer.buffer, l.mr.buffer.byteOffset + l.offset, 8);
    const orig = dv.getBigUint64(0, true);
    const next = info.name.endsWith('COMPARE_SWAP') ? (orig === a.compare ? a.swapAdd : orig) : BigInt.asUintN(64, orig + a.swapAdd);
    dv.setBigUint64(0, next, true);
    const res = this.nextResource(qp);
    res.kind = 'atomic';
    res.firstPsn = pkt.bth.psn;
    res.lastPsn = pkt.bth.psn;
    res.vaHi = Number(a.va >> 32n);
    res.vaLo = Number(a.va & 0xffff_ffffn);
    res.length = 8;
    res.rkey = a.rkey;
    res.origValue = orig;
    qp.respMsn = (qp.respMsn + 1) & 0xffffff;
    qp.respPsn = psnAdd(pkt.bth.psn, 1);
    qp.respOpcode = -1;
    this.sendAtomicAck(qp, pkt.bth.psn, orig);
    return OK;
  }

  /**
   * The slot for a new READ or atomic, for the caller to fill: the resource ring holds maxDestRdAtomic
   * entries and the oldest is recycled, refilled in place as rxe refills its `resources` array (a
   * record per READ was 44 B of garbage at the target). A job still queued for the old request would
   * not notice, having copied what it needs when it was made; and none is, since `onRequest` sends
   * every queued response before it looks at a request.
   */
  private nextResource(qp: ResponderState): Resource {
    const cap = qp.respResCap;
    if (cap === 0) return newResource(); // checkResource refuses the request first; kept nowhere
    const ring = qp.respResources;
    const at = qp.respResHead;
    qp.respResHead = (at + 1) % cap;
    if (at < ring.length) return ring[at]!;
    const res = newResource();
    ring.push(res);
    return res;
  }

  private findResource(qp: ResponderState, psn: Psn): Resource | undefined {
    for (const r of qp.respResources) {
      if (r && psnDiff(psn, r.firstPsn) >= 0 && psnDiff(psn, r.lastPsn) <= 0) return r;
    }
    return undefined;
  }

  // ---------------------------------------------------------------------------------------
  // Verdicts

  private handle(qp: ResponderQp, rq: WorkQueue<RecvWqe>, pkt: RocePacket, info: OpcodeInfo, v: Verdict): ResponderOutcome {
    switch (v.v) {
      case 'drop':
        if (v.counter) qp.counters[v.counter]++;
        if (v.abandon) this.abandonUc(qp);
        return OK;
      case 'nakSeq':
        // Class B: NAK with the PSN we expect (9.7.4.1.4).
        this.sendAck(qp, nakSyndrome(NAK_CODE.PSN_SEQUENCE_ERROR), qp.respPsn);
        return OK;
      case 'duplicate':
        return this.duplicate(qp, pkt, info);
      case 'rnr':
        if (qp.type === 'RC') {
          // Class B: Receiver Not Ready, with our minimum RNR timer (9.7.5.2.8); the packet is dropped.
          qp.counters.sndRnr++;
          this.sendAck(qp, rnrNakSyndrome(qp.attrs.minRnrTimer), pkt.bth.psn);
        } else {
          // UC/UD class D: no receive WQE, drop the message.
          qp.counters.noRecvWqe++;
          if (qp.type === 'UC') {
            qp.respDropMsg = true;
            this.abandonUc(qp);
          }
        }
        return OK;
      case 'localLength':
        qp.counters.badLength++;
        this.completeRecv(qp, rq, pkt, info, 'LOC_LEN_ERR');
        if (qp.type === 'UC') {
          qp.respDropMsg = true;
          this.abandonUc(qp);
        }
        return OK;
      case 'fatal':
        qp.counters[v.counter]++;
        // Classes A, C, J (9.9.3.1): NAK, complete the receive WQE in progress in error, QP → ERR.
        if (qp.type === 'RC') this.sendAck(qp, nakSyndrome(v.nak), pkt.bth.psn);
        if (qp.respRecvWqe !== undefined) this.completeRecv(qp, rq, pkt, info, v.status);
        return { kind: 'fatal', reason: v.why };
    }
  }

  /** Duplicates (9.7.4.1.2, C9-104..C9-112). */
  private duplicate(qp: ResponderQp, pkt: RocePacket, info: OpcodeInfo): ResponderOutcome {
    if (info.kind === 'send' || info.kind === 'write') {
      // Not executed again; acknowledge what we have (rxe: the PSN before the expected one).
      this.sendAck(qp, ackSyndrome(), psnAdd(qp.respPsn, -1));
      return OK;
    }
    const res = this.findResource(qp, pkt.bth.psn);
    if (info.kind === 'readRequest') {
      const r = pkt.reth!;
      // Re-executed, but only as a subset of the original request (C9-112 area); otherwise class D.
      if (!res || res.kind !== 'read' || r.rkey !== res.rkey || r.va < resourceVa(res) ||
          r.va + BigInt(r.dmaLength) > resourceVa(res) + BigInt(res.length)) {
        qp.counters.dupNoResource++;
        return OK;
      }
      for (let i = qp.respJobs.length - 1; i >= 0; i--) if (qp.respJobs[i]!.res === res) releaseJob(qp.respJobs.splice(i, 1)[0]!);
      if (!this.queueRead(qp, res, pkt.bth.psn, r, r.dmaLength)) {
        qp.counters.dupNoResource++;
        return OK;
      }
      qp.counters.dupReadReplay++;
      return OK;
    }
    if (info.kind === 'atomic') {
      // Replayed from the cache, never executed twice (C9-111).
      if (!res || res.kind !== 'atomic' || res.firstPsn !== pkt.bth.psn) {
        qp.counters.dupNoResource++;
        return OK;
      }
      qp.counters.dupAtomicReplay++;
      this.sendAtomicAck(qp, pkt.bth.psn, res.origValue);
      return OK;
    }
    return OK;
  }

  // ---------------------------------------------------------------------------------------
  // Output

  /** Sends the coalesced ACK, if one is waiting. */
  flushAck(qp: ResponderQp): void {
    if (!qp.respAckPending) return;
    qp.respAckPending = false;
    this.writeAck(qp, ackSyndrome(), qp.respAckPsn, qp.respAckMsn);
  }

  private sendAck(qp: ResponderQp, syndrome: number, psn: Psn): void {
    if (!this.flushedAckLeftState(qp)) this.writeAck(qp, syndrome, psn, qp.respMsn);
  }

  /**
   * Sends the coalesced ACK ahead of another response or a state change; true if that send's hook
   * reset or failed the QP, whose new state then has nothing of what was to follow.
   */
  flushedAckLeftState(qp: ResponderQp): boolean {
    if (!qp.respAckPending) return false;
    const epoch = qp.stateEpoch;
    this.flushAck(qp);
    return qp.stateEpoch !== epoch;
  }

  private writeAck(qp: ResponderQp, syndrome: number, psn: Psn, msn: number): void {
    const h = ACK_HEADERS;
    const qpn = qp.attrs.destQpNum;
    h[5] = qpn >>> 16;
    h[6] = qpn >>> 8;
    h[7] = qpn;
    h[9] = psn >>> 16;
    h[10] = psn >>> 8;
    h[11] = psn;
    h[12] = syndrome;
    h[13] = msn >>> 16;
    h[14] = msn >>> 8;
    h[15] = msn;
    qp.transmit(qp.attrs.dest!, ACK_PARTS);
  }

  private sendAtomicAck(qp: ResponderQp, psn: Psn, orig: bigint): void {
    if (this.flushedAckLeftState(qp)) return;
    const f = RESPONSE_FIELDS;
    f.opcode = RC_ATOMIC_ACK;
    f.destQp = qp.attrs.destQpNum;
    f.psn = psn;
    f.ackReq = false;
    f.se = false;
    f.padCount = 0;
    f.syndrome = ackSyndrome();
    f.msn = qp.respMsn;
    f.origData = orig;
    clearParts(RESPONSE_PARTS);
    RESPONSE_PARTS.push(SHARED_HEADER_BUILDER.build(f));
    qp.transmit(qp.attrs.dest!, RESPONSE_PARTS);
    clearParts(RESPONSE_PARTS); // nothing of this packet stays reachable from the QP
  }

  /** Sends up to `budget` READ response packets (rxe read_reply); returns how many. */
  emitReads(qp: ResponderQp, budget: number): number {
    let sent = 0;
    if (qp.respJobs.length > 0) this.flushAck(qp);
    const mtu = qp.attrs.pathMtu;
    while (sent < budget && qp.respJobs.length > 0) {
      const job = qp.respJobs[0]!;
      // The region is checked again before every response, as rxe's read_reply does
      // (rxe_recheck_mr): one deregistered since the request was accepted, or whose R_Key a SEND
      // with Invalidate took, ends the READ with a remote access NAK and the QP in ERR (class C).
      const gone = job.mr.remoteKeyGone;
      if (gone !== undefined) {
        this.readFault(qp, job, gone);
        break;
      }
      const n = Math.min(job.resid, mtu);
      const isLast = job.resid <= mtu;
      let opcode: number;
      if (job.fresh && job.fromStart) opcode = isLast ? RESP_ONLY : RESP_FIRST;
      else opcode = isLast ? RESP_LAST : RESP_MIDDLE;
      const f = RESPONSE_FIELDS;
      f.opcode = opcode;
      f.destQp = qp.attrs.destQpNum;
      f.psn = job.psn;
      f.ackReq = false;
      f.se = false;
      f.padCount = padFor(n);
      f.syndrome = ackSyndrome();
      f.msn = qp.respMsn;
      const parts = RESPONSE_PARTS;
      clearParts(parts);
      parts.push(SHARED_HEADER_BUILDER.build(f));
      if (n > 0) parts.push(job.mr.viewAt(job.off, n));
      if (f.padCount) parts.push(PAD[f.padCount]!);
      const epoch = qp.stateEpoch;
      qp.transmit(qp.attrs.dest!, parts);
      clearParts(parts);
      sent++;
      // A link or trace hook that reset or failed the QP from inside the send has given every job
      // back already (`dropJobs`): this one may be another READ's by now, and the list the frozen
      // empty one.
      if (qp.stateEpoch !== epoch) break;
      job.fresh = false;
      job.psn = psnAdd(job.psn, 1);
      job.off += n;
      job.resid -= n;
      if (isLast) releaseJob(qp.respJobs.shift()!);
    }
    return sent;
  }

  /** A READ whose region went away: NAK the next response's PSN, as the requester expects it, and fail the QP. */
  private readFault(qp: ResponderQp, job: ReadJob, gone: 'noKey' | 'invalidated'): void {
    qp.counters.rkeyViolation++;
    const why = `READ ${gone} rkey=0x${job.mr.rkey.toString(16)} at PSN ${job.psn}`;
    const epoch = qp.stateEpoch;
    this.sendAck(qp, nakSyndrome(NAK_CODE.REMOTE_ACCESS_ERROR), job.psn);
    qp.responderFailed(why, epoch);
  }

  private flushReads(qp: ResponderQp): void {
    while (qp.respJobs.length > 0) this.emitReads(qp, 1 << 30);
  }
}

/** The responder of every QP. */
export const RESPONDER = new Responder();

const EMPTY_MR = { buffer: new Uint8Array(0) } as MemoryRegion;

function fatalVerdict(nak: number, status: WcStatus, counter: CounterName, why: string): Verdict {
  return { v: 'fatal', nak, status, counter, why };
}


/**
 * The 40-byte GRH area of a UD receive (IBTA 11.4.1.2; rxe `execute`): IPv4 → 20 zero bytes then
 * the IPv4 header; IPv6 → the IPv6 header. A UDP socket does not show us the IP header, so it is
 * rebuilt from what the datagram tells us, with the values rxe itself sends (TTL 64, DF, ID 0).
 */
export function buildGrh(rx: RxInfo): Uint8Array {
  const grh = new Uint8Array(GRH_LEN);
  const src = parseIpAddress(rx.srcAddress);
  const dst = parseIpAddress(rx.dstAddress);
  const v4 = (a: Uint8Array | undefined): Uint8Array | undefined => {
    if (!a) return undefined;
    if (a.length === 4) return a;
    const mapped = a.length === 16 && a.subarray(0, 10).every((b) => b === 0) && a[10] === 0xff && a[11] === 0xff;
    return mapped ? a.subarray(12) : undefined;
  };
  const s4 = v4(src);
  const d4 = v4(dst);
  const udpLen = 8 + rx.udpLength;
  if (s4 && d4) {
    const h = grh.subarray(20);
    h[0] = 0x45;
    const total = 20 + udpLen;
    h[2] = total >>> 8;
    h[3] = total & 0xff;
    h[6] = 0x40; // DF
    h[8] = 64;
    h[9] = 17;
    h.set(s4, 12);
    h.set(d4, 16);
    const c = ipv4Checksum(h, 0, 20);
    h[10] = c >>> 8;
    h[11] = c & 0xff;
  } else {
    grh[0] = 0x60;
    grh[4] = udpLen >>> 8;
    grh[5] = udpLen & 0xff;
    grh[6] = 17;
    grh[7] = 64;
    if (src && src.length === 16) grh.set(src, 8);
    if (dst && dst.length === 16) grh.set(dst, 24);
  }
  return grh;
}

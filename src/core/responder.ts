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
import { blankFields, clearParts, PAD, SHARED_HEADER_BUILDER } from './headers.js';
import { resolveSges, scatter, type MemoryRegion } from './mr.js';
import { ACCESS, WC_FLAGS, type Psn, type WcStatus, type WorkCompletion } from './types.js';
import type { RecvWqe, WorkQueue } from './wqe.js';

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
interface Resource {
  kind: 'read' | 'atomic';
  firstPsn: Psn;
  lastPsn: Psn;
  va: bigint;
  length: number;
  rkey: number;
  origValue: bigint;
}

/** READ response packets still to send. */
interface ReadJob {
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
const NO_JOBS: ReadJob[] = Object.freeze([]) as unknown as ReadJob[];
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

export class Responder {
  /** Expected PSN of the next new request (ePSN). */
  psn: Psn = 0;
  /** Message sequence number: completed messages, 24 bits (9.7.5.2). */
  msn = 0;
  /** Opcode of the last accepted packet, or -1 between messages. */
  private opcode = -1;

  /** Inside a multi-packet SEND or WRITE: only its MIDDLE/LAST packets are valid next (9.7.3.2). */
  get inMessage(): boolean {
    if (this.opcode === -1) return false;
    const prev = opcodeInfo(this.opcode);
    return prev !== undefined && !prev.end && (prev.kind === 'send' || prev.kind === 'write');
  }
  /** RC: a PSN sequence NAK was sent for the current gap (NAK once per gap, C9-106 area). */
  private sentPsnNak = false;
  /** UC: drop packets until the next message start. */
  private dropMsg = false;
  /** The receive WQE a SEND in progress is filling, and how far. */
  private recv: { wqe: RecvWqe; segments: Uint8Array[]; offset: number } | undefined;
  // The RDMA WRITE in progress, in fields of this record rather than an object of its own: with
  // thousands of QPs taking turns, a fresh object per message stored here was a write-barrier entry
  // on another page at every message, and the 64-bit VA it advanced two BigInts per packet. The
  // first packet checks the R_Key over the whole message (as rxe's check_rkey does with the RETH's
  // length), so the rest need only where they go: the region and a byte offset into it.
  /** A WRITE message is in progress (its first packet was accepted, its last not yet). */
  private writing = false;
  /** Its R_Key, its DMA length, and the bytes still to come. */
  private writeRkey = 0;
  private writeLength = 0;
  private writeResid = 0;
  /** The region it writes into (undefined for a zero-length WRITE), and where its next packet goes. */
  private writeMr: MemoryRegion | undefined;
  private writeOff = 0;
  /** READ/atomic resources, grown on use up to `resCap` (maxDestRdAtomic), then a ring. */
  private resources: Resource[] = [];
  private resCap = 0;
  private resHead = 0;
  /**
   * READ responses waiting to go out. `NO_JOBS`, shared, until the first READ: `hasWork`, asked on
   * every poll, then reads a hot array rather than each QP's own, cold with thousands of QPs.
   */
  private jobs: ReadJob[] = NO_JOBS;
  /**
   * A coalesced ACK (IBTA 9.7.4.1.x, C9-99 area: an ACK for PSN n acknowledges every request up to
   * n, so a responder may answer several AckReq packets with one). The ACK an AckReq packet asks for
   * is held until the QP's next poll (the end of the current receive batch, one event-loop turn) and
   * replaced by a later one; the PSN and MSN are those the ACK would have carried at once. Any
   * other response (NAK, duplicate ACK, READ response, ATOMIC ACK) sends it first, so ACKs still
   * leave in PSN order and never acknowledge a READ before its responses.
   */
  private ackPending = false;
  private ackPsn: Psn = 0;
  private ackMsn = 0;
  private readonly hb = SHARED_HEADER_BUILDER;
  // Scratch shared by every responder of the process, as the header builder is (its comment says why
  // that is safe): with thousands of QPs taking turns, a record and a list of each QP's own were
  // cold in cache at every packet.
  private readonly f = RESPONSE_FIELDS;
  private readonly parts = RESPONSE_PARTS;

  reset(rqPsn: Psn, maxDestRdAtomic: number): void {
    this.psn = rqPsn;
    this.msn = 0;
    this.opcode = -1;
    this.sentPsnNak = false;
    this.dropMsg = false;
    this.recv = undefined;
    this.endWrite();
    // Grown on use: most QPs never see a READ or atomic, and an idle QP should cost little.
    this.resources = [];
    this.resCap = Math.max(0, maxDestRdAtomic);
    this.resHead = 0;
    this.jobs = NO_JOBS;
    this.ackPending = false;
  }

  /** READ responses waiting to go out. */
  get hasWork(): boolean {
    return this.jobs.length > 0;
  }

  /** A coalesced ACK waits for `flushAck`. */
  get hasAck(): boolean {
    return this.ackPending;
  }

  private endWrite(): void {
    this.writing = false;
    this.writeMr = undefined;
  }

  /** Drops the message in progress (QP reset/error). */
  abandon(): void {
    this.recv = undefined;
    this.endWrite();
    this.opcode = -1;
    this.jobs = NO_JOBS;
  }

  // ---------------------------------------------------------------------------------------
  // The pipeline

  onRequest(ctx: EngineContext, rq: WorkQueue<RecvWqe>, pkt: RocePacket, info: OpcodeInfo, rx: RxInfo): ResponderOutcome {
    // rxe answers one request at a time: a READ's responses all go out before the next request
    // is looked at. Sending what is left first keeps responses in PSN order and keeps a later
    // WRITE from changing memory a READ has not yet returned.
    this.flushReads(ctx);
    const verdict =
      this.checkPsn(ctx, pkt, info) ??
      this.checkOpSeq(ctx, info) ??
      this.checkOpValid(ctx, info) ??
      this.checkResource(ctx, rq, info) ??
      this.checkLength(ctx, pkt, info) ??
      this.checkRkey(ctx, pkt, info);
    if (verdict) return this.handle(ctx, rq, pkt, info, verdict);
    return this.execute(ctx, rq, pkt, info, rx);
  }

  /** 9.7.3.1 / rxe check_psn. */
  private checkPsn(ctx: EngineContext, pkt: RocePacket, info: OpcodeInfo): Check {
    const psn = pkt.bth.psn;
    switch (ctx.type) {
      case 'RC': {
        const d = psnDiff(psn, this.psn);
        if (d > 0) {
          // Class B: PSN sequence error. NAK the first packet of a gap only; the rest are dropped.
          if (this.sentPsnNak) return { v: 'drop', counter: undefined, abandon: false };
          this.sentPsnNak = true;
          ctx.counters.outOfSeqReq++;
          return { v: 'nakSeq' };
        }
        if (d < 0) {
          ctx.counters.dupReq++;
          return { v: 'duplicate' };
        }
        this.sentPsnNak = false;
        return undefined;
      }
      case 'UC':
        // 9.8.3: UC has no retransmission. After a gap, drop everything up to the next message
        // start, which resynchronises the PSN.
        if (this.dropMsg || psn !== this.psn) {
          if (info.start) {
            if (this.opcode !== -1) this.abandonUc(ctx);
            this.dropMsg = false;
            this.psn = psn;
            return undefined;
          }
          if (!this.dropMsg) this.abandonUc(ctx);
          this.dropMsg = true;
          return { v: 'drop', counter: 'outOfSeqReq', abandon: false };
        }
        return undefined;
      default:
        return undefined;
    }
  }

  /** UC: the message in progress is abandoned; its receive WQE is reused by the next message. */
  private abandonUc(ctx: EngineContext): void {
    if (this.opcode !== -1) ctx.counters.ucDroppedMsg++;
    this.recv = undefined;
    this.endWrite();
    this.opcode = -1;
  }

  /** 9.7.3.2 / rxe check_op_seq: FIRST, MIDDLE* , LAST of one kind, or ONLY. */
  private checkOpSeq(ctx: EngineContext, info: OpcodeInfo): Check {
    if (ctx.type === 'UD') return undefined;
    const prev = this.opcode === -1 ? undefined : info.transport === ctx.type ? opcodeInfo(this.opcode) : undefined;
    const inMsg = prev !== undefined && !prev.end && (prev.kind === 'send' || prev.kind === 'write');
    if (inMsg) {
      const continues = !info.start && info.kind === prev.kind;
      if (continues) return undefined;
      if (ctx.type === 'RC') {
        // Class C: missing LAST (an unexpected opcode inside a message).
        return fatalVerdict(NAK_CODE.INVALID_REQUEST, 'REM_INV_REQ_ERR', 'badOpcodeSeq', 'opcode out of sequence (missing LAST)');
      }
      // UC (class D1): abandon the partial message; a new start is taken as the next message.
      ctx.counters.badOpcodeSeq++;
      this.abandonUc(ctx);
      if (info.start) return undefined;
      this.dropMsg = true;
      return { v: 'drop', counter: undefined, abandon: false };
    }
    if (!info.start && (info.kind === 'send' || info.kind === 'write')) {
      if (ctx.type === 'RC') {
        // Class C: missing FIRST.
        return fatalVerdict(NAK_CODE.INVALID_REQUEST, 'REM_INV_REQ_ERR', 'badOpcodeSeq', 'opcode out of sequence (missing FIRST)');
      }
      this.dropMsg = true;
      return { v: 'drop', counter: 'badOpcodeSeq', abandon: false };
    }
    return undefined;
  }

  /** rxe check_op_valid: the QP's access flags allow the operation (C9-92 area). */
  private checkOpValid(ctx: EngineContext, info: OpcodeInfo): Check {
    const f = ctx.attrs.accessFlags;
    if (ctx.type === 'RC') {
      if ((info.kind === 'readRequest' && !(f & ACCESS.REMOTE_READ)) ||
          (info.kind === 'write' && !(f & ACCESS.REMOTE_WRITE)) ||
          (info.kind === 'atomic' && !(f & ACCESS.REMOTE_ATOMIC))) {
        // Class C: the QP does not accept this operation: NAK Invalid Request.
        return fatalVerdict(NAK_CODE.INVALID_REQUEST, 'REM_INV_REQ_ERR', 'invalidRequest', `QP access flags forbid ${info.name}`);
      }
      if (info.kind !== 'send' && info.kind !== 'write' && info.kind !== 'readRequest' && info.kind !== 'atomic') {
        return fatalVerdict(NAK_CODE.INVALID_REQUEST, 'REM_INV_REQ_ERR', 'invalidRequest', `unsupported opcode ${info.name}`);
      }
    } else if (ctx.type === 'UC' && info.kind === 'write' && !(f & ACCESS.REMOTE_WRITE)) {
      this.dropMsg = true;
      return { v: 'drop', counter: 'invalidRequest', abandon: true };
    }
    return undefined;
  }

  /** rxe check_resource: a receive WQE for messages that consume one; READ/atomic resources. */
  private checkResource(ctx: EngineContext, rq: WorkQueue<RecvWqe>, info: OpcodeInfo): Check {
    if (info.kind === 'readRequest' || info.kind === 'atomic') {
      // Class C: the requester exceeded the responder's resources (maxDestRdAtomic = 0).
      if (ctx.attrs.maxDestRdAtomic <= 0) {
        return fatalVerdict(NAK_CODE.INVALID_REQUEST, 'REM_INV_REQ_ERR', 'invalidRequest', 'no READ/atomic resources (maxDestRdAtomic 0)');
      }
      return undefined;
    }
    const needsWqe = info.kind === 'send' ? info.start : info.consumesRecv && info.end;
    if (needsWqe && !this.recv) {
      const wqe = rq.peek();
      if (!wqe) return { v: 'rnr' };
      if (!wqe.segments) {
        const segs = resolveSges(ctx.mrs, ctx.pd, wqe.sges, true);
        // Class A: a malformed receive WQE (bad L_Key): remote operational error.
        if (!segs) return fatalVerdict(NAK_CODE.REMOTE_OPERATIONAL_ERROR, 'LOC_PROT_ERR', 'remoteOpErr', 'receive WQE has a bad L_Key');
        wqe.segments = segs;
      }
      this.recv = { wqe, segments: wqe.segments, offset: 0 };
    }
    return undefined;
  }

  /** rxe check_length: per-position payload rules (C9-88 area) and the 2^31 message limit. */
  private checkLength(ctx: EngineContext, pkt: RocePacket, info: OpcodeInfo): Check {
    const mtu = ctx.type === 'UD' ? ctx.attrs.portMtu : ctx.attrs.pathMtu;
    const n = pkt.payload.length;
    let bad = false;
    if (info.payload) {
      if (info.start && info.end) bad = n > mtu;
      else if (info.start || info.position === 'middle') bad = n !== mtu;
      else if (info.end) bad = n === 0 || n > mtu;
    }
    if (pkt.reth && pkt.reth.dmaLength > 0x80000000) bad = true;
    if (!bad) return undefined;
    if (ctx.type === 'RC') return fatalVerdict(NAK_CODE.INVALID_REQUEST, 'REM_INV_REQ_ERR', 'badLength', `bad payload length ${n} for ${info.name}`);
    // UC/UD class D: drop the message.
    if (ctx.type === 'UC') this.dropMsg = true;
    return { v: 'drop', counter: 'badLength', abandon: ctx.type === 'UC' };
  }

  /** rxe check_rkey: R_Key, PD, access right and bounds (C9-88..C9-91), atomic alignment. */
  private checkRkey(ctx: EngineContext, pkt: RocePacket, info: OpcodeInfo): Check {
    if (info.kind === 'write') {
      const reth = pkt.reth;
      if (reth) {
        this.writing = true;
        this.writeRkey = reth.rkey;
        this.writeLength = reth.dmaLength;
        this.writeResid = reth.dmaLength;
        this.writeMr = undefined;
        this.writeOff = 0;
        if (reth.dmaLength === 0) return undefined; // a zero-length WRITE needs no valid R_Key (9.4.4)
        const r = ctx.mrs.remote(ctx.pd, reth.rkey, ACCESS.REMOTE_WRITE, reth.va, reth.dmaLength);
        if (!r.ok) return this.rkeyFault(ctx, `WRITE ${r.fault} rkey=0x${reth.rkey.toString(16)}`);
        this.writeMr = r.mr;
        this.writeOff = r.offset;
      } else {
        if (!this.writing) return fatalVerdict(NAK_CODE.INVALID_REQUEST, 'REM_INV_REQ_ERR', 'invalidRequest', 'WRITE continuation without a WRITE in progress');
        // The range was checked whole at the first packet; what may have changed since is the key:
        // the region deregistered, or its R_Key invalidated (a SEND with Invalidate between).
        const mr = this.writeMr;
        if (mr !== undefined && (mr.deregistered || mr.rkeyInvalidated)) {
          return this.rkeyFault(ctx, `WRITE ${mr.deregistered ? 'noKey' : 'invalidated'} rkey=0x${this.writeRkey.toString(16)}`);
        }
      }
      const mtu = ctx.attrs.pathMtu;
      const n = pkt.payload.length;
      const resid = this.writeResid;
      if (resid > mtu ? n !== mtu : n !== resid) {
        if (ctx.type === 'RC') return fatalVerdict(NAK_CODE.INVALID_REQUEST, 'REM_INV_REQ_ERR', 'badLength', `WRITE payload ${n}, ${resid} left`);
        this.dropMsg = true;
        return { v: 'drop', counter: 'badLength', abandon: true };
      }
      return undefined;
    }
    if (info.kind === 'readRequest') {
      const r = pkt.reth!;
      if (r.dmaLength === 0) return undefined;
      const l = ctx.mrs.remote(ctx.pd, r.rkey, ACCESS.REMOTE_READ, r.va, r.dmaLength);
      if (!l.ok) return this.rkeyFault(ctx, `READ ${l.fault} rkey=0x${r.rkey.toString(16)}`);
      return undefined;
    }
    if (info.kind === 'atomic') {
      const a = pkt.atomicEth!;
      const l = ctx.mrs.remote(ctx.pd, a.rkey, ACCESS.REMOTE_ATOMIC, a.va, 8);
      if (!l.ok) return this.rkeyFault(ctx, `atomic ${l.fault} rkey=0x${a.rkey.toString(16)}`);
      // Class C: atomics need an 8-byte aligned address (9.4.5); rxe NAKs Invalid Request.
      if ((a.va & 7n) !== 0n) return fatalVerdict(NAK_CODE.INVALID_REQUEST, 'REM_INV_REQ_ERR', 'invalidRequest', 'misaligned atomic');
      return undefined;
    }
    return undefined;
  }

  private rkeyFault(ctx: EngineContext, why: string): Verdict {
    if (ctx.type === 'RC') return fatalVerdict(NAK_CODE.REMOTE_ACCESS_ERROR, 'REM_ACCESS_ERR', 'rkeyViolation', why);
    // UC, no SRQ: class E, drop the message silently.
    this.dropMsg = true;
    return { v: 'drop', counter: 'rkeyViolation', abandon: true };
  }

  /** rxe execute + do_complete + acknowledge. */
  private execute(ctx: EngineContext, rq: WorkQueue<RecvWqe>, pkt: RocePacket, info: OpcodeInfo, rx: RxInfo): ResponderOutcome {
    switch (info.kind) {
      case 'send': {
        const r = this.recv!;
        if (ctx.type === 'UD') {
          // The receive buffer starts with the 40-byte GRH area: an IPv4 packet's header goes
          // at offset 20 (the first 20 bytes zero), an IPv6 header fills all 40 (as rxe does).
          const grh = buildGrh(rx);
          if (!scatter(r.segments, 0, grh)) return this.handle(ctx, rq, pkt, info, { v: 'localLength' });
          r.offset = GRH_LEN;
        }
        if (!scatter(r.segments, r.offset, pkt.payload)) {
          if (ctx.type === 'RC') {
            return this.handle(ctx, rq, pkt, info, fatalVerdict(NAK_CODE.INVALID_REQUEST, 'LOC_LEN_ERR', 'badLength', 'message longer than the receive WQE'));
          }
          return this.handle(ctx, rq, pkt, info, { v: 'localLength' });
        }
        r.offset += pkt.payload.length;
        break;
      }
      case 'write': {
        const n = pkt.payload.length;
        if (n > 0) {
          const mr = this.writeMr;
          if (mr === undefined) return this.handle(ctx, rq, pkt, info, this.rkeyFault(ctx, 'WRITE target vanished'));
          mr.buffer.set(pkt.payload, this.writeOff);
          this.writeOff += n;
        }
        this.writeResid -= n;
        break;
      }
      case 'readRequest':
        return this.startRead(ctx, pkt);
      case 'atomic':
        return this.doAtomic(ctx, pkt, info);
      default:
        break;
    }

    if (info.invalidate) {
      // Class J: the R_Key to invalidate does not exist (or is not invalidatable).
      if (!ctx.mrs.invalidate(ctx.pd, pkt.ieth!.rkey)) {
        return this.handle(ctx, rq, pkt, info, fatalVerdict(NAK_CODE.INVALID_REQUEST, 'REM_INV_REQ_ERR', 'invalidRequest', 'invalid R_Key to invalidate'));
      }
    }
    if (info.end) this.msn = (this.msn + 1) & 0xffffff;
    this.psn = psnAdd(pkt.bth.psn, 1);
    this.opcode = info.end ? -1 : pkt.bth.opcode;
    // WRITE with immediate reports the RETH length, so the WRITE state outlives its last packet
    // until the receive completion is built.
    if (info.consumesRecv && info.end) this.completeRecv(ctx, rq, pkt, info, 'SUCCESS');
    if (info.end && info.kind === 'write') this.endWrite();
    // Acknowledge (9.7.4.1): RC answers packets with AckReq (the requester sets it on the last
    // packet of a message and every MAX_PKT_PER_ACK); the answers to one receive batch are
    // coalesced into the last one (see `ackPending`).
    if (ctx.type === 'RC' && pkt.bth.ackReq) {
      this.ackPending = true;
      this.ackPsn = pkt.bth.psn;
      this.ackMsn = this.msn;
    }
    return OK;
  }

  private completeRecv(ctx: EngineContext, rq: WorkQueue<RecvWqe>, pkt: RocePacket, info: OpcodeInfo, status: WcStatus): void {
    const r = this.recv;
    this.recv = undefined;
    const wqe = r?.wqe ?? rq.peek();
    if (!wqe) return;
    rq.shift();
    const isWriteImm = info.kind === 'write';
    let flags = 0;
    const wc: WorkCompletion = {
      wrId: wqe.wrId,
      status,
      opcode: isWriteImm ? 'RECV_RDMA_WITH_IMM' : 'RECV',
      vendorErr: 0,
      byteLen: status !== 'SUCCESS' ? 0 : isWriteImm ? (this.writing ? this.writeLength : 0) : (r?.offset ?? 0),
      qpNum: ctx.qpn,
      srcQp: pkt.deth?.srcQp ?? 0,
      wcFlags: 0,
      pkeyIndex: 0,
    };
    if (status === 'SUCCESS') {
      if (ctx.type === 'UD') flags |= WC_FLAGS.GRH;
      if (pkt.immDt) {
        flags |= WC_FLAGS.WITH_IMM;
        wc.immData = pkt.immDt.data;
      }
      if (pkt.ieth) {
        flags |= WC_FLAGS.WITH_INV;
        wc.invalidatedRkey = pkt.ieth.rkey;
      }
      wc.wcFlags = flags;
      ctx.counters.rdmaRecvs++;
    }
    ctx.postRecvCompletion(wc);
  }

  private startRead(ctx: EngineContext, pkt: RocePacket): ResponderOutcome {
    const r = pkt.reth!;
    const mtu = ctx.attrs.pathMtu;
    const npkts = Math.max(1, Math.ceil(r.dmaLength / mtu));
    // C9-148: a READ counts as a completed message as soon as it is accepted.
    this.msn = (this.msn + 1) & 0xffffff;
    const res: Resource = {
      kind: 'read', firstPsn: pkt.bth.psn, lastPsn: psnAdd(pkt.bth.psn, npkts - 1),
      va: r.va, length: r.dmaLength, rkey: r.rkey, origValue: 0n,
    };
    this.remember(res);
    this.psn = psnAdd(pkt.bth.psn, npkts);
    this.opcode = -1;
    this.queueRead(ctx, res, pkt.bth.psn, r.va, r.dmaLength);
    return OK;
  }

  private queueRead(ctx: EngineContext, res: Resource, psn: Psn, va: bigint, len: number): boolean {
    let mr: MemoryRegion | undefined;
    let off = 0;
    if (len > 0) {
      const l = ctx.mrs.remote(ctx.pd, res.rkey, ACCESS.REMOTE_READ, va, len);
      if (!l.ok) return false;
      mr = l.mr;
      off = l.offset;
    }
    if (this.jobs === NO_JOBS) this.jobs = [];
    this.jobs.push({ res, mr: mr ?? EMPTY_MR, psn, off, resid: len, fresh: true, fromStart: psn === res.firstPsn });
    return true;
  }

  private doAtomic(ctx: EngineContext, pkt: RocePacket, info: OpcodeInfo): ResponderOutcome {
    const a = pkt.atomicEth!;
    const l = ctx.mrs.remote(ctx.pd, a.rkey, ACCESS.REMOTE_ATOMIC, a.va, 8);
    if (!l.ok) return OK; // checked by checkRkey
    // Host-order (little-endian) 64-bit operand, as the CPU behind a real HCA sees it.
    const dv = new DataView(l.mr.buffer.buffer, l.mr.buffer.byteOffset + l.offset, 8);
    const orig = dv.getBigUint64(0, true);
    const next = info.name.endsWith('COMPARE_SWAP') ? (orig === a.compare ? a.swapAdd : orig) : BigInt.asUintN(64, orig + a.swapAdd);
    dv.setBigUint64(0, next, true);
    const res: Resource = { kind: 'atomic', firstPsn: pkt.bth.psn, lastPsn: pkt.bth.psn, va: a.va, length: 8, rkey: a.rkey, origValue: orig };
    this.remember(res);
    this.msn = (this.msn + 1) & 0xffffff;
    this.psn = psnAdd(pkt.bth.psn, 1);
    this.opcode = -1;
    this.sendAtomicAck(ctx, pkt.bth.psn, orig);
    return OK;
  }

  /** The responder resource ring holds maxDestRdAtomic entries; the oldest is recycled. */
  private remember(res: Resource): void {
    const cap = this.resCap;
    if (cap === 0) return;
    if (this.resources.length < cap) this.resources.push(res);
    else this.resources[this.resHead] = res;
    this.resHead = (this.resHead + 1) % cap;
  }

  private findResource(psn: Psn): Resource | undefined {
    for (const r of this.resources) {
      if (r && psnDiff(psn, r.firstPsn) >= 0 && psnDiff(psn, r.lastPsn) <= 0) return r;
    }
    return undefined;
  }

  // ---------------------------------------------------------------------------------------
  // Verdicts

  private handle(ctx: EngineContext, rq: WorkQueue<RecvWqe>, pkt: RocePacket, info: OpcodeInfo, v: Verdict): ResponderOutcome {
    switch (v.v) {
      case 'drop':
        if (v.counter) ctx.counters[v.counter]++;
        if (v.abandon) this.abandonUc(ctx);
        return OK;
      case 'nakSeq':
        // Class B: NAK with the PSN we expect (9.7.4.1.4).
        this.sendAck(ctx, nakSyndrome(NAK_CODE.PSN_SEQUENCE_ERROR), this.psn);
        return OK;
      case 'duplicate':
        return this.duplicate(ctx, pkt, info);
      case 'rnr':
        if (ctx.type === 'RC') {
          // Class B: Receiver Not Ready, with our minimum RNR timer (9.7.5.2.8); the packet is dropped.
          ctx.counters.sndRnr++;
          this.sendAck(ctx, rnrNakSyndrome(ctx.attrs.minRnrTimer), pkt.bth.psn);
        } else {
          // UC/UD class D: no receive WQE, drop the message.
          ctx.counters.noRecvWqe++;
          if (ctx.type === 'UC') {
            this.dropMsg = true;
            this.abandonUc(ctx);
          }
        }
        return OK;
      case 'localLength':
        ctx.counters.badLength++;
        this.completeRecv(ctx, rq, pkt, info, 'LOC_LEN_ERR');
        if (ctx.type === 'UC') {
          this.dropMsg = true;
          this.abandonUc(ctx);
        }
        return OK;
      case 'fatal':
        ctx.counters[v.counter]++;
        // Classes A, C, J (9.9.3.1): NAK, complete the receive WQE in progress in error, QP → ERR.
        if (ctx.type === 'RC') this.sendAck(ctx, nakSyndrome(v.nak), pkt.bth.psn);
        if (this.recv) this.completeRecv(ctx, rq, pkt, info, v.status);
        return { kind: 'fatal', reason: v.why };
    }
  }

  /** Duplicates (9.7.4.1.2, C9-104..C9-112). */
  private duplicate(ctx: EngineContext, pkt: RocePacket, info: OpcodeInfo): ResponderOutcome {
    if (info.kind === 'send' || info.kind === 'write') {
      // Not executed again; acknowledge what we have (rxe: the PSN before the expected one).
      this.sendAck(ctx, ackSyndrome(), psnAdd(this.psn, -1));
      return OK;
    }
    const res = this.findResource(pkt.bth.psn);
    if (info.kind === 'readRequest') {
      const r = pkt.reth!;
      // Re-executed, but only as a subset of the original request (C9-112 area); otherwise class D.
      if (!res || res.kind !== 'read' || r.rkey !== res.rkey || r.va < res.va ||
          r.va + BigInt(r.dmaLength) > res.va + BigInt(res.length)) {
        ctx.counters.dupNoResource++;
        return OK;
      }
      for (let i = this.jobs.length - 1; i >= 0; i--) if (this.jobs[i]!.res === res) this.jobs.splice(i, 1);
      if (!this.queueRead(ctx, res, pkt.bth.psn, r.va, r.dmaLength)) {
        ctx.counters.dupNoResource++;
        return OK;
      }
      ctx.counters.dupReadReplay++;
      return OK;
    }
    if (info.kind === 'atomic') {
      // Replayed from the cache, never executed twice (C9-111).
      if (!res || res.kind !== 'atomic' || res.firstPsn !== pkt.bth.psn) {
        ctx.counters.dupNoResource++;
        return OK;
      }
      ctx.counters.dupAtomicReplay++;
      this.sendAtomicAck(ctx, pkt.bth.psn, res.origValue);
      return OK;
    }
    return OK;
  }

  // ---------------------------------------------------------------------------------------
  // Output

  /** Sends the coalesced ACK, if one is waiting. */
  flushAck(ctx: EngineContext): void {
    if (!this.ackPending) return;
    this.ackPending = false;
    this.writeAck(ctx, ackSyndrome(), this.ackPsn, this.ackMsn);
  }

  private sendAck(ctx: EngineContext, syndrome: number, psn: Psn): void {
    this.flushAck(ctx);
    this.writeAck(ctx, syndrome, psn, this.msn);
  }

  private writeAck(ctx: EngineContext, syndrome: number, psn: Psn, msn: number): void {
    const h = ACK_HEADERS;
    const qpn = ctx.attrs.destQpNum;
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
    ctx.transmit(ctx.attrs.dest!, ACK_PARTS);
  }

  private sendAtomicAck(ctx: EngineContext, psn: Psn, orig: bigint): void {
    this.flushAck(ctx);
    const f = this.f;
    f.opcode = RC_ATOMIC_ACK;
    f.destQp = ctx.attrs.destQpNum;
    f.psn = psn;
    f.ackReq = false;
    f.se = false;
    f.padCount = 0;
    f.syndrome = ackSyndrome();
    f.msn = this.msn;
    f.origData = orig;
    clearParts(this.parts);
    this.parts.push(this.hb.build(f));
    ctx.transmit(ctx.attrs.dest!, this.parts);
    clearParts(this.parts); // nothing of this packet stays reachable from the QP
  }

  /** Sends up to `budget` READ response packets (rxe read_reply); returns how many. */
  emitReads(ctx: EngineContext, budget: number): number {
    let sent = 0;
    if (this.jobs.length > 0) this.flushAck(ctx);
    const mtu = ctx.attrs.pathMtu;
    while (sent < budget && this.jobs.length > 0) {
      const job = this.jobs[0]!;
      const n = Math.min(job.resid, mtu);
      const isLast = job.resid <= mtu;
      let opcode: number;
      if (job.fresh && job.fromStart) opcode = isLast ? RESP_ONLY : RESP_FIRST;
      else opcode = isLast ? RESP_LAST : RESP_MIDDLE;
      const f = this.f;
      f.opcode = opcode;
      f.destQp = ctx.attrs.destQpNum;
      f.psn = job.psn;
      f.ackReq = false;
      f.se = false;
      f.padCount = padFor(n);
      f.syndrome = ackSyndrome();
      f.msn = this.msn;
      const parts = this.parts;
      clearParts(parts);
      parts.push(this.hb.build(f));
      if (n > 0) parts.push(job.mr.buffer.subarray(job.off, job.off + n));
      if (f.padCount) parts.push(PAD[f.padCount]!);
      ctx.transmit(ctx.attrs.dest!, parts);
      clearParts(parts);
      sent++;
      job.fresh = false;
      job.psn = psnAdd(job.psn, 1);
      job.off += n;
      job.resid -= n;
      if (isLast) this.jobs.shift();
    }
    return sent;
  }

  private flushReads(ctx: EngineContext): void {
    while (this.jobs.length > 0) this.emitReads(ctx, 1 << 30);
  }
}

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

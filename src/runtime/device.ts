/**
 * The device: binds one `Link` and one `Clock` to the sans-IO core.
 *
 * Read first: IBTA Vol. 1 §9.6 (packet transport header validation: the checks below, in
 * order) and Annex A17 (RoCEv2). rdma_rxe: rxe_recv.c (`rxe_rcv`, `hdr_check`,
 * `check_type_state`, `check_keys`, `check_addr`) and rxe_net.c (source ports).
 *
 * Ingress runs rxe's order: parse (length, version, opcode, header sizes) → QPN lookup → QP type
 * against the opcode's transport → QP state → P_Key → source address against the QP's
 * destination (RC/UC) → Q_Key (UD) → the QP. Every drop is counted by reason; nothing received
 * ever throws.
 *
 * Egress and time: after anything touches a QP, the device asks it `pollAt()` and either runs
 * it on the next event-loop turn (ASAP work; several kicks coalesce into one run) or arms one
 * clock timer for its deadline. On a real clock a posted send is the exception: its QP runs in a
 * microtask, before the event loop turns (`posted`). Only this file (and the links) touch clocks
 * and sockets.
 */

import type { Link, RxMeta } from '../link/link.js';
import { gidOf, normalizeAddress } from '../core/address.js';
import { DeviceNotificationPoint, qpCcState, qpCongestion, type CcOption, type QpCcState } from '../core/cc-hooks.js';
import { newCounters, type Counters } from '../core/counters.js';
import type { RxInfo } from '../core/context.js';
import { CompletionQueue } from '../core/cq.js';
import { RoceError } from '../core/errors.js';
import { DEFAULT_PORT_MTU, DEVICE_LIMITS, FIRST_QPN, MAX_PKTS_PER_POLL } from '../core/limits.js';
import { MrTable, ProtectionDomain } from '../core/mr.js';
import { QueuePair, type QpIo } from '../core/qp.js';
import type { AsyncEvent, Endpoint, QpCap, QpState, QpType, Qpn } from '../core/types.js';
import { DEFAULT_PKEY } from '../wire/constants.js';
import { ACK_LEN, PacketRecord, parsePacket, parsePacketInto, type RocePacket } from '../wire/packet.js';
import { OPCODE, type OpcodeInfo } from '../wire/opcode.js';
import { Gsi } from '../cm/gsi.js';
import { VirtualClock, type Clock, type TimerHandle } from './clock.js';
import { DeadlineHeap } from './deadline-heap.js';

export interface DeviceOptions {
  link: Link;
  clock: Clock;
  /** The port's active MTU (bytes): caps pathMtu and bounds UD messages. Default 4096, or less if the link cannot carry it. */
  mtu?: number;
  /**
   * Called on every QP state change (traces), in order, once the new state's work is done (ERR's
   * flush completions written); it may move the QP again.
   */
  onStateChange?: (qpn: Qpn, from: QpState, to: QpState, reason: string) => void;
  /** Called on every dropped packet with its counter name (traces, tests). */
  onDrop?: (reason: keyof Counters, detail: string) => void;
  /** Congestion control (core/cc-hooks.ts): the RC/UC QPs' default, and whether CNPs are sent. Default 'none'. */
  cc?: CcOption;
}

export interface CreateQpOptions {
  type: QpType;
  pd: ProtectionDomain;
  sendCq: CompletionQueue;
  recvCq: CompletionQueue;
  cap: QpCap;
  sqSigAll: boolean;
  /** This QP's congestion control, instead of the device's. */
  cc?: CcOption;
  /**
   * Only for QP1, the GSI (src/cm/gsi.ts): a QPN below FIRST_QPN asked for by number. Every
   * other QPN comes from the allocator, which starts at FIRST_QPN and wraps back to it, so it
   * never hands out 0 or 1.
   */
  qpn?: Qpn;
}

/** Headers a path-MTU packet needs besides its payload: BTH + RETH/AETH/… + ImmDt + ICRC (rounded up). */
const MAX_HEADER_OVERHEAD = 80;

/**
 * At most this many ready QPs for a batch's ACKs to wait a turn (`answerBatch`): the check touches
 * each of them, and a batch that woke many is a stream, whose ACKs should not wait.
 */
const DEFER_ACK_MAX_QPS = 4;

const RC_ACKNOWLEDGE = OPCODE['RC_ACKNOWLEDGE']!;

export class Device {
  readonly link: Link;
  readonly clock: Clock;
  readonly counters: Counters = newCounters();
  readonly mrs = new MrTable();
  readonly gid: Uint8Array;
  readonly portMtu: number;
  /** Where asynchronous events go; the API layer sets it. */
  onEvent: (ev: AsyncEvent) => void = () => {};
  private readonly opts: DeviceOptions;
  private readonly qps = new Map<Qpn, QueuePair>();
  // A direct-mapped index of the QPs by the low bits of their QPN, as a NIC indexes its QP context
  // table: one array slot per lookup, where the map's buckets and entries were two more cold lines
  // per packet with thousands of QPs. New QPNs skip numbers whose slot is taken, so every QP the
  // allocator numbers has its slot; the map stays the registry, and answers for the rest (a special
  // QPN whose slot was taken). Twice as many slots as QPs: growing keeps distinct slots distinct.
  private qpSlots: (QueuePair | undefined)[] = new Array<QueuePair | undefined>(64).fill(undefined);
  // QP deadlines (ACK, RNR and pacing timers): one heap, and one clock timer for its earliest entry.
  // A timer per QP cost a Timeout, a closure and a map entry each time a QP armed one, which with
  // thousands of QPs is once per message. An entry is live while `qp.timerAt` equals its deadline;
  // anything else is stale and skipped when it comes up.
  private readonly deadlines = new DeadlineHeap<QueuePair>();
  private armed: TimerHandle | undefined;
  private armedAt = Infinity;
  // QPs to run on the next turn, each once (`qp.queued`): an array and a flag on the QP rather than
  // a Set, whose hashing read one more cold line of every QP and whose table was rebuilt after each
  // run's clear. The two arrays swap, so QPs made ready during a run wait for the next one. Each
  // keeps its count apart and is emptied slot by slot: setting an array's length to 0 frees its
  // backing store, and the next run's pushes allocated it again, twice per receive batch.
  private ready: (QueuePair | undefined)[] = [];
  private readyN = 0;
  private spare: (QueuePair | undefined)[] = [];
  private runPending = false;
  private nextQpn = FIRST_QPN;
  private nextHandle = 1;
  private readonly addrCache = new Map<string, string | undefined>();
  private lastAddr: string | undefined;
  private lastNormalized: string | undefined;
  private closed = false;
  private readonly virtual: boolean;
  /** `RxMeta.at` is on this device's clock (see `deliver`). */
  private readonly rxTimeOnClock: boolean;
  private readonly io: QpIo;
  private readonly rxInfo: RxInfo = { srcAddress: '', dstAddress: '', udpLength: 0 };
  /** The record ingress parses into; in use while a packet is delivered (see `receive`). */
  private readonly rxRecord = new PacketRecord();
  private rxRecordInUse = false;
  /** QP1 and the CM agent it feeds; created at open, as a kernel does for every port. */
  readonly gsi: Gsi;

  constructor(opts: DeviceOptions) {
    this.opts = opts;
    this.link = opts.link;
    this.clock = opts.clock;
    this.virtual = opts.clock instanceof VirtualClock;
    this.rxTimeOnClock = opts.link.rxClock !== undefined && opts.link.rxClock === opts.clock;
    this.gid = gidOf(opts.link.local.address);
    const linkMtu = [4096, 2048, 1024, 512, 256].find((m) => m + MAX_HEADER_OVERHEAD <= opts.link.caps.maxDatagram) ?? 256;
    this.portMtu = Math.min(opts.mtu ?? DEFAULT_PORT_MTU, linkMtu);
    if (![256, 512, 1024, 2048, 4096].includes(this.portMtu)) throw new RoceError('ERR_INVALID_ATTR', `port MTU ${this.portMtu} is not 256..4096`);
    this.io = {
      transmit: (dst: Endpoint, srcPort: number, parts: readonly Uint8Array[]) => {
        if (!this.closed) this.link.send(dst, srcPort, parts);
      },
      event: (ev: AsyncEvent) => this.onEvent(ev),
      stateChanged: (qpn, from, to, reason) => this.opts.onStateChange?.(qpn, from, to, reason),
    };
    this.link.onReceive((payload, meta) => this.receive(payload, meta));
    // A receive batch is answered at its end (Link.onReceiveBatchEnd), where the link offers it.
    this.link.onReceiveBatchEnd?.((last) => this.answerBatch(last));
    this.np = DeviceNotificationPoint.create(opts.cc, this.link, this.counters);
    this.gsi = new Gsi(this);
  }

  allocPd(owner: object): ProtectionDomain {
    this.assertOpen();
    return new ProtectionDomain(this.nextHandle++, owner);
  }

  /**
   * Frees a protection domain, as `ibv_dealloc_pd`: refused (ERR_BUSY) while a region registered in
   * it or a QP created in it remains, unless the device is closed (which took everything with it).
   */
  deallocPd(pd: ProtectionDomain): void {
    if (pd.users > 0 && !this.closed) {
      throw new RoceError('ERR_BUSY', `the protection domain still has ${pd.users} region(s) or QP(s): deregister and destroy them first`);
    }
    pd.deallocated = true;
  }

  createCq(cqe: number): CompletionQueue {
    this.assertOpen();
    if (!Number.isInteger(cqe) || cqe < 1 || cqe > DEVICE_LIMITS.maxCqe) {
      throw new RoceError('ERR_INVALID_ATTR', `cqe ${cqe} outside 1..${DEVICE_LIMITS.maxCqe}`);
    }
    return new CompletionQueue(this.nextHandle++, cqe);
  }

  createQp(o: CreateQpOptions): QueuePair {
    this.assertOpen();
    if (o.pd.deallocated) throw new RoceError('ERR_RESOURCE', 'the protection domain was deallocated');
    if (o.sendCq.destroyed || o.recvCq.destroyed) throw new RoceError('ERR_RESOURCE', 'the CQ was destroyed');
    const c = o.cap;
    const lim = (name: string, v: number, max: number): void => {
      if (!Number.isInteger(v) || v < 0 || v > max) throw new RoceError('ERR_INVALID_ATTR', `${name} ${v} outside 0..${max}`);
    };
    lim('maxSendWr', c.maxSendWr, DEVICE_LIMITS.maxQpWr);
    lim('maxRecvWr', c.maxRecvWr, DEVICE_LIMITS.maxQpWr);
    lim('maxSendSge', c.maxSendSge, DEVICE_LIMITS.maxSge);
    lim('maxRecvSge', c.maxRecvSge, DEVICE_LIMITS.maxSge);
    lim('maxInlineData', c.maxInlineData, DEVICE_LIMITS.maxInlineData);
    if (this.qps.size >= DEVICE_LIMITS.maxQp) throw new RoceError('ERR_INVALID_ATTR', 'too many QPs');
    let qpn = this.nextQpn;
    if (o.qpn !== undefined) {
      if (!(o.qpn > 0 && o.qpn < FIRST_QPN) || this.qps.has(o.qpn)) throw new RoceError('ERR_INVALID_ATTR', `QPN ${o.qpn} is not a free special QPN`);
      qpn = o.qpn;
    } else {
      if (2 * (this.qps.size + 1) > this.qpSlots.length) this.growSlots();
      const mask = this.qpSlots.length - 1;
      while (this.qps.has(qpn) || this.qpSlots[qpn & mask] !== undefined) qpn = qpn >= 0xffffff ? FIRST_QPN : qpn + 1;
      this.nextQpn = qpn >= 0xffffff ? FIRST_QPN : qpn + 1;
    }
    const qp = new QueuePair({
      qpn, type: o.type, pd: o.pd, mrs: this.mrs, counters: this.counters, sendCq: o.sendCq, recvCq: o.recvCq,
      cap: c, sqSigAll: o.sqSigAll, portMtu: this.portMtu, io: this.io,
    });
    qp.cc = qpCongestion(o.cc ?? this.opts.cc, qp, this.virtual, this.clock.now());
    this.qps.set(qpn, qp);
    const slot = qpn & (this.qpSlots.length - 1);
    if (this.qpSlots[slot] === undefined) this.qpSlots[slot] = qp;
    qp.attached = true;
    o.pd.users++;
    o.sendCq.users++;
    o.recvCq.users++;
    return qp;
  }

  private growSlots(): void {
    const slots = new Array<QueuePair | undefined>(this.qpSlots.length * 2).fill(undefined);
    const mask = slots.length - 1;
    for (const q of this.qpSlots) if (q !== undefined) slots[q.qpn & mask] = q;
    this.qpSlots = slots;
  }

  private lookupQp(qpn: Qpn): QueuePair | undefined {
    const q = this.qpSlots[qpn & (this.qpSlots.length - 1)];
    return q !== undefined && q.qpn === qpn ? q : this.qps.get(qpn);
  }

  /**
   * Destroys a CQ, as `ibv_destroy_cq`: refused (ERR_BUSY) while a QP that uses it remains, unless
   * the device is closed.
   */
  destroyCq(cq: CompletionQueue): void {
    if (cq.users > 0 && !this.closed) {
      throw new RoceError('ERR_BUSY', `the CQ is still the send or receive CQ of a QP (${cq.users} use(s)): destroy the QP first`);
    }
    cq.destroyed = true;
  }

  destroyQp(qp: QueuePair): void {
    if (this.qps.get(qp.qpn) !== qp) return; // destroyed already (or not this device's)
    // The coalesced ACK of the last receive batch still goes out, as it would have at once.
    if (!this.closed) qp.responder.flushAck(qp);
    qp.respAckPending = false; // on a closed device, dropped: its link is gone
    this.cancel(qp);
    qp.queued = false; // left in the ready (or posted) queue, where a detached QP is skipped
    this.qps.delete(qp.qpn);
    const slot = qp.qpn & (this.qpSlots.length - 1);
    if (this.qpSlots[slot] === qp) this.qpSlots[slot] = undefined;
    qp.attached = false;
    qp.pd.users--;
    qp.sendCq.users--;
    qp.recvCq.users--;
    // RESET lets its work go (no completions, as ibv_destroy_qp) and ends every loop of its engines
    // that the destroy may have been called from (a link's or trace hook's, inside a send).
    if (qp.state !== 'RESET') qp.setState('RESET', 'destroyed');
  }

  qp(qpn: Qpn): QueuePair | undefined {
    return this.lookupQp(qpn);
  }

  /** Time on the device's clock, µs. */
  now(): number {
    return this.clock.now();
  }

  /**
   * The time a post to `qp` is made at. On a real clock a post only queues work: the run it starts
   * (`posted`) reads the clock before the QP decides anything, so the QP's last reading serves, and
   * the clock is not read per message (a reading was 5 % of a message's cost on the initiator). On a
   * virtual clock the post is an event at the current instant.
   */
  postTime(qp: QueuePair): number {
    return this.virtual ? this.clock.now() : qp.lastNow;
  }

  /**
   * Re-evaluates when `qp` needs to run; call after anything changed it. `now` may be a reading
   * taken a moment earlier (by the caller that just ran the QP): a deadline that passed since is
   * then armed rather than run at once, which costs a timer and not a wrong answer.
   */
  kick(qp: QueuePair, now: number = this.clock.now()): void {
    // Flags on the QP rather than map probes: with thousands of QPs a map's entry is one more cold
    // cache line per kick. A QP in the ready queue runs on the next turn, and that run kicks it
    // again: nothing to decide before then.
    if (this.closed || !qp.attached || qp.queued) return;
    const t = qp.pollAt();
    // Nothing to wait for (the last message was acknowledged): the QP's entry, if it has one, stays
    // live. Its next message arms an ACK deadline later than it, which keeps it (below); when it comes
    // up the QP polls, finds nothing due and re-arms for its real deadline. Marking it stale here meant
    // a heap entry per message for a QP with one message in flight at a time (every QP, with thousands
    // of them, and a ping-pong's), each popped stale later by reading the QP, cold by then.
    if (t === undefined) return;
    if (t <= now) {
      // The entry stays: a QP with traffic becomes ready once per message and will want its ACK
      // deadline again; an early wake-up is a no-op poll that re-arms for the real deadline.
      qp.queued = true;
      this.ready[this.readyN++] = qp;
      this.deferRun();
      return;
    }
    // An entry for this deadline or an earlier one is kept: most kicks move the ACK deadline a
    // little later (every ACK restarts it), and a heap entry per ACK would cost more than the odd
    // early wake-up, which polls, finds nothing due and re-arms (runQp → kick).
    if (qp.timerAt >= 0 && qp.timerAt <= t) return;
    qp.timerAt = t;
    this.deadlines.push(t, qp);
    if (t < this.armedAt) this.arm(t);
  }

  /**
   * After a post to `qp`'s send queue: on a real clock a QP with work to do now runs in a microtask,
   * before control returns to the event loop, and its datagrams leave with the flush that ends this
   * stretch of JavaScript, as rxe_post_send runs the requester in the posting process's context
   * ("utilize process context to do protocol processing"). Left to the next event-loop turn (a
   * `kick`), every message waited one turn on each side of a ping-pong: a third of its round trip.
   * Posts made in one stretch (a loop over completions) still share one run, and a microtask never
   * runs inside an engine's call: a post from a completion hook waits for the engine to return.
   * A virtual clock keeps its runs as scheduled events, in order.
   */
  posted(qp: QueuePair, now: number): void {
    if (this.virtual) return this.kick(qp, now);
    // A post is work to do now, unless the requester is blocked (its window, a fence, an RNR wait,
    // its pacing): the run's poll finds that out and its kick arms what the QP waits for. Asking
    // `pollAt` here too read the send queue and its WQE a second time per message, and with
    // thousands of QPs each post is to another QP.
    //
    // A QP already in the ready queue (its ACK waits for the answer to the receive batch that
    // completed the request being answered, or for the immediate after the application's) runs in
    // the microtask too, and its entry there is then skipped: the reply and the ACK leave together
    // either way, without waiting for that answer or that immediate this way.
    if (this.closed || !qp.attached || qp.postQueued) return;
    qp.queued = true;
    qp.postQueued = true;
    this.postedQps[this.postedN++] = qp;
    if (this.postedN === 1) queueMicrotask(this.postRunTask);
  }

  // Posted QPs wait in a queue of their own: the microtask runs only them. The ready queue may hold a
  // QP whose ACK deadline passed on this turn's timers; it must run after the turn has read its
  // input (QueuePair.poll: a response already waiting counts), not before.
  private postedQps: (QueuePair | undefined)[] = [];
  private postedN = 0;
  private postedSpare: (QueuePair | undefined)[] = [];
  private readonly postRunTask = (): void => {
    const batch = this.postedQps;
    const n = this.postedN;
    this.postedQps = this.postedSpare;
    this.postedN = 0;
    for (let i = 0; i < n; i++) batch[i]!.postQueued = false;
    try {
      this.runBatch(batch, n);
    } finally {
      this.postedSpare = batch; // emptied by runBatch, also when it throws
    }
  };

  private cancel(qp: QueuePair): void {
    qp.timerAt = -1; // its heap entry, if any, is now stale
  }

  private arm(t: number): void {
    this.armed?.cancel();
    this.armedAt = t;
    this.armed = this.clock.at(t, this.onTimer);
  }

  /** The device timer: runs every QP whose deadline has come, then re-arms for the next one. */
  private readonly onTimer = (): void => {
    this.armed = undefined;
    this.armedAt = Infinity;
    if (this.closed) return;
    const now = this.clock.now();
    const d = this.deadlines;
    try {
      this.runDue(d, now);
    } finally {
      // Re-armed for what is left also when the application's code threw from inside a QP's run.
      const next = d.topAt();
      if (!this.closed && next !== undefined && next < this.armedAt) this.arm(next);
    }
  };

  private runDue(d: DeadlineHeap<QueuePair>, now: number): void {
    let read = false;
    for (let at = d.topAt(); at !== undefined && at <= now; at = d.topAt()) {
      const qp = d.pop()!;
      if (qp.timerAt !== at) continue;
      qp.timerAt = -1;
      // Before an ACK timer is judged, what has arrived is read: an ACK waiting in the socket is
      // progress (9.7.6.1), not a timeout. Node runs the timers before it reads (the poll phase),
      // and the QP's deferred decision would run here, before that. Most expiries are not that (a
      // deadline moved later since it was armed) and read nothing early.
      if (!read && qp.ackOverdue(now)) {
        read = true;
        this.link.readWaiting?.();
        if (this.closed) return;
      }
      // The reading the deadlines were judged by, one for every entry that came up (as `runBatch`
      // does): with thousands of QPs, most of them come up only to re-arm, and each read the clock.
      this.runQp(qp, now);
    }
  }

  private deferRun(): void {
    if (this.runPending) return;
    this.runPending = true;
    // A virtual clock runs it at the current instant, deterministically; a real one on the
    // next event-loop turn, so that received datagrams get their turn between bursts.
    if (this.virtual) this.clock.at(this.clock.now(), this.runTask);
    else setImmediate(this.runTask);
  }

  /**
   * The answer to a receive batch: the ready QPs run. When the read is over and all a few QPs have
   * to send is an ACK for data that completed nothing (RDMA WRITEs, which the application sees
   * only by polling memory), the run waits for `runTask`, an immediate queued when they became
   * ready, which runs after the application's own immediates: a reply posted from a polling loop
   * then runs the QP in the posting microtask (`posted`) and leaves with the ACK, as a reply posted
   * from a completion does. Mid-read answers and anything else go at once.
   */
  private answerBatch(last: boolean): void {
    const ready = this.ready;
    const n = this.readyN;
    if (last && this.runPending && n <= DEFER_ACK_MAX_QPS) {
      let ackOnly = true;
      for (let i = 0; i < n && ackOnly; i++) {
        const qp = ready[i]!;
        ackOnly = !qp.queued || qp.onlyAckDue();
      }
      if (ackOnly) return;
    }
    this.runReady();
  }

  private readonly runTask = (): void => {
    this.runPending = false;
    this.runReady();
  };

  /** Runs every QP that is ready, once: the queue is swapped for an empty one, so QPs made ready meanwhile wait for the next run. */
  private runReady(): void {
    const n = this.readyN;
    if (n === 0) return;
    const batch = this.ready;
    // A run inside a run (a link that delivers at once answers a batch from inside a send) takes
    // the spare array the outer run is filling: the QPs it makes ready go to a new one.
    const nested = this.runningReady;
    this.ready = nested ? [] : this.spare;
    this.readyN = 0;
    this.runningReady = true;
    try {
      this.runBatch(batch, n);
    } finally {
      if (!nested) {
        this.runningReady = false;
        this.spare = batch;
      }
    }
  }

  /** `runReady` is under way: its batch is out of the queue, and `ready` is the spare array. */
  private runningReady = false;

  /** Runs the first `n` QPs of `batch` and empties their slots. */
  private runBatch(batch: (QueuePair | undefined)[], n: number): void {
    // One clock reading for the batch: with one message per QP a reading per QP was a tenth of the
    // run's cost. The QPs see the time the batch started; a deadline that passes during the batch
    // is armed instead of run at once (see kick).
    const now = this.clock.now();
    let i = 0;
    try {
      for (; i < n; i++) {
        const qp = batch[i]!;
        batch[i] = undefined;
        if (!qp.queued) continue; // destroyed since
        qp.queued = false;
        this.runQp(qp, now);
      }
    } finally {
      // The application's code threw from inside a QP's run (a completion handler, a link): the QPs
      // after it keep their turn, on the next run, and the exception goes on to the caller.
      if (i < n) this.requeue(batch, i + 1, n);
    }
  }

  /** The QPs of a batch that had not run when one of them threw, back in the ready queue. */
  private requeue(batch: (QueuePair | undefined)[], from: number, n: number): void {
    for (let k = from; k < n; k++) {
      const qp = batch[k]!;
      batch[k] = undefined;
      if (qp.queued) this.ready[this.readyN++] = qp;
    }
    if (this.readyN > 0) this.deferRun();
  }

  private runQp(qp: QueuePair, now: number = this.clock.now()): void {
    if (this.closed || !qp.attached) return;
    try {
      qp.poll(now, MAX_PKTS_PER_POLL);
    } catch (e) {
      // The application's code threw from inside the run: the QP is still scheduled for what it has left.
      this.kick(qp, now);
      throw e;
    }
    this.kick(qp, now);
  }

  /** Ingress, in rxe_rcv's order. Never throws. */
  receive(payload: Uint8Array, meta: RxMeta): void {
    if (this.closed) return;
    if (this.usualAck(payload, meta)) return;
    // Parsed into one reused record: the engines read a packet only during the call and copy what
    // they keep (payload into memory, RETH fields into the QP). A receive nested in that call (a
    // completion hook feeding the device at once) gets records of its own.
    if (!this.rxRecordInUse) {
      const info = parsePacketInto(payload, 0, payload.length, this.rxRecord);
      if (info !== undefined) {
        this.rxRecordInUse = true;
        try {
          this.deliver(payload, meta, this.rxRecord, info);
        } finally {
          this.rxRecordInUse = false;
        }
        return;
      }
    }
    const parsed = parsePacket(payload, 0, payload.length);
    if (!parsed.ok) return this.drop('malformed', `${parsed.error}: ${parsed.detail}`);
    this.deliver(payload, meta, parsed.packet, parsed.info);
  }

  /**
   * With many connections every message gets an ACK of its own, and most are the usual one: a plain
   * ACK from a QP's peer that retires its oldest WQE. That case is read straight from the bytes and
   * handed to the QP (`QueuePair.onAck`), without the general path's record and dispatch. Anything
   * else — another opcode, a QP that would refuse it, a NAK, an ACK of several messages — returns
   * false having changed nothing, and takes the general path, which drops and counts what it must.
   */
  private usualAck(b: Uint8Array, meta: RxMeta): boolean {
    // Opcode, then PadCnt and TVer (0), as a parse checks them.
    if (b.length !== ACK_LEN || b[0] !== RC_ACKNOWLEDGE || (b[1]! & 0x3f) !== 0) return false;
    const qp = this.lookupQp((b[5]! << 16) | (b[6]! << 8) | b[7]!);
    if (qp === undefined || qp.type !== 'RC') return false;
    const st = qp.state;
    if ((st !== 'RTS' && st !== 'SQD') || (((b[2]! << 8) | b[3]!) & 0x7fff) !== (DEFAULT_PKEY & 0x7fff)) return false;
    if (this.normalize(meta.src.address) !== qp.dest?.address) return false;
    const now = this.rxTimeOnClock ? meta.at : this.clock.now();
    try {
      if (!qp.onAck(now, (b[9]! << 16) | (b[10]! << 8) | b[11]!, b[12]!)) return false;
    } catch (e) {
      this.counters.rcvdPkts++;
      this.kick(qp, now); // a completion's handler threw: as in `deliver`
      throw e;
    }
    this.counters.rcvdPkts++;
    this.kick(qp, now);
    return true;
  }

  /** What follows the parse: QPN lookup, QP type, state, P_Key, address or Q_Key, then the QP. */
  private deliver(payload: Uint8Array, meta: RxMeta, pkt: RocePacket, info: OpcodeInfo): void {
    const c = this.counters;
    if (info.transport === 'CNP') {
      c.cnpRcvd++;
      this.feedCnp(pkt.bth.destQp, meta);
      return;
    }
    const qp = this.lookupQp(pkt.bth.destQp);
    if (!qp) return this.drop('noQp', `no QP 0x${pkt.bth.destQp.toString(16)}`);
    // check_type_state: the opcode's transport must be the QP's (9.6.1.2.1).
    if (info.transport !== qp.type) return this.drop('badTransport', `${info.name} to a ${qp.type} QP`);
    const st = qp.state;
    if (info.request ? !(st === 'RTR' || st === 'RTS' || st === 'SQD' || st === 'SQE') : !(st === 'RTS' || st === 'SQD')) {
      return this.drop('badState', `${info.name} to a QP in ${st}`);
    }
    // check_keys (9.6.1.2.2): our one P_Key is the default, 0xffff, a full member. Two keys match
    // when their low 15 bits agree and at least one is a full member (10.9.3), so the default
    // partition's limited-member key 0x7fff matches too (rxe accepts it); nothing else does.
    if ((pkt.bth.pkey & 0x7fff) !== (DEFAULT_PKEY & 0x7fff)) return this.drop('badPkey', `P_Key 0x${pkt.bth.pkey.toString(16)}`);
    if (qp.type === 'UD') {
      // Q_Key (10.2.5): a datagram must carry the receiving QP's Q_Key.
      if ((pkt.deth!.qkey >>> 0) !== (qp.attrs.qkey >>> 0)) return this.drop('badQkey', `Q_Key 0x${pkt.deth!.qkey.toString(16)}`);
    } else {
      // check_addr: a connected QP hears only its peer.
      const src = this.normalize(meta.src.address);
      if (src === undefined || src !== qp.attrs.dest?.address) return this.drop('badAddr', `from ${meta.src.address}`);
    }
    c.rcvdPkts++;
    // The link's receive time when it is on this clock: one reading per batch, not per packet.
    // It is earlier than the clock by the batch's work so far, well under a millisecond (the
    // link refreshes it every 32 datagrams); timers armed from it run that much early, within
    // what a kernel timer's jiffy would round.
    const now = this.rxTimeOnClock ? meta.at : this.clock.now();
    if (this.np !== undefined && info.request) this.np.onRequest(qp, payload, meta, now, pkt.deth?.srcQp);
    // One record for every packet: the engines read it during the call only (the GRH of a UD receive).
    const rx = this.rxInfo;
    rx.srcAddress = meta.src.address;
    rx.dstAddress = this.link.local.address;
    rx.udpLength = payload.length;
    try {
      qp.onPacket(now, pkt, info, rx);
    } catch (e) {
      // The application's code threw from inside (a receive's completion handler): the QP still
      // gets its run for what the packet left it (the ACK of what it completed).
      this.kick(qp, now);
      throw e;
    }
    this.kick(qp, now);
  }

  // --- congestion control (core/cc-hooks.ts) ------------------------------------------------

  /** The NP: sends CNPs for marked requests; undefined when the device sends none. */
  private readonly np: DeviceNotificationPoint | undefined = undefined;

  /** A CNP for `qpn` feeds that QP's RP, if it has one and the CNP came from its peer. */
  private feedCnp(qpn: Qpn, meta: RxMeta): void {
    const qp = this.lookupQp(qpn);
    if (qp?.cc === undefined || qp.type === 'UD' || this.normalize(meta.src.address) !== qp.attrs.dest?.address) return;
    qp.cc.onCnp(this.clock.now());
    this.kick(qp);
  }

  /** `qp`'s congestion state: its rate, CNPs both ways, marked packets received. */
  ccState(qp: QueuePair): QpCcState {
    return qpCcState(qp, this.np, this.clock.now());
  }

  // ---------------------------------------------------------------------------------------

  private drop(reason: keyof Counters, detail: string): void {
    this.counters[reason]++;
    this.opts.onDrop?.(reason, detail);
  }

  private normalize(address: string): string | undefined {
    // Links hand every datagram of one peer the same address string: the last answer is kept
    // outside the map, which otherwise costs two lookups per packet.
    if (address === this.lastAddr) return this.lastNormalized;
    const n = this.addrCache.has(address) ? this.addrCache.get(address) : this.normalizeNew(address);
    this.lastAddr = address;
    this.lastNormalized = n;
    return n;
  }

  private normalizeNew(address: string): string | undefined {
    const n = normalizeAddress(address);
    if (this.addrCache.size > 1024) this.addrCache.clear();
    this.addrCache.set(address, n);
    return n;
  }

  /** Counters, with the link's ICRC drops folded in. */
  snapshot(): Counters {
    const c = { ...this.counters };
    c.icrcErr = this.link.drops.badIcrc;
    return c;
  }

  private assertOpen(): void {
    if (this.closed) throw new RoceError('ERR_DEVICE_CLOSED', 'the device is closed');
  }

  get isClosed(): boolean {
    return this.closed;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    // Coalesced ACKs still waiting go out before the link closes: for the end of the receive batch,
    // or, when the close comes from the application's code inside the engine (a receive's completion
    // handler), for the run of a QP not in any queue yet. Their requests completed here; unanswered,
    // the peer would retry them into a closed device and fail them.
    for (const qp of this.qps.values()) {
      if (qp.respAckPending) qp.responder.flushAck(qp);
      if (this.closed) return; // closed from inside that send
    }
    const waiting = [...this.ready.slice(0, this.readyN), ...this.postedQps.slice(0, this.postedN)] as QueuePair[];
    this.closed = true;
    this.gsi.close();
    this.armed?.cancel();
    this.armed = undefined;
    for (const qp of this.deadlines.values()) qp.timerAt = -1;
    this.deadlines.clear();
    for (const qp of waiting) qp.queued = false;
    this.ready.fill(undefined);
    this.postedQps.fill(undefined);
    this.readyN = 0;
    this.postedN = 0;
    await this.link.close();
  }
}

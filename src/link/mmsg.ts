/**
 * Batched datagram I/O for `UdpLink`: `sendmmsg` with UDP GSO trains, and `recvmmsg`, on the
 * link's own sockets (the addon's calls where it is built, else koffi's: `sockopt.ts`,
 * `batchIoFfi`), into native memory the kernel is given once.
 *
 * Why (bench/README.md, "what mattered", has the figures): `node:dgram` costs one syscall, one
 * JavaScript-to-C++ crossing and, on receive, a fresh 64 KiB allocation, a `Buffer`, an address
 * string and a callback with its microtask checkpoint per datagram. Over loopback the `dgram`
 * receiver saturates first; batched, RC WRITE of 4 KiB at path MTU 4096 went from 6.44 to 14.14
 * Gbit/s and READ from 3.58 to 7.48 (`rc.bench.js --quick`). On the send side one `sendmsg`
 * carrying a GSO train (`UDP_SEGMENT`) hands the kernel up to 64 datagrams of one size as one
 * buffer, and `sendmmsg` carries many such messages per call.
 *
 * The rules the stack depends on:
 * - Order. Datagrams of one socket leave in the order `send` was called: every send of a socket
 *   goes into its queue, and a queue that the kernel would not take (EAGAIN) is handed to the
 *   `dgram` socket, which keeps order with its own queue (`UdpLink.send` checks it first).
 * - IP ID. The kernel numbers the segments of a GSO train ID, ID + 1, … (`inet_gso_segment`) from
 *   the ID of the train's skb, which is 0 for an unconnected DF socket. So segment `k` of a train
 *   leaves with ID `k`, and its ICRC is computed for that ID (`TxTrain.nextId`): strict peers that
 *   see the IP header (rdma_rxe, Wireshark) verify it; UDP-socket receivers recover it (`recover`,
 *   the default). A datagram sent alone still leaves with ID 0.
 * - When. A queue is flushed at the end of the current JavaScript task (a microtask), when it is
 *   full, and before the link closes: what the engines send in one run leaves in one call.
 * - Memory. Received datagrams are views of a ring slot, valid until the handler returns (the
 *   `Link` contract). Slots are `RX_SLOT` bytes, above any RoCEv2 packet (≤ 4 KiB path MTU plus
 *   headers); a longer datagram is truncated by the kernel, and counted as not RoCE.
 *
 * Struct layouts are those of Linux LP64 (x86-64, arm64, the platforms koffi ships for):
 * `struct mmsghdr` is a 56-byte `msghdr` and a 4-byte `msg_len`, padded to 64.
 */

import { icrcAddon } from '../wire/addon.js';
import { UDP_GRO, type BatchIoFfi } from './sockopt.js';

const MMSG = 64;
const OFF_NAME = 0;
const OFF_NAMELEN = 8;
const OFF_IOV = 16;
const OFF_IOVLEN = 24;
const OFF_CONTROL = 32;
const OFF_CONTROLLEN = 40;
const OFF_FLAGS = 48;
const OFF_LEN = 56;
const IOV = 16;
/** CMSG_SPACE(sizeof(uint16_t)): a 16-byte `cmsghdr`, 2 bytes of data, aligned to 8. */
const CMSG = 24;
const CMSG_LEN_U16 = 18;
/** Room for a `sockaddr_in6` (28 bytes), kept 8-aligned. */
const SOCKADDR = 32;
const AF_INET = 2;
const AF_INET6 = 10;
const SOL_UDP = 17;
const UDP_SEGMENT = 103;
const MSG_DONTWAIT = 0x40;
const MSG_TRUNC = 0x20;
const EAGAIN = 11;
const EINTR = 4;

/** Messages per `sendmmsg`/`recvmmsg` call. */
export const BATCH = 64;
/** Segments per GSO train: the kernel's UDP_MAX_SEGMENTS on every kernel that has UDP GSO. */
export const MAX_SEGMENTS = 64;
/**
 * Smallest datagram that starts a train: any RoCEv2 packet (BTH + ICRC). Trains of small datagrams
 * (READ requests, ACKs) used to measure slower than separate messages, while receivers had the
 * kernel cut every train (RC READ 4 KiB at MTU 4096: 187 k READs/s with them, 214 k without). With
 * UDP_GRO at the receiver (`RxRing`, on by default on loopback, where trains are) a train is one
 * message end to end, and the same case went from 257 k to 410 k READs/s (bench/README.md).
 */
export const MIN_TRAIN_DATAGRAM = 16;
/** Bytes per train: the UDP payload of one IPv4 datagram, less room for the headers. */
const MAX_TRAIN_BYTES = 65507 - 128;
/** Receive slot: above the largest RoCEv2 UDP payload (4096 + BTH + RETH + ImmDt + ICRC = 4132). */
export const RX_SLOT = 9216;
/** Receive slot with UDP GRO: the largest UDP payload, which is what a coalesced train can be. */
export const RX_SLOT_GRO = 65536;
/** The most segments the kernel puts in one UDP GRO train (UDP_GRO_CNT_MAX). */
const MAX_CACHED_SEGMENTS = 64;

/** CMSG_SPACE(sizeof(int)): room for the UDP_GRO segment size. */
const CMSG_INT = 24;
/** Datagrams read per readiness callback before other work gets its turn. */
const RX_BUDGET = 4 * BATCH;
/**
 * Datagrams delivered between two `after` calls (where the device answers what it received and the
 * answers are flushed). Answering only at the end of a `recvmmsg` of 64 messages, each of which can
 * be a GRO train of 64 datagrams, held a peer's ACKs back until everything in the socket had been
 * processed: the two ends took turns instead of working at once.
 */
const ANSWER_EVERY = 32;
/** Messages per `recvmmsg` when they can be GRO trains of up to 64 datagrams each. */
const GRO_BATCH = 16;

const isLittleEndian = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

/**
 * Writes a pointer or size_t. User-space addresses are below 2^47, so a double holds them exactly,
 * and two 32-bit stores avoid a BigInt per field on the send path.
 */
function setWord(dv: DataView, off: number, v: number): void {
  const lo = v % 0x1_0000_0000;
  const hi = (v - lo) / 0x1_0000_0000;
  if (isLittleEndian) {
    dv.setUint32(off, lo, true);
    dv.setUint32(off + 4, hi, true);
  } else {
    dv.setUint32(off, hi, false);
    dv.setUint32(off + 4, lo, false);
  }
}

/** A destination in sockaddr form, built once per address and port. */
export interface TxDest {
  address: string;
  port: number;
  /** 4 or 16 address bytes. */
  addr: Uint8Array;
}

/**
 * What a queue hands back when the kernel will not take a message (EAGAIN): each datagram (a copy),
 * with its index in its train, whose ICRC was computed for IP ID = that index.
 */
export type TxSpill = (dst: TxDest, datagram: Uint8Array, trainIndex: number) => void;

/**
 * Writes the ICRCs of a queue's messages `from … to - 1`, all to `dst`, into the ring before they
 * leave: `desc` is the queue's (`TxQueue.desc`), three runs of `BATCH` words (offset in the ring,
 * length, segment length), and segment k of a message leaves with IPv4 ID k (`IcrcFlowKey.trains`).
 */
export type TxSeal = (dst: TxDest, desc: Int32Array, from: number, to: number) => void;

/**
 * The send queue of one socket: up to `BATCH` messages, each one datagram or a GSO train of
 * datagrams of one size (the last may be shorter), their bytes in the shared `TxRing`.
 */
export class TxQueue {
  private readonly mem: { address: bigint; view: ArrayBuffer };
  /** The message vector as the FFI passes it (a typed array's memory is passed as the pointer). */
  private readonly vec: Uint8Array;
  private readonly dv: DataView;
  private readonly base: number;
  /** JavaScript-side record of each message, for the spill path. */
  private readonly dsts: (TxDest | undefined)[] = new Array<TxDest | undefined>(BATCH).fill(undefined);
  /**
   * Each message's offset in the ring, length and segment length, as three runs of `BATCH` words in one
   * array: the form `seal` takes (`TxSeal`), so that one native call covers a flush's messages.
   */
  readonly desc = new Int32Array(3 * BATCH);
  private readonly at = this.desc.subarray(0, BATCH);
  private readonly bytes = this.desc.subarray(BATCH, 2 * BATCH);
  private readonly segLen = this.desc.subarray(2 * BATCH);
  private readonly segs = new Int32Array(BATCH);
  private n = 0;
  /** The last message can take another segment (same destination, contiguous, full-size so far). */
  private open = false;
  /** The train index of the datagram `add` placed last: the IPv4 ID it will leave with. */
  index = 0;
  /** In its ring's list of queues to flush (`TxRing.pending`). */
  listed = false;

  constructor(
    private readonly ffi: BatchIoFfi,
    readonly fd: number,
    private readonly ring: TxRing,
    private readonly gso: boolean,
    private readonly spill: TxSpill,
    /** The ICRCs, written at the flush for all the messages queued (undefined: the datagrams carry theirs). */
    private readonly seal?: TxSeal,
  ) {
    this.mem = ffi.alloc(BATCH * (MMSG + IOV + CMSG + SOCKADDR));
    this.vec = new Uint8Array(this.mem.view);
    this.dv = new DataView(this.mem.view);
    this.base = Number(this.mem.address);
    for (let i = 0; i < BATCH; i++) {
      const m = i * MMSG;
      setWord(this.dv, m + OFF_NAME, this.base + this.nameOff(i));
      setWord(this.dv, m + OFF_IOV, this.base + this.iovOff(i));
      setWord(this.dv, m + OFF_IOVLEN, 1);
      const c = this.cmsgOff(i);
      setWord(this.dv, c, CMSG_LEN_U16);
      this.dv.setInt32(c + 8, SOL_UDP, isLittleEndian);
      this.dv.setInt32(c + 12, UDP_SEGMENT, isLittleEndian);
    }
  }

  get pending(): number {
    return this.n;
  }

  private nameOff(i: number): number {
    return BATCH * (MMSG + IOV + CMSG) + i * SOCKADDR;
  }

  private iovOff(i: number): number {
    return BATCH * MMSG + i * IOV;
  }

  private cmsgOff(i: number): number {
    return BATCH * (MMSG + IOV) + i * CMSG;
  }

  /**
   * Reserves `len` bytes for one datagram to `dst` and returns its offset in the ring (its train
   * index, the IP ID it will leave with, is then in `index`), or -1 when the ring has no room even
   * after a flush. The caller writes the datagram there at once.
   */
  add(dst: TxDest, len: number): number {
    const ring = this.ring;
    if (this.open && this.n > 0) {
      const i = this.n - 1;
      const seg = this.segLen[i]!;
      if (this.dsts[i] === dst && len <= seg && this.segs[i]! < MAX_SEGMENTS && this.bytes[i]! + len <= MAX_TRAIN_BYTES && ring.canExtend(this.at[i]! + this.bytes[i]!, len)) {
        const at = ring.take(len);
        this.index = this.segs[i]!;
        this.bytes[i] = this.bytes[i]! + len;
        this.segs[i] = this.index + 1;
        // Only the last segment may be shorter: a short one closes the train.
        if (len < seg) this.open = false;
        return at;
      }
    }
    if (this.n === BATCH) this.flush();
    let at = ring.tryTake(len);
    if (at < 0) {
      ring.flushAll();
      at = ring.tryTake(len);
      if (at < 0) return -1;
    }
    const i = this.n++;
    this.dsts[i] = dst;
    this.at[i] = at;
    this.bytes[i] = len;
    this.segLen[i] = len;
    this.segs[i] = 1;
    this.open = this.gso && len >= MIN_TRAIN_DATAGRAM;
    this.writeName(i, dst);
    ring.pending(this);
    this.index = 0;
    return at;
  }

  private writeName(i: number, dst: TxDest): void {
    const o = this.nameOff(i);
    const dv = this.dv;
    const u8 = this.vec;
    const v4 = dst.addr.length === 4;
    dv.setUint16(o, v4 ? AF_INET : AF_INET6, isLittleEndian);
    dv.setUint16(o + 2, dst.port, false);
    if (v4) {
      u8.set(dst.addr, o + 4);
      u8.fill(0, o + 8, o + 16);
    } else {
      dv.setUint32(o + 4, 0); // flowinfo
      u8.set(dst.addr, o + 8);
      dv.setUint32(o + 24, 0); // scope id: link-local peers with a zone take the dgram path
    }
    dv.setUint32(i * MMSG + OFF_NAMELEN, v4 ? 16 : 28, isLittleEndian);
  }

  /** Hands every queued message to the kernel; what it will not take goes to `spill`, in order. */
  flush(): void {
    const n = this.n;
    if (n === 0) return;
    this.n = 0;
    this.open = false;
    const seal = this.seal;
    if (seal !== undefined) {
      // One call per run of messages to one destination: one for a flush to a single peer.
      const dsts = this.dsts;
      for (let i = 0; i < n; ) {
        const d = dsts[i]!;
        let j = i + 1;
        while (j < n && dsts[j] === d) j++;
        seal(d, this.desc, i, j);
        i = j;
      }
    }
    const dv = this.dv;
    const base = this.ring.base;
    for (let i = 0; i < n; i++) {
      const m = i * MMSG;
      const iov = this.iovOff(i);
      setWord(dv, iov, base + this.at[i]!);
      setWord(dv, iov + 8, this.bytes[i]!);
      if (this.segs[i]! > 1) {
        const c = this.cmsgOff(i);
        dv.setUint16(c + 16, this.segLen[i]!, isLittleEndian);
        setWord(dv, m + OFF_CONTROL, this.base + c);
        setWord(dv, m + OFF_CONTROLLEN, CMSG);
      } else {
        setWord(dv, m + OFF_CONTROL, 0);
        setWord(dv, m + OFF_CONTROLLEN, 0);
      }
    }
    let done = 0;
    while (done < n) {
      const r = this.ffi.sendmmsg(this.fd, done === 0 ? this.vec : this.vec.subarray(done * MMSG), n - done, MSG_DONTWAIT);
      if (r > 0) {
        done += r;
        continue;
      }
      const errno = this.ffi.errno();
      if (errno === EINTR) continue;
      if (errno === EAGAIN) break;
      // The first message was refused (EMSGSIZE, ENETUNREACH, …): it is lost, as a datagram may be.
      this.ring.refused(this.segs[done]!);
      done++;
    }
    for (let i = done; i < n; i++) this.spillMessage(i);
    for (let i = 0; i < n; i++) this.dsts[i] = undefined;
  }

  private spillMessage(i: number): void {
    const dst = this.dsts[i]!;
    const seg = this.segLen[i]!;
    let at = this.at[i]!;
    let left = this.bytes[i]!;
    for (let k = 0; left > 0; k++) {
      const len = Math.min(seg, left);
      this.spill(dst, this.ring.bytes.slice(at, at + len), k);
      at += len;
      left -= len;
    }
  }

}

/**
 * The bytes of every queued datagram of one link, in native memory: taken from the start again
 * whenever nothing is queued (so it stays hot in cache), flushed whole when it fills.
 */
export class TxRing {
  readonly bytes: Uint8Array;
  /** The address of `bytes[0]`. */
  readonly base: number;
  private readonly mem: { address: bigint; view: ArrayBuffer };
  private next = 0;
  /**
   * The queues with messages, each once (`TxQueue.listed`), in the order they got their first. An array
   * and a flag rather than a Set: iterating and clearing a Set cost ~120 ns per flush even when empty
   * (clear makes a new table), and `add` hashed once per message.
   */
  private readonly queues: TxQueue[] = [];
  private flushQueued = false;
  private disposed = false;

  /** `refused` counts datagrams the kernel rejected (EMSGSIZE, ENETUNREACH, …: not EAGAIN). */
  constructor(
    ffi: BatchIoFfi,
    readonly size: number,
    readonly refused: (datagrams: number) => void,
  ) {
    this.mem = ffi.alloc(size);
    this.bytes = new Uint8Array(this.mem.view);
    this.base = Number(this.mem.address);
  }

  /** Whether `len` more bytes can follow at `end` (the end of the last message). */
  canExtend(end: number, len: number): boolean {
    return end === this.next && this.next + len <= this.size;
  }

  take(len: number): number {
    const at = this.next;
    this.next += len;
    return at;
  }

  tryTake(len: number): number {
    if (this.next + len > this.size) return -1;
    return this.take(len);
  }

  /** Notes a queue with messages; the first one of a task schedules the flush. */
  pending(q: TxQueue): void {
    if (!q.listed) {
      q.listed = true;
      this.queues.push(q);
    }
    if (!this.flushQueued) {
      this.flushQueued = true;
      queueMicrotask(this.flushTask);
    }
  }

  private readonly flushTask = (): void => this.flushAll();

  flushAll(): void {
    this.flushQueued = false;
    if (this.disposed) return;
    const qs = this.queues;
    for (let i = 0; i < qs.length; i++) {
      const q = qs[i]!;
      q.listed = false;
      q.flush();
    }
    while (qs.length > 0) qs.pop();
    this.next = 0;
  }

  /** After close: nothing more is sent (a flush already scheduled does nothing). */
  dispose(): void {
    this.disposed = true;
    for (const q of this.queues) q.listed = false;
    this.queues.length = 0;
  }
}

/**
 * Where `RxRing` delivers: a datagram (a view of a slot), its source, whether it was truncated, and
 * its place `k` in a GRO train (0 alone), and its ICRC's verdict where `RxVerify` judged it with its
 * batch (-1 where not). The view's bytes are the next `recvmmsg`'s to overwrite,
 * and so may the view object be: one with the same place and length is handed out again (see
 * `RxRing.view`). Keep a copy, not the view.
 */
export type RxDeliver = (datagram: Uint8Array, srcAddr: Uint8Array, srcPort: number, truncated: boolean, k: number, verdict: number) => void;

/**
 * Judges every datagram of `messages` messages of a batch at once, before any of them is delivered
 * (`verifyReceived` in `src/wire/icrc.ts`): `mem` is the ring's memory, `desc` holds 4 words per
 * message from the first of them on (offset of its bytes in `mem`, length, the length it is cut at,
 * offset of its sockaddr), and `out[j]` gets the j-th datagram's word. Returns how many datagrams it
 * judged (0: none, each is checked on delivery).
 */
export type RxVerify = (mem: Uint8Array, desc: Int32Array, messages: number, out: Int32Array) => number;

/**
 * How `RxRing` learns that its socket is readable: `read` is called then, and `answer` after the
 * promise reactions and microtasks that `read` queued have run (a completion the application awaited,
 * its reply's post); the send flush `answer` queues runs before the event loop goes on. The watch keeps
 * the loop alive until it is closed.
 */
export type ReadableWatch = (fd: number, read: () => void, answer: () => void) => { close(): void };

/**
 * The addon's watch (`src/native/watch.c`): both calls in the poll phase of the turn that found the
 * socket readable, each in a node callback scope, which runs the microtasks after it.
 */
export const addonWatch: ReadableWatch | undefined = icrcAddon?.watch;

/**
 * koffi's poll as a `ReadableWatch`, where the addon is not built. koffi calls its callback outside any
 * node callback scope, so promise reactions and microtasks queued by what the datagrams trigger would
 * wait for the next unrelated callback, up to a timer's millisecond. The read is therefore done in an
 * immediate of the same loop turn (the check phase follows the poll phase), which node runs in a scope
 * that drains them, and the answer in a second immediate queued with it: node runs the microtasks in
 * between. The two hops cost 1.3–2.1 µs from the callback to the read and 0.7–1.4 µs more to the
 * answer (bench/README.md, "What mattered").
 */
export function pollWatch(ffi: BatchIoFfi): ReadableWatch {
  return (fd, read, answer) => {
    let scheduled = false;
    const readTask = (): void => {
      scheduled = false;
      read();
    };
    const handle = ffi.poll(fd, { readable: true }, () => {
      if (scheduled) return;
      scheduled = true;
      setImmediate(readTask);
      setImmediate(answer);
    });
    let open = true;
    return {
      close: () => {
        // koffi frees the handle on close: a second close would be a use after free.
        if (!open) return;
        open = false;
        handle.stop();
        handle.close();
      },
    };
  };
}

function defaultWatch(ffi: BatchIoFfi): ReadableWatch {
  return addonWatch ?? pollWatch(ffi);
}

/** The kernel's most segments in one GRO train (UDP_GRO_CNT_MAX). */
const GRO_MAX_SEGMENTS = 64;

/**
 * Reads a socket with `recvmmsg` into `BATCH` slots whenever libuv reports it readable. The socket
 * is a duplicate of the `dgram` socket's descriptor, whose own reading is stopped (two libuv
 * watchers on one descriptor are not allowed; two descriptors of one socket are).
 */
export class RxRing {
  private readonly mem: { address: bigint; view: ArrayBuffer };
  private readonly slotBytes: number;
  private readonly ctrlOff: number;
  private readonly vec: Uint8Array;
  private readonly dv: DataView;
  private readonly slots: Uint8Array[] = [];
  private readonly names: Uint8Array[] = [];
  /** Per slot, the views last handed out, by segment number (see `view`). */
  private readonly views: Uint8Array[][] = [];
  private readonly watch: { close(): void };
  private closed = false;
  /** The ring's memory, and each message's place in it as `verify` takes it (`RxVerify`). */
  private readonly bytes: Uint8Array;
  private readonly desc = new Int32Array(4 * BATCH);
  /** `desc` from message i on, for each i: a chunk of the batch is judged from where it starts. */
  private readonly descFrom: Int32Array[] = [];
  /** The most datagrams a chunk holds (see `drain`): fewer than ANSWER_EVERY, then one more message. */
  private readonly verdicts = new Int32Array(ANSWER_EVERY + GRO_MAX_SEGMENTS);

  constructor(
    private readonly ffi: BatchIoFfi,
    private readonly fd: number,
    private readonly family: 4 | 6,
    private readonly deliver: RxDeliver,
    /** Called before each batch is delivered, and after it (`last`: the read is over). */
    private readonly before: () => void,
    private readonly after: (last: boolean) => void,
    /**
     * The socket has UDP_GRO set: the kernel may hand over a train of datagrams of one size (the last
     * may be shorter) as one message with its segment size in a control message; it is cut back into
     * datagrams here. The slots are then `RX_SLOT_GRO` bytes.
     */
    private readonly gro = false,
    /** Called for each message that was such a train. */
    private readonly onTrain?: () => void,
    /** Judges each batch's datagrams before they are delivered (their `verdict`; -1 where it did not). */
    private readonly verify?: RxVerify,
    /** What tells it the socket is readable: the addon's watch where it is built, else koffi's poll. */
    watch: ReadableWatch = defaultWatch(ffi),
  ) {
    this.slotBytes = gro ? RX_SLOT_GRO : RX_SLOT;
    this.ctrlOff = BATCH * (MMSG + IOV + SOCKADDR);
    const dataOff = this.ctrlOff + (gro ? BATCH * CMSG_INT : 0);
    this.mem = ffi.alloc(dataOff + BATCH * this.slotBytes);
    this.vec = new Uint8Array(this.mem.view, 0, BATCH * MMSG);
    this.dv = new DataView(this.mem.view);
    this.bytes = new Uint8Array(this.mem.view);
    const base = Number(this.mem.address);
    for (let i = 0; i < BATCH; i++) {
      const m = i * MMSG;
      const iov = BATCH * MMSG + i * IOV;
      const name = BATCH * (MMSG + IOV) + i * SOCKADDR;
      const slot = dataOff + i * this.slotBytes;
      setWord(this.dv, m + OFF_NAME, base + name);
      setWord(this.dv, m + OFF_IOV, base + iov);
      setWord(this.dv, m + OFF_IOVLEN, 1);
      if (gro) setWord(this.dv, m + OFF_CONTROL, base + this.ctrlOff + i * CMSG_INT);
      setWord(this.dv, iov, base + slot);
      setWord(this.dv, iov + 8, this.slotBytes);
      this.slots.push(new Uint8Array(this.mem.view, slot, this.slotBytes));
      this.views.push([]);
      this.names.push(new Uint8Array(this.mem.view, name + (family === 4 ? 4 : 8), family === 4 ? 4 : 16));
      this.desc[4 * i] = slot;
      this.desc[4 * i + 3] = name;
      this.descFrom.push(this.desc.subarray(4 * i));
    }
    // The answer to the last batch (`after`) comes after the promise reactions the batch caused (see
    // `ReadableWatch`), so what the application posts in answer to this batch's completions joins it.
    // A ping-pong's reply then leaves with the ACK of the request it answers, reply first, as one GSO
    // train: one datagram's way through the kernel instead of two.
    this.watch = watch(fd, this.drainTask, this.answerTask);
  }

  /** A batch was delivered and not yet answered (`after`). */
  private unanswered = false;
  private readonly drainTask = (): void => {
    this.drain();
  };
  private readonly answerTask = (): void => {
    if (!this.unanswered) return;
    this.unanswered = false;
    if (!this.closed) this.after(true);
  };

  /** Reads what is waiting now, and answers it, outside the readable callback (see `UdpLink.readWaiting`). */
  readNow(): void {
    if (this.closed) return;
    try {
      this.drain();
    } finally {
      this.answerTask();
    }
  }

  private drain(): void {
    const dv = this.dv;
    const nameLen = this.family === 4 ? 16 : 28;
    let budget = RX_BUDGET;
    // A handler's exception, held until the batch it came from is delivered (see below).
    let failure: { error: unknown } | undefined;
    while (!this.closed && budget > 0 && failure === undefined) {
      const gro = this.gro;
      const want = gro ? GRO_BATCH : BATCH;
      // Only the headers recvmmsg may fill: with GRO a quarter of them.
      for (let i = 0; i < want; i++) {
        dv.setUint32(i * MMSG + OFF_NAMELEN, nameLen, isLittleEndian);
        dv.setInt32(i * MMSG + OFF_FLAGS, 0, isLittleEndian);
        // The kernel sets msg_controllen to what it wrote: reset to the room there is.
        if (gro) dv.setUint32(i * MMSG + OFF_CONTROLLEN, CMSG_INT, isLittleEndian);
      }
      const r = this.ffi.recvmmsg(this.fd, this.vec, want, MSG_DONTWAIT, null);
      if (r <= 0) break; // EAGAIN: drained (any other error: nothing to read either)
      this.before();
      const nameOff = BATCH * (MMSG + IOV);
      // Each message's length and the length it is cut at: a GRO train into its datagrams, anything
      // else is one datagram (`step` = its length).
      const desc = this.desc;
      for (let i = 0; i < r; i++) {
        const m = i * MMSG;
        const len = dv.getUint32(m + OFF_LEN, isLittleEndian);
        const truncated = (dv.getInt32(m + OFF_FLAGS, isLittleEndian) & MSG_TRUNC) !== 0;
        const seg = gro ? this.segmentSize(i) : 0;
        desc[4 * i + 1] = len;
        desc[4 * i + 2] = seg > 0 && seg < len && !truncated ? seg : len;
      }
      // The datagrams are judged a chunk at a time, each chunk just before it is delivered (about
      // ANSWER_EVERY datagrams: one native call each, and the answer that follows it): its bytes are
      // then still in cache when the engines copy them out, and the first answers leave without
      // waiting for the rest of the batch to be read. Judging a whole batch first (up to a megabyte
      // of GRO trains) read it all once before any of it was used, and held every answer back.
      const verify = this.verify;
      let judgedTo = verify !== undefined ? 0 : r;
      let v = 0;
      let judged = 0;
      let since = 0;
      for (let i = 0; i < r && !this.closed; i++) {
        const m = i * MMSG;
        const len = desc[4 * i + 1]!;
        const step = desc[4 * i + 2]!;
        if (i === judgedTo) {
          let k = i;
          let count = 0;
          while (k < r && count < ANSWER_EVERY) {
            const n = desc[4 * k + 1]!;
            const st = desc[4 * k + 2]!;
            count += n === 0 || st === 0 ? 1 : Math.ceil(n / st);
            k++;
          }
          judged = verify!(this.bytes, this.descFrom[i]!, k - i, this.verdicts);
          judgedTo = k;
          v = 0;
        }
        const truncated = (dv.getInt32(m + OFF_FLAGS, isLittleEndian) & MSG_TRUNC) !== 0;
        const port = dv.getUint16(nameOff + i * SOCKADDR + 2, false);
        if (step < len) this.onTrain?.();
        let o = 0;
        let k = 0;
        do {
          const end = Math.min(o + step, len);
          try {
            this.deliver(this.view(i, k, o, end - o), this.names[i]!, port, truncated, k, v < judged ? this.verdicts[v]! : -1);
          } catch (error) {
            // The batch's other datagrams were read from the socket and are nowhere else: they are
            // delivered all the same, and the first exception is thrown once the batch is.
            failure ??= { error };
          }
          v++;
          k++;
          o = end;
          budget--;
          if (++since >= ANSWER_EVERY) {
            this.after(false);
            this.before();
            since = 0;
          }
        } while (o < len && !this.closed);
      }
      if (r < want || budget <= 0 || this.closed) {
        this.unanswered = true;
        break;
      }
      this.after(false);
    }
    if (failure !== undefined) throw failure.error;
  }

  /**
   * Bytes `o … o + n` of slot `i`, segment `k` of its message. A view costs more to make than an
   * ACK costs to check, and every train of one peer's ACKs or WRITEs is cut at the same places batch
   * after batch: the view of the last such segment is handed out again when it still fits. That
   * changes nothing for a handler: the bytes under any view are the next read's anyway.
   */
  private view(i: number, k: number, o: number, n: number): Uint8Array {
    const cached = this.views[i]!;
    const v = cached[k];
    if (v !== undefined && v.length === n && v.byteOffset === this.slots[i]!.byteOffset + o) return v;
    const fresh = this.slots[i]!.subarray(o, o + n);
    if (k < MAX_CACHED_SEGMENTS) cached[k] = fresh;
    return fresh;
  }

  /** Message `i`'s UDP_GRO segment size, or 0 when it carries one datagram. */
  private segmentSize(i: number): number {
    const dv = this.dv;
    if (dv.getUint32(i * MMSG + OFF_CONTROLLEN, isLittleEndian) < CMSG_INT - 4) return 0;
    const c = this.ctrlOff + i * CMSG_INT;
    // struct cmsghdr: size_t cmsg_len, int cmsg_level, int cmsg_type, then the data (an int here).
    if (dv.getInt32(c + 8, isLittleEndian) !== SOL_UDP || dv.getInt32(c + 12, isLittleEndian) !== UDP_GRO) return 0;
    return dv.getInt32(c + 16, isLittleEndian);
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.watch.close();
    this.ffi.close(this.fd);
  }
}

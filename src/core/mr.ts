/**
 * Protection domains and memory regions: key allocation, a 64-bit virtual address for each
 * region, and the two lookups every data movement goes through — local (L_Key, for SGEs)
 * and remote (R_Key, for RETH/AtomicETH) — with IBTA's access and bounds checks.
 *
 * Read first: IBTA Vol. 1 §10.6 (memory management), §9.7.4.1.6 (R_Key checks, C9-88..C9-91)
 * and §10.7.2.2 (local SGE checks). rdma_rxe: rxe_mr.c (`lookup_mr`, `mr_check_range`).
 *
 * Memory is a Uint8Array registered by the user. Data moves by views: a resolved SGE is a
 * `subarray` into the region, so gathering a packet's payload copies nothing.
 */

import { DEVICE_LIMITS } from './limits.js';
import { MrError, RoceError } from './errors.js';
import { ACCESS, type Lkey, type Rkey, type Sge } from './types.js';
import { ViewTable } from '../wire/view-table.js';

export class ProtectionDomain {
  /** Its regions not yet deregistered and its QPs not yet destroyed: `deallocPd` refuses while any are. */
  users = 0;
  deallocated = false;

  constructor(readonly handle: number, readonly owner: object) {}
}

/**
 * Where a region appears in the (pretend) address space. Each region gets its own 4 GiB
 * slot above a user-space-looking base, so VAs on the wire look like real ones and two
 * regions never overlap.
 */
const VA_BASE = 0x7f3c_0000_0000n;
const VA_SLOT = 1n << 32n;
/** No region is longer: an offset past this is outside every one (and below 2^53, exact as a number). */
const MAX_OFFSET = BigInt(DEVICE_LIMITS.maxMrSize);

/**
 * The size of a region's table of views of its parts (`viewAt`): two entries per piece of the smallest
 * path MTU (256 B), 16 to 4,096 of them (a 1 MiB buffer's 256 pieces of 4 KiB take 256 entries of
 * 4,096, where 1,024 entries held them in 177).
 */
function partViewBits(length: number): number {
  return Math.min(12, Math.max(4, Math.ceil(Math.log2(length / 128))));
}

export class MemoryRegion {
  /** True once a SEND with Invalidate (or `invalidate()`) has revoked the R_Key. */
  rkeyInvalidated = false;
  deregistered = false;
  /**
   * The region's memory and where it starts in it, read once: `buffer.buffer` is a call into the
   * runtime each time, and every resolved SGE (one per message) makes a view of it.
   */
  readonly memory: ArrayBufferLike;
  readonly memoryOffset: number;
  /** `addr`'s high and low 32 bits, for `offsetOfHalves`. */
  readonly addrHi: number;
  readonly addrLo: number;
  /** A plain view of the whole region: an SGE that covers it (one buffer per message) needs no view of its own. */
  readonly whole: Uint8Array;
  /** `[whole]`: the segment list of a WR whose one SGE covers the region, made once rather than per post. */
  readonly wholeList: readonly Uint8Array[];
  /** Views of parts of the region made so far (`viewAt`); made at the first. */
  private parts: ViewTable | undefined = undefined;

  /**
   * Why the R_Key no longer grants a request that already holds the region what `MrTable.remote`
   * granted it (deregistered, or the key invalidated since), in `remote`'s words; undefined while it does.
   */
  get remoteKeyGone(): 'noKey' | 'invalidated' | undefined {
    return this.deregistered ? 'noKey' : this.rkeyInvalidated ? 'invalidated' : undefined;
  }

  constructor(
    readonly pd: ProtectionDomain,
    readonly buffer: Uint8Array,
    readonly addr: bigint,
    readonly lkey: Lkey,
    readonly rkey: Rkey,
    readonly access: number,
  ) {
    this.memory = buffer.buffer;
    this.memoryOffset = buffer.byteOffset;
    this.addrHi = Number(addr >> 32n);
    this.addrLo = Number(addr & 0xffff_ffffn);
    this.whole = new Uint8Array(this.memory, this.memoryOffset, buffer.length);
    this.wholeList = [this.whole];
  }

  /**
   * A view of bytes `off … off + len` of the region, the one made before for the same range while
   * the region's table still holds it. A message longer than the path MTU leaves as views of its
   * buffer, one per packet, and a buffer sent or read again is cut at the same places; the table is
   * the region's own, so it keeps nothing alive that the region does not.
   */
  viewAt(off: number, len: number): Uint8Array {
    if (off === 0 && len === this.whole.length) return this.whole;
    let t = this.parts;
    if (t === undefined) t = this.parts = new ViewTable(partViewBits(this.whole.length));
    return t.view(this.whole, off, off + len);
  }

  get length(): number {
    return this.buffer.length;
  }

  /** An SGE for `length` bytes at `offset` into the region (libibverbs `{ addr, length, lkey }`). */
  sge(offset = 0, length = this.buffer.length - offset): Sge {
    if (!Number.isInteger(offset) || !Number.isInteger(length) || offset < 0 || length < 0 || offset + length > this.buffer.length) {
      throw new MrError(`sge(${offset}, ${length}) outside a ${this.buffer.length}-byte region`);
    }
    return { addr: this.addr + BigInt(offset), length, lkey: this.lkey };
  }

  /** The VA of byte `offset` of the region. */
  va(offset = 0): bigint {
    return this.addr + BigInt(offset);
  }

  /** Byte offset into the region of [va, va+len), or undefined when not entirely inside. */
  offsetOf(va: bigint, len: number): number | undefined {
    // An SGE at the region's start (a whole-region SGE, the usual one) needs no arithmetic: comparing
    // BigInts makes none, where each difference is an allocation.
    if (va === this.addr) return len > this.buffer.length ? undefined : 0;
    // Otherwise one BigInt, the difference; the rest in numbers, exact below MAX_OFFSET.
    const off = va - this.addr;
    if (off < 0n || off > MAX_OFFSET) return undefined;
    const o = Number(off);
    return o + len > this.buffer.length ? undefined : o;
  }

  /**
   * `offsetOf` for the VA given as its two 32-bit halves, in numbers only (no BigInt made). Exact
   * wherever it matters: a high half that differs from the region's by more than one gives an offset
   * of 2^64 scale, rounded perhaps, but far outside any region either way.
   */
  offsetOfHalves(vaHi: number, vaLo: number, len: number): number | undefined {
    const o = (vaHi - this.addrHi) * 0x1_0000_0000 + (vaLo - this.addrLo);
    return o < 0 || o + len > this.buffer.length ? undefined : o;
  }
}

/** Why a remote access was refused; each maps to a responder error class. */
export type RemoteAccessFault = 'noKey' | 'wrongPd' | 'invalidated' | 'access' | 'bounds';

export type RemoteLookup = { ok: true; mr: MemoryRegion; offset: number } | { ok: false; fault: RemoteAccessFault };

/** A remote VA: a bigint, and its 32-bit halves where the parse left them (`Reth.vaHi`, `vaLo`). */
export interface RemoteVa {
  va: bigint;
  vaHi?: number | undefined;
  vaLo?: number | undefined;
}

/** Per-device registry of regions by key index (key = index << 8 | key byte, as rxe). */
export class MrTable {
  private readonly byIndex = new Map<number, MemoryRegion>();
  /**
   * `remote`'s answer, one record refilled by every lookup (each R_Key check of a request made an
   * object): read it before the next lookup of this table.
   */
  private readonly lookup: { ok: boolean; mr: MemoryRegion | undefined; offset: number; fault: RemoteAccessFault } = {
    ok: false,
    mr: undefined,
    offset: 0,
    fault: 'noKey',
  };
  /**
   * Regions deregistered so far. A WQE notes it when it resolves its SGEs; while it is unchanged, no
   * region a resolved SGE list points into can have gone (`regionsStillHeld`).
   */
  deregistrations = 0;
  private nextIndex = 1;
  private keyByte = 0x5a;
  private slot = 0n;

  register(pd: ProtectionDomain, buffer: Uint8Array, access: number): MemoryRegion {
    if (pd.deallocated) throw new RoceError('ERR_RESOURCE', 'the protection domain was deallocated');
    if (!(buffer instanceof Uint8Array)) throw new MrError('regMr needs a Uint8Array (or Buffer)');
    if (buffer.length > DEVICE_LIMITS.maxMrSize) throw new MrError(`region of ${buffer.length} bytes exceeds ${DEVICE_LIMITS.maxMrSize}`);
    const known = ACCESS.LOCAL_WRITE | ACCESS.REMOTE_WRITE | ACCESS.REMOTE_READ | ACCESS.REMOTE_ATOMIC;
    if (!Number.isInteger(access) || (access & ~known) !== 0) throw new MrError(`unsupported access flags 0x${access.toString(16)}`);
    // IBTA 10.6.3.1 (C10-45 area) and libibverbs: remote write or atomic needs local write.
    if ((access & (ACCESS.REMOTE_WRITE | ACCESS.REMOTE_ATOMIC)) !== 0 && (access & ACCESS.LOCAL_WRITE) === 0) {
      throw new MrError('REMOTE_WRITE and REMOTE_ATOMIC require LOCAL_WRITE');
    }
    const index = this.nextIndex++;
    if (index > 0xffffff) throw new MrError('out of memory region keys');
    this.keyByte = (this.keyByte + 0x3b) & 0xff;
    const key = ((index << 8) | this.keyByte) >>> 0;
    const mr = new MemoryRegion(pd, buffer, VA_BASE + this.slot * VA_SLOT, key, key, access);
    this.slot++;
    this.byIndex.set(index, mr);
    pd.users++;
    return mr;
  }

  deregister(mr: MemoryRegion): void {
    const idx = mr.lkey >>> 8;
    if (this.byIndex.get(idx) === mr) this.byIndex.delete(idx);
    if (mr.deregistered) return;
    this.deregistrations++;
    mr.pd.users--;
    mr.deregistered = true;
  }

  byLkey(key: number): MemoryRegion | undefined {
    const mr = this.byIndex.get(key >>> 8);
    return mr && mr.lkey === key >>> 0 ? mr : undefined;
  }

  /**
   * R_Key check for an incoming RDMA READ/WRITE/atomic (IBTA C9-88: key valid, same PD as the
   * QP, access right granted, range inside the region).
   */
  remote(pd: ProtectionDomain, rkey: number, access: number, at: RemoteVa, len: number): RemoteLookup {
    const out = this.lookup;
    const mr = this.byIndex.get(rkey >>> 8);
    if (!mr || mr.rkey !== rkey >>> 0) return this.refused('noKey');
    if (mr.pd !== pd) return this.refused('wrongPd');
    if (mr.rkeyInvalidated) return this.refused('invalidated');
    if ((mr.access & access) === 0) return this.refused('access');
    const hi = at.vaHi;
    const lo = at.vaLo;
    const offset = hi !== undefined && lo !== undefined ? mr.offsetOfHalves(hi, lo, len) : mr.offsetOf(at.va, len);
    if (offset === undefined) return this.refused('bounds');
    out.ok = true;
    out.mr = mr;
    out.offset = offset;
    out.fault = 'noKey';
    return out as RemoteLookup;
  }

  private refused(fault: RemoteAccessFault): RemoteLookup {
    const out = this.lookup;
    out.ok = false;
    out.mr = undefined;
    out.offset = 0;
    out.fault = fault;
    return out as RemoteLookup;
  }

  /** SEND with Invalidate: revoke an R_Key of this PD. False when no such key (IBTA class J). */
  invalidate(pd: ProtectionDomain, rkey: number): boolean {
    const mr = this.byIndex.get(rkey >>> 8);
    if (!mr || mr.rkey !== rkey >>> 0 || mr.pd !== pd || mr.rkeyInvalidated) return false;
    mr.rkeyInvalidated = true;
    return true;
  }
}

/**
 * Resolves a local SGE list to views into registered memory (IBTA 10.7.2.2: L_Key valid, same
 * PD, inside the region, LOCAL_WRITE when the HCA writes into it). Returns undefined on any
 * violation: the caller completes the WR with LOC_PROT_ERR.
 */
export function resolveSges(
  table: MrTable,
  pd: ProtectionDomain,
  sges: readonly Sge[],
  needLocalWrite: boolean,
): readonly Uint8Array[] | undefined {
  let out: Uint8Array[] | undefined;
  for (const s of sges) {
    if (s.length === 0) continue;
    const mr = table.byLkey(s.lkey);
    if (!mr || mr.pd !== pd || mr.deregistered) return undefined;
    if (needLocalWrite && (mr.access & ACCESS.LOCAL_WRITE) === 0) return undefined;
    const off = mr.offsetOf(s.addr, s.length);
    if (off === undefined) return undefined;
    const whole = off === 0 && s.length === mr.whole.length;
    // The usual post, one SGE over a whole region: the region's own list. An empty array grows a
    // backing store of 17 slots at its first push (about 180 bytes per message).
    if (whole && sges.length === 1) return mr.wholeList;
    // A plain view: Buffer's subarray goes through its own JS wrapper (FastBuffer), twice the cost
    // per message for what the engines use as a Uint8Array.
    const view = whole ? mr.whole : new Uint8Array(mr.memory, mr.memoryOffset + off, s.length);
    if (out === undefined) out = [view];
    else out.push(view);
  }
  return out ?? NO_SEGMENTS;
}

/**
 * Whether every region a WQE's resolved SGEs point into is still registered. rxe looks the L_Key up
 * for every packet it copies to or from local memory (`copy_data` → `lookup_mr`), so a region
 * deregistered in the middle of a message fails the WQE (local protection error) instead of being
 * read or written on. Here the lookups are made again only when some region of the device has been
 * deregistered since the WQE last looked (`MrTable.deregistrations`): per packet, one comparison.
 * Keys are never reused, so a key that still finds a region finds the one it resolved to.
 */
export function regionsStillHeld(table: MrTable, wqe: { readonly sges: readonly Sge[]; mrEpoch: number }): boolean {
  const now = table.deregistrations;
  if (wqe.mrEpoch === now) return true;
  for (const s of wqe.sges) if (s.length > 0 && table.byLkey(s.lkey) === undefined) return false;
  wqe.mrEpoch = now;
  return true;
}

/** The segments of a WR without bytes. */
const NO_SEGMENTS: readonly Uint8Array[] = [];

export function sgeTotal(sges: readonly Sge[] | undefined): number {
  let n = 0;
  if (sges) for (const s of sges) n += s.length;
  return n;
}

/** Appends views covering bytes [off, off+len) of the concatenated segments to `parts`. */
export function gather(segments: readonly Uint8Array[], off: number, len: number, parts: Uint8Array[]): void {
  let skip = off;
  let need = len;
  for (const seg of segments) {
    if (need === 0) return;
    if (skip >= seg.length) {
      skip -= seg.length;
      continue;
    }
    const take = Math.min(seg.length - skip, need);
    // A packet that is a whole segment (a message of one packet) needs no view of it.
    parts.push(skip === 0 && take === seg.length ? seg : seg.subarray(skip, skip + take));
    need -= take;
    skip = 0;
  }
}

/**
 * Copies `src` into the concatenated segments starting at byte `off`. Returns false (and copies
 * nothing) when it would overrun them.
 */
export function scatter(segments: readonly Uint8Array[], off: number, src: Uint8Array): boolean {
  let total = 0;
  for (const s of segments) total += s.length;
  if (off + src.length > total) return false;
  let skip = off;
  let from = 0;
  for (const seg of segments) {
    if (from === src.length) break;
    if (skip >= seg.length) {
      skip -= seg.length;
      continue;
    }
    const take = Math.min(seg.length - skip, src.length - from);
    // All of `src` into one segment (a packet's payload, the usual case) needs no view of it.
    seg.set(take === src.length ? src : src.subarray(from, from + take), skip);
    from += take;
    skip = 0;
  }
  return true;
}

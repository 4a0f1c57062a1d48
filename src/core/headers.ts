/**
 * Header emission for the engines: fills a reused scratch buffer with BTH and the extension
 * headers an opcode needs, and returns a view of exactly the header bytes (one cached view per
 * opcode, so steady-state emission allocates only the payload views).
 *
 * The payload itself never passes through here: it goes to the link as views into registered
 * memory, followed by a pad view, because the link takes a packet as parts.
 */

import { emitAeth } from '../wire/aeth.js';
import { emitAtomicAckEth, emitAtomicEth } from '../wire/atomic.js';
import { emitBth, type Bth } from '../wire/bth.js';
import { DEFAULT_PKEY } from '../wire/constants.js';
import { emitDeth } from '../wire/deth.js';
import { opcodeInfo } from '../wire/opcode.js';
import { emitReth } from '../wire/reth.js';
import { emitIeth, emitImmDt } from '../wire/small.js';

/** Fields an engine may set; the builder writes only those the opcode's headers need. */
export interface HeaderFields {
  opcode: number;
  destQp: number;
  psn: number;
  ackReq: boolean;
  se: boolean;
  padCount: number;
  va: bigint;
  rkey: number;
  dmaLength: number;
  swapAdd: bigint;
  compare: bigint;
  syndrome: number;
  msn: number;
  origData: bigint;
  immData: number;
  invRkey: number;
  qkey: number;
  srcQp: number;
}

export function blankFields(): HeaderFields {
  return {
    opcode: 0, destQp: 0, psn: 0, ackReq: false, se: false, padCount: 0, va: 0n, rkey: 0, dmaLength: 0,
    swapAdd: 0n, compare: 0n, syndrome: 0, msn: 0, origData: 0n, immData: 0, invRkey: 0, qkey: 0, srcQp: 0,
  };
}

const ZERO4 = new Uint8Array(4);
/** Pad views by length, shared: pad bytes are always zero. */
export const PAD: readonly Uint8Array[] = [ZERO4.subarray(0, 0), ZERO4.subarray(0, 1), ZERO4.subarray(0, 2), ZERO4.subarray(0, 3)];

/**
 * Empties a reused parts list. Popping its two or three entries stays in compiled code, where
 * `parts.length = 0` is a runtime call, which showed as 2 % of a many-QP initiator.
 */
export function clearParts(parts: Uint8Array[]): void {
  while (parts.length > 0) parts.pop();
}

export class HeaderBuilder {
  private readonly buf = new Uint8Array(128);
  private readonly views: (Uint8Array | undefined)[] = new Array(256).fill(undefined);
  private readonly bth: Bth = {
    opcode: 0, se: false, m: false, padCount: 0, tver: 0, pkey: DEFAULT_PKEY, fecn: false, becn: false,
    resv6: 0, destQp: 0, ackReq: false, resv7: 0, psn: 0,
  };
  private readonly reth = { va: 0n, rkey: 0, dmaLength: 0 };
  private readonly atomicEth = { va: 0n, rkey: 0, swapAdd: 0n, compare: 0n };
  private readonly aeth = { syndrome: 0, msn: 0 };
  private readonly ack = { originalData: 0n };
  private readonly imm = { data: 0 };
  private readonly ieth = { rkey: 0 };
  private readonly deth = { qkey: 0, srcQp: 0 };

  /** Writes the headers for `f.opcode` and returns a view of them, valid until the next build. */
  build(f: HeaderFields): Uint8Array {
    const info = opcodeInfo(f.opcode);
    if (!info) throw new RangeError(`no opcode 0x${f.opcode.toString(16)}`);
    const b = this.bth;
    b.opcode = f.opcode;
    b.se = f.se;
    b.padCount = f.padCount;
    b.destQp = f.destQp;
    b.ackReq = f.ackReq;
    b.psn = f.psn;
    emitBth(b, this.buf, 0);
    const o = info.offsets;
    if (o.DETH !== undefined) {
      this.deth.qkey = f.qkey;
      this.deth.srcQp = f.srcQp;
      emitDeth(this.deth, this.buf, o.DETH);
    }
    if (o.RETH !== undefined) {
      this.reth.va = f.va;
      this.reth.rkey = f.rkey;
      this.reth.dmaLength = f.dmaLength;
      emitReth(this.reth, this.buf, o.RETH);
    }
    if (o.AtomicETH !== undefined) {
      const a = this.atomicEth;
      a.va = f.va;
      a.rkey = f.rkey;
      a.swapAdd = f.swapAdd;
      a.compare = f.compare;
      emitAtomicEth(a, this.buf, o.AtomicETH);
    }
    if (o.AETH !== undefined) {
      this.aeth.syndrome = f.syndrome;
      this.aeth.msn = f.msn;
      emitAeth(this.aeth, this.buf, o.AETH);
    }
    if (o.AtomicAckETH !== undefined) {
      this.ack.originalData = f.origData;
      emitAtomicAckEth(this.ack, this.buf, o.AtomicAckETH);
    }
    if (o.ImmDt !== undefined) {
      this.imm.data = f.immData;
      emitImmDt(this.imm, this.buf, o.ImmDt);
    }
    if (o.IETH !== undefined) {
      this.ieth.rkey = f.invRkey;
      emitIeth(this.ieth, this.buf, o.IETH);
    }
    let v = this.views[f.opcode];
    if (!v) {
      v = this.buf.subarray(0, info.headerLength);
      this.views[f.opcode] = v;
    }
    return v;
  }
}

/**
 * The one builder every requester and responder uses. A built header lives only until the engine
 * hands the packet to `transmit`, and every link consumes (copies or sends) the parts before `send`
 * returns (the `Link` contract), while engines run one at a time; so nothing needs a builder of its
 * own. Sharing it saves two builders per QP (~4.6 KB: the 256-slot view cache, the scratch buffer
 * and the scratch records), most of an idle QP's heap.
 */
export const SHARED_HEADER_BUILDER = new HeaderBuilder();

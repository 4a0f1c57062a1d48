/**
 * A whole RoCEv2 transport packet, i.e. one UDP payload: BTH, the extension headers the
 * opcode table names, payload, pad and ICRC.
 *
 * The contract (as smoltcp's wire layer states it):
 *  - `parsePacket` takes untrusted bytes and never throws; it checks, in rdma_rxe's ingress
 *    order, length, transport version, opcode and the header/pad/ICRC lengths, and either
 *    returns a typed error or a record whose payload is a view into the input (valid as long
 *    as the caller keeps the input buffer unchanged).
 *  - `emitPacket` writes every byte of `packetLength(p)` bytes at the offset it is given,
 *    reserved bits and pad included, and never allocates or decides a length itself.
 *  - The ICRC is written as the record holds it; `icrc.ts` computes it, because it covers
 *    IP and UDP fields this layer does not see.
 */

import { AETH_LEN, BTH_LEN, BTH_TVER, ICRC_LEN } from './constants.js';
import { emitAeth, parseAeth, parseAethInto, type Aeth } from './aeth.js';
import {
  emitAtomicAckEth, emitAtomicEth, parseAtomicAckEth, parseAtomicAckEthInto, parseAtomicEth, parseAtomicEthInto, type AtomicAckEth, type AtomicEth,
} from './atomic.js';
import { emitBth, parseBth, parseBthInto, type Bth } from './bth.js';
import { emitDeth, parseDeth, parseDethInto, type Deth } from './deth.js';
import { opcodeInfo, type OpcodeInfo } from './opcode.js';
import { emitReth, newRethRecord, parseReth, parseRethInto, type Reth } from './reth.js';
import { ViewTable } from './view-table.js';
import {
  emitFeth, emitIeth, emitImmDt, parseFeth, parseFethInto, parseIeth, parseIethInto, parseImmDt, parseImmDtInto, type Feth, type Ieth, type ImmDt,
} from './small.js';

export interface RocePacket {
  bth: Bth;
  // Absent or undefined alike: a header the opcode does not carry (a reused `PacketRecord` holds
  // every slot, undefined when empty).
  deth?: Deth | undefined;
  feth?: Feth | undefined;
  reth?: Reth | undefined;
  atomicEth?: AtomicEth | undefined;
  aeth?: Aeth | undefined;
  atomicAckEth?: AtomicAckEth | undefined;
  immDt?: ImmDt | undefined;
  ieth?: Ieth | undefined;
  /** Payload without pad. On parse, a view into the input. */
  payload: Uint8Array;
  /** The ICRC as the 4 trailing bytes hold it (little-endian on the wire). */
  icrc: number;
}

export type PacketErrorCode =
  /** Shorter than a BTH plus an ICRC. */
  | 'TOO_SHORT'
  /** BTH.TVer is not 0. */
  | 'BAD_TVER'
  /** An opcode this stack does not know (RD, XRC, reserved). */
  | 'UNKNOWN_OPCODE'
  /** Shorter than the opcode's headers plus PadCnt plus the ICRC. */
  | 'TRUNCATED_HEADERS'
  /** Bytes between the headers and the ICRC for an opcode that carries no payload. */
  | 'UNEXPECTED_PAYLOAD';

export type PacketParse =
  | { ok: true; packet: RocePacket; info: OpcodeInfo }
  | PacketFailure;

type PacketFailure = { ok: false; error: PacketErrorCode; detail: string };

/**
 * The payload of every packet that has none (ACKs, READ requests, empty messages): a view costs as
 * much to make as the rest of an ACK's parse, and an empty one can neither be written nor read.
 */
const NO_PAYLOAD = new Uint8Array(0);

/** Pad bytes that round a payload up to a multiple of four (IBTA §9.2, PadCnt). */
export const padFor = (payloadLength: number): number => (4 - (payloadLength & 3)) & 3;

/** Total bytes of the UDP payload for a packet record: headers + payload + pad + ICRC. */
export function packetLength(p: Pick<RocePacket, 'bth' | 'payload'>): number {
  const info = opcodeInfo(p.bth.opcode);
  const headers = info ? info.headerLength : BTH_LEN;
  return headers + p.payload.length + (p.bth.padCount & 3) + ICRC_LEN;
}

export function parsePacket(b: Uint8Array, off = 0, len = b.length - off): PacketParse {
  const info = check(b, off, len);
  if (typeof info === 'string') return failure(info, b, off, len);
  const payloadLength = len - info.headerLength - padCount(b, off) - ICRC_LEN;
  const pkt: RocePacket = {
    bth: parseBth(b, off),
    payload: payloadLength === 0 ? NO_PAYLOAD : b.subarray(off + info.headerLength, off + info.headerLength + payloadLength),
    icrc: icrcAt(b, off + len),
  };
  const o = info.offsets;
  if (o.DETH !== undefined) pkt.deth = parseDeth(b, off + o.DETH);
  if (o.FETH !== undefined) pkt.feth = parseFeth(b, off + o.FETH);
  if (o.RETH !== undefined) pkt.reth = parseReth(b, off + o.RETH);
  if (o.AtomicETH !== undefined) pkt.atomicEth = parseAtomicEth(b, off + o.AtomicETH);
  if (o.AETH !== undefined) pkt.aeth = parseAeth(b, off + o.AETH);
  if (o.AtomicAckETH !== undefined) pkt.atomicAckEth = parseAtomicAckEth(b, off + o.AtomicAckETH);
  if (o.ImmDt !== undefined) pkt.immDt = parseImmDt(b, off + o.ImmDt);
  if (o.IETH !== undefined) pkt.ieth = parseIeth(b, off + o.IETH);
  return { ok: true, packet: pkt, info };
}

/**
 * A `PacketRecord` keeps 2^VIEW_BITS payload views: a receive ring's 64 slots, with a GRO train's
 * segments in each, put a steady stream's payloads at up to about a thousand places (at path MTU
 * 4096, 64 × 15 trains' segments take 960 entries of 4,096 with no two on one; of 1,024, 789).
 */
const VIEW_BITS = 12;

/**
 * A packet record that `parsePacketInto` refills, for a receive path that reads each packet only
 * during one call: every header slot is always present (undefined when the opcode has no such
 * header) and points, when set, at the one object of its kind the record owns, so the record keeps
 * one shape whatever opcode it holds. A parse allocates nothing but the BigInts of an atomic's 64-bit
 * fields (a RETH's VA is kept as two numbers, `newRethRecord`) and its payload's view, which it hands
 * out again for the same range of the same array while that view is still in its table
 * (`payloadView`).
 */
export class PacketRecord implements RocePacket {
  bth: Bth = { opcode: 0, se: false, m: false, padCount: 0, tver: 0, pkey: 0, fecn: false, becn: false, resv6: 0, destQp: 0, ackReq: false, resv7: 0, psn: 0 };
  deth: Deth | undefined = undefined;
  feth: Feth | undefined = undefined;
  reth: Reth | undefined = undefined;
  atomicEth: AtomicEth | undefined = undefined;
  aeth: Aeth | undefined = undefined;
  atomicAckEth: AtomicAckEth | undefined = undefined;
  immDt: ImmDt | undefined = undefined;
  ieth: Ieth | undefined = undefined;
  payload: Uint8Array = NO_PAYLOAD;
  icrc = 0;
  /** The header objects the slots point at; refilled in place by each parse. */
  readonly owned = {
    deth: { qkey: 0, srcQp: 0 },
    feth: { placementType: 0, selectivity: 0 },
    reth: newRethRecord(),
    atomicEth: { va: 0n, rkey: 0, swapAdd: 0n, compare: 0n },
    aeth: { syndrome: 0, msn: 0 },
    atomicAckEth: { originalData: 0n },
    immDt: { data: 0 },
    ieth: { rkey: 0 },
  };

  // The payload views made so far, handed out again for the same range of the same array.
  readonly #views = new ViewTable(VIEW_BITS);

  /**
   * `b.subarray(start, end)`, or the view this record made for the same range of the same array
   * before (`ViewTable`): a receive ring hands the same view of a slot in again batch after batch,
   * where a stream's packets lie at the same places (src/link/mmsg.ts, `RxRing.view`).
   */
  payloadView(b: Uint8Array, start: number, end: number): Uint8Array {
    return this.#views.view(b, start, end);
  }
}

/**
 * `parsePacket` into a reused record: when `b[off … off + len)` is a packet `parsePacket` would
 * accept, fills `rec` with the same fields and returns the opcode's table entry; otherwise returns
 * undefined and leaves `rec` unchanged (`parsePacket` then says what is wrong). `rec` holds the
 * packet until its next parse: a caller that may be re-entered needs a record per level.
 */
export function parsePacketInto(b: Uint8Array, off: number, len: number, rec: PacketRecord): OpcodeInfo | undefined {
  const info = check(b, off, len);
  if (typeof info === 'string') return undefined;
  const payloadLength = len - info.headerLength - padCount(b, off) - ICRC_LEN;
  parseBthInto(b, off, rec.bth);
  rec.payload = payloadLength === 0 ? NO_PAYLOAD : rec.payloadView(b, off + info.headerLength, off + info.headerLength + payloadLength);
  rec.icrc = icrcAt(b, off + len);
  const o = info.offsets;
  const h = rec.owned;
  rec.deth = o.DETH === undefined ? undefined : parseDethInto(b, off + o.DETH, h.deth);
  rec.feth = o.FETH === undefined ? undefined : parseFethInto(b, off + o.FETH, h.feth);
  rec.reth = o.RETH === undefined ? undefined : parseRethInto(b, off + o.RETH, h.reth);
  rec.atomicEth = o.AtomicETH === undefined ? undefined : parseAtomicEthInto(b, off + o.AtomicETH, h.atomicEth);
  rec.aeth = o.AETH === undefined ? undefined : parseAethInto(b, off + o.AETH, h.aeth);
  rec.atomicAckEth = o.AtomicAckETH === undefined ? undefined : parseAtomicAckEthInto(b, off + o.AtomicAckETH, h.atomicAckEth);
  rec.immDt = o.ImmDt === undefined ? undefined : parseImmDtInto(b, off + o.ImmDt, h.immDt);
  rec.ieth = o.IETH === undefined ? undefined : parseIethInto(b, off + o.IETH, h.ieth);
  return info;
}

/** The one length of a well-formed ACK: BTH, AETH, ICRC. */
export const ACK_LEN = BTH_LEN + AETH_LEN + ICRC_LEN;

/**
 * The checks of a parse, in rdma_rxe's ingress order: length, transport version, opcode, then the
 * opcode's headers, pad and ICRC; the opcode's table entry when they pass, else the error's code.
 * Reads only the bytes. No message is built here: with them this was too large for V8 to inline
 * into the per-packet parse (`failure` words a refusal).
 */
function check(b: Uint8Array, off: number, len: number): OpcodeInfo | PacketErrorCode {
  if (off < 0 || len < 0 || off + len > b.length || len < BTH_LEN + ICRC_LEN) return 'TOO_SHORT';
  if ((b[off + 1]! & 0xf) !== BTH_TVER) return 'BAD_TVER';
  const info = opcodeInfo(b[off]!);
  if (!info) return 'UNKNOWN_OPCODE';
  const pad = padCount(b, off);
  const fixed = info.headerLength + pad + ICRC_LEN;
  if (len < fixed) return 'TRUNCATED_HEADERS';
  if (!info.payload && len - fixed + pad > 0) return 'UNEXPECTED_PAYLOAD';
  return info;
}

/** `check`'s refusal in words, from the same bytes read again (only a refused packet pays for it). */
function failure(error: PacketErrorCode, b: Uint8Array, off: number, len: number): PacketFailure {
  switch (error) {
    case 'TOO_SHORT':
      return fail(error, off < 0 || len < 0 || off + len > b.length ? `range ${off}+${len} outside a ${b.length}-byte buffer` : `${len} bytes, need at least ${BTH_LEN + ICRC_LEN}`);
    case 'BAD_TVER':
      return fail(error, `TVer ${b[off + 1]! & 0xf}`);
    case 'UNKNOWN_OPCODE':
      return fail(error, `opcode 0x${b[off]!.toString(16).padStart(2, '0')}`);
    default: {
      const info = opcodeInfo(b[off]!)!;
      const pad = padCount(b, off);
      const fixed = info.headerLength + pad + ICRC_LEN;
      return fail(error, error === 'TRUNCATED_HEADERS' ? `${info.name} needs ${fixed} bytes, got ${len}` : `${info.name} carries no payload, found ${len - fixed + pad} bytes`);
    }
  }
}

const padCount = (b: Uint8Array, off: number): number => (b[off + 1]! >>> 4) & 3;
/** The ICRC in the four bytes before `end`, little-endian as the wire holds it. */
const icrcAt = (b: Uint8Array, end: number): number => (b[end - 4]! | (b[end - 3]! << 8) | (b[end - 2]! << 16) | (b[end - 1]! << 24)) >>> 0;

function fail(error: PacketErrorCode, detail: string): PacketFailure {
  return { ok: false, error, detail };
}

export class PacketEmitError extends Error {
  readonly code = 'ERR_PACKET_EMIT';
}

/**
 * Writes the packet at `off` and returns the offset after its ICRC. Throws PacketEmitError
 * only for a record that cannot be a packet (unknown opcode, a header the opcode needs is
 * missing, or the buffer is too small): those are programming errors, not bad input.
 */
export function emitPacket(p: RocePacket, b: Uint8Array, off = 0): number {
  const info = opcodeInfo(p.bth.opcode);
  if (!info) throw new PacketEmitError(`cannot emit unknown opcode 0x${p.bth.opcode.toString(16)}`);
  const total = info.headerLength + p.payload.length + (p.bth.padCount & 3) + ICRC_LEN;
  if (off < 0 || off + total > b.length) throw new PacketEmitError(`${info.name}: ${total} bytes do not fit at offset ${off} of ${b.length}`);
  emitBth(p.bth, b, off);
  for (const h of info.headers) {
    const at = off + info.offsets[h]!;
    switch (h) {
      case 'DETH': emitDeth(need(p.deth, h, info), b, at); break;
      case 'FETH': emitFeth(need(p.feth, h, info), b, at); break;
      case 'RETH': emitReth(need(p.reth, h, info), b, at); break;
      case 'AtomicETH': emitAtomicEth(need(p.atomicEth, h, info), b, at); break;
      case 'AETH': emitAeth(need(p.aeth, h, info), b, at); break;
      case 'AtomicAckETH': emitAtomicAckEth(need(p.atomicAckEth, h, info), b, at); break;
      case 'ImmDt': emitImmDt(need(p.immDt, h, info), b, at); break;
      case 'IETH': emitIeth(need(p.ieth, h, info), b, at); break;
      case 'CNP': b.fill(0, at, at + 16); break;
    }
  }
  let at = off + info.headerLength;
  b.set(p.payload, at);
  at += p.payload.length;
  const pad = p.bth.padCount & 3;
  b.fill(0, at, at + pad);
  at += pad;
  writeIcrcLe(b, at, p.icrc);
  return at + ICRC_LEN;
}

function need<T>(h: T | undefined, name: string, info: OpcodeInfo): T {
  if (h === undefined) throw new PacketEmitError(`${info.name} needs a ${name}`);
  return h;
}

function writeIcrcLe(b: Uint8Array, at: number, v: number): void {
  b[at] = v;
  b[at + 1] = v >>> 8;
  b[at + 2] = v >>> 16;
  b[at + 3] = v >>> 24;
}

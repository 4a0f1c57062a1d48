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
import { emitAeth, parseAeth, type Aeth } from './aeth.js';
import { emitAtomicAckEth, emitAtomicEth, parseAtomicAckEth, parseAtomicEth, type AtomicAckEth, type AtomicEth } from './atomic.js';
import { emitBth, parseBth, type Bth } from './bth.js';
import { emitDeth, parseDeth, type Deth } from './deth.js';
import { OPCODE, opcodeInfo, type OpcodeInfo } from './opcode.js';
import { emitReth, parseReth, type Reth } from './reth.js';
import { emitFeth, emitIeth, emitImmDt, parseFeth, parseIeth, parseImmDt, type Feth, type Ieth, type ImmDt } from './small.js';

export interface RocePacket {
  bth: Bth;
  deth?: Deth;
  feth?: Feth;
  reth?: Reth;
  atomicEth?: AtomicEth;
  aeth?: Aeth;
  atomicAckEth?: AtomicAckEth;
  immDt?: ImmDt;
  ieth?: Ieth;
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
  | { ok: false; error: PacketErrorCode; detail: string };

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
  if (off < 0 || len < 0 || off + len > b.length) return fail('TOO_SHORT', `range ${off}+${len} outside a ${b.length}-byte buffer`);
  if (len < BTH_LEN + ICRC_LEN) return fail('TOO_SHORT', `${len} bytes, need at least ${BTH_LEN + ICRC_LEN}`);
  const bth = parseBth(b, off);
  if (bth.tver !== BTH_TVER) return fail('BAD_TVER', `TVer ${bth.tver}`);
  const info = opcodeInfo(bth.opcode);
  if (!info) return fail('UNKNOWN_OPCODE', `opcode 0x${bth.opcode.toString(16).padStart(2, '0')}`);
  const fixed = info.headerLength + bth.padCount + ICRC_LEN;
  if (len < fixed) return fail('TRUNCATED_HEADERS', `${info.name} needs ${fixed} bytes, got ${len}`);
  const payloadLength = len - fixed;
  if (!info.payload && payloadLength + bth.padCount > 0) {
    return fail('UNEXPECTED_PAYLOAD', `${info.name} carries no payload, found ${payloadLength + bth.padCount} bytes`);
  }
  const end = off + len;
  const pkt: RocePacket = {
    bth,
    payload: payloadLength === 0 ? NO_PAYLOAD : b.subarray(off + info.headerLength, off + info.headerLength + payloadLength),
    icrc: (b[end - 4]! | (b[end - 3]! << 8) | (b[end - 2]! << 16) | (b[end - 1]! << 24)) >>> 0,
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

/** An RC ACKNOWLEDGE record that `parseAckInto` fills: the same fields `parsePacket` gives an ACK. */
export type AckRecord = RocePacket & { aeth: Aeth };

export function newAckRecord(): AckRecord {
  return {
    bth: { opcode: 0, se: false, m: false, padCount: 0, tver: 0, pkey: 0, fecn: false, becn: false, resv6: 0, destQp: 0, ackReq: false, resv7: 0, psn: 0 },
    aeth: { syndrome: 0, msn: 0 },
    payload: NO_PAYLOAD,
    icrc: 0,
  };
}

const RC_ACKNOWLEDGE = OPCODE['RC_ACKNOWLEDGE']!;
/** The RC ACKNOWLEDGE opcode's table entry. */
export const ACK_INFO: OpcodeInfo = opcodeInfo(RC_ACKNOWLEDGE)!;
/** The one length of a well-formed ACK: BTH, AETH, ICRC. */
export const ACK_LEN = BTH_LEN + AETH_LEN + ICRC_LEN;

/**
 * `parsePacket` for the packet a connection receives most of when it has many peers' messages in
 * flight, one ACK per message: when `b[off … off + len)` is an RC ACKNOWLEDGE that `parsePacket`
 * would accept (20 bytes, TVer 0, no pad), fills `rec` with what it would return and answers
 * true; for anything else, false, and `rec` is unchanged (`parsePacket` then says what is wrong).
 * No allocation: the caller reuses `rec`, which holds the packet only until its next call.
 */
export function parseAckInto(b: Uint8Array, off: number, len: number, rec: AckRecord): boolean {
  if (len !== ACK_LEN || off < 0 || off + len > b.length || b[off] !== RC_ACKNOWLEDGE || (b[off + 1]! & 0x3f) !== BTH_TVER) return false;
  const h = rec.bth;
  const f = b[off + 1]!;
  const e = b[off + 4]!;
  const a = b[off + 8]!;
  h.opcode = RC_ACKNOWLEDGE;
  h.se = (f & 0x80) !== 0;
  h.m = (f & 0x40) !== 0;
  h.padCount = 0;
  h.tver = 0;
  h.pkey = (b[off + 2]! << 8) | b[off + 3]!;
  h.fecn = (e & 0x80) !== 0;
  h.becn = (e & 0x40) !== 0;
  h.resv6 = e & 0x3f;
  h.destQp = (b[off + 5]! << 16) | (b[off + 6]! << 8) | b[off + 7]!;
  h.ackReq = (a & 0x80) !== 0;
  h.resv7 = a & 0x7f;
  h.psn = (b[off + 9]! << 16) | (b[off + 10]! << 8) | b[off + 11]!;
  rec.aeth.syndrome = b[off + 12]!;
  rec.aeth.msn = (b[off + 13]! << 16) | (b[off + 14]! << 8) | b[off + 15]!;
  rec.icrc = (b[off + 16]! | (b[off + 17]! << 8) | (b[off + 18]! << 16) | (b[off + 19]! << 24)) >>> 0;
  return true;
}

function fail(error: PacketErrorCode, detail: string): PacketParse {
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

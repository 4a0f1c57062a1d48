/** One-line renderings of packets for reports. */

import { aethKind, aethValue, describeSyndrome, NAK_CODE } from '../wire/aeth.js';
import { opcodeName } from '../wire/opcode.js';
import type { PacketParse } from '../wire/packet.js';
import type { Rx } from './prober.js';

export const hex = (v: number, w = 6): string => '0x' + v.toString(16).padStart(w, '0');

export function describeParsed(p: PacketParse, len: number): string {
  if (!p.ok) return `unparseable ${len}-byte datagram (${p.error})`;
  const { packet: k, info } = p;
  let s = `${info.name} qp ${hex(k.bth.destQp)} psn ${hex(k.bth.psn)}`;
  if (k.aeth) s += ` ${describeSyndrome(k.aeth.syndrome)} msn ${k.aeth.msn}`;
  if (k.atomicAckEth) s += ` orig 0x${k.atomicAckEth.originalData.toString(16)}`;
  if (k.reth) s += ` va 0x${k.reth.va.toString(16)} rkey ${hex(k.reth.rkey, 8)} len ${k.reth.dmaLength}`;
  if (info.payload) s += ` ${k.payload.length} B`;
  return s;
}

export function describeRx(r: Rx): string {
  return describeParsed(r.parsed, r.bytes.length) + (r.icrcOk ? '' : ' [ICRC not accepted by our link]');
}

export const opName = opcodeName;

export function isAck(r: Rx, psn?: number): boolean {
  if (!r.parsed.ok || !r.icrcOk) return false;
  const k = r.parsed.packet;
  return r.parsed.info.kind === 'ack' && aethKind(k.aeth!.syndrome) === 'ACK' && (psn === undefined || k.bth.psn === psn);
}

export function isNak(r: Rx, code: number, psn?: number): boolean {
  if (!r.parsed.ok || !r.icrcOk) return false;
  const k = r.parsed.packet;
  return r.parsed.info.kind === 'ack' && aethKind(k.aeth!.syndrome) === 'NAK' && aethValue(k.aeth!.syndrome) === code &&
    (psn === undefined || k.bth.psn === psn);
}

export function isRnrNak(r: Rx, psn?: number): boolean {
  if (!r.parsed.ok || !r.icrcOk) return false;
  const k = r.parsed.packet;
  return r.parsed.info.kind === 'ack' && aethKind(k.aeth!.syndrome) === 'RNR_NAK' && (psn === undefined || k.bth.psn === psn);
}

export { NAK_CODE };

/**
 * One line per packet, shared by `--trace`, `roce decode` and test names:
 *
 *   RC_RDMA_WRITE_FIRST qp=0x000011 psn=0x7714cf ack reth(va=0x7f2a00001000 rkey=0x1234 len=65536) payload=1024
 */

import { describeSyndrome } from './aeth.js';
import { hex24, hex32 } from './bytes.js';
import { DEFAULT_PKEY } from './constants.js';
import { opcodeName } from './opcode.js';
import type { RocePacket } from './packet.js';

const hex64 = (v: bigint): string => '0x' + v.toString(16);

export function formatPacket(p: RocePacket): string {
  const h = p.bth;
  let s = `${opcodeName(h.opcode)} qp=${hex24(h.destQp)} psn=${hex24(h.psn)}`;
  if (h.ackReq) s += ' ack';
  if (h.se) s += ' se';
  if (h.m) s += ' m';
  if (h.fecn) s += ' fecn';
  if (h.becn) s += ' becn';
  if (h.pkey !== DEFAULT_PKEY) s += ` pkey=0x${h.pkey.toString(16).padStart(4, '0')}`;
  if (h.padCount) s += ` pad=${h.padCount}`;
  if (p.deth) s += ` deth(qkey=${hex32(p.deth.qkey)} src=${hex24(p.deth.srcQp)})`;
  if (p.feth) s += ` feth(sel=${p.feth.selectivity} plt=${p.feth.placementType})`;
  if (p.reth) s += ` reth(va=${hex64(p.reth.va)} rkey=${hex32(p.reth.rkey)} len=${p.reth.dmaLength})`;
  if (p.atomicEth) {
    const a = p.atomicEth;
    s += ` atomic(va=${hex64(a.va)} rkey=${hex32(a.rkey)} swap/add=${hex64(a.swapAdd)} cmp=${hex64(a.compare)})`;
  }
  if (p.aeth) s += ` aeth(${describeSyndrome(p.aeth.syndrome)} msn=${p.aeth.msn})`;
  if (p.atomicAckEth) s += ` orig=${hex64(p.atomicAckEth.originalData)}`;
  if (p.immDt) s += ` imm=${hex32(p.immDt.data)}`;
  if (p.ieth) s += ` inv=${hex32(p.ieth.rkey)}`;
  if (p.payload.length > 0) s += ` payload=${p.payload.length}`;
  return s;
}

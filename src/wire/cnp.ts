/**
 * The RoCEv2 Congestion Notification Packet (Annex A17.9.2): BTH with opcode 0x81, BECN set,
 * P_Key 0xFFFF (rxe and NICs send the default key), DestQP = the QP whose traffic was
 * marked, PSN 0, then 16 reserved bytes and the ICRC. No AckReq, no payload.
 */

import { DEFAULT_PKEY } from './constants.js';
import { CNP_OPCODE } from './opcode.js';
import type { RocePacket } from './packet.js';

export function cnpPacket(destQp: number, pkey: number = DEFAULT_PKEY): RocePacket {
  return {
    bth: {
      opcode: CNP_OPCODE, se: false, m: false, padCount: 0, tver: 0, pkey,
      fecn: false, becn: true, resv6: 0, destQp, ackReq: false, resv7: 0, psn: 0,
    },
    payload: new Uint8Array(0),
    icrc: 0,
  };
}

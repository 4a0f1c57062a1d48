/** fast-check generators for transport packets, shared by the wire and engine tests. */

import fc from 'fast-check';
import { KNOWN_OPCODES, opcodeInfo } from '../../src/wire/opcode.js';
import type { RocePacket } from '../../src/wire/packet.js';

const u32 = fc.integer({ min: 0, max: 0xffffffff });
const u24 = fc.integer({ min: 0, max: 0xffffff });
const u64 = fc.bigInt({ min: 0n, max: (1n << 64n) - 1n });

export const arbBth = (opcode: number) =>
  fc.record({
    opcode: fc.constant(opcode),
    se: fc.boolean(),
    m: fc.boolean(),
    padCount: fc.integer({ min: 0, max: 3 }),
    tver: fc.constant(0),
    pkey: fc.integer({ min: 0, max: 0xffff }),
    fecn: fc.boolean(),
    becn: fc.boolean(),
    resv6: fc.integer({ min: 0, max: 0x3f }),
    destQp: u24,
    ackReq: fc.boolean(),
    resv7: fc.integer({ min: 0, max: 0x7f }),
    psn: u24,
  });

/** Any well-formed packet of the given opcode (payload only where the opcode allows one). */
export function arbPacketOf(opcode: number): fc.Arbitrary<RocePacket> {
  const info = opcodeInfo(opcode)!;
  const parts: Record<string, fc.Arbitrary<unknown>> = {
    bth: arbBth(opcode),
    payload: info.payload ? fc.uint8Array({ maxLength: 300 }) : fc.constant(new Uint8Array(0)),
    icrc: u32,
  };
  for (const h of info.headers) {
    switch (h) {
      case 'DETH': parts['deth'] = fc.record({ qkey: u32, srcQp: u24 }); break;
      case 'FETH': parts['feth'] = fc.record({ placementType: fc.integer({ min: 0, max: 15 }), selectivity: fc.integer({ min: 0, max: 3 }) }); break;
      case 'RETH': parts['reth'] = fc.record({ va: u64, rkey: u32, dmaLength: u32 }); break;
      case 'AtomicETH': parts['atomicEth'] = fc.record({ va: u64, rkey: u32, swapAdd: u64, compare: u64 }); break;
      case 'AETH': parts['aeth'] = fc.record({ syndrome: fc.integer({ min: 0, max: 0xff }), msn: u24 }); break;
      case 'AtomicAckETH': parts['atomicAckEth'] = fc.record({ originalData: u64 }); break;
      case 'ImmDt': parts['immDt'] = fc.record({ data: u32 }); break;
      case 'IETH': parts['ieth'] = fc.record({ rkey: u32 }); break;
      case 'CNP': break;
    }
  }
  return (fc.record(parts) as fc.Arbitrary<RocePacket>).map((p) => {
    // A packet without payload has no pad either: PadCnt only rounds up a payload.
    if (!info.payload) p.bth.padCount = 0;
    return p;
  });
}

export const arbPacket: fc.Arbitrary<RocePacket> = fc.constantFrom(...KNOWN_OPCODES).chain(arbPacketOf);

/** The CM MADs of the rping capture (test/fixtures/rxe/rping.pcap), as decoded by our stack. */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { decodeCapture } from '../../src/analyze/decode.js';
import type { RocePacket } from '../../src/wire/packet.js';
import { fixtureDir } from '../wire/capture-helper.js';

export const RPING_PCAP = join(fixtureDir(), 'rping.pcap');

export interface CapturedMad {
  frame: number;
  src: string;
  dst: string;
  packet: RocePacket;
  /** The UD payload: the 256-byte MAD (a view into the capture). */
  mad: Uint8Array;
}

/** Every UD SEND to QP1 in rping.pcap, in capture order. */
export function rpingMads(): CapturedMad[] {
  const out: CapturedMad[] = [];
  for (const d of decodeCapture(readFileSync(RPING_PCAP))) {
    const p = d.packet;
    if (p === undefined || p.bth.destQp !== 1) continue;
    out.push({ frame: d.frame, src: d.src, dst: d.dst, packet: p, mad: p.payload });
  }
  return out;
}

/** RC request opcodes (SEND, WRITE, READ request, atomics): the PSNs a send queue consumes. */
const REQUEST_OPCODES = new Set([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 19, 20, 22, 23]);

/** The PSN of the first RC request `src` sent in rping.pcap (its send queue's starting PSN). */
export function rpingFirstRequestPsn(src: string): number | undefined {
  for (const d of decodeCapture(readFileSync(RPING_PCAP))) {
    const p = d.packet;
    if (p === undefined || d.src !== src || p.bth.destQp === 1) continue;
    if (REQUEST_OPCODES.has(p.bth.opcode)) return p.bth.psn;
  }
  return undefined;
}

const hexOf = (b: Uint8Array): string => Buffer.from(b).toString('hex');
export { hexOf };

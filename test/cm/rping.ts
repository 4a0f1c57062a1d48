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

const hexOf = (b: Uint8Array): string => Buffer.from(b).toString('hex');
export { hexOf };

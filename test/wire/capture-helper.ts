/**
 * Just enough of classic pcap + Ethernet + IPv4/IPv6 + UDP to pull the RoCEv2 datagrams out of the
 * rxe fixture captures for the ICRC tests. Deliberately independent of the stack's own parsers
 * (`src/pcap`, `src/wire/frame.ts`), so these tests do not trust the code paths they may later check.
 */
import { readFileSync, readdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';
import type { UdpDatagramInfo } from '../../src/wire/icrc.js';

export const ROCEV2_PORT = 4791;

export interface RocePacket {
  /** Fixture file name. */
  file: string;
  /** 1-based frame number, as Wireshark counts. */
  frame: number;
  /** The IP datagram (IP header … ICRC), a view of the frame without Ethernet padding. */
  ip: Uint8Array;
  /** The UDP payload (BTH … ICRC), a view into `ip`. */
  payload: Uint8Array;
  /** Everything known from the headers, including the real IPv4 ID and flags. */
  info: UdpDatagramInfo;
}

/** The fixture directory: `test/fixtures/rxe` next to the sources (the compiled tests live in `dist/test`). */
export function fixtureDir(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (let i = 0; i < 6; i++) {
    const candidate = join(dir, 'test', 'fixtures', 'rxe');
    try {
      readdirSync(candidate);
      return candidate;
    } catch {
      dir = dirname(dir);
    }
  }
  throw new Error('test/fixtures/rxe not found');
}

export function fixtureFiles(): string[] {
  return readdirSync(fixtureDir())
    .filter((f) => f.endsWith('.pcap'))
    .sort();
}

/** Frames of a classic pcap file (either byte order, µs or ns timestamps), as views of the file. */
export function* pcapFrames(buf: Uint8Array): Generator<Uint8Array> {
  const dv = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  const magic = dv.getUint32(0, true);
  let le: boolean;
  if (magic === 0xa1b2c3d4 || magic === 0xa1b23c4d) le = true;
  else if (magic === 0xd4c3b2a1 || magic === 0x4d3cb2a1) le = false;
  else throw new Error('not a classic pcap file');
  if (dv.getUint32(20, le) !== 1) throw new Error('link type is not Ethernet');
  let off = 24;
  while (off + 16 <= buf.length) {
    const incl = dv.getUint32(off + 8, le);
    const start = off + 16;
    if (start + incl > buf.length) return;
    yield buf.subarray(start, start + incl);
    off = start + incl;
  }
}

const be16 = (b: Uint8Array, o: number): number => (b[o]! << 8) | b[o + 1]!;

/** The RoCEv2 datagram in an Ethernet frame (UDP to port 4791), or undefined. */
export function rocePacketOf(frame: Uint8Array): Omit<RocePacket, 'file' | 'frame'> | undefined {
  let off = 12;
  let type = be16(frame, off);
  while (type === 0x8100 || type === 0x88a8) {
    off += 4;
    type = be16(frame, off);
  }
  off += 2;
  let ip: Uint8Array;
  let udp: number;
  let info: UdpDatagramInfo;
  if (type === 0x0800) {
    const ihl = (frame[off]! & 15) * 4;
    if (frame[off + 9] !== 17) return undefined;
    ip = frame.subarray(off, off + be16(frame, off + 2));
    udp = ihl;
    info = {
      family: 4,
      srcAddr: ip.subarray(12, 16),
      dstAddr: ip.subarray(16, 20),
      srcPort: be16(ip, udp),
      dstPort: be16(ip, udp + 2),
      ipId: be16(ip, 4),
      ipFlagsFrag: be16(ip, 6),
    };
  } else if (type === 0x86dd) {
    if (frame[off + 6] !== 17) return undefined;
    ip = frame.subarray(off, off + 40 + be16(frame, off + 4));
    udp = 40;
    info = { family: 6, srcAddr: ip.subarray(8, 24), dstAddr: ip.subarray(24, 40), srcPort: be16(ip, udp), dstPort: be16(ip, udp + 2) };
  } else {
    return undefined;
  }
  if (info.dstPort !== ROCEV2_PORT) return undefined;
  return { ip, payload: ip.subarray(udp + 8, udp + be16(ip, udp + 4)), info };
}

/** Every RoCEv2 packet of one fixture capture. */
export function rocePackets(file: string): RocePacket[] {
  const out: RocePacket[] = [];
  let frame = 0;
  for (const f of pcapFrames(readFileSync(join(fixtureDir(), file)))) {
    frame++;
    const p = rocePacketOf(f);
    if (p !== undefined) out.push({ file, frame, ...p });
  }
  return out;
}

/** A copy of `info` without the IPv4 fields a UDP socket cannot see. */
export function socketView(info: UdpDatagramInfo): UdpDatagramInfo {
  return { family: info.family, srcAddr: info.srcAddr, dstAddr: info.dstAddr, srcPort: info.srcPort, dstPort: info.dstPort };
}

/** xorshift32, seeded: reproducible "random" test data. */
export function xorshift32(seed: number): () => number {
  let s = seed >>> 0 || 1;
  return () => {
    s ^= s << 13;
    s >>>= 0;
    s ^= s >>> 17;
    s ^= s << 5;
    s >>>= 0;
    return s;
  };
}

export function randomBytes(rnd: () => number, n: number): Uint8Array {
  const b = new Uint8Array(n);
  for (let i = 0; i < n; i++) b[i] = rnd() & 0xff;
  return b;
}

export function hex(s: string): Uint8Array {
  const clean = s.replace(/\s+|\/\/[^\n]*/g, '');
  return Uint8Array.from(clean.match(/../g) ?? [], (h) => parseInt(h, 16));
}

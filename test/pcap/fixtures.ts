/**
 * Shared by the pcap and frame tests: where the rxe captures live, what tshark says is in them,
 * a seeded PRNG, and record comparison.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { CaptureRecord } from '../../src/pcap/format.js';

/** `test/fixtures/rxe` in the source tree (the compiled tests run from `dist/test`). */
export function rxeFixtureDir(): string {
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

export function readFixture(name: string): Uint8Array {
  return readFileSync(join(rxeFixtureDir(), name));
}

/**
 * Per capture: total frames and frames with UDP destination port 4791, as counted by
 * `tshark -r F | wc -l` and `tshark -r F -Y udp.dstport==4791 | wc -l` (TShark 4.0.17), and the
 * address pairs of those RoCEv2 frames (test/fixtures/README.md).
 */
export const RXE_FIXTURES: Readonly<Record<string, { frames: number; roce: number; hosts: readonly string[] }>> = {
  'atomic_cas.pcap': { frames: 82, roce: 40, hosts: ['10.77.0.2', '10.77.0.3'] },
  'atomic_faa.pcap': { frames: 82, roce: 40, hosts: ['10.77.0.2', '10.77.0.3'] },
  'hostpeer_listen.pcap': { frames: 186, roce: 172, hosts: ['10.77.0.1', '10.77.0.2'] },
  'imm_rc.pcap': { frames: 39, roce: 22, hosts: ['10.77.0.2', '10.77.0.3'] },
  'imm_uc.pcap': { frames: 28, roce: 10, hosts: ['10.77.0.2', '10.77.0.3'] },
  'imm_ud.pcap': { frames: 21, roce: 3, hosts: ['10.77.0.2', '10.77.0.3'] },
  'loss_write_bw.pcap': { frames: 264, roce: 219, hosts: ['10.77.0.2', '10.77.0.3'] },
  'rc_mtu256.pcap': { frames: 694, roce: 680, hosts: ['10.77.0.2', '10.77.0.3'] },
  'rc_mtu4096.pcap': { frames: 222, roce: 208, hosts: ['10.77.0.2', '10.77.0.3'] },
  'rc_pingpong.pcap': { frames: 217, roce: 200, hosts: ['10.77.0.2', '10.77.0.3'] },
  'read_bw.pcap': { frames: 1343, roce: 1300, hosts: ['10.77.0.2', '10.77.0.3'] },
  'rnr_rc.pcap': { frames: 48, roce: 32, hosts: ['10.77.0.2', '10.77.0.3'] },
  'rping.pcap': { frames: 248, roce: 245, hosts: ['10.77.0.2', '10.77.0.3'] },
  'uc_pingpong.pcap': { frames: 174, roce: 160, hosts: ['10.77.0.2', '10.77.0.3'] },
  'ud_mtu4096.pcap': { frames: 55, roce: 40, hosts: ['10.77.0.2', '10.77.0.3'] },
  'ud_pingpong.pcap': { frames: 54, roce: 40, hosts: ['10.77.0.2', '10.77.0.3'] },
  'v6_rc_pingpong.pcap': { frames: 227, roce: 200, hosts: ['fd77::2', 'fd77::3'] },
  'v6_ud_pingpong.pcap': { frames: 69, roce: 40, hosts: ['fd77::2', 'fd77::3'] },
  'write_bw.pcap': { frames: 1344, roce: 1300, hosts: ['10.77.0.2', '10.77.0.3'] },
};

/** xorshift32: reproducible test data from a fixed seed. */
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

/** A plain, comparable copy of a record (data as hex) for `t.same`. */
export function plain(r: CaptureRecord): { frame: number; ts: string; linkType: number; len: number; ifId: number; data: string } {
  return {
    frame: r.frame,
    ts: r.timestampNs.toString(),
    linkType: r.linkType,
    len: r.originalLength,
    ifId: r.interfaceId,
    data: Buffer.from(r.data.buffer, r.data.byteOffset, r.data.byteLength).toString('hex'),
  };
}

export function hex(s: string): Uint8Array {
  const clean = s.replace(/\/\/[^\n]*|\s+/g, '');
  return Uint8Array.from(clean.match(/../g) ?? [], (h) => parseInt(h, 16));
}

export function toHex(b: Uint8Array): string {
  return Buffer.from(b.buffer, b.byteOffset, b.byteLength).toString('hex');
}

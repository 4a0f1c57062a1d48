/**
 * The stack's native addon, `src/native/icrc.c`: CRC-32, and the RoCEv2 ICRC of a whole packet, in
 * one call each; `src/native/watch.c`, a socket's readiness for the batched link; and
 * `src/native/mmsg.c`, that link's `sendmmsg` and `recvmmsg`. `npm install` builds it with
 * node-gyp (`npm run build:addon` rebuilds it); where that fails (no compiler) the stack runs on the
 * JavaScript ICRC over the fastest CRC-32 package instead, with the same results, and the batched
 * link on koffi's poll and koffi's calls into libc. `ROCE_ADDON=0` in the environment leaves it
 * unloaded, for comparisons.
 *
 * This module only loads it. `crc32.ts` and `icrc.ts` each check it against their JavaScript
 * reference when they load, and use it only if it agrees.
 */
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

/** What `icrc.c` exports. Results are int32: take `>>> 0` for the unsigned value. */
export interface IcrcAddon {
  /** Whether the CRC runs on carry-less multiplication (x86-64 with PCLMULQDQ); else a table. */
  readonly clmul: boolean;
  /** CRC-32 of `data`, continuing from the final CRC `seed` (zlib's chaining). */
  crc32(data: Uint8Array, seed?: number): number;
  /** The ICRC of a UDP payload (BTH … ICRC field) for the flow in the bound key block. */
  icrc(udpPayload: Uint8Array): number;
  /** The ICRC of a UDP payload given as `head ‖ tail` without its ICRC field, for the bound flow. */
  icrc2(head: Uint8Array, tail: Uint8Array): number;
  /**
   * The ICRCs of a send queue's messages `from … to - 1`, written in place, for the bound flow: `desc`
   * holds three runs of `desc.length / 3` words (offset in `ring`, length, segment length), and segment
   * k of a message takes IPv4 ID k. Returns the number of datagrams; a RangeError for a message outside
   * `ring` or a segment shorter than BTH + ICRC, before anything is written.
   */
  trains(ring: Uint8Array, desc: Int32Array, from: number, to: number): number;
  /**
   * The verdicts on every datagram of a `recvmmsg` batch, in one call: `desc` holds 4 words per message
   * (offset of its bytes in `mem`, length, the length a GRO train is cut at, offset of its sockaddr);
   * the key block holds the family, the local address and port, the flags and the mode. `out[j]` is the
   * j-th datagram's verdict | (ID << 1 | DF) << 2. Returns how many datagrams were judged.
   */
  received(mem: Uint8Array, desc: Int32Array, messages: number, out: Int32Array): number;
  /** 1: the ICRC matches; 2: it matches for another IPv4 ID (recover mode); 0: it does not. */
  verify(udpPayload: Uint8Array): number;
  /** The Int32Array (16 words) the key is written into before each `icrc`, `icrc2` or `verify`. */
  bind(block: Int32Array): void;
  /**
   * `src/native/watch.c`: calls `read` whenever descriptor `fd` is readable, then `answer`, each in a
   * node callback scope (microtasks run after each). Absent from a build older than that file.
   */
  watch?(fd: number, read: () => void, answer: () => void): { close(): void };
  /**
   * `src/native/mmsg.c`, on Linux: `sendmmsg(2)` and `recvmmsg(2)` (no timeout) over a vector of
   * `struct mmsghdr` in `vec`, returning the count or -errno. Absent elsewhere and from a build
   * older than that file.
   */
  sendmmsg?(fd: number, vec: Uint8Array, vlen: number, flags: number): number;
  recvmmsg?(fd: number, vec: Uint8Array, vlen: number, flags: number): number;
}

/** Where node-gyp leaves the addon, from this file in `src/wire` or in `dist/src/wire`. */
const CANDIDATES = ['../native/build/Release/roce_icrc.node', '../../../src/native/build/Release/roce_icrc.node'];

/** Why the addon is not loaded, or undefined when it is. */
export let addonMissing: string | undefined;

function load(): IcrcAddon | undefined {
  if (process.env['ROCE_ADDON'] === '0') {
    addonMissing = 'ROCE_ADDON=0';
    return undefined;
  }
  const path = CANDIDATES.map((c) => fileURLToPath(new URL(c, import.meta.url))).find((p) => existsSync(p));
  if (path === undefined) {
    addonMissing = 'not built (npm run build:addon)';
    return undefined;
  }
  try {
    const m = createRequire(import.meta.url)(path) as IcrcAddon;
    for (const f of ['crc32', 'icrc', 'icrc2', 'verify', 'trains', 'received', 'bind'] as const) {
      if (typeof m[f] !== 'function') throw new Error(`no ${f}()`);
    }
    return m;
  } catch (e) {
    addonMissing = `failed to load ${path}: ${(e as Error).message}`;
    return undefined;
  }
}

/** The addon, or undefined (see `addonMissing`). */
export const icrcAddon: IcrcAddon | undefined = load();

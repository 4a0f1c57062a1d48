/**
 * CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320, init and final XOR 0xFFFFFFFF): the CRC of
 * zlib, Ethernet and the RoCEv2 ICRC.
 *
 * Several implementations share one type. They differ only in speed, so the stack uses `crc32`, the
 * fastest one that loads *and* agrees with the bit-at-a-time reference on this machine, chosen once at
 * module load. The others stay exported for the differential tests and the benchmark.
 *
 * Chaining follows zlib: `prev` is the previous *final* CRC, so `crc(b, crc(a)) === crc(a ++ b)` and
 * `crc(empty, p) === p`. Results are always unsigned 32-bit numbers.
 */
import { createRequire } from 'node:module';
import * as zlib from 'node:zlib';
import { icrcAddon } from './addon.js';

/** CRC-32 of `data`, continuing from the final CRC `prev` of the bytes before it (default 0 = none). */
export type Crc32 = (data: Uint8Array, prev?: number) => number;

/** The reflected CRC-32 polynomial x^32 + x^26 + … + 1. */
export const CRC32_POLY = 0xedb88320;

/** The reference: one bit per step, no tables. Slow; it is the oracle the others are tested against. */
export const crc32Bitwise: Crc32 = (data, prev = 0) => {
  let c = ~prev;
  for (let i = 0; i < data.length; i++) {
    c ^= data[i]!;
    for (let k = 0; k < 8; k++) c = (c >>> 1) ^ (CRC32_POLY & -(c & 1));
  }
  return ~c >>> 0;
};

// Slicing-by-8 tables: T[k][b] is the CRC register contribution of byte b followed by k zero bytes,
// so eight input bytes fold into the register with eight independent lookups.
const SLICE = new Int32Array(8 * 256);
for (let n = 0; n < 256; n++) {
  let c = n;
  for (let k = 0; k < 8; k++) c = (c >>> 1) ^ (CRC32_POLY & -(c & 1));
  SLICE[n] = c;
}
for (let n = 0; n < 256; n++) {
  let c = SLICE[n]!;
  for (let k = 1; k < 8; k++) {
    c = SLICE[c & 0xff]! ^ (c >>> 8);
    SLICE[k * 256 + n] = c;
  }
}
// Separate views let V8 keep each lookup a single typed-array load without index arithmetic.
const T0 = SLICE.subarray(0, 256);
const T1 = SLICE.subarray(256, 512);
const T2 = SLICE.subarray(512, 768);
const T3 = SLICE.subarray(768, 1024);
const T4 = SLICE.subarray(1024, 1280);
const T5 = SLICE.subarray(1280, 1536);
const T6 = SLICE.subarray(1536, 1792);
const T7 = SLICE.subarray(1792, 2048);

/** Pure JS, slicing-by-8 (about 1.5 GB/s): the fallback that needs no package and no native code. */
export const crc32Table: Crc32 = (data, prev = 0) => {
  let c = ~prev;
  const n = data.length;
  const end8 = n - (n & 7);
  let i = 0;
  for (; i < end8; i += 8) {
    const a = c ^ (data[i]! | (data[i + 1]! << 8) | (data[i + 2]! << 16) | (data[i + 3]! << 24));
    c =
      T7[a & 0xff]! ^
      T6[(a >>> 8) & 0xff]! ^
      T5[(a >>> 16) & 0xff]! ^
      T4[a >>> 24]! ^
      T3[data[i + 4]!]! ^
      T2[data[i + 5]!]! ^
      T1[data[i + 6]!]! ^
      T0[data[i + 7]!]!;
  }
  // Four more bytes, if left, in one slice too: the BTH (12 B) and the IPv4 pseudo header (28 B) end
  // so, and four independent lookups beat four dependent byte steps.
  if (n - i >= 4) {
    const a = c ^ (data[i]! | (data[i + 1]! << 8) | (data[i + 2]! << 16) | (data[i + 3]! << 24));
    c = T3[a & 0xff]! ^ T2[(a >>> 8) & 0xff]! ^ T1[(a >>> 16) & 0xff]! ^ T0[a >>> 24]!;
    i += 4;
  }
  for (; i < n; i++) c = T0[(c ^ data[i]!) & 0xff]! ^ (c >>> 8);
  return ~c >>> 0;
};

// Running the CRC backwards. One zero-byte step r -> T0[r & 0xff] ^ (r >>> 8) is linear and
// invertible: T0's 256 top bytes are all different, so the top byte of the result names the table
// index, and the rest follows. UNSHIFT4 is the inverse of four such steps, sliced by byte like SLICE:
// the register difference at the start of four bytes that ends up as a given difference after them.
const T0_BY_TOP = new Uint8Array(256);
for (let n = 0; n < 256; n++) T0_BY_TOP[T0[n]! >>> 24] = n;
const UNSHIFT4 = new Int32Array(4 * 256);
for (let k = 0; k < 4; k++) {
  for (let b = 0; b < 256; b++) {
    let r = b << (8 * k);
    for (let s = 0; s < 4; s++) {
      const n = T0_BY_TOP[r >>> 24]!;
      r = ((r ^ T0[n]!) << 8) | n;
    }
    UNSHIFT4[k * 256 + b] = r;
  }
}
const U0 = UNSHIFT4.subarray(0, 256);
const U1 = UNSHIFT4.subarray(256, 512);
const U2 = UNSHIFT4.subarray(512, 768);
const U3 = UNSHIFT4.subarray(768, 1024);

/**
 * The CRC of a message without its last four bytes, from `crc`, the CRC of the whole message, and
 * `tail`, those four bytes read as a little-endian word. Lets a caller CRC a buffer whole, trailer
 * included, instead of creating a view that stops short of it (~30 ns for the view, a few for this).
 * Chaining as for `Crc32`: with `crc = crc32(m ‖ t, prev)` it returns `crc32(m, prev)`.
 */
export function crc32DropTail4(crc: number, tail: number): number {
  // Four bytes t enter the register r as the word r ^ t moved through four zero bytes.
  const r = ~crc;
  return ~(U0[r & 0xff]! ^ U1[(r >>> 8) & 0xff]! ^ U2[(r >>> 16) & 0xff]! ^ U3[r >>> 24]! ^ tail) >>> 0;
}

/**
 * The CRC of any message followed by its own CRC (little-endian, as `crc32DropTail4` reads a tail):
 * `crc32(m ‖ t, prev) === CRC32_RESIDUE` with `t = crc32(m, prev)`, whatever `m` and `prev`. And only
 * then: the last four bytes move the register one to one, so for any other `t` the result differs.
 * Lets a caller check a trailer with one CRC over the message and trailer, without taking it off.
 */
export const CRC32_RESIDUE = 0x2144df1c;

/**
 * A seed that stands in for a change to byte 4: `crc32(d, crc32XorByte4(prev, x))` equals
 * `crc32(d', prev)` for d' equal to d but with `d'[4] = d[4] ^ x` (the low byte of x; d at least 5 bytes).
 * Lets a caller CRC a buffer it may not modify as if one byte were masked (the ICRC's BTH byte 4),
 * in the same call as the bytes around it.
 */
export function crc32XorByte4(prev: number, x: number): number {
  // The register meets byte 4 after four bytes; flipping x there equals flipping its preimage at the start.
  return (prev ^ U0[x & 0xff]!) >>> 0;
}

const require = createRequire(import.meta.url);

interface CrcPackage {
  buf(data: Uint8Array, seed?: number): number;
}
interface NodeRsCrc32 {
  crc32(input: Uint8Array, initialState?: number): number;
}

/** SheetJS `crc-32` (pure JS, slicing-by-16). It returns a signed int32, hence `>>> 0`; any 32-bit seed works. */
export const crc32Pkg: Crc32 | undefined = (() => {
  try {
    const m = require('crc-32') as CrcPackage;
    if (typeof m.buf !== 'function') return undefined;
    return (data: Uint8Array, prev = 0) => m.buf(data, prev) >>> 0;
  } catch {
    return undefined;
  }
})();

/**
 * node's `zlib.crc32` (Node ≥ 20.15 / 22.2). It throws on a negative seed, so the seed is made
 * unsigned; and for an empty view of a zero-sized ArrayBuffer (e.g. `TextEncoder().encode('')`) it
 * returns 0 instead of the seed (node 20.20), so empty input is answered here.
 */
export const crc32Zlib: Crc32 | undefined = (() => {
  const f = (zlib as { crc32?: (data: Uint8Array, value?: number) => number }).crc32;
  if (typeof f !== 'function') return undefined;
  return (data: Uint8Array, prev = 0) => (data.length === 0 ? prev >>> 0 : f(data, prev >>> 0) >>> 0);
})();

/** `@node-rs/crc32`: prebuilt native SIMD (PCLMULQDQ / PMULL). Absent on platforms without a prebuilt binary. */
export const crc32Native: Crc32 | undefined = (() => {
  try {
    const m = require('@node-rs/crc32') as NodeRsCrc32;
    if (typeof m.crc32 !== 'function') return undefined;
    return (data: Uint8Array, prev = 0) => m.crc32(data, prev >>> 0) >>> 0;
  } catch {
    return undefined;
  }
})();

/**
 * The stack's own addon (`src/native/icrc.c`, see `addon.ts`): carry-less multiplication folding like
 * `@node-rs/crc32`, behind a call that costs about 40 ns where that one costs about 100. Absent where
 * the addon was not built.
 */
export const crc32Addon: Crc32 | undefined = (() => {
  const a = icrcAddon;
  if (a === undefined) return undefined;
  return (data: Uint8Array, prev = 0) => a.crc32(data, prev) >>> 0;
})();

/**
 * Whether `fn` computes CRC-32 here: the standard check value, chaining, a seed above 2^31 (the
 * signed/unsigned trap) and an unaligned view of a larger buffer, all against the bitwise reference.
 * A binding that loads but misbehaves (wrong seed convention, ignores `byteOffset`) is not trusted.
 */
export function crc32SelfTest(fn: Crc32): boolean {
  try {
    const check = new TextEncoder().encode('123456789');
    if (fn(check) !== 0xcbf43926) return false;
    if (fn(new Uint8Array(0)) !== 0 || fn(new Uint8Array(0), 0xdeadbeef) !== 0xdeadbeef) return false;
    if (fn(new Uint8Array(new ArrayBuffer(0)), 0xdeadbeef) !== 0xdeadbeef) return false;
    const big = new Uint8Array(301);
    for (let i = 0; i < big.length; i++) big[i] = (i * 167 + 13) & 0xff;
    const view = big.subarray(3, 290);
    const a = view.subarray(0, 97);
    const b = view.subarray(97);
    if (fn(view) !== crc32Bitwise(view)) return false;
    if (fn(b, fn(a)) !== crc32Bitwise(view)) return false;
    if (fn(b, 0x9abcdef0) !== crc32Bitwise(b, 0x9abcdef0)) return false;
    return true;
  } catch {
    return false;
  }
}

const candidates: readonly { name: string; fn: Crc32 | undefined }[] = [
  // Fastest first (see docs/perf-ceilings.md: native SIMD ≈ 5× zlib at 4 KiB, zlib ≈ 2–3× pure JS;
  // bench/README.md: the addon ahead of `@node-rs/crc32` at every size, by its cheaper call).
  { name: 'addon', fn: crc32Addon },
  { name: 'native', fn: crc32Native },
  { name: 'zlib', fn: crc32Zlib },
  { name: 'crc-32', fn: crc32Pkg },
  { name: 'table', fn: crc32Table },
  { name: 'bitwise', fn: crc32Bitwise },
];

/** Every implementation that loaded and passed `crc32SelfTest`, fastest first; the last is the oracle. */
export const crc32Implementations: readonly { readonly name: string; readonly fn: Crc32 }[] = Object.freeze(
  candidates.flatMap((c) => (c.fn !== undefined && crc32SelfTest(c.fn) ? [Object.freeze({ name: c.name, fn: c.fn })] : [])),
);

// `table` always passes (it is pure JS over the same polynomial), so there is always a choice.
const chosen = crc32Implementations[0] ?? { name: 'table', fn: crc32Table };

/**
 * Below this many bytes `crc32` uses the JS table even when native code is available: a call into
 * `@node-rs/crc32` or zlib costs about 100 ns however short the input (measured: native ~110 ns flat
 * from 64 to 256 B, the table ~1 ns per byte), and the ICRC's pseudo header (40–60 B) and ACK-sized
 * payloads fall well below it. The addon's call is cheaper (75–80 ns at 16–96 B, against the table's
 * 32 at 16 B and 79 at 96 B), so with it the line is lower.
 */
export const CRC32_SMALL = chosen.name === 'addon' ? 96 : 112;

/**
 * The CRC-32 the stack uses: the fastest correct implementation available, fixed at load, with inputs
 * shorter than `CRC32_SMALL` bytes handled by the JS table.
 */
export const crc32: Crc32 =
  chosen.fn === crc32Table
    ? crc32Table
    : ((big: Crc32): Crc32 =>
        (data, prev = 0) =>
          data.length < CRC32_SMALL ? crc32Table(data, prev) : big(data, prev))(chosen.fn);
/** Which implementation `crc32` uses for inputs of `CRC32_SMALL` bytes and more (`'addon'`, `'native'`, `'zlib'`, `'crc-32'` or `'table'`). */
export const crc32Name: string = chosen.name;

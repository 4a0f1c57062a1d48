/**
 * Big-endian field access over (buffer, offset) pairs.
 *
 * Plain byte arithmetic on Uint8Array rather than a DataView: it needs no view object per
 * packet, and it keeps every codec a pure function of (bytes, offset). 32-bit reads use
 * multiplication for the top byte so the result is never a negative int32. 64-bit fields are
 * the exception (below).
 */

export function readU16(b: Uint8Array, off: number): number {
  return (b[off]! << 8) | b[off + 1]!;
}

export function writeU16(b: Uint8Array, off: number, v: number): void {
  b[off] = v >>> 8;
  b[off + 1] = v;
}

export function readU24(b: Uint8Array, off: number): number {
  return (b[off]! << 16) | (b[off + 1]! << 8) | b[off + 2]!;
}

export function writeU24(b: Uint8Array, off: number, v: number): void {
  b[off] = v >>> 16;
  b[off + 1] = v >>> 8;
  b[off + 2] = v;
}

export function readU32(b: Uint8Array, off: number): number {
  return b[off]! * 0x1000000 + ((b[off + 1]! << 16) | (b[off + 2]! << 8) | b[off + 3]!);
}

export function writeU32(b: Uint8Array, off: number, v: number): void {
  b[off] = v >>> 24;
  b[off + 1] = v >>> 16;
  b[off + 2] = v >>> 8;
  b[off + 3] = v;
}

// 64-bit fields (RETH and AtomicETH addresses, CM identifiers) go through one 8-byte scratch and
// its DataView, whose BigInt accessors are one builtin call with no intermediate BigInt: assembling
// a BigInt from two 32-bit halves (or splitting one) allocated four and called into the runtime
// twice for every RDMA request. The scratch is module-wide: nothing holds it across calls.
const U64 = new Uint8Array(8);
const U64_VIEW = new DataView(U64.buffer);

export function readU64(b: Uint8Array, off: number): bigint {
  for (let i = 0; i < 8; i++) U64[i] = b[off + i]!;
  return U64_VIEW.getBigUint64(0);
}

/** Writes `v` modulo 2^64 (as `BigInt.asUintN(64, v)`). */
export function writeU64(b: Uint8Array, off: number, v: bigint): void {
  U64_VIEW.setBigUint64(0, v);
  for (let i = 0; i < 8; i++) b[off + i] = U64[i]!;
}

/** Lower-case hex of a byte range, for traces and test names. */
export function toHex(b: Uint8Array, off = 0, len = b.length - off): string {
  let s = '';
  for (let i = off; i < off + len; i++) s += b[i]!.toString(16).padStart(2, '0');
  return s;
}

export function fromHex(hex: string): Uint8Array {
  const clean = hex.replace(/[\s:]/g, '');
  if (clean.length % 2 !== 0 || /[^0-9a-fA-F]/.test(clean)) throw new TypeError(`not a hex string: ${hex}`);
  const out = new Uint8Array(clean.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = parseInt(clean.slice(2 * i, 2 * i + 2), 16);
  return out;
}

export function hex32(v: number): string {
  return '0x' + (v >>> 0).toString(16).padStart(8, '0');
}

export function hex24(v: number): string {
  return '0x' + v.toString(16).padStart(6, '0');
}

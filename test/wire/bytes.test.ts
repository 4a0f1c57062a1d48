/**
 * Big-endian field access (wire/bytes.ts): 64-bit fields against a byte-by-byte model, at every
 * offset parity, with the modulo-2^64 wrap of writes.
 */
import t from 'tap';
import { readU64, writeU64 } from '../../src/wire/bytes.js';
import { Xorshift32 } from '../../src/link/fault.js';

/** The big-endian bytes of `v` modulo 2^64, one at a time. */
function model(v: bigint): number[] {
  const u = ((v % (1n << 64n)) + (1n << 64n)) % (1n << 64n);
  return Array.from({ length: 8 }, (_, i) => Number((u >> BigInt(56 - 8 * i)) & 0xffn));
}

t.test('writeU64 lays out big-endian bytes, readU64 reads them back, at any offset', async (t) => {
  const rng = new Xorshift32(0x64);
  let bad = 0;
  for (let n = 0; n < 2000; n++) {
    const v = (BigInt(rng.next() >>> 0) << 32n) | BigInt(rng.next() >>> 0);
    const off = rng.next() % 9;
    const b = new Uint8Array(20).fill(0xee);
    writeU64(b, off, v);
    const want = model(v);
    if (want.some((x, i) => b[off + i] !== x) || b[off - 1] !== (off > 0 ? 0xee : undefined) || b[off + 8] !== 0xee) bad++;
    if (readU64(b, off) !== v) bad++;
  }
  t.equal(bad, 0, '2,000 random values: bytes, neighbours untouched, round trip');
  const b = new Uint8Array(8);
  writeU64(b, 0, 0x0102030405060708n);
  t.same([...b], [1, 2, 3, 4, 5, 6, 7, 8], 'most significant byte first');
  writeU64(b, 0, -1n);
  t.same([...b], [255, 255, 255, 255, 255, 255, 255, 255], '-1 is written as 2^64 - 1');
  t.equal(readU64(b, 0), (1n << 64n) - 1n, 'and read back unsigned');
  writeU64(b, 0, (1n << 64n) + 5n);
  t.equal(readU64(b, 0), 5n, 'values past 2^64 wrap');
});

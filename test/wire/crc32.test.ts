import t from 'tap';
import {
  CRC32_RESIDUE,
  crc32,
  crc32Addon,
  crc32Bitwise,
  crc32DropTail4,
  crc32Implementations,
  crc32Name,
  crc32Native,
  crc32Pkg,
  crc32SelfTest,
  crc32Table,
  crc32XorByte4,
  crc32Zlib,
  type Crc32,
} from '../../src/wire/crc32.js';
import { randomBytes, xorshift32 } from './capture-helper.js';

const ascii = (s: string): Uint8Array => new TextEncoder().encode(s);

t.test('the oracle matches published check values', async (t) => {
  t.equal(crc32Bitwise(new Uint8Array(0)), 0);
  t.equal(crc32Bitwise(ascii('123456789')), 0xcbf43926, 'the CRC-32/ISO-HDLC check value');
  t.equal(crc32Bitwise(ascii('The quick brown fox jumps over the lazy dog')), 0x414fa339);
  t.equal(crc32Bitwise(new Uint8Array(32)), 0x190a55ad, '32 zero bytes');
  t.equal(crc32Bitwise(new Uint8Array(32).fill(0xff)), 0xff6cab0b, '32 0xff bytes');
  t.equal(crc32Bitwise(new Uint8Array(8).fill(0xff)), 0x2144df1c, 'the ICRC prefix: the complement of rxe seed 0xdebb20e3');
});

t.test('the selection', async (t) => {
  const names = crc32Implementations.map((i) => i.name);
  t.same([...new Set(names)], names, 'names are unique');
  t.ok(names.includes('table'), 'the pure-JS table is always available');
  t.ok(names.includes('bitwise'), 'the oracle is listed');
  t.equal(crc32Name, names[0], 'crc32 is the first (fastest) implementation available');
  t.ok(crc32SelfTest(crc32), 'crc32 (fastest + table for short inputs) passes the self test');
  t.ok(crc32SelfTest(crc32Table));
  const signed: Crc32 = (d, p = 0) => crc32Bitwise(d, p) | 0;
  t.notOk(crc32SelfTest(signed), 'a signed result is rejected');
  const ignoresOffset: Crc32 = (d, p = 0) => crc32Bitwise(new Uint8Array(d.buffer, 0, d.length), p);
  t.notOk(crc32SelfTest(ignoresOffset), 'an implementation that ignores byteOffset is rejected');
  const rawSeed: Crc32 = (d, p = 0) => crc32Bitwise(d, ~p);
  t.notOk(crc32SelfTest(rawSeed), 'a raw-register seed convention is rejected');
  const throws: Crc32 = () => {
    throw new Error('no');
  };
  t.notOk(crc32SelfTest(throws));
});

// Every implementation that loads, whether or not it passed the load-time self test, so that a broken
// one fails here by name instead of silently dropping out of the selection.
const loaded: { name: string; fn: Crc32 }[] = [{ name: 'table', fn: crc32Table }];
if (crc32Addon !== undefined) loaded.push({ name: 'addon', fn: crc32Addon });
if (crc32Native !== undefined) loaded.push({ name: 'native', fn: crc32Native });
if (crc32Zlib !== undefined) loaded.push({ name: 'zlib', fn: crc32Zlib });
if (crc32Pkg !== undefined) loaded.push({ name: 'crc-32', fn: crc32Pkg });

t.test('implementations that loaded all passed the self test', async (t) => {
  t.same(
    loaded.map((l) => l.name).filter((n) => n !== 'crc32').sort(),
    crc32Implementations.map((i) => i.name).filter((n) => n !== 'bitwise').sort(),
    `available: ${crc32Implementations.map((i) => i.name).join(', ')}; crc32 = ${crc32Name}`,
  );
});

loaded.push({ name: 'crc32', fn: crc32 });
for (const { name, fn } of loaded) {
  t.test(`${name} agrees with the oracle`, async (t) => {
    const rnd = xorshift32(0xc0ffee ^ name.length);
    const lengths = [0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 255, 256, 257, 1023, 1024, 1500, 4096, 4099, 65536 + 3];
    for (let n = 0; n < 100; n++) lengths.push(n);
    let mismatches = 0;
    for (const n of lengths) {
      const b = randomBytes(rnd, n);
      const r = fn(b);
      if (r !== crc32Bitwise(b)) mismatches++;
      if (!(Number.isInteger(r) && r >= 0 && r <= 0xffffffff)) mismatches++;
    }
    t.equal(mismatches, 0, `${lengths.length} random buffers, lengths 0 … 65539, unsigned results`);
    t.equal(fn(ascii('123456789')), 0xcbf43926);
  });

  t.test(`${name} chains with prev (zlib convention)`, async (t) => {
    const rnd = xorshift32(0xbeef);
    let bad = 0;
    for (let k = 0; k < 200; k++) {
      const b = randomBytes(rnd, rnd() % 700);
      const cut = b.length === 0 ? 0 : rnd() % (b.length + 1);
      if (fn(b.subarray(cut), fn(b.subarray(0, cut))) !== crc32Bitwise(b)) bad++;
      // Seeds at and above 2^31 (negative as int32) must work and must be taken as unsigned.
      const seed = rnd() | 0x80000000;
      if (fn(b, seed >>> 0) !== crc32Bitwise(b, seed >>> 0)) bad++;
      if (fn(b, seed | 0) !== crc32Bitwise(b, seed >>> 0)) bad++;
    }
    t.equal(bad, 0, '200 random splits and high seeds');
    t.equal(fn(new Uint8Array(0), 0x12345678), 0x12345678, 'an empty buffer returns prev');
    t.equal(fn(new Uint8Array(new ArrayBuffer(0)), 0x12345678), 0x12345678, '…also over a zero-sized ArrayBuffer');
    t.equal(fn(new Uint8Array(8).subarray(8), 0x87654321), 0x87654321, '…and an empty view at the end of a buffer');
    const parts = [ascii('12'), ascii(''), ascii('3456'), ascii('789')];
    let c = 0;
    for (const p of parts) c = fn(p, c);
    t.equal(c, 0xcbf43926, 'four pieces chain to the check value');
  });

  t.test(`${name} reads unaligned views of a larger buffer`, async (t) => {
    const rnd = xorshift32(0x5eed);
    const big = randomBytes(rnd, 9000);
    let bad = 0;
    for (let k = 0; k < 300; k++) {
      const start = rnd() % 9000;
      const end = start + (rnd() % (9000 - start + 1));
      const view = big.subarray(start, end);
      if (fn(view) !== crc32Bitwise(view)) bad++;
    }
    t.equal(bad, 0, '300 views at random offsets');
    const before = big.slice();
    fn(big.subarray(1, 4097));
    t.same(big, before, 'the input is not modified');
  });
}

t.test('crc32DropTail4 takes the last four bytes back off', async (t) => {
  const rnd = xorshift32(0x7a11);
  let bad = 0;
  for (let k = 0; k < 300; k++) {
    const b = randomBytes(rnd, 4 + (rnd() % 5000));
    const n = b.length;
    const tail = (b[n - 4]! | (b[n - 3]! << 8) | (b[n - 2]! << 16) | (b[n - 1]! << 24)) >>> 0;
    const prev = k % 3 === 0 ? 0 : rnd() >>> 0;
    const got = crc32DropTail4(crc32(b, prev), tail);
    if (got !== crc32Bitwise(b.subarray(0, n - 4), prev) || !(got >= 0 && got <= 0xffffffff)) bad++;
  }
  t.equal(bad, 0, '300 random buffers of 4 … 5003 bytes, with and without a seed');
  const check = ascii('123456789');
  const withCrc = new Uint8Array([...check, 0x26, 0x39, 0xf4, 0xcb]);
  t.equal(crc32(withCrc), 0x2144df1c, 'a message followed by its CRC has the CRC-32 residue');
  t.equal(crc32DropTail4(crc32(withCrc), 0xcbf43926), 0xcbf43926, 'dropping the CRC gives back the CRC of the message');
});

t.test('CRC32_RESIDUE: a message followed by its own CRC, and by nothing else', async (t) => {
  const rnd = xorshift32(0x2e51);
  let bad = 0;
  for (let k = 0; k < 300; k++) {
    const n = rnd() % 3000;
    const b = randomBytes(rnd, n + 4);
    const prev = k % 3 === 0 ? 0 : rnd() >>> 0;
    const c = crc32Bitwise(b.subarray(0, n), prev);
    b[n] = c;
    b[n + 1] = c >>> 8;
    b[n + 2] = c >>> 16;
    b[n + 3] = c >>> 24;
    for (const { fn } of crc32Implementations) if (fn(b, prev) !== CRC32_RESIDUE) bad++;
    // Any other trailer (a random nonzero change to it) gives something else.
    const d = (rnd() >>> 0) || 1;
    for (let i = 0; i < 4; i++) b[n + i] = b[n + i]! ^ (d >>> (8 * i));
    if (crc32(b, prev) === CRC32_RESIDUE) bad++;
  }
  t.equal(bad, 0, '300 random messages of 0 … 2999 bytes, with and without a seed, every implementation');
});

t.test('crc32XorByte4 stands in for a change to byte 4', async (t) => {
  const rnd = xorshift32(0xb7e4);
  let bad = 0;
  for (let k = 0; k < 200; k++) {
    const b = randomBytes(rnd, 5 + (rnd() % 300));
    const prev = k % 4 === 0 ? 0 : rnd() >>> 0;
    const x = k < 2 ? k * 0xff : rnd() & 0xff;
    const changed = b.slice();
    changed[4] = changed[4]! ^ x;
    const seed = crc32XorByte4(prev, x);
    // Also chained: the seed holds when the bytes go through in pieces, byte 4 in any of them.
    const cut = rnd() % (b.length + 1);
    if (crc32(b, seed) !== crc32Bitwise(changed, prev)) bad++;
    if (crc32(b.subarray(cut), crc32(b.subarray(0, cut), seed)) !== crc32Bitwise(changed, prev)) bad++;
    if (!(seed >= 0 && seed <= 0xffffffff)) bad++;
  }
  t.equal(bad, 0, '200 random buffers, every x and seeds at and above 2^31');
  let all = 0;
  const b = randomBytes(rnd, 12);
  for (let x = 0; x < 256; x++) {
    const changed = b.slice();
    changed[4] = changed[4]! ^ x;
    if (crc32Bitwise(b, crc32XorByte4(0x9abcdef0, x)) !== crc32Bitwise(changed, 0x9abcdef0)) all++;
  }
  t.equal(all, 0, 'all 256 values of x over a 12-byte BTH-sized buffer');
  t.equal(crc32XorByte4(0x12345678, 0), 0x12345678, 'x = 0 leaves the seed alone');
});

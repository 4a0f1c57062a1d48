/**
 * The native addon (src/native/icrc.c) against the JavaScript it replaces: CRC-32 against the bitwise
 * oracle, and every ICRC entry point against `icrcJs`, over random packets at every alignment, both
 * families, random IDs, splits and corruptions. icrc.test.ts runs the public functions (the addon,
 * where built) against the rxe captures and a naive oracle; this file holds the two implementations
 * to each other where the captures do not reach.
 */
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import t from 'tap';
import { addonMissing, icrcAddon } from '../../src/wire/addon.js';
import { crc32Bitwise, crc32Name } from '../../src/wire/crc32.js';
import {
  ICRC_BAD,
  ICRC_RECOVERED,
  ICRC_UNCHECKED,
  icrcImplementation,
  icrcJs,
  icrcOfParts,
  icrcOfUdpPayload,
  MIN_ICRC_PAYLOAD,
  recoverIpv4Id,
  verified,
  verifyIcrc,
  verifyIcrc4,
  verifyIcrc6,
  Ipv4IcrcKey,
  Ipv6IcrcKey,
  IcrcFlowKey,
  receivedIpId,
  receivedVerdict,
  verifyReceived,
  writeIcrc,
  type IcrcMode,
  type UdpDatagramInfo,
} from '../../src/wire/icrc.js';
import { randomBytes, xorshift32 } from './capture-helper.js';

// `npm install` builds the addon; only an explicit ROCE_ADDON=0 runs these tests without it.
const optedOut = process.env['ROCE_ADDON'] === '0';

t.test('the addon is built, loaded and used', async (t) => {
  if (optedOut) {
    t.equal(icrcAddon, undefined, 'ROCE_ADDON=0 leaves it unloaded');
    t.equal(icrcImplementation, 'js');
    return;
  }
  t.ok(icrcAddon, `the addon loads (${addonMissing ?? 'loaded'}); npm run build:addon builds it`);
  t.equal(icrcImplementation, 'addon', 'it agreed with the JavaScript ICRC at load');
  t.equal(crc32Name, 'addon', 'and it is the CRC-32 the stack uses');
});

// What `npm install` of the published package compiles is what its `files` ship: every source the
// binding names, and every header those include. A file left out fails the build there, and the
// stack then runs without the addon.
t.test('the package ships every source and header the addon is built from', (t) => {
  const native = fileURLToPath(new URL('../../../src/native/', import.meta.url));
  const gyp = JSON.parse(readFileSync(`${native}binding.gyp`, 'utf8')) as { targets: { sources: string[] }[] };
  const sources = gyp.targets.flatMap((x) => x.sources);
  const headers = [...new Set(sources.flatMap((f) => [...readFileSync(`${native}${f}`, 'utf8').matchAll(/^#include "([^"]+)"/gm)].map((m) => m[1]!)))];
  t.ok(sources.length >= 3 && headers.length >= 2, `sources ${sources.join(', ')}; headers ${headers.join(', ')}`);
  const root = fileURLToPath(new URL('../../../', import.meta.url));
  const r = spawnSync('npm', ['pack', '--dry-run', '--json', '--ignore-scripts'], { cwd: root, encoding: 'utf8', timeout: 60_000 });
  t.equal(r.status, 0, `npm pack --dry-run ran (${r.stderr.slice(0, 200)})`);
  const packed = new Set((JSON.parse(r.stdout) as { files: { path: string }[] }[])[0]!.files.map((f) => f.path));
  for (const f of ['binding.gyp', ...sources, ...headers]) t.ok(packed.has(`src/native/${f}`), `src/native/${f} is in the package`);
  t.end();
});

// Where the addon cannot be built (no compiler), `npm install` must still succeed, with a warning:
// the install script's fallback runs in place of node-gyp and exits 0.
t.test('the install script falls back to a warning, exit 0, where node-gyp fails', (t) => {
  const root = fileURLToPath(new URL('../../../', import.meta.url));
  const pkg = JSON.parse(readFileSync(`${root}package.json`, 'utf8')) as { scripts: { install: string } };
  const build = 'node-gyp rebuild --directory=src/native';
  t.ok(pkg.scripts.install.startsWith(`${build} || `), 'node-gyp first, then the fallback');
  const r = spawnSync('sh', ['-c', pkg.scripts.install.replace(build, 'false')], { cwd: root, encoding: 'utf8', timeout: 30_000 });
  t.equal(r.status, 0, `the fallback exits 0 (${r.stderr.slice(0, 200)})`);
  t.match(r.stderr, /did not build/, 'and says the addon did not build');
  t.end();
});

const addon = icrcAddon;

t.test('CRC-32: every length to 300, then random lengths, offsets and seeds, against the oracle', { skip: addon === undefined && 'no addon (see above)' }, async (t) => {
  const a = addon!;
  const rnd = xorshift32(0xc0ffee);
  const big = randomBytes(rnd, 70_000);
  let bad = 0;
  let n = 0;
  const check = (off: number, len: number, seed: number): void => {
    const v = big.subarray(off, off + len);
    if (a.crc32(v, seed) >>> 0 !== crc32Bitwise(v, seed)) bad++;
    n++;
  };
  for (let len = 0; len <= 300; len++) check(len % 17, len, len * 0x9e3779b9);
  for (let k = 0; k < 400; k++) check(rnd() % 64, rnd() % 9000, rnd());
  check(3, 65_600, 0); // longer than any datagram, not a multiple of 16, unaligned
  t.equal(bad, 0, `${n} cases`);
  t.equal(a.crc32(big.subarray(0, 0), 0x12345678) >>> 0, 0x12345678, 'empty input returns the seed');
  t.equal(a.crc32(new TextEncoder().encode('123456789')) >>> 0, 0xcbf43926, 'the check value, seed defaulted');
});

t.test('the addon refuses what is not a byte array, without crashing', { skip: addon === undefined && 'no addon (see above)' }, async (t) => {
  const a = addon!;
  for (const bad of [undefined, null, 42, 'abc', {}, [1, 2, 3], new Int32Array(8), new DataView(new ArrayBuffer(8))]) {
    t.throws(() => a.crc32(bad as unknown as Uint8Array), TypeError, `crc32(${Object.prototype.toString.call(bad)})`);
    t.throws(() => a.icrc(bad as unknown as Uint8Array), TypeError, `icrc(${Object.prototype.toString.call(bad)})`);
    t.throws(() => a.verify(bad as unknown as Uint8Array), TypeError);
    t.throws(() => a.icrc2(bad as unknown as Uint8Array, new Uint8Array(16)), TypeError);
  }
  t.throws(() => a.bind(new Uint8Array(64) as unknown as Int32Array), TypeError, 'bind wants an Int32Array');
  t.throws(() => a.bind(new Int32Array(4)), TypeError, 'of 16 words');
  t.throws(() => a.icrc(new Uint8Array(MIN_ICRC_PAYLOAD - 1)), RangeError, 'a payload shorter than BTH + ICRC');
  t.throws(() => a.icrc2(new Uint8Array(5), new Uint8Array(6)), RangeError, 'parts shorter than a BTH');
  t.equal(a.verify(new Uint8Array(3)), ICRC_BAD, 'verify answers bad for a runt');
  const info: UdpDatagramInfo = { family: 4, srcAddr: Uint8Array.of(1, 2, 3, 4), dstAddr: Uint8Array.of(5, 6, 7, 8), srcPort: 1, dstPort: 4791 };
  t.throws(() => icrcOfUdpPayload(info, new Uint8Array(15)), RangeError, 'the public function: a RangeError, as without the addon');
});

function randomInfo(rnd: () => number, family: 4 | 6): UdpDatagramInfo {
  const n = family === 4 ? 4 : 16;
  return {
    family,
    srcAddr: randomBytes(rnd, n),
    dstAddr: randomBytes(rnd, n),
    srcPort: rnd() & 0xffff,
    dstPort: rnd() & 1 ? 4791 : rnd() & 0xffff,
    ipId: rnd() & 1 ? 0 : rnd() & 0xffff,
    ipFlagsFrag: rnd() & 1 ? 0x4000 : 0,
  };
}

t.test('ICRC: addon and JavaScript agree on random packets, both families, every alignment', async (t) => {
  const rnd = xorshift32(0x1cc0);
  const arena = randomBytes(rnd, 5000 + 64);
  let bad = 0;
  let n = 0;
  for (let k = 0; k < 1500; k++) {
    const info = randomInfo(rnd, k % 3 === 0 ? 6 : 4);
    const len = k < 200 ? MIN_ICRC_PAYLOAD + k : MIN_ICRC_PAYLOAD + (rnd() % 4200);
    const off = rnd() % 48;
    const p = arena.subarray(off, off + len);
    const want = icrcJs.icrcOfUdpPayload(info, p);
    if (icrcOfUdpPayload(info, p) !== want) bad++;
    // Two parts split anywhere, the BTH included.
    const cut = rnd() % (len - 4 + 1);
    if (icrcOfParts(info, [p.subarray(0, cut), p.subarray(cut, len - 4)], len) !== want) bad++;
    n++;
  }
  t.equal(bad, 0, `${n} packets, each whole and in two parts`);
});

t.test('ICRC verdicts: addon and JavaScript agree, with the same ID and DF, on good, foreign-ID and corrupt packets', async (t) => {
  const rnd = xorshift32(0x5eed);
  let differ = 0;
  let recovered = 0;
  let n = 0;
  for (let k = 0; k < 1200; k++) {
    const family = k % 4 === 0 ? 6 : 4;
    const sender = randomInfo(rnd, family);
    const len = MIN_ICRC_PAYLOAD + (rnd() % 3000);
    const p = randomBytes(rnd, len);
    writeIcrc(p, icrcJs.icrcOfUdpPayload(sender, p));
    const what = rnd() % 4;
    const at = rnd() % (len - 4);
    if (what === 1) p[at] = p[at]! ^ (1 << (rnd() & 7)); // corrupt a covered byte
    if (what === 2) p[4] = p[4]! ^ 0xc0; // FECN/BECN: masked, still good
    // The receiver guesses an ID (a UDP socket cannot see it) or knows it.
    const receiver: UdpDatagramInfo = { ...sender, ipId: what === 3 ? (sender.ipId ?? 0) : rnd() & 0xffff, ipFlagsFrag: rnd() & 1 ? 0x4000 : 0 };
    for (const mode of ['strict', 'recover', 'off'] as IcrcMode[]) {
      const js = icrcJs.verifyIcrc(receiver, p, mode);
      const jsOut = { ...verified };
      const native = verifyIcrc(receiver, p, mode);
      const out = { ...verified };
      n++;
      if (js !== native) differ++;
      else if (native !== ICRC_BAD && family === 4 && (out.ipId !== jsOut.ipId || out.dontFragment !== jsOut.dontFragment)) differ++;
      if (mode === 'recover' && native === 2) recovered++;
    }
    const r1 = icrcJs.recoverIpv4Id(receiver, p);
    const r2 = recoverIpv4Id(receiver, p);
    if (JSON.stringify(r1) !== JSON.stringify(r2)) differ++;
  }
  t.equal(differ, 0, `${n} verdicts`);
  t.ok(recovered > 300, `IDs recovered: ${recovered}`);
});

t.test('verifyIcrc6 with a flow\'s key words gives verifyIcrc\'s verdicts; a key for other addresses fails good packets', async (t) => {
  const rnd = xorshift32(0x6c6c);
  // One key set to each flow's addresses in turn, as UdpLink's when its peer changes address.
  const reused = new Ipv6IcrcKey(new Uint8Array(16), new Uint8Array(16));
  let differ = 0;
  let good = 0;
  let n = 0;
  const other = randomInfo(rnd, 6);
  const stale = new Ipv6IcrcKey(other.srcAddr, other.dstAddr);
  let staleOk = 0;
  for (let k = 0; k < 600; k++) {
    const flow = randomInfo(rnd, 6);
    const key = new Ipv6IcrcKey(flow.srcAddr, flow.dstAddr);
    reused.set(flow.srcAddr, flow.dstAddr);
    const len = MIN_ICRC_PAYLOAD + (rnd() % 3000);
    const p = randomBytes(rnd, len);
    writeIcrc(p, icrcJs.icrcOfUdpPayload(flow, p));
    const what = rnd() % 3;
    const at = rnd() % (len - 4);
    if (what === 1) p[at] = p[at]! ^ (1 << (rnd() & 7)); // a covered byte
    if (what === 2) p[4] = p[4]! ^ 0xc0; // FECN/BECN: masked, still good
    for (const mode of ['strict', 'recover', 'off'] as IcrcMode[]) {
      const want = icrcJs.verifyIcrc(flow, p, mode);
      n++;
      if (verifyIcrc6(flow, key, p, mode) !== want || verifyIcrc6(flow, reused, p, mode) !== want || verifyIcrc(flow, p, mode) !== want) differ++;
      if (mode === 'strict' && want !== ICRC_BAD) {
        good++;
        if (verifyIcrc6(flow, stale, p, mode) !== ICRC_BAD) staleOk++;
      }
    }
  }
  t.equal(differ, 0, `${n} verdicts`);
  t.ok(good > 300, `good packets: ${good}`);
  if (icrcImplementation === 'addon') t.equal(staleOk, 0, 'the key words, not the info\'s addresses, are what the addon checks');
  else t.equal(staleOk, good, 'without the addon the JavaScript checks the info\'s addresses');
  t.throws(() => new Ipv6IcrcKey(new Uint8Array(4), new Uint8Array(16)), RangeError, 'IPv6 addresses only');
});

t.test('verifyIcrc4 with a flow\'s key words gives verifyIcrc\'s verdicts, IDs and DF; a key for other addresses fails good packets', async (t) => {
  const rnd = xorshift32(0x4c4c);
  // One key set to each flow's addresses in turn, as UdpLink's when its peer changes.
  const reused = new Ipv4IcrcKey(new Uint8Array(4), new Uint8Array(4));
  let differ = 0;
  let good = 0;
  let recovered = 0;
  let n = 0;
  const other = randomInfo(rnd, 4);
  const stale = new Ipv4IcrcKey(other.srcAddr, other.dstAddr);
  let staleOk = 0;
  for (let k = 0; k < 800; k++) {
    const sender = randomInfo(rnd, 4);
    const key = new Ipv4IcrcKey(sender.srcAddr, sender.dstAddr);
    reused.set(sender.srcAddr, sender.dstAddr);
    const len = MIN_ICRC_PAYLOAD + (rnd() % 3000);
    const p = randomBytes(rnd, len);
    writeIcrc(p, icrcJs.icrcOfUdpPayload(sender, p));
    const what = rnd() % 4;
    const at = rnd() % (len - 4);
    if (what === 1) p[at] = p[at]! ^ (1 << (rnd() & 7)); // a covered byte
    if (what === 2) p[4] = p[4]! ^ 0xc0; // FECN/BECN: masked, still good
    // The receiver guesses an ID (a UDP socket cannot see it) or knows it, and assumes DF or not.
    const receiver: UdpDatagramInfo = { ...sender, ipId: what === 3 ? (sender.ipId ?? 0) : rnd() & 0xffff, ipFlagsFrag: rnd() & 1 ? 0x4000 : 0 };
    for (const mode of ['strict', 'recover', 'off'] as IcrcMode[]) {
      const want = icrcJs.verifyIcrc(receiver, p, mode);
      const wantOut = { ...verified };
      n++;
      for (const kw of [key, reused]) {
        const got = verifyIcrc4(receiver, kw, p, mode);
        if (got !== want || (got !== ICRC_BAD && got !== ICRC_UNCHECKED && (verified.ipId !== wantOut.ipId || verified.dontFragment !== wantOut.dontFragment))) differ++;
      }
      if (mode === 'recover' && want === ICRC_RECOVERED) recovered++;
      if (mode === 'strict' && want !== ICRC_BAD) {
        good++;
        if (verifyIcrc4(receiver, stale, p, mode) !== ICRC_BAD) staleOk++;
      }
    }
  }
  t.equal(differ, 0, `${n} verdicts, each with two keys`);
  t.ok(good > 50, `good packets: ${good}`);
  t.ok(recovered > 100, `IDs recovered: ${recovered}`);
  if (icrcImplementation === 'addon') t.equal(staleOk, 0, 'the key words, not the info\'s addresses, are what the addon checks');
  else t.equal(staleOk, good, 'without the addon the JavaScript checks the info\'s addresses');
  t.throws(() => new Ipv4IcrcKey(new Uint8Array(16), new Uint8Array(4)), RangeError, 'IPv4 addresses only');
  t.equal(verifyIcrc4(randomInfo(rnd, 4), stale, new Uint8Array(MIN_ICRC_PAYLOAD - 1), 'recover'), ICRC_BAD, 'shorter than BTH + ICRC: bad, no throw');
});

t.test('IcrcFlowKey computes icrcOfUdpPayload\'s ICRC from its key words, not from the info it was built from', async (t) => {
  const rnd = xorshift32(0xf10e);
  let differ = 0;
  let n = 0;
  const key = new IcrcFlowKey(randomInfo(rnd, 4));
  for (let k = 0; k < 800; k++) {
    const family = (k & 1) === 0 ? 4 : 6;
    const flow = randomInfo(rnd, family);
    // One key reused across flows and families, as a link keeps one for its last send; the info's
    // arrays are overwritten after `set`, which must not reach the key.
    key.set(flow);
    const want: number[] = [];
    const ids = [0, rnd() & 0xffff, 0xffff];
    const p = randomBytes(rnd, MIN_ICRC_PAYLOAD + (rnd() % 3000));
    for (const id of ids) want.push(icrcJs.icrcOfUdpPayload({ ...flow, ipId: family === 4 ? id : 0, ipFlagsFrag: 0x4000 }, p));
    flow.srcAddr.fill(0xaa);
    flow.dstPort ^= 1;
    ids.forEach((id, i) => {
      n++;
      if (key.icrc(id, p) !== want[i]) differ++;
    });
  }
  t.equal(differ, 0, `${n} ICRCs, both families`);
  t.throws(() => key.set({ family: 6, srcAddr: new Uint8Array(4), dstAddr: new Uint8Array(16), srcPort: 1, dstPort: 2 }), RangeError, 'an invalid flow');
  t.throws(() => key.icrc(0, new Uint8Array(MIN_ICRC_PAYLOAD - 1)), RangeError, 'a payload shorter than BTH + ICRC');
});

/**
 * A send queue's layout (mmsg.ts, `TxQueue.desc`) of `b` messages at random places in `ring`: lone
 * datagrams and GSO trains of 2–12 segments of 16–1500 B, the last one shorter or not. Returns the
 * descriptor and every datagram as [message, offset, length, train index].
 */
function randomQueue(rnd: () => number, ring: Uint8Array, b: number): { desc: Int32Array; datagrams: [number, number, number, number][] } {
  const desc = new Int32Array(3 * b);
  const datagrams: [number, number, number, number][] = [];
  let at = rnd() % 8;
  for (let i = 0; i < b; i++) {
    const seg = MIN_ICRC_PAYLOAD + (rnd() % 1485);
    const segs = rnd() & 1 ? 1 : 2 + (rnd() % 11);
    const last = rnd() & 1 ? seg : MIN_ICRC_PAYLOAD + (rnd() % (seg - MIN_ICRC_PAYLOAD + 1));
    const bytes = (segs - 1) * seg + last;
    desc[i] = at;
    desc[b + i] = bytes;
    desc[2 * b + i] = seg;
    for (let k = 0; k < segs; k++) datagrams.push([i, at + k * seg, k === segs - 1 ? last : seg, k]);
    at += bytes + (rnd() % 8);
  }
  if (at > ring.length) throw new Error('ring too small for the test queue');
  return { desc, datagrams };
}

t.test('IcrcFlowKey.trains writes every datagram of a queue\'s messages with its train index as the IPv4 ID, and nothing else', async (t) => {
  const rnd = xorshift32(0x7a15);
  const ring = new Uint8Array(8 * 12 * 1500 + 64);
  const key = new IcrcFlowKey(randomInfo(rnd, 4));
  let differ = 0;
  let outside = 0;
  let n = 0;
  for (let trial = 0; trial < 300; trial++) {
    const family = (trial & 1) === 0 ? 4 : 6;
    const flow = randomInfo(rnd, family);
    key.set(flow);
    ring.set(randomBytes(rnd, ring.length));
    const before = ring.slice();
    const { desc, datagrams } = randomQueue(rnd, ring, 8);
    const from = rnd() % 8;
    const to = from + (rnd() % (9 - from));
    key.trains(ring, desc, from, to);
    const fields = new Set<number>();
    for (const [i, at, len, k] of datagrams) {
      if (i < from || i >= to) continue;
      n++;
      const d = ring.subarray(at, at + len);
      const want = icrcJs.icrcOfUdpPayload({ ...flow, ipId: family === 4 ? k : 0, ipFlagsFrag: 0x4000 }, d);
      const got = (d[len - 4]! | (d[len - 3]! << 8) | (d[len - 2]! << 16) | (d[len - 1]! << 24)) >>> 0;
      if (got !== want) differ++;
      for (let j = len - 4; j < len; j++) fields.add(at + j);
    }
    for (let j = 0; j < ring.length; j++) if (!fields.has(j) && ring[j] !== before[j]) outside++;
  }
  t.ok(n > 1000, `${n} datagrams checked`);
  t.equal(differ, 0, 'each ICRC is the JavaScript one for its train index (IPv4) or none (IPv6)');
  t.equal(outside, 0, 'no byte but the ICRC fields of the messages asked for changed');

  const small = new Uint8Array(4096);
  const bad: [string, Int32Array, number, number][] = [
    ['a message past the ring', Int32Array.of(4000, 200, 200), 0, 1],
    ['a negative offset', Int32Array.of(-1, 100, 100), 0, 1],
    ['segments shorter than BTH + ICRC', Int32Array.of(0, 60, 15), 0, 1],
    ['a last segment shorter than BTH + ICRC', Int32Array.of(0, 110, 100), 0, 1],
    ['more messages than the queue holds', Int32Array.of(0, 100, 100), 0, 2],
    ['from after to', Int32Array.of(0, 100, 100), 1, 0],
  ];
  for (const [what, desc, from, to] of bad) {
    // A good message ahead of the bad one: nothing is written unless every message is good.
    const two = desc.length === 3 && from === 0 && to === 1 ? Int32Array.of(0, desc[0]!, 100, desc[1]!, 100, desc[2]!) : desc;
    const last = two === desc ? to : 2;
    small.fill(0x5a);
    t.throws(() => key.trains(small, two, from, last), RangeError, what);
    t.ok(small.every((x) => x === 0x5a), `${what}: nothing written`);
  }
});

/**
 * A receive batch as RxRing lays it out (src/link/mmsg.ts): each message's sockaddr and bytes somewhere
 * in `mem`, lone datagrams and GRO trains cut at a segment size, from random sources to one local end.
 * Each datagram was sent with its train index as the IPv4 ID and DF, or another ID, or without DF, or
 * is corrupt or shorter than BTH + ICRC. Returns the batch and, per datagram, what `verifyIcrc` says of
 * it with the train index as its guess, in the order `verifyReceived` judges them.
 */
function randomBatch(rnd: () => number, family: 4 | 6, local: Uint8Array, localPort: number, mode: IcrcMode, messages: number): { mem: Uint8Array; desc: Int32Array; want: number[] } {
  const mem = randomBytes(rnd, messages * (32 + 12 * 700) + 64);
  const desc = new Int32Array(4 * messages + 4);
  const want: number[] = [];
  let at = rnd() % 8;
  for (let i = 0; i < messages; i++) {
    const srcAddr = randomBytes(rnd, family === 4 ? 4 : 16);
    const srcPort = rnd() & 0xffff;
    mem[at + 2] = srcPort >> 8;
    mem[at + 3] = srcPort & 0xff;
    mem.set(srcAddr, at + (family === 4 ? 4 : 8));
    desc[4 * i + 3] = at;
    at += family === 4 ? 16 : 28;
    const seg = MIN_ICRC_PAYLOAD + (rnd() % 685);
    const segs = rnd() & 1 ? 1 : 2 + (rnd() % 11);
    // A short datagram: a lone one of any length, or a train's last segment of at least a byte.
    const last = rnd() % 8 === 0 ? (segs === 1 ? 0 : 1) + (rnd() % (MIN_ICRC_PAYLOAD - 1)) : rnd() & 1 ? seg : MIN_ICRC_PAYLOAD + (rnd() % (seg - MIN_ICRC_PAYLOAD + 1));
    const len = segs === 1 ? last : (segs - 1) * seg + last;
    desc[4 * i] = at;
    desc[4 * i + 1] = len;
    desc[4 * i + 2] = segs === 1 ? (rnd() & 1 ? len : 0) : seg;
    for (let k = 0, o = 0; k < segs; k++) {
      const n = k === segs - 1 ? last : seg;
      const d = mem.subarray(at + o, at + o + n);
      const what = rnd() % 4;
      const sent: UdpDatagramInfo = { family, srcAddr, dstAddr: local, srcPort, dstPort: localPort, ipId: family === 4 && what === 1 ? rnd() & 0xffff : k, ipFlagsFrag: what === 2 ? 0 : 0x4000 };
      if (n >= MIN_ICRC_PAYLOAD) writeIcrc(d, icrcJs.icrcOfUdpPayload(sent, d));
      if (what === 3 && n > 0) {
        const x = rnd() % n;
        d[x] = d[x]! ^ (1 << (rnd() & 7));
      }
      const guess: UdpDatagramInfo = { ...sent, ipId: family === 4 ? k : 0, ipFlagsFrag: family === 4 ? 0x4000 : 0 };
      const v = n >= MIN_ICRC_PAYLOAD ? icrcJs.verifyIcrc(guess, d, mode) : ICRC_BAD;
      want.push(v === ICRC_BAD || family === 6 ? v : v | (((verified.ipId << 1) | (verified.dontFragment ? 1 : 0)) << 2));
      o += n;
    }
    at += len + (rnd() % 8);
  }
  if (at > mem.length) throw new Error('mem too small for the test batch');
  return { mem, desc, want };
}

t.test('verifyReceived judges a whole receive batch, trains cut at their segment size, as verifyIcrc judges each datagram', { skip: addon === undefined && 'no addon (see above)' }, async (t) => {
  const rnd = xorshift32(0x4ecb);
  let n = 0;
  let differ = 0;
  const seen = new Set<number>();
  for (let trial = 0; trial < 400; trial++) {
    const family = (trial & 1) === 0 ? 4 : 6;
    const local = randomBytes(rnd, family === 4 ? 4 : 16);
    const localPort = rnd() & 1 ? 4791 : rnd() & 0xffff;
    const mode: IcrcMode = rnd() & 1 ? 'recover' : 'strict';
    const messages = 1 + (rnd() % 8);
    const { mem, desc, want } = randomBatch(rnd, family, local, localPort, mode, messages);
    const out = new Int32Array(want.length + 3).fill(-7);
    const judged = verifyReceived(family, local, localPort, mode, mem, desc, messages, out);
    if (judged !== want.length) differ++;
    for (let j = 0; j < want.length; j++) {
      n++;
      seen.add(receivedVerdict(out[j]!));
      if (out[j] !== want[j]) differ++;
    }
    if (out[want.length] !== -7) differ++;
  }
  t.ok(n > 4000, `${n} datagrams judged`);
  t.equal(differ, 0, 'every word is the verdict, ID and DF verifyIcrc gives, and no word past the batch is written');
  t.same([...seen].sort(), [ICRC_BAD, 1, 2], 'the batches held good, recovered and bad datagrams');

  // An out shorter than the batch: as many as it holds, the first ones.
  const local = Uint8Array.of(10, 1, 1, 2);
  const { mem, desc, want } = randomBatch(xorshift32(9), 4, local, 4791, 'recover', 8);
  const short = new Int32Array(3);
  t.equal(verifyReceived(4, local, 4791, 'recover', mem, desc, 8, short), 3, 'an out of three words: three judged');
  t.same(Array.from(short), want.slice(0, 3), 'the first three');
  t.equal(receivedIpId(want.find((w) => receivedVerdict(w) !== ICRC_BAD)!) >= 0, true, 'an ID reads from a word');
  t.equal(verifyReceived(4, local, 4791, 'off', mem, desc, 8, short), 0, 'mode off: nothing judged, each is checked on delivery');

  const bad: [string, Int32Array, number][] = [
    ['a message past the memory', Int32Array.of(100, mem.length, 0, 0), 1],
    ['a negative offset', Int32Array.of(-1, 100, 100, 0), 1],
    ['a negative length', Int32Array.of(0, -5, 0, 0), 1],
    ['a sockaddr past the memory', Int32Array.of(0, 100, 100, mem.length - 4), 1],
    ['more messages than desc holds', Int32Array.of(0, 100, 100, 0), 2],
    ['a negative message count', Int32Array.of(0, 100, 100, 0), -1],
  ];
  for (const [what, d, messages] of bad) {
    // A good message ahead of the bad one: nothing is judged unless every message is good.
    const two = messages === 1 ? Int32Array.of(200, 100, 100, 100, ...d) : d;
    const out = new Int32Array(8).fill(-7);
    t.throws(() => verifyReceived(4, local, 4791, 'recover', mem, two, messages === 1 ? 2 : messages, out), RangeError, what);
    t.ok(out.every((x) => x === -7), `${what}: nothing written`);
  }
  t.throws(() => verifyReceived(6, local, 4791, 'strict', mem, desc, 1, short), RangeError, 'a 4-byte local address for IPv6');
});

t.test('recoverIpv4Id with assumed flags other than DF or 0 answers as the JavaScript does', async (t) => {
  const rnd = xorshift32(4242);
  const p = randomBytes(rnd, 300);
  for (const flags of [0x2000, 0x6000, 0x4001, 0x8000]) {
    const sender: UdpDatagramInfo = { family: 4, srcAddr: Uint8Array.of(10, 1, 1, 1), dstAddr: Uint8Array.of(10, 1, 1, 2), srcPort: 4000, dstPort: 4791, ipId: 77, ipFlagsFrag: flags };
    writeIcrc(p, icrcJs.icrcOfUdpPayload(sender, p));
    t.same(recoverIpv4Id(sender, p), icrcJs.recoverIpv4Id(sender, p), `flags 0x${flags.toString(16)}`);
  }
});

t.test('the flow cache: a flow of three alternating, and an address rewritten in place, each get their own ICRC', async (t) => {
  const rnd = xorshift32(77);
  const flows = [randomInfo(rnd, 4), randomInfo(rnd, 6), randomInfo(rnd, 4)];
  const p = randomBytes(rnd, 1040);
  let bad = 0;
  for (let k = 0; k < 300; k++) {
    const info = flows[k % 3]!;
    const at = rnd() % info.srcAddr.length;
    if (k % 7 === 0) info.srcAddr[at] = info.srcAddr[at]! ^ (1 << (rnd() & 7)); // same array, new address
    if (k % 11 === 0) info.ipId = rnd() & 0xffff;
    const q = p.subarray(0, 16 + (k % 5) * 100); // and the length changes
    if (icrcOfUdpPayload(info, q) !== icrcJs.icrcOfUdpPayload(info, q)) bad++;
  }
  t.equal(bad, 0);
});

t.test('a worker thread has its own addon state: both compute at once and agree', async (t) => {
  // The worker runs the compiled dist/src/wire/icrc.js, as this file runs from dist/test.
  const icrcModule = new URL('../../src/wire/icrc.js', import.meta.url).href;
  const code = `
    const { parentPort } = require('node:worker_threads');
    import(${JSON.stringify(icrcModule)}).then((m) => {
      const info = { family: 4, srcAddr: Uint8Array.of(10, 0, 0, 9), dstAddr: Uint8Array.of(10, 0, 0, 8), srcPort: 5000, dstPort: 4791, ipId: 0, ipFlagsFrag: 0x4000 };
      const p = new Uint8Array(1040).map((_, i) => i * 31);
      let x = 0;
      for (let i = 0; i < 20000; i++) { info.ipId = i & 0xffff; x = (x + m.icrcOfUdpPayload(info, p)) >>> 0; }
      parentPort.postMessage({ impl: m.icrcImplementation, x });
    });`;
  const w = new Worker(code, { eval: true });
  const fromWorker = new Promise<{ impl: string; x: number }>((resolve, reject) => {
    w.once('message', resolve);
    w.once('error', reject);
  });
  // Meanwhile this thread computes other flows through its own key block and cache.
  const mine: UdpDatagramInfo = { family: 6, srcAddr: new Uint8Array(16).fill(1), dstAddr: new Uint8Array(16).fill(2), srcPort: 7, dstPort: 4791 };
  const q = new Uint8Array(600).map((_, i) => i * 7);
  let mismatches = 0;
  for (let i = 0; i < 20000; i++) {
    mine.srcPort = i & 0xffff;
    if (icrcOfUdpPayload(mine, q) !== icrcJs.icrcOfUdpPayload(mine, q)) mismatches++;
  }
  const r = await fromWorker;
  await w.terminate();
  const info: UdpDatagramInfo = { family: 4, srcAddr: Uint8Array.of(10, 0, 0, 9), dstAddr: Uint8Array.of(10, 0, 0, 8), srcPort: 5000, dstPort: 4791, ipId: 0, ipFlagsFrag: 0x4000 };
  const p = new Uint8Array(1040).map((_, i) => i * 31);
  let x = 0;
  for (let i = 0; i < 20000; i++) {
    info.ipId = i & 0xffff;
    x = (x + icrcJs.icrcOfUdpPayload(info, p)) >>> 0;
  }
  t.equal(mismatches, 0, 'this thread');
  t.equal(r.impl, icrcImplementation, 'the worker uses the same implementation');
  t.equal(r.x, x, 'the worker');
});

t.test('without the addon (ROCE_ADDON=0) the stack computes the same ICRCs in JavaScript', { skip: optedOut && 'this run is the one without' }, async (t) => {
  const icrcModule = fileURLToPath(new URL('../../src/wire/icrc.js', import.meta.url));
  const crcModule = fileURLToPath(new URL('../../src/wire/crc32.js', import.meta.url));
  const script = `
    const m = await import(${JSON.stringify(icrcModule)});
    const c = await import(${JSON.stringify(crcModule)});
    const info = { family: 4, srcAddr: Uint8Array.of(192, 168, 7, 1), dstAddr: Uint8Array.of(192, 168, 7, 2), srcPort: 49152, dstPort: 4791, ipId: 7, ipFlagsFrag: 0x4000 };
    const p = new Uint8Array(1100).map((_, i) => i * 13);
    const ring = new Uint8Array(2500).map((_, i) => i * 7);
    new m.IcrcFlowKey(info).trains(ring, Int32Array.of(0, 1100, 1100, 1400, 1100, 600), 0, 2);
    const judged = m.verifyReceived(4, info.dstAddr, 4791, 'recover', ring, Int32Array.of(0, 100, 100, 0), 1, new Int32Array(4));
    console.log(JSON.stringify({ impl: m.icrcImplementation, crc: c.crc32Name, icrc: m.icrcOfUdpPayload(info, p), ring: Array.from(ring), judged }));`;
  const r = spawnSync(process.execPath, ['--input-type=module', '-e', script], { env: { ...process.env, ROCE_ADDON: '0' }, encoding: 'utf8', timeout: 30_000 });
  t.equal(r.status, 0, r.stderr);
  const out = JSON.parse(r.stdout) as { impl: string; crc: string; icrc: number; ring: number[]; judged: number };
  t.equal(out.impl, 'js');
  t.equal(out.judged, 0, 'verifyReceived judges nothing: each datagram is checked in JavaScript on delivery');
  t.not(out.crc, 'addon');
  const info: UdpDatagramInfo = { family: 4, srcAddr: Uint8Array.of(192, 168, 7, 1), dstAddr: Uint8Array.of(192, 168, 7, 2), srcPort: 49152, dstPort: 4791, ipId: 7, ipFlagsFrag: 0x4000 };
  const p = new Uint8Array(1100).map((_, i) => i * 13);
  t.equal(out.icrc, icrcOfUdpPayload(info, p), `the same ICRC as this process computes (${icrcImplementation})`);
  // IcrcFlowKey.trains: a lone datagram (ID 0) at 0, and a train of 600, 600 and 200 B (IDs 0, 1, 2) at 1100.
  const ring = new Uint8Array(2500).map((_, i) => i * 7);
  new IcrcFlowKey(info).trains(ring, Int32Array.of(0, 1100, 1100, 1400, 1100, 600), 0, 2);
  t.same(out.ring, Array.from(ring), 'IcrcFlowKey.trains writes the same bytes');
  const seg = ring.subarray(1700, 2300);
  t.equal(icrcOfUdpPayload({ ...info, ipId: 1 }, seg), (seg[596]! | (seg[597]! << 8) | (seg[598]! << 16) | (seg[599]! << 24)) >>> 0, 'the second segment with IPv4 ID 1');
});

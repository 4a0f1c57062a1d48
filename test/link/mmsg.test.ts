/**
 * The batched send queue (`mmsg.ts`) against a scripted `sendmmsg`: how datagrams become messages
 * and GSO trains, what the kernel is handed (iovec, UDP_SEGMENT), and what happens to what it will
 * not take. The real kernel path is covered in udp.test.ts.
 */

import t from 'tap';
import { BATCH, MAX_SEGMENTS, MIN_TRAIN_DATAGRAM, TxQueue, TxRing, type TxDest, type TxSeal } from '../../src/link/mmsg.js';
import type { BatchIoFfi } from '../../src/link/sockopt.js';

interface Sent {
  /** Offset of the message's bytes in the ring, its length, and the GSO segment size (0: none). */
  at: number;
  bytes: number;
  gso: number;
  port: number;
}

/** A fake FFI: memory at made-up addresses; `sendmmsg` decodes the vector and answers from `script`. */
function fakeFfi(script: (vlen: number) => { r: number; errno?: number }) {
  const blocks: { address: number; view: ArrayBuffer }[] = [];
  let next = 0x10_0000;
  let errno = 0;
  const calls: Sent[][] = [];
  const offsetOf = (addr: number): { block: ArrayBuffer; off: number } => {
    const b = blocks.find((x) => addr >= x.address && addr < x.address + x.view.byteLength)!;
    return { block: b.view, off: addr - b.address };
  };
  const word = (dv: DataView, o: number): number => dv.getUint32(o, true) + dv.getUint32(o + 4, true) * 0x1_0000_0000;
  const ffi: BatchIoFfi = {
    sendmmsg: (_fd, msgvec, vlen) => {
      const v = msgvec as Uint8Array;
      const dv = new DataView(v.buffer, v.byteOffset);
      const { r, errno: e } = script(vlen);
      const n = r > 0 ? r : 0;
      const got: Sent[] = [];
      for (let i = 0; i < n; i++) {
        const m = i * 64;
        const iov = offsetOf(word(dv, m + 16));
        const idv = new DataView(iov.block);
        const base = word(idv, iov.off);
        const ring = blocks[0]!;
        const control = word(dv, m + 32);
        let gso = 0;
        if (control !== 0) {
          const c = offsetOf(control);
          const cdv = new DataView(c.block);
          t.equal(cdv.getInt32(c.off + 8, true), 17, 'cmsg level SOL_UDP');
          t.equal(cdv.getInt32(c.off + 12, true), 103, 'cmsg type UDP_SEGMENT');
          gso = cdv.getUint16(c.off + 16, true);
        }
        const name = offsetOf(word(dv, m));
        const port = new DataView(name.block).getUint16(name.off + 2, false);
        got.push({ at: base - ring.address, bytes: word(idv, iov.off + 8), gso, port });
      }
      calls.push(got);
      errno = e ?? 0;
      return r;
    },
    recvmmsg: () => -1,
    dup: () => -1,
    close: () => 0,
    errno: () => errno,
    alloc: (bytes) => {
      const b = { address: next, view: new ArrayBuffer(bytes) };
      next += bytes + 0x1000;
      blocks.push(b);
      return { address: BigInt(b.address), view: b.view };
    },
    poll: () => {
      throw new Error('not used');
    },
    calls: 'koffi',
  };
  return { ffi, calls };
}

const dstA: TxDest = { address: '127.0.0.2', port: 4791, addr: new Uint8Array([127, 0, 0, 2]) };
const dstB: TxDest = { address: '127.0.0.3', port: 4791, addr: new Uint8Array([127, 0, 0, 3]) };

function setup(script: (vlen: number) => { r: number; errno?: number }, gso = true, seal?: TxSeal) {
  const f = fakeFfi(script);
  let refused = 0;
  const ring = new TxRing(f.ffi, 1 << 20, (n) => (refused += n));
  const spilled: { dst: TxDest; len: number; k: number; first: number }[] = [];
  const q = new TxQueue(f.ffi, 9, ring, gso, (dst, d, k) => spilled.push({ dst, len: d.length, k, first: d[0]! }), seal);
  const add = (dst: TxDest, len: number, mark = 0): { at: number; index: number } => {
    const at = q.add(dst, len);
    ring.bytes.fill(mark, at, at + len);
    return { at, index: q.index };
  };
  return { ...f, ring, q, add, spilled, refused: () => refused };
}

t.test('equal sizes to one peer form a train; a shorter one ends it; another peer starts a message', async (t) => {
  const s = setup((vlen) => ({ r: vlen }));
  t.same([s.add(dstA, 2000), s.add(dstA, 2000), s.add(dstA, 2000)].map((x) => x.index), [0, 1, 2], 'indexes = IP IDs 0, 1, 2');
  t.equal(s.add(dstA, 300).index, 3, 'a shorter datagram is the last segment');
  t.equal(s.add(dstA, 1500).index, 0, 'after the short one, a new train');
  t.equal(s.add(dstB, 1500).index, 0, 'another destination: a new message');
  t.equal(s.add(dstB, 1600).index, 0, 'longer than the segment size: a new message');
  t.equal(s.q.pending, 4);
  s.ring.flushAll();
  t.same(s.calls, [[
    { at: 0, bytes: 6300, gso: 2000, port: 4791 },
    { at: 6300, bytes: 1500, gso: 0, port: 4791 },
    { at: 7800, bytes: 1500, gso: 0, port: 4791 },
    { at: 9300, bytes: 1600, gso: 0, port: 4791 },
  ]], 'one sendmmsg: a train with UDP_SEGMENT 2000, three single datagrams');
  t.equal(s.q.pending, 0);
  t.equal(s.add(dstA, 50).at, 0, 'an empty ring starts again at 0');
});

t.test(`train limits: 64 KiB and 64 segments, datagrams of ${MIN_TRAIN_DATAGRAM} bytes or more; no trains when GSO is off`, async (t) => {
  const s = setup((vlen) => ({ r: vlen }));
  for (let i = 0; i < 3; i++) s.add(dstA, MIN_TRAIN_DATAGRAM - 1);
  t.equal(s.q.pending, 3, 'datagrams shorter than any RoCEv2 packet leave one per message');
  s.ring.flushAll();
  for (let i = 0; i < 16; i++) s.add(dstA, 4112);
  t.equal(s.q.pending, 2, '15 × 4112 bytes fit in one datagram, the 16th starts another');
  s.ring.flushAll();
  for (let i = 0; i < MAX_SEGMENTS; i++) t.equal(s.add(dstA, 1024).index, i < 63 ? i : 0);
  t.equal(s.q.pending, 2, '63 segments of 1024 bytes (64 KiB), then a new message');
  s.ring.flushAll();
  // ACK-sized datagrams reach the kernel's 64 segments first.
  for (let i = 0; i <= MAX_SEGMENTS; i++) t.equal(s.add(dstA, 20).index, i < MAX_SEGMENTS ? i : 0);
  t.equal(s.q.pending, 2, '64 segments of 20 bytes, then a new message');
  s.ring.flushAll();
  const off = setup((vlen) => ({ r: vlen }), false);
  for (let i = 0; i < 5; i++) t.equal(off.add(dstA, 2000).index, 0);
  t.equal(off.q.pending, 5);
});

t.test('the seal runs at the flush, once per run of messages to one peer, before sendmmsg, over the queue\'s descriptors', async (t) => {
  const seals: { dst: string; from: number; to: number; messages: number[][]; sentBefore: number }[] = [];
  let s: ReturnType<typeof setup> | undefined;
  const seal: TxSeal = (dst, desc, from, to) => {
    const b = desc.length / 3;
    const messages: number[][] = [];
    for (let i = from; i < to; i++) messages.push([desc[i]!, desc[b + i]!, desc[2 * b + i]!]);
    seals.push({ dst: dst.address, from, to, messages, sentBefore: s!.calls.length });
    // What the seal writes is what leaves: the first byte of each message.
    for (let i = from; i < to; i++) s!.ring.bytes[desc[i]!] = 0xee;
  };
  s = setup((vlen) => ({ r: vlen }), true, seal);
  s.add(dstA, 1000);
  s.add(dstA, 1000);
  s.add(dstA, 400); // a train of three
  s.add(dstA, 500); // a lone datagram to the same peer
  s.add(dstB, 600);
  s.add(dstA, 700);
  t.same(seals, [], 'nothing is sealed before the flush');
  s.ring.flushAll();
  t.same(seals, [
    { dst: '127.0.0.2', from: 0, to: 2, messages: [[0, 2400, 1000], [2400, 500, 500]], sentBefore: 0 },
    { dst: '127.0.0.3', from: 2, to: 3, messages: [[2900, 600, 600]], sentBefore: 0 },
    { dst: '127.0.0.2', from: 3, to: 4, messages: [[3500, 700, 700]], sentBefore: 0 },
  ], 'three runs of messages, all sealed before the one sendmmsg');
  t.same(s.calls.map((c) => c.map((m) => s!.ring.bytes[m.at])), [[0xee, 0xee, 0xee, 0xee]], 'each message left as sealed');
});

t.test('a full queue flushes itself', async (t) => {
  const s = setup((vlen) => ({ r: vlen }), false);
  for (let i = 0; i < BATCH + 1; i++) s.add(dstA, 10);
  t.equal(s.calls.length, 1);
  t.equal(s.calls[0]!.length, BATCH);
  t.equal(s.q.pending, 1);
});

t.test('partial send, then EAGAIN: the rest is spilled in order, each segment with its train index', async (t) => {
  let call = 0;
  const s = setup(() => (call++ === 0 ? { r: 1 } : { r: -1, errno: 11 }));
  s.add(dstA, 200, 1);
  s.add(dstB, 1100, 2);
  s.add(dstB, 1100, 3);
  s.add(dstB, 60, 4);
  s.add(dstA, 200, 5);
  s.ring.flushAll();
  t.same(s.calls.map((c) => c.length), [1, 0], 'one message taken, then EAGAIN');
  t.same(s.spilled.map((x) => [x.dst.address, x.len, x.k, x.first]), [
    ['127.0.0.3', 1100, 0, 2],
    ['127.0.0.3', 1100, 1, 3],
    ['127.0.0.3', 60, 2, 4],
    ['127.0.0.2', 200, 0, 5],
  ]);
  t.equal(s.refused(), 0);
});

t.test('a refused message is counted per datagram and the rest still goes', async (t) => {
  let call = 0;
  const s = setup(() => {
    call++;
    if (call === 1) return { r: -1, errno: 90 }; // EMSGSIZE for the first message
    return { r: 1 };
  });
  s.add(dstA, 1100);
  s.add(dstA, 1100); // a train of two: refused together
  s.add(dstB, 100);
  s.ring.flushAll();
  t.equal(s.refused(), 2);
  t.same(s.calls.map((c) => c.map((m) => m.at)), [[], [2200]], 'the second message is sent on its own call');
  t.same(s.spilled, []);
});


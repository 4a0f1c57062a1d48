import { inspect } from 'node:util';
import t from 'tap';
import fc from 'fast-check';
import { fromHex, toHex } from '../../src/wire/bytes.js';
import { aethKind, aethValue, describeSyndrome, RNR_TIMER_US } from '../../src/wire/aeth.js';
import { bthDestQp, bthPsn, setBthFecn } from '../../src/wire/bth.js';
import { cnpPacket } from '../../src/wire/cnp.js';
import { KNOWN_OPCODES } from '../../src/wire/opcode.js';
import { emitPacket, PacketRecord, packetLength, parsePacket, parsePacketInto, type RocePacket } from '../../src/wire/packet.js';
import { formatPacket } from '../../src/wire/pretty.js';
import { emitReth, newRethRecord, parseReth, parseRethInto } from '../../src/wire/reth.js';
import { arbPacket, arbPacketOf } from '../helpers/arbitrary.js';

// UDP payloads copied from the rdma_rxe captures in test/fixtures/rxe (frame numbers as
// Wireshark shows them). Long payloads are cut at the headers we check; the ICRC is
// therefore not the packet's and is not checked here (icrc.test.ts does that).
function parseOk(hex: string): RocePacket {
  const r = parsePacket(fromHex(hex));
  if (!r.ok) throw new Error(`${r.error}: ${r.detail}`);
  return r.packet;
}

t.test('golden: RC RDMA WRITE First (write_bw.pcap frame 23)', async (t) => {
  const p = parseOk('0600ffff00000011001c473400007ff96912a00000000245000100000102030400000000');
  t.match(p.bth, { opcode: 6, se: false, m: false, padCount: 0, tver: 0, pkey: 0xffff, fecn: false, becn: false, destQp: 0x11, ackReq: false, psn: 0x1c4734 });
  t.same(p.reth, { va: 0x7ff96912a000n, rkey: 0x245, dmaLength: 65536 });
  t.equal(p.payload.length, 4);
});

t.test('golden: RC Acknowledge (rc_pingpong.pcap frame 22)', async (t) => {
  const p = parseOk('1100ffff00000012005d290a1f0000013f6f6d99');
  t.equal(p.bth.psn, 0x5d290a);
  t.equal(p.bth.destQp, 0x12);
  t.same(p.aeth, { syndrome: 0x1f, msn: 1 });
  t.equal(aethKind(p.aeth!.syndrome), 'ACK');
  t.equal(aethValue(p.aeth!.syndrome), 31);
  t.equal(p.icrc, 0x996d6f3f, 'ICRC read little-endian');
  t.equal(p.payload.length, 0);
});

t.test('golden: RNR NAK (rnr_rc.pcap frame 12): timer 22 = 20.48 ms', async (t) => {
  const p = parseOk('1100ffff00000011007ae173360000004c1f89ad');
  t.equal(aethKind(p.aeth!.syndrome), 'RNR_NAK');
  t.equal(aethValue(p.aeth!.syndrome), 22);
  t.equal(RNR_TIMER_US[22], 20480);
  t.equal(describeSyndrome(p.aeth!.syndrome), 'RNR_NAK timer=22 (20.48 ms)');
});

t.test('golden: UD SEND Only (ud_pingpong.pcap frame 15): DETH', async (t) => {
  const p = parseOk('6400ffff000000110055e6a111111111000000117b7b7b7b00000000');
  t.same(p.deth, { qkey: 0x11111111, srcQp: 0x11 });
  t.equal(p.payload.length, 4);
});

t.test('golden: CmpSwap and its ATOMIC Acknowledge (atomic_cas.pcap frames 23, 43)', async (t) => {
  const req = parseOk('1300ffff00000011803d41ce00005597e9b77000000002ff0000000000000000000000000000000073a641b3');
  t.equal(req.bth.ackReq, true);
  t.same(req.atomicEth, { va: 0x5597e9b77000n, rkey: 0x2ff, swapAdd: 0n, compare: 0n });
  const ack = parseOk('1200ffff00000011003d41ce1f0000016b624512e2e367b4dc459ea4');
  t.same(ack.aeth, { syndrome: 0x1f, msn: 1 });
  t.same(ack.atomicAckEth, { originalData: 0x6b624512e2e367b4n });
});

t.test('golden: FetchAdd add=1 (atomic_faa.pcap frame 23)', async (t) => {
  const p = parseOk('1400ffff000000118071767a0000564e847a3000000002a900000000000000010000000000000000ca111966');
  t.equal(p.atomicEth!.swapAdd, 1n);
});

t.test('golden: immediate and invalidate (imm_rc.pcap, imm_ud.pcap)', async (t) => {
  t.same(parseOk('0500ffff00000011808b439b0102030410111213' + 'c40e9af1').immDt, { data: 0x01020304 });
  const w = parseOk('0b00ffff00000011808b43a0' + '00007ff8949c3000' + '00000236' + '00000040' + '11121314' + '40414243' + '00000000');
  t.same(w.reth, { va: 0x7ff8949c3000n, rkey: 0x236, dmaLength: 64 });
  t.same(w.immDt, { data: 0x11121314 });
  t.same(parseOk('1700ffff00000011808b43a50800011e7071727300000000').ieth, { rkey: 0x0800011e });
  const ud = parseOk('6500ffff0000001100896417' + '11111111' + '00000012' + '01020304' + '10111213' + '00000000');
  t.same(ud.deth, { qkey: 0x11111111, srcQp: 0x12 });
  t.same(ud.immDt, { data: 0x01020304 });
});

t.test('golden: READ request and response First (read_bw.pcap frames 23, 26)', async (t) => {
  const req = parseOk('0c00ffff0000001180498ca800007f43f4a34000000002c20001000013a80f3e');
  t.same(req.reth, { va: 0x7f43f4a34000n, rkey: 0x2c2, dmaLength: 65536 });
  const resp = parseOk('0d00ffff0000001100498ca81f000001591b579e00000000');
  t.same(resp.aeth, { syndrome: 0x1f, msn: 1 });
  t.equal(resp.payload.length, 4);
});

t.test('errors are values, in ingress order', async (t) => {
  const cases: [string, string, string][] = [
    ['', 'TOO_SHORT', '0 bytes, need at least 16'],
    ['1100ffff00000012005d290a1f0000', 'TOO_SHORT', '15 bytes, need at least 16'],
    ['1101ffff00000012005d290a1f0000013f6f6d99', 'BAD_TVER', 'TVer 1'],
    ['1500ffff00000012005d290a1f0000013f6f6d99', 'UNKNOWN_OPCODE', 'opcode 0x15'],
    ['1100ffff00000012005d290a3f6f6d99', 'TRUNCATED_HEADERS', 'RC_ACKNOWLEDGE needs 20 bytes, got 16'],
    ['0600ffff00000011001c473400007ff96912a0000000024500010000', 'TRUNCATED_HEADERS', 'RC_RDMA_WRITE_FIRST needs 32 bytes, got 28'],
    ['1100ffff00000012005d290a1f000001aabbccdd3f6f6d99', 'UNEXPECTED_PAYLOAD', 'RC_ACKNOWLEDGE carries no payload, found 4 bytes'],
    ['1110ffff00000012005d290a1f000001aabbccdd3f6f6d99', 'UNEXPECTED_PAYLOAD', 'RC_ACKNOWLEDGE carries no payload, found 4 bytes'], // 3 + PadCnt 1
    ['0430ffff00000012005d290a3f6f6d99', 'TRUNCATED_HEADERS', 'RC_SEND_ONLY needs 19 bytes, got 16'], // PadCnt 3 with nothing to pad
  ];
  for (const [hex, code, detail] of cases) {
    const r = parsePacket(fromHex(hex));
    t.same(r.ok ? 'ok' : [r.error, r.detail], [code, detail], `${hex || '(empty)'} -> ${code}: ${detail}`);
  }
  t.match(parsePacket(new Uint8Array(20), 15, 10), { ok: false, error: 'TOO_SHORT', detail: 'range 15+10 outside a 20-byte buffer' }, 'a range outside the buffer is TOO_SHORT, not an exception');
});

t.test('round trip parse(emit(x)) == x for every opcode', async (t) => {
  for (const op of KNOWN_OPCODES) {
    fc.assert(
      fc.property(arbPacketOf(op), (p) => {
        const buf = new Uint8Array(packetLength(p));
        const end = emitPacket(p, buf, 0);
        if (end !== buf.length) return false;
        const r = parsePacket(buf);
        if (!r.ok) return false;
        t.same(r.packet, p);
        return true;
      }),
      { seed: 0x5eed + op, numRuns: 60 },
    );
  }
});

t.test('emit at offset 10 into 0xa5 touches exactly the packet bytes', async () => {
  fc.assert(
    fc.property(arbPacket, (p) => {
      const len = packetLength(p);
      const a = new Uint8Array(len + 20).fill(0xa5);
      const b = new Uint8Array(len + 20).fill(0x5a);
      emitPacket(p, a, 10);
      emitPacket(p, b, 10);
      // Outside the packet: untouched; inside: the same bytes whatever was there before,
      // which proves emit writes every byte (reserved bits and pad included).
      for (let i = 0; i < 10; i++) if (a[i] !== 0xa5 || b[i] !== 0x5a) return false;
      for (let i = 10 + len; i < len + 20; i++) if (a[i] !== 0xa5 || b[i] !== 0x5a) return false;
      return toHex(a, 10, len) === toHex(b, 10, len);
    }),
    { seed: 42, numRuns: 400 },
  );
});

t.test('random bytes and truncations never throw', async (t) => {
  fc.assert(
    fc.property(fc.uint8Array({ maxLength: 200 }), fc.nat(10), (bytes, cut) => {
      const r = parsePacket(bytes, 0, Math.max(0, bytes.length - cut));
      if (r.ok) formatPacket(r.packet);
      return true;
    }),
    { seed: 7, numRuns: 5000 },
  );
  // Every opcode byte, every TVer/pad nibble, over short and long bodies.
  let n = 0;
  for (let op = 0; op < 256; op++) {
    for (const len of [0, 12, 15, 16, 20, 27, 28, 44, 64]) {
      const b = new Uint8Array(len).fill(0xff);
      if (len) b[0] = op;
      if (len > 1) b[1] = 0x30;
      parsePacket(b);
      n++;
    }
  }
  t.equal(n, 256 * 9);
});

t.test('raw accessors agree with the record; FECN toggles in place', async (t) => {
  const b = fromHex('1100ffff00000012005d290a1f0000013f6f6d99');
  t.equal(bthDestQp(b, 0), 0x12);
  t.equal(bthPsn(b, 0), 0x5d290a);
  setBthFecn(b, 0, true);
  const r = parsePacket(b);
  t.ok(r.ok && r.packet.bth.fecn);
});

t.test('CNP: opcode 0x81, BECN, P_Key 0xffff, PSN 0, 16 zero bytes', async (t) => {
  const p = cnpPacket(0x123456);
  const buf = new Uint8Array(packetLength(p)).fill(0xa5);
  emitPacket(p, buf);
  t.equal(buf.length, 32);
  t.equal(toHex(buf, 0, 28), '8100ffff40123456000000000000000000000000000000000000000000000000'.slice(0, 56));
  const r = parsePacket(buf);
  t.ok(r.ok && r.info.name === 'CNP' && r.packet.bth.becn);
});

t.test('one-line printer', async (t) => {
  t.equal(
    formatPacket(parseOk('0600ffff00000011801c473400007ff96912a00000000245000100000102030400000000')),
    'RC_RDMA_WRITE_FIRST qp=0x000011 psn=0x1c4734 ack reth(va=0x7ff96912a000 rkey=0x00000245 len=65536) payload=4',
  );
  t.equal(formatPacket(parseOk('1100ffff00000012005d290a1f0000013f6f6d99')), 'RC_ACKNOWLEDGE qp=0x000012 psn=0x5d290a aeth(ACK (no credit limit) msn=1)');
});

t.test('parsePacketInto: exactly the packets parsePacket accepts, with the same fields, into one reused record', async (t) => {
  const rec = new PacketRecord();
  const HEADERS = ['deth', 'feth', 'reth', 'atomicEth', 'aeth', 'atomicAckEth', 'immDt', 'ieth'] as const;
  // Well-formed packets of every opcode, the same with a byte changed (an opcode, TVer or PadCnt
  // that no longer fits, or just another field), and anything.
  const wellFormed = arbPacket.map((p) => {
    const b = new Uint8Array(packetLength(p));
    emitPacket(p, b, 0);
    return b;
  });
  const arbBytes = fc.oneof(
    wellFormed,
    fc.tuple(wellFormed, fc.nat(), fc.integer({ min: 0, max: 255 })).map(([b, i, v]) => {
      b[i % b.length] = v;
      return b;
    }),
    fc.uint8Array({ maxLength: 80 }),
  );
  // One record for the whole run, so every parse follows another opcode's.
  const show = (v: unknown): string => JSON.stringify(v, (_k, x: unknown) => (typeof x === 'bigint' ? `${x}n` : x instanceof Uint8Array ? toHex(x) : x));
  const seen = new Set<string>();
  fc.assert(
    fc.property(arbBytes, fc.nat(3), fc.nat(3), (bytes, off, tail) => {
      const buf = new Uint8Array(off + bytes.length + tail).fill(0xa5);
      buf.set(bytes, off);
      const before = show(rec);
      const info = parsePacketInto(buf, off, bytes.length, rec);
      const ref = parsePacket(buf, off, bytes.length);
      if ((info !== undefined) !== ref.ok) return false;
      if (!ref.ok) return show(rec) === before; // untouched
      seen.add(ref.info.name);
      const p = ref.packet;
      if (info !== ref.info || show(rec.bth) !== show(p.bth) || rec.icrc !== p.icrc) return false;
      if (toHex(rec.payload) !== toHex(p.payload)) return false;
      // A view into the input, as parsePacket gives it, not a copy.
      if (rec.payload.length > 0 && (rec.payload.buffer !== buf.buffer || rec.payload.byteOffset !== p.payload.byteOffset)) return false;
      return HEADERS.every((h) => show(rec[h]) === show(p[h]) && (rec[h] === undefined || rec[h] === rec.owned[h]));
    }),
    { numRuns: 6000 },
  );
  t.ok(seen.size > 30, `${seen.size} opcodes compared field by field`);
  t.ok(seen.has('RC_ACKNOWLEDGE') && seen.has('RC_RDMA_WRITE_ONLY') && seen.has('UD_SEND_ONLY_WITH_IMMEDIATE'), 'ACK, WRITE and UD among them');
});

t.test('the receive path\'s RETH record keeps the VA in halves and reads as the RETH parseReth gives', async (t) => {
  const rec = newRethRecord();
  const b = new Uint8Array(16);
  let checked = 0;
  fc.assert(
    fc.property(fc.bigInt({ min: 0n, max: (1n << 64n) - 1n }), fc.nat({ max: 0xffff_ffff }), fc.nat({ max: 0xffff_ffff }), (va, rkey, dmaLength) => {
      emitReth({ va, rkey, dmaLength }, b, 0);
      parseRethInto(b, 0, rec);
      const plain = parseReth(b, 0);
      // The halves are the wire's words; `va` is made from them, whatever its top bit.
      if (rec.vaHi !== Number(va >> 32n) || rec.vaLo !== Number(va & 0xffff_ffffn) || rec.va !== va) return false;
      if (rec.rkey !== plain.rkey || rec.dmaLength !== plain.dmaLength || plain.va !== va) return false;
      // Serialized and printed (as traces and the tests show records), it is the plain record.
      const show = (x: unknown): string => JSON.stringify(x, (_k, v: unknown) => (typeof v === 'bigint' ? `${v}n` : v));
      if (show(rec) !== show(plain) || inspect(rec) !== inspect(plain)) return false;
      checked++;
      return true;
    }),
    { numRuns: 2000, examples: [[0n, 0, 0], [(1n << 64n) - 1n, 0xffff_ffff, 0xffff_ffff], [1n << 63n, 1, 2], [0xffff_ffffn, 0, 0], [1n << 32n, 0, 0], [(1n << 53n) - 1n, 0, 0], [1n << 53n, 0, 0], [(1n << 53n) + 1n, 0, 0]] },
  );
  t.ok(checked >= 2000, `${checked} RETHs read back`);
  // Written through `va` (a caller that builds a RETH in the record), the halves follow; a negative
  // bigint is taken modulo 2^64, as the wire's 64 bits would hold it.
  rec.va = 0x0123_4567_89ab_cdefn;
  t.same([rec.vaHi, rec.vaLo, rec.va], [0x0123_4567, 0x89ab_cdef, 0x0123_4567_89ab_cdefn]);
  rec.va = -1n;
  t.same([rec.vaHi, rec.vaLo, rec.va], [0xffff_ffff, 0xffff_ffff, (1n << 64n) - 1n]);
  t.equal(emitReth(rec, b, 0), 16);
  t.equal(parseReth(b, 0).va, (1n << 64n) - 1n, 'and emits as that VA');
});

t.test('parsePacketInto hands out the payload view it made before only for the same range of the same array', async (t) => {
  // RC RDMA WRITE ONLY with a RETH, `n` payload bytes of `fill`, and an ICRC field.
  const writeOnly = (n: number, fill: number): Uint8Array => {
    const b = new Uint8Array(28 + n + 4);
    b.set(fromHex('0a00ffff0000001100000001' + '00007ff96912a00000000245' + n.toString(16).padStart(8, '0')));
    b.fill(fill, 28, 28 + n);
    return b;
  };
  const rec = new PacketRecord();
  const payloadOf = (b: Uint8Array, len = b.length): Uint8Array => {
    t.ok(parsePacketInto(b, 0, len, rec), 'parsed');
    return rec.payload;
  };
  // Two slots of one buffer, as a receive ring's.
  const SLOT = 4200;
  const ring = new ArrayBuffer(2 * SLOT);
  const slot0 = new Uint8Array(ring, 0, 4128);
  const slot1 = new Uint8Array(ring, SLOT, 4128);
  slot0.set(writeOnly(4096, 0x11));
  slot1.set(writeOnly(4096, 0x22));
  const first = payloadOf(slot0);
  const other = payloadOf(slot1);
  t.not(other, first, 'another slot: another view');
  t.equal(payloadOf(slot0), first, 'the same slot again: the same view');
  t.ok(first.every((x) => x === 0x11) && other.every((x) => x === 0x22), 'each over its own bytes');

  // The next packet in slot 0 (new bytes, same place): the same view, showing them.
  slot0.set(writeOnly(4096, 0x33));
  const again = payloadOf(slot0);
  t.equal(again, first);
  t.ok(again.every((x) => x === 0x33), 'the view shows the bytes now there');

  // A shorter packet in slot 0: a range that ends elsewhere, so a view of its own length.
  slot0.set(writeOnly(1024, 0x44));
  const shorter = payloadOf(slot0, 28 + 1024 + 4);
  t.not(shorter, first);
  t.equal(shorter.length, 1024);
  t.equal(shorter.byteOffset, 28);

  // Another array at the same offset (its own buffer, or a second view of the ring): never the view
  // of slot 0, whose entry it shares.
  const alone = writeOnly(1024, 0x55);
  const its = payloadOf(alone);
  t.not(its, shorter);
  t.equal(its.buffer, alone.buffer);
  t.ok(its.length === 1024 && its.every((x) => x === 0x55), 'its own bytes');
  const twin = new Uint8Array(ring, 0, 4128);
  const viaTwin = payloadOf(twin, 28 + 1024 + 4);
  t.not(viaTwin, shorter, 'another array over the same bytes: a view of its own');
  t.equal(toHex(viaTwin), toHex(shorter));
  t.equal(payloadOf(slot0, 28 + 1024 + 4).byteOffset, 28, 'slot 0 again: its range');
});

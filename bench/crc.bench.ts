/**
 * CRC-32 and ICRC micro-benchmarks: throughput of each CRC-32 implementation at 256 B … 64 KiB, and the
 * per-packet cost of the ICRC at path MTU 1024 and 4096 (send-side compute, strict check, and the extra
 * cost of IPv4 IP-ID recovery). Run: `node dist/bench/crc.bench.js [--quick]`.
 */
import { pathToFileURL } from 'node:url';
import { createRequire } from 'node:module';
import { icrcAddon } from '../src/wire/addon.js';
import { crc32, crc32Implementations, crc32Name } from '../src/wire/crc32.js';
import {
  checkIcrc,
  checkIcrcOfIpDatagram,
  ICRC_RECOVERED,
  icrcOfParts,
  icrcOfUdpPayload,
  icrcImplementation,
  icrcJs,
  verifyIcrc,
  verifyIcrc4,
  verifyIcrc6,
  Ipv4IcrcKey,
  Ipv6IcrcKey,
  IcrcFlowKey,
  readIcrc,
  receivedVerdict,
  verifyReceived,
  writeIcrc,
  type UdpDatagramInfo,
} from '../src/wire/icrc.js';
import { BATCH, TxRing } from '../src/link/mmsg.js';
import type { BatchIoFfi } from '../src/link/sockopt.js';
import { formatRows, measure, measureInterleaved, median, ratioToBest, type BenchRow, type MeasureOptions } from './harness.js';

const SIZES = [256, 1024, 4096, 65536] as const;

function filled(n: number, seed: number): Uint8Array {
  // 0xa5-style deterministic content; CRC speed does not depend on the bytes.
  const b = new Uint8Array(n);
  let s = seed;
  for (let i = 0; i < n; i++) {
    s = (s * 1103515245 + 12345) >>> 0;
    b[i] = s >>> 24;
  }
  return b;
}

function crcRows(m: MeasureOptions): BenchRow[] {
  const rows: BenchRow[] = [];
  // One byte into a larger buffer, so that every implementation reads an unaligned view, as it does
  // with payload views on the receive path.
  const big = filled(65536 + 1, 1);
  for (const size of SIZES) {
    const data = big.subarray(1, 1 + size);
    const group: BenchRow[] = [];
    for (const { name, fn } of crc32Implementations) {
      const r = measure(() => fn(data), m);
      group.push({ name: `crc32 ${name} ${size} B`, value: size / r.nsPerOp, unit: 'GB/s' });
    }
    rows.push(...ratioToBest(group, true));
  }
  return rows;
}

/**
 * The raw CRC-32 calls the ICRC rows are held to: each native implementation called directly, as a
 * program that wanted only a CRC would call it (no wrapper, no seed). Per round, the fastest of them
 * is the baseline.
 */
function rawCrcCalls(): { name: string; fn: (d: Uint8Array) => number }[] {
  const calls: { name: string; fn: (d: Uint8Array) => number }[] = [];
  const addon = icrcAddon;
  if (addon !== undefined) calls.push({ name: 'addon', fn: (d) => addon.crc32(d) });
  try {
    const rs = createRequire(import.meta.url)('@node-rs/crc32') as { crc32(d: Uint8Array): number };
    calls.push({ name: '@node-rs/crc32', fn: (d) => rs.crc32(d) });
  } catch {
    // not installed here: the other calls are the baseline
  }
  if (calls.length === 0) calls.push({ name: crc32Name, fn: (d) => crc32(d) });
  return calls;
}

/**
 * A receive batch as `RxRing` lays it out for `verifyReceived` (src/link/mmsg.ts): 16 messages, each
 * its source's sockaddr (port, address) then `payload`, which was sent from `from`.
 */
function receiveBatch(from: UdpDatagramInfo, payload: Uint8Array): { mem: Uint8Array; desc: Int32Array } {
  const name = from.family === 4 ? 16 : 28;
  const mem = new Uint8Array(16 * (name + payload.length));
  const desc = new Int32Array(4 * 16);
  for (let i = 0, at = 0; i < 16; i++, at += name + payload.length) {
    mem[at + 2] = from.srcPort >> 8;
    mem[at + 3] = from.srcPort & 0xff;
    mem.set(from.srcAddr, at + (from.family === 4 ? 4 : 8));
    mem.set(payload, at + name);
    desc.set([at + name, payload.length, payload.length, at], 4 * i);
  }
  return { mem, desc };
}

function icrcRows(m: MeasureOptions): BenchRow[] {
  const rows: BenchRow[] = [];
  for (const mtu of [1024, 4096]) {
    // A full RC SEND_MIDDLE: BTH, MTU bytes of payload, ICRC; rxe-like IPv4 header with ID 0x24b0, DF.
    const udpLen = 12 + mtu + 4;
    const ip = new Uint8Array(20 + 8 + udpLen);
    ip.set([0x45, 0, (ip.length >>> 8) & 0xff, ip.length & 0xff, 0x24, 0xb0, 0x40, 0, 64, 17, 0, 0, 10, 77, 0, 2, 10, 77, 0, 3]);
    ip.set([0xc1, 0x32, 0x12, 0xb7, (8 + udpLen) >>> 8, (8 + udpLen) & 0xff, 0, 0], 20);
    ip.set([0x01, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x12, 0x00, 0x5d, 0x29, 0x0a], 28);
    ip.set(filled(mtu, mtu), 40);
    const payload = ip.subarray(28);
    // Every info record has the shape UdpLink's has (all seven fields, in its order), as in the stack,
    // where one record per link is reused: records of several shapes made every ICRC function's property
    // reads polymorphic here, which the stack never sees. `socket` is what a UDP socket tells the
    // receive path (the ID unknown, guessed 0), `known` the real header.
    const socket: UdpDatagramInfo = { family: 4, srcAddr: ip.subarray(12, 16), dstAddr: ip.subarray(16, 20), srcPort: 0xc132, dstPort: 4791, ipId: 0, ipFlagsFrag: 0x4000 };
    const known: UdpDatagramInfo = { family: 4, srcAddr: socket.srcAddr, dstAddr: socket.dstAddr, srcPort: 0xc132, dstPort: 4791, ipId: 0x24b0, ipFlagsFrag: 0x4000 };
    writeIcrc(payload, icrcOfUdpPayload(known, payload));
    if (checkIcrc(socket, payload, 'recover').status !== 'ok-recovered') throw new Error('bench packet does not verify');
    const parts = [payload.subarray(0, 12), payload.subarray(12, 12 + mtu)];
    const six: UdpDatagramInfo = { family: 6, srcAddr: filled(16, 6), dstAddr: filled(16, 7), srcPort: 0xc121, dstPort: 4791, ipId: 0, ipFlagsFrag: 0x4000 };
    const key6 = new Ipv6IcrcKey(six.srcAddr, six.dstAddr);
    const key4 = new Ipv4IcrcKey(socket.srcAddr, socket.dstAddr);
    const flowKey = new IcrcFlowKey(known);
    if (flowKey.icrc(0x24b0, payload) !== icrcOfUdpPayload(known, payload)) throw new Error('IcrcFlowKey disagrees with icrcOfUdpPayload');
    // The same packet with the ICRC an IPv6 sender computes: checked against `six`, it passes (with the
    // IPv4 packet's ICRC the check fails and computes the expected value too, a second pass).
    const payload6 = payload.slice();
    writeIcrc(payload6, icrcOfUdpPayload(six, payload6));
    if (checkIcrc(six, payload6, 'strict').status !== 'ok') throw new Error('IPv6 bench packet does not verify');

    const covered = 8 + 20 + 8 + udpLen - 4;
    const plain = filled(covered, 9);
    // The batched send path (UdpLink.send, TxQueue.flush): a task lays out 16 datagrams in the send ring,
    // each noted in the queue's descriptors, and the flush writes all their ICRCs in one call with the
    // key words the link keeps for the flow of its last send (IcrcFlowKey.trains); the ring is released.
    // Its memory is a plain ArrayBuffer here (only `alloc` of the FFI is used). A row's figure is per
    // datagram: the call's cost is spread over the 16. Before, one call per datagram over a view of the
    // ring (`icrcOfUdpPayload of a fresh view of the ring`, the row below, less the view kept for reuse).
    const txRing = new TxRing({ alloc: (n: number) => ({ address: 0n, view: new ArrayBuffer(n) }) } as unknown as BatchIoFfi, 1 << 17, () => undefined);
    for (let k = 0; k < 16; k++) txRing.bytes.set(payload.subarray(0, udpLen - 4), k * udpLen);
    const desc = new Int32Array(3 * BATCH);
    let inTask = 0;
    const trainsKey = new IcrcFlowKey(known);
    trainsKey.trains(txRing.bytes, Int32Array.of(0, udpLen, udpLen), 0, 1);
    if (readIcrc(txRing.bytes.subarray(0, udpLen)) !== flowKey.icrc(0, txRing.bytes.subarray(0, udpLen))) throw new Error('IcrcFlowKey.trains disagrees with IcrcFlowKey.icrc');
    if (verifyIcrc(socket, payload, 'recover') !== ICRC_RECOVERED) throw new Error('verifyIcrc does not recover the bench packet');
    if (verifyIcrc4(socket, key4, payload, 'recover') !== ICRC_RECOVERED) throw new Error('verifyIcrc4 does not recover the bench packet');
    // The batched receive path (UdpLink's RxRing): every datagram of a recvmmsg batch judged in one call
    // (`verifyReceived`), 16 to a batch, the verdicts read back one per datagram as the delivery does.
    // Before, one call per datagram: the `verifyIcrc` and `verifyIcrc6` rows.
    const rx4 = receiveBatch(socket, payload);
    const rx6 = receiveBatch(six, payload6);
    const verdicts = new Int32Array(16);
    let inBatch4 = 0;
    let inBatch6 = 0;
    if (verifyReceived(4, socket.dstAddr, 4791, 'recover', rx4.mem, rx4.desc, 16, verdicts) !== (icrcImplementation === 'addon' ? 16 : 0)) throw new Error('verifyReceived did not judge the bench batch');
    if (icrcImplementation === 'addon' && !verdicts.every((w) => receivedVerdict(w) === ICRC_RECOVERED)) throw new Error('verifyReceived does not recover the bench batch');
    // Every row is measured interleaved with the raw CRC (one sample of each in turn), and its ratio is
    // the median of the per-sample ratios: measured one after the other, a slow stretch of this shared
    // machine under one of them moved a ratio by ±20 % (rows below 1.0 for functions that do the raw
    // CRC's work and more).
    const calls = rawCrcCalls();
    const raw = calls.map((c) => ({ name: `MTU ${mtu}: raw CRC-32 of the ${covered} covered bytes, ${c.name}`, op: () => c.fn(plain) }));
    const cases: { name: string; op: () => number }[] = [
      ...raw,
      { name: `MTU ${mtu}: crc32 (the stack's, ${crc32Name}) of the ${covered} covered bytes`, op: () => crc32(plain) },
      { name: `MTU ${mtu}: icrcOfUdpPayload (one buffer)`, op: () => icrcOfUdpPayload(known, payload) },
      {
        name: `MTU ${mtu}: IcrcFlowKey.trains, 16 datagrams of the send ring per call (batched send path)`,
        op: () => {
          const at = txRing.take(udpLen);
          const i = inTask;
          desc[i] = at;
          desc[BATCH + i] = udpLen;
          desc[2 * BATCH + i] = udpLen;
          if (++inTask === 16) {
            trainsKey.trains(txRing.bytes, desc, 0, 16);
            txRing.flushAll();
            inTask = 0;
          }
          return at;
        },
      },
      { name: `MTU ${mtu}: IcrcFlowKey.icrc (one buffer, dgram send path)`, op: () => flowKey.icrc(0x24b0, payload) },
      { name: `MTU ${mtu}: icrcOfUdpPayload of a fresh view of the ring`, op: () => icrcOfUdpPayload(known, new Uint8Array(txRing.bytes.buffer, udpLen, udpLen)) },
      { name: `MTU ${mtu}: icrcOfParts [bth, payload] (dgram scatter path)`, op: () => icrcOfParts(known, parts, udpLen) },
      // `verifyIcrc`, recover mode, the ID recovered: the IPv4 check of one datagram from its info alone.
      { name: `MTU ${mtu}: verifyIcrc recover, ID recovered`, op: () => verifyIcrc(socket, payload, 'recover') },
      // The IPv4 receive path (UdpLink.accept): the same with the peer's key words.
      { name: `MTU ${mtu}: verifyIcrc4 recover, the peer's key words, ID recovered (IPv4 receive path)`, op: () => verifyIcrc4(socket, key4, payload, 'recover') },
      // Strict with the right ID vs recover with the ID hidden: the same CRC work plus the recovery step.
      { name: `MTU ${mtu}: checkIcrc strict IPv4`, op: () => (checkIcrc(known, payload, 'strict').status === 'ok' ? 1 : 0) },
      { name: `MTU ${mtu}: checkIcrc strict IPv6`, op: () => (checkIcrc(six, payload6, 'strict').status === 'ok' ? 1 : 0) },
      // The IPv6 receive path (UdpLink.accept): no ID to recover, no record.
      { name: `MTU ${mtu}: verifyIcrc IPv6`, op: () => verifyIcrc(six, payload6, 'strict') },
      { name: `MTU ${mtu}: verifyIcrc6, the peer's key words (IPv6 receive path)`, op: () => verifyIcrc6(six, key6, payload6, 'strict') },
      {
        name: `MTU ${mtu}: verifyReceived, 16 datagrams of a receive batch per call, IDs recovered (batched IPv4 receive path)`,
        op: () => {
          if (inBatch4 === 0) verifyReceived(4, socket.dstAddr, 4791, 'recover', rx4.mem, rx4.desc, 16, verdicts);
          const v = receivedVerdict(verdicts[inBatch4]!);
          inBatch4 = (inBatch4 + 1) & 15;
          return v;
        },
      },
      {
        name: `MTU ${mtu}: verifyReceived IPv6, 16 datagrams of a receive batch per call (batched IPv6 receive path)`,
        op: () => {
          if (inBatch6 === 0) verifyReceived(6, six.dstAddr, 4791, 'strict', rx6.mem, rx6.desc, 16, verdicts);
          const v = receivedVerdict(verdicts[inBatch6]!);
          inBatch6 = (inBatch6 + 1) & 15;
          return v;
        },
      },
      { name: `MTU ${mtu}: checkIcrcOfIpDatagram`, op: () => (checkIcrcOfIpDatagram(ip).status === 'ok' ? 1 : 0) },
      // Where the addon is not built: the JavaScript ICRC over the fastest CRC package.
      { name: `MTU ${mtu}: JS ICRC: icrcOfUdpPayload (send)`, op: () => icrcJs.icrcOfUdpPayload(known, payload) },
      { name: `MTU ${mtu}: JS ICRC: verifyIcrc recover, ID recovered (receive path)`, op: () => icrcJs.verifyIcrc(socket, payload, 'recover') },
      // Last: `extra` below pairs it with the strict check.
      { name: `MTU ${mtu}: checkIcrc recover (ID recovered)`, op: () => (checkIcrc(socket, payload, 'recover').status === 'ok-recovered' ? 1 : 0) },
    ];
    const r = measureInterleaved(
      cases.map((c) => c.op),
      { ...m, samples: (m.samples ?? 15) * 2 + 1 },
    );
    // Each round's baseline is the fastest raw call of that round; a row's ratio is the median of its
    // per-round ratios to it.
    const base = r.samples[0]!.map((_, i) => Math.min(...raw.map((_, k) => r.samples[k]![i]!)));
    const baseName = `MTU ${mtu}: fastest raw CRC-32 of the round (${calls.map((c) => c.name).join(' | ')})`;
    rows.push({ name: baseName, value: median(base), unit: 'ns/pkt' });
    cases.forEach((c, k) => rows.push({ name: c.name, value: r.nsPerOp[k]!, unit: 'ns/pkt', baseline: baseName, ratio: median(r.samples[k]!.map((x, i) => x / base[i]!)) }));
    const strictAt = cases.findIndex((c) => c.name.endsWith('checkIcrc strict IPv4'));
    const recoverAt = cases.length - 1;
    const extra = median(r.samples[recoverAt]!.map((x, i) => x - r.samples[strictAt]![i]!));
    rows.push({ name: `MTU ${mtu}: recover extra over strict (paired median)`, value: extra, unit: 'ns/pkt' });
    rows.push({ name: `MTU ${mtu}: strict check rate`, value: 1e3 / r.nsPerOp[strictAt]!, unit: 'Mpkt/s' });
  }
  return rows;
}

/** Entry point for the bench runner. `quick` trades precision for a run of a few seconds. */
export async function run(opts: { quick: boolean }): Promise<BenchRow[]> {
  const m: MeasureOptions = opts.quick ? { warmupMs: 30, samples: 5, sampleMs: 5 } : { warmupMs: 200, samples: 15, sampleMs: 20 };
  return [...crcRows(m), ...icrcRows(m)];
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const rows = await run({ quick: process.argv.includes('--quick') });
  console.log(`node ${process.version}, crc32 = ${crc32Name}, ICRC = ${icrcImplementation}`);
  console.log(formatRows(rows));
}

/**
 * A capture with one packet of every opcode the stack knows (CNP included), written by our
 * pcap writer with ICRCs from our ICRC code, then read by tshark: no malformed frames, and the
 * fields Wireshark shows equal what we encoded. pcap and pcapng, IPv4 and IPv6.
 */

import t from 'tap';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { decodeCapture } from '../../src/analyze/decode.js';
import { parseIpAddress } from '../../src/wire/frame.js';
import { icrcOfUdpPayload, writeIcrc } from '../../src/wire/icrc.js';
import { KNOWN_OPCODES, opcodeInfo } from '../../src/wire/opcode.js';
import { emitPacket, packetLength, padFor, type RocePacket } from '../../src/wire/packet.js';
import { PcapngWriter, PcapWriter } from '../../src/pcap/writer.js';
import { tsharkJson } from './tshark.js';

function packetFor(opcode: number, i: number): RocePacket {
  const info = opcodeInfo(opcode)!;
  const payload = info.payload ? new Uint8Array(i % 7 === 0 ? 0 : 37 + i).map((_, k) => k) : new Uint8Array(0);
  const p: RocePacket = {
    bth: {
      opcode, se: i % 2 === 0, m: false, padCount: padFor(payload.length), tver: 0, pkey: 0xffff,
      fecn: false, becn: opcode === 0x81, resv6: 0, destQp: 0x100 + i, ackReq: info.end && info.request, resv7: 0,
      psn: opcode === 0x81 ? 0 : (0xfffff0 + i * 3) & 0xffffff,
    },
    payload,
    icrc: 0,
  };
  if (info.offsets.DETH !== undefined) p.deth = { qkey: 0x11111111, srcQp: 0x200 + i };
  if (info.offsets.FETH !== undefined) p.feth = { placementType: 1, selectivity: 0 };
  if (info.offsets.RETH !== undefined) p.reth = { va: 0x7f0000001000n + BigInt(i) * 0x1000n, rkey: 0x1234 + i, dmaLength: 4096 * (i + 1) };
  if (info.offsets.AtomicETH !== undefined) p.atomicEth = { va: 0x5500000000n + BigInt(i * 8), rkey: 0x77 + i, swapAdd: 0x1122334455667788n, compare: BigInt(i) };
  if (info.offsets.AETH !== undefined) p.aeth = { syndrome: [0x1f, 0x36, 0x60, 0x61, 0x62][i % 5]!, msn: i };
  if (info.offsets.AtomicAckETH !== undefined) p.atomicAckEth = { originalData: 0xfedcba9876543210n };
  if (info.offsets.ImmDt !== undefined) p.immDt = { data: 0x01020304 * (i + 1) };
  if (info.offsets.IETH !== undefined) p.ieth = { rkey: 0x0800011e + i };
  return p;
}

const ADDRS = {
  4: [parseIpAddress('10.77.0.1')!, parseIpAddress('10.77.0.2')!],
  6: [parseIpAddress('fd77::1')!, parseIpAddress('fd77::2')!],
} as const;

function datagram(p: RocePacket, family: 4 | 6): Uint8Array {
  const buf = new Uint8Array(packetLength(p));
  emitPacket(p, buf, 0);
  const [src, dst] = ADDRS[family];
  writeIcrc(buf, icrcOfUdpPayload({ family, srcAddr: src, dstAddr: dst, srcPort: 0xc000 + p.bth.destQp, dstPort: 4791 }, buf));
  return buf;
}

const dir = mkdtempSync(join(tmpdir(), 'roce-every-opcode-'));
t.teardown(() => { if (!process.env['ROCE_KEEP']) rmSync(dir, { recursive: true, force: true }); });

for (const format of ['pcap', 'pcapng'] as const) {
  for (const family of [4, 6] as const) {
    t.test(`${format}, IPv${family}: every opcode`, async (t) => {
      const chunks: Uint8Array[] = [];
      const w = format === 'pcap' ? new PcapWriter((c) => chunks.push(c)) : new PcapngWriter((c) => chunks.push(c));
      const packets = KNOWN_OPCODES.map((op, i) => packetFor(op, i));
      packets.forEach((p, i) => {
        const [src, dst] = ADDRS[family];
        w.writeRoce(BigInt(i) * 1000n, { src, dst, srcPort: 0xc000 + p.bth.destQp, ipId: 0, dontFragment: true }, datagram(p, family));
      });
      const file = join(dir, `every-opcode-v${family}.${format}`);
      writeFileSync(file, Buffer.concat(chunks));

      // Our own decoder: every packet well formed, ICRC good from the full header.
      const ours = [...decodeCapture(new Uint8Array(Buffer.concat(chunks)))];
      t.equal(ours.length, packets.length);
      t.ok(ours.every((d) => d.packet && d.icrc.status === 'ok'), 'roce decode: all ok');

      // Wireshark offers every InfiniBand payload to upper-layer heuristics; RPC-over-RDMA's
      // throws on an empty SEND payload and marks the frame malformed. That is its bug, not
      // the packet's: turn that one dissector off.
      const frames = await tsharkJson(file, ['--disable-protocol', 'rpcordma']);
      t.equal(frames.length, packets.length, 'tshark reads every frame');
      frames.forEach((f, i) => {
        const p = packets[i]!;
        const layers = f._source.layers;
        const name = opcodeInfo(p.bth.opcode)!.name;
        const text = JSON.stringify(layers);
        t.notMatch(text, /_ws\.malformed|Malformed Packet/, `${name}: not malformed`);
        t.notMatch(text, /_ws\.expert\.severity": "(8388608|4194304)"/, `${name}: no expert error/warning`);
        const ib = layers.infiniband;
        t.ok(ib, `${name}: dissected as InfiniBand`);
        const bth = ib['infiniband.bth_tree'];
        // FLUSH and ATOMIC WRITE (IBTA 1.5) are newer than Wireshark 4.0, which shows them as
        // "Unknown OpCode" with the BTH only.
        const wiresharkKnows = p.bth.opcode !== 0x1c && p.bth.opcode !== 0x1d;
        t.equal(Number(bth['infiniband.bth.opcode']), p.bth.opcode, `${name}: opcode`);
        t.equal(Number(bth['infiniband.bth.destqp']), p.bth.destQp, `${name}: DestQP`);
        t.equal(Number(bth['infiniband.bth.psn']), p.bth.psn, `${name}: PSN`);
        t.equal(Number(bth['infiniband.bth.padcnt']), p.bth.padCount, `${name}: PadCnt`);
        if (p.reth && !p.atomicEth && wiresharkKnows) {
          const r = ib['infiniband.reth_tree'];
          t.equal(BigInt(r['infiniband.reth.va']), p.reth.va, `${name}: RETH VA`);
          t.equal(Number(r['infiniband.reth.r_key']), p.reth.rkey, `${name}: RETH R_Key`);
          t.equal(Number(r['infiniband.reth.dmalen']), p.reth.dmaLength, `${name}: RETH DMA length`);
        }
        if (p.aeth) {
          const a = ib['infiniband.aeth_tree'];
          t.equal(Number(a['infiniband.aeth.syndrome']), p.aeth.syndrome, `${name}: AETH syndrome`);
          t.equal(Number(a['infiniband.aeth.msn']), p.aeth.msn, `${name}: AETH MSN`);
        }
        if (p.deth) {
          const d = ib['infiniband.deth_tree'];
          t.equal(Number(d['infiniband.deth.q_key']), p.deth.qkey, `${name}: DETH Q_Key`);
          t.equal(Number(d['infiniband.deth.srcqp']), p.deth.srcQp, `${name}: DETH SrcQP`);
        }
      });
    });
  }
}

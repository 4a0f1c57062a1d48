/**
 * Header codec rates: parse and emit of whole transport packets with our codecs, against the
 * same BTH + RETH layout described declaratively with `buffer-layout` (named in the design;
 * this measurement is why it stays off the per-packet path and serves colder layouts only).
 */

import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';
import { bthDestQp, bthOpcode, bthPsn } from '../src/wire/bth.js';
import { OPCODE } from '../src/wire/opcode.js';
import { emitPacket, PacketRecord, packetLength, parsePacket, parsePacketInto, type RocePacket } from '../src/wire/packet.js';
import { formatRows, measure, type BenchRow, type MeasureOptions } from './harness.js';

const require = createRequire(import.meta.url);

const writeFirst: RocePacket = {
  bth: { opcode: OPCODE['RC_RDMA_WRITE_FIRST']!, se: false, m: false, padCount: 0, tver: 0, pkey: 0xffff, fecn: false, becn: false, resv6: 0, destQp: 0x11, ackReq: false, resv7: 0, psn: 0x1c4734 },
  reth: { va: 0x7ff96912a000n, rkey: 0x245, dmaLength: 65536 },
  payload: new Uint8Array(1024),
  icrc: 0,
};
const ack: RocePacket = {
  bth: { ...writeFirst.bth, opcode: OPCODE['RC_ACKNOWLEDGE']! },
  aeth: { syndrome: 0x1f, msn: 3 },
  payload: new Uint8Array(0),
  icrc: 0,
};

function codecRows(m: MeasureOptions): BenchRow[] {
  const wf = new Uint8Array(packetLength(writeFirst));
  emitPacket(writeFirst, wf);
  const ackBuf = new Uint8Array(packetLength(ack));
  emitPacket(ack, ackBuf);
  const out = new Uint8Array(wf.length);
  const rec = new PacketRecord();

  // buffer-layout's description of the same 28 header bytes. It has no 64-bit big-endian
  // integer that keeps precision, so the VA is two 32-bit halves.
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  const BL: any = require('buffer-layout');
  const bthRethLayout = BL.struct([
    BL.u8('opcode'), BL.u8('flags'), BL.u16be('pkey'), BL.u8('ecn'), BL.u24be('destQp'), BL.u8('ackReq'), BL.u24be('psn'),
    BL.u32be('vaHi'), BL.u32be('vaLo'), BL.u32be('rkey'), BL.u32be('dmaLength'),
  ]);
  const wfBuffer = Buffer.from(wf.buffer, wf.byteOffset, wf.length);

  const parse = measure(() => {
    const r = parsePacket(wf);
    return r.ok ? r.packet.bth.psn : 0;
  }, m).nsPerOp;
  const rows: BenchRow[] = [
    { name: 'parsePacket RC_RDMA_WRITE_FIRST (BTH+RETH, 1 KiB payload view)', value: parse, unit: 'ns/pkt' },
    { name: 'parsePacket RC_ACKNOWLEDGE (BTH+AETH)', value: measure(() => { const r = parsePacket(ackBuf); return r.ok ? r.packet.bth.psn : 0; }, m).nsPerOp, unit: 'ns/pkt' },
    // The device's ingress: the same parse into one reused record (no BTH, header or result objects).
    { name: 'parsePacketInto RC_RDMA_WRITE_FIRST, reused record', value: measure(() => (parsePacketInto(wf, 0, wf.length, rec) ? rec.bth.psn : 0), m).nsPerOp, unit: 'ns/pkt' },
    { name: 'parsePacketInto RC_ACKNOWLEDGE, reused record', value: measure(() => (parsePacketInto(ackBuf, 0, ackBuf.length, rec) ? rec.bth.psn : 0), m).nsPerOp, unit: 'ns/pkt' },
    { name: 'raw accessors: opcode, DestQP, PSN', value: measure(() => bthOpcode(wf, 0) ^ bthDestQp(wf, 0) ^ bthPsn(wf, 0), m).nsPerOp, unit: 'ns/pkt' },
    { name: 'buffer-layout decode of the same BTH+RETH', value: measure(() => bthRethLayout.decode(wfBuffer, 0).psn, m).nsPerOp, unit: 'ns/pkt' },
    { name: 'emitPacket RC_RDMA_WRITE_FIRST (headers + 1 KiB copy)', value: measure(() => emitPacket(writeFirst, out, 0), m).nsPerOp, unit: 'ns/pkt' },
    { name: 'emitPacket RC_ACKNOWLEDGE', value: measure(() => emitPacket(ack, out, 0), m).nsPerOp, unit: 'ns/pkt' },
  ];
  const base = rows[0]!;
  return rows.map((r) => ({ ...r, baseline: base.name, ratio: r.value / base.value }));
}

export async function run(opts: { quick: boolean }): Promise<BenchRow[]> {
  const m: MeasureOptions = opts.quick ? { warmupMs: 30, samples: 5, sampleMs: 5 } : { warmupMs: 200, samples: 15, sampleMs: 20 };
  return codecRows(m);
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  console.log(formatRows(await run({ quick: process.argv.includes('--quick') })));
}

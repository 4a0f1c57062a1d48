/**
 * Our decoder against Wireshark's on real rdma_rxe traffic: for every RoCEv2 frame of every
 * fixture capture, each header field we parse equals what `tshark -T json` shows for the
 * same frame. Needs tshark (Debian package `tshark`); fails, never skips, without it.
 */

import t, { type Test } from 'tap';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { decodeCapture, type DecodedFrame } from '../../src/analyze/decode.js';
import { toHex } from '../../src/wire/bytes.js';
import { tsharkJson, flatten } from './tshark.js';

const FIXTURES = join(import.meta.dirname, '../../../test/fixtures/rxe');


const num = (s: string | undefined): number => (s === undefined ? NaN : Number(s));
const hexBytes = (s: string | undefined): string => (s ?? '').replace(/:/g, '');

function compare(t: Test, d: DecodedFrame, ws: Map<string, string>): void {
  const p = d.packet!;
  const b = p.bth;
  const where = `frame ${d.frame}`;
  t.equal(num(ws.get('infiniband.bth.opcode')), b.opcode, `${where} opcode`);
  t.equal(num(ws.get('infiniband.bth.se')), +b.se, `${where} SE`);
  t.equal(num(ws.get('infiniband.bth.m')), +b.m, `${where} M`);
  t.equal(num(ws.get('infiniband.bth.padcnt')), b.padCount, `${where} PadCnt`);
  t.equal(num(ws.get('infiniband.bth.tver')), b.tver, `${where} TVer`);
  t.equal(num(ws.get('infiniband.bth.p_key')), b.pkey, `${where} P_Key`);
  t.equal(num(ws.get('infiniband.bth.destqp')), b.destQp, `${where} DestQP`);
  t.equal(num(ws.get('infiniband.bth.a')), +b.ackReq, `${where} AckReq`);
  t.equal(num(ws.get('infiniband.bth.psn')), b.psn, `${where} PSN`);
  // Wireshark 4.0 shows BTH byte 4 (FECN/BECN/resv6) as one reserved byte.
  t.equal(num('0x' + hexBytes(ws.get('infiniband.reserved'))), (+b.fecn << 7) | (+b.becn << 6) | b.resv6, `${where} BTH byte 4`);
  // Wireshark prints the four ICRC bytes as a big-endian number; we hold the little-endian value.
  const icrcWire = ((p.icrc & 0xff) << 24 | (p.icrc >>> 8 & 0xff) << 16 | (p.icrc >>> 16 & 0xff) << 8 | p.icrc >>> 24) >>> 0;
  // Wireshark 4.0 shows no ICRC field for a UD SEND with immediate data and no payload
  // (imm_ud.pcap frame 15): it is absent there, and must be present everywhere else.
  const wsIcrc = ws.get('infiniband.invariant.crc');
  if (wsIcrc !== undefined || p.payload.length > 0 || !p.deth) t.equal(num(wsIcrc), icrcWire, `${where} ICRC`);
  if (p.reth) {
    t.equal(BigInt(ws.get('infiniband.reth.va') ?? '-1'), p.reth.va, `${where} RETH VA`);
    t.equal(num(ws.get('infiniband.reth.r_key')), p.reth.rkey, `${where} RETH R_Key`);
    t.equal(num(ws.get('infiniband.reth.dmalen')), p.reth.dmaLength, `${where} RETH DMA length`);
  }
  if (p.aeth) {
    t.equal(num(ws.get('infiniband.aeth.syndrome')), p.aeth.syndrome, `${where} AETH syndrome`);
    t.equal(num(ws.get('infiniband.aeth.msn')), p.aeth.msn, `${where} AETH MSN`);
  }
  if (p.deth) {
    t.equal(num(ws.get('infiniband.deth.q_key')), p.deth.qkey, `${where} DETH Q_Key`);
    t.equal(num(ws.get('infiniband.deth.srcqp')), p.deth.srcQp, `${where} DETH SrcQP`);
  }
  if (p.atomicEth) {
    // Wireshark reuses the RETH VA and R_Key fields inside the AtomicETH.
    t.equal(BigInt(ws.get('infiniband.reth.va') ?? '-1'), p.atomicEth.va, `${where} AtomicETH VA`);
    t.equal(num(ws.get('infiniband.reth.r_key')), p.atomicEth.rkey, `${where} AtomicETH R_Key`);
    t.equal(BigInt(ws.get('infiniband.atomiceth.swapdt') ?? '-1'), p.atomicEth.swapAdd, `${where} AtomicETH swap/add`);
    t.equal(BigInt(ws.get('infiniband.atomiceth.cmpdt') ?? '-1'), p.atomicEth.compare, `${where} AtomicETH compare`);
  }
  if (p.atomicAckEth) {
    t.equal(BigInt(ws.get('infiniband.atomicacketh.origremdt') ?? '-1'), p.atomicAckEth.originalData, `${where} AtomicAckETH`);
  }
  if (p.immDt) t.equal(hexBytes(ws.get('infiniband.immdt')), p.immDt.data.toString(16).padStart(8, '0'), `${where} ImmDt`);
  if (p.ieth) t.equal(hexBytes(ws.get('infiniband.ieth')), p.ieth.rkey.toString(16).padStart(8, '0'), `${where} IETH`);
}

const files = readdirSync(FIXTURES).filter((f) => f.endsWith('.pcap')).sort();

t.test('fixtures are present', async (t) => {
  t.ok(files.length >= 19, `${files.length} rxe captures in test/fixtures/rxe`);
});

for (const file of files) {
  t.test(file, async (t) => {
    const path = join(FIXTURES, file);
    const frames = [...decodeCapture(readFileSync(path))];
    t.ok(frames.length > 0, 'has RoCEv2 frames');
    const ws = new Map<number, Map<string, string>>();
    for (const pkt of await tsharkJson(path)) {
      const layers = pkt?._source?.layers;
      const no = Number(layers?.frame?.['frame.number']);
      if (layers?.infiniband) ws.set(no, flatten(layers.infiniband));
    }
    t.equal(ws.size, frames.length, 'tshark sees the same number of InfiniBand frames');
    let bad = 0;
    for (const d of frames) {
      if (!d.packet || d.icrc.status !== 'ok') bad++;
      const w = ws.get(d.frame);
      if (!w) {
        t.fail(`frame ${d.frame}: tshark did not dissect it as InfiniBand`);
        continue;
      }
      if (d.packet) compare(t, d, w);
    }
    t.equal(bad, 0, 'every packet parses and its ICRC verifies from the full header');
    t.ok(toHex(frames[0]!.udpPayload, 0, 1).length === 2);
  });
}

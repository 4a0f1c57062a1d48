/** PcapTap: what it writes reads back as frames whose ICRCs check against their own headers. */

import t from 'tap';
import { PcapTap } from '../../src/link/pcap-tap.js';
import { FaultyLink } from '../../src/link/fault.js';
import { MemoryLink } from '../../src/link/memory.js';
import { UdpLink } from '../../src/link/udp.js';
import { PcapngWriter, PcapWriter } from '../../src/pcap/writer.js';
import { readCapture } from '../../src/pcap/reader.js';
import type { CaptureRecord } from '../../src/pcap/format.js';
import { SystemClock, VirtualClock } from '../../src/runtime/clock.js';
import { formatIpAddress, parseFrame } from '../../src/wire/frame.js';
import { checkIcrcOfIpDatagram, icrcOfUdpPayload, writeIcrc } from '../../src/wire/icrc.js';
import { parseIpAddress } from '../../src/wire/frame.js';
import { closeSocket, concat, plainSocket, psnOf, recorder, sendOnly, until } from './helpers.js';

function capture(): { chunks: Uint8Array[]; records: () => CaptureRecord[] } {
  const chunks: Uint8Array[] = [];
  return { chunks, records: () => [...readCapture(concat(chunks))].map((r) => ({ ...r, data: r.data.slice() })) };
}

interface Seen {
  src: string;
  dst: string;
  srcPort: number;
  dstPort: number;
  ipId: number | undefined;
  tos: number;
  psn: number;
  icrc: string;
}

function frames(recs: CaptureRecord[]): Seen[] {
  return recs.map((r) => {
    const p = parseFrame(r.linkType, r.data);
    if (!p.ok) throw new Error(`frame ${r.frame}: ${p.error}`);
    const f = p.frame;
    return {
      src: formatIpAddress(f.ip.src),
      dst: formatIpAddress(f.ip.dst),
      srcPort: f.udp.srcPort,
      dstPort: f.udp.dstPort,
      ipId: f.ip.family === 4 ? f.ip.id : undefined,
      tos: f.ip.family === 4 ? f.ip.tos : f.ip.trafficClass,
      psn: psnOf(r.data.subarray(f.payloadOffset)),
      icrc: checkIcrcOfIpDatagram(r.data, f.ipOffset).status,
    };
  });
}

t.test('both directions over MemoryLink, virtual timestamps, ICRCs valid in the capture', (t) => {
  const clock = new VirtualClock(1000);
  const [a0, b] = MemoryLink.pair(clock, { latencyUs: 7 });
  const cap = capture();
  const a = new PcapTap(a0, new PcapWriter(cap.chunks.push.bind(cap.chunks)), 'both', { clock });
  const gotA = recorder(a);
  const gotB = recorder(b);
  a.send(b.local, 0xc001, sendOnly(1, new Uint8Array(20)));
  a.send(b.local, 0xc002, sendOnly(2, new Uint8Array(21)));
  clock.run();
  b.send(a.local, 0xc003, sendOnly(3, new Uint8Array(22)));
  clock.run();
  t.equal(gotB.length, 2);
  t.equal(gotA.length, 1, 'the tap passes received packets on');
  const recs = cap.records();
  t.same(recs.map((r) => r.timestampNs), [1_000_000n, 1_000_000n, 1_014_000n], 'clock µs → ns (sent at 1000, received at 1007 + 7)');
  t.same(frames(recs), [
    { src: '10.0.0.1', dst: '10.0.0.2', srcPort: 0xc001, dstPort: 4791, ipId: 0, tos: 0, psn: 1, icrc: 'ok' },
    { src: '10.0.0.1', dst: '10.0.0.2', srcPort: 0xc002, dstPort: 4791, ipId: 0, tos: 0, psn: 2, icrc: 'ok' },
    { src: '10.0.0.2', dst: '10.0.0.1', srcPort: 0xc003, dstPort: 4791, ipId: 0, tos: 0, psn: 3, icrc: 'ok' },
  ]);
  t.same(a.counters, { written: 3, writeErrors: 0 });
  t.end();
});

t.test('modes, order against FaultyLink, CE in the TOS, pcapng directions', (t) => {
  const clock = new VirtualClock();
  const [a0, b0] = MemoryLink.pair(clock, { family: 6 });
  const txOnly = capture();
  const rxOnly = capture();
  // Outside the faults: sees what the stack sent. Inside on b: sees what arrived (marked).
  const a = new PcapTap(new FaultyLink(a0, clock, { seed: 1, dropPct: 50 }), new PcapWriter(txOnly.chunks.push.bind(txOnly.chunks)), 'tx', { clock });
  const b = new PcapTap(new FaultyLink(b0, clock, { seed: 1, fecnPct: 100, ceMark: true, direction: 'rx' }), new PcapngWriter(rxOnly.chunks.push.bind(rxOnly.chunks)), 'rx', { clock });
  const got = recorder(b);
  for (let i = 0; i < 10; i++) a.send(b.local, 0xc000, sendOnly(i, new Uint8Array(8)));
  b.send(a.local, 0xc000, sendOnly(99, new Uint8Array(8)));
  clock.run();
  const sent = frames(txOnly.records());
  const received = frames(rxOnly.records());
  t.equal(sent.length, 10, 'tx tap outside the faults: all 10 sent');
  t.equal(received.length, got.length, 'rx tap: what arrived');
  t.ok(received.length < 10, `${received.length} survived the 50 % loss`);
  t.ok(sent.every((f) => f.icrc === 'ok' && f.src === 'fd00::1' && f.tos === 0));
  t.ok(received.every((f) => f.icrc === 'ok' && f.tos === 3), 'ECN CE in the traffic class, ICRC still ok (FECN masked)');
  t.notOk(received.some((f) => f.psn === 99), 'rx-only tap ignores what b sends');
  t.end();
});

t.test('over UdpLink: a received packet is captured with the ID its ICRC implies', async (t) => {
  const b0 = await UdpLink.open({ address: '127.0.0.1', port: 0 });
  const cap = capture();
  const b = new PcapTap(b0, new PcapWriter(cap.chunks.push.bind(cap.chunks)), 'both', { clock: new SystemClock() });
  t.teardown(() => b.close());
  const plain = await plainSocket('127.0.0.1');
  t.teardown(() => closeSocket(plain));
  const got = recorder(b);
  const d = concat([...sendOnly(7, new Uint8Array(12)), new Uint8Array(4)]);
  const lo = parseIpAddress('127.0.0.1')!;
  writeIcrc(d, icrcOfUdpPayload({ family: 4, srcAddr: lo, dstAddr: lo, srcPort: plain.address().port, dstPort: b.local.port, ipId: 0x4242 }, d));
  plain.send(d, b.local.port, '127.0.0.1');
  await until(() => got.length === 1);
  b.send({ address: '127.0.0.1', port: plain.address().port }, 0, sendOnly(8, new Uint8Array(12)));
  const f = frames(cap.records());
  t.equal(f.length, 2);
  t.same(f[0], { src: '127.0.0.1', dst: '127.0.0.1', srcPort: plain.address().port, dstPort: b.local.port, ipId: 0x4242, tos: 0, psn: 7, icrc: 'ok' });
  t.same(f[1], { src: '127.0.0.1', dst: '127.0.0.1', srcPort: b.local.port, dstPort: plain.address().port, ipId: 0, tos: 0, psn: 8, icrc: 'ok' });
  const ts = cap.records()[0]!.timestampNs;
  t.ok(Math.abs(Number(ts / 1_000_000n) - Date.now()) < 10_000, 'SystemClock: wall-clock timestamps');
});

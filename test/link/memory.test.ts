/** MemoryLink on a VirtualClock: latency, copying, real ICRCs, routing, close; TraceLink over it. */

import t from 'tap';
import { MemoryLink } from '../../src/link/memory.js';
import { TraceLink } from '../../src/link/trace.js';
import { VirtualClock } from '../../src/runtime/clock.js';
import { checkIcrc, type UdpDatagramInfo } from '../../src/wire/icrc.js';
import { parseIpAddress } from '../../src/wire/frame.js';
import { psnOf, recorder, sendOnly } from './helpers.js';

t.test('delivery after latencyUs, in order, payload copied at send', (t) => {
  const clock = new VirtualClock();
  const [a, b] = MemoryLink.pair(clock, { latencyUs: 5 });
  const got = recorder(b);
  const parts = sendOnly(1, new Uint8Array(6).fill(0x11));
  a.send(b.local, 0xc000, parts);
  parts[1]!.fill(0xee); // the sender reuses its buffers at once
  clock.advanceTo(1);
  a.send(b.local, 0xc000, sendOnly(2, new Uint8Array(8)));
  clock.advanceTo(4);
  t.equal(got.length, 0, 'nothing before 5 µs');
  clock.advanceTo(5);
  t.equal(got.length, 1, 'the first at 5 µs');
  clock.run();
  t.same(got.map((r) => psnOf(r.payload)), [1, 2]);
  t.same(got.map((r) => r.meta.at), [5, 6], 'arrival times on the clock');
  const r = got[0]!;
  t.same(r.payload.subarray(12, 18), new Uint8Array(6).fill(0x11), 'the bytes as they were at send');
  t.equal(r.payload.length, 12 + 6 + 2 + 4);
  t.same(r.meta.src, { address: '10.0.0.1', port: 0xc000 });
  t.equal(r.meta.icrc, 'ok');
  t.equal(r.meta.ipId, 0);
  const info: UdpDatagramInfo = { family: 4, srcAddr: parseIpAddress('10.0.0.1')!, dstAddr: parseIpAddress('10.0.0.2')!, srcPort: 0xc000, dstPort: 4791 };
  t.equal(checkIcrc(info, r.payload, 'strict').status, 'ok', 'a real ICRC, ID 0 + DF');
  t.same(a.caps, { family: 4, icrcGenerate: true, icrcVerify: 'strict', maxDatagram: 65507 });
  t.same(a.counters, { sent: 2, received: 0 });
  t.same(b.counters, { sent: 0, received: 2 });
  t.end();
});

t.test('a bit flipped in flight is caught by the ICRC (rx hook)', (t) => {
  const clock = new VirtualClock();
  const [a, b] = MemoryLink.pair(clock);
  const got = recorder(b);
  b.setRxHook((d, _src, accept) => {
    d[20]! ^= 0x04;
    accept(d);
  });
  a.send(b.local, 0xc000, sendOnly(1, new Uint8Array(16)));
  clock.run();
  t.equal(got.length, 0);
  t.equal(b.drops.badIcrc, 1);
  t.end();
});

t.test('IPv6 pair, custom addresses; icrc off appends a zero ICRC field', (t) => {
  const clock = new VirtualClock();
  const [a, b] = MemoryLink.pair(clock, { a: { address: 'fd00::a', port: 4791 }, b: { address: 'fd00::b', port: 5000 } });
  t.equal(a.caps.family, 6);
  const got = recorder(b);
  a.send({ address: 'fd00:0::b', port: 5000 }, 0xc001, sendOnly(3, new Uint8Array(4)));
  clock.run();
  t.equal(got[0]?.meta.icrc, 'ok');
  t.equal(got[0]?.meta.ipId, undefined);

  const [c, d] = MemoryLink.pair(clock, { icrc: false });
  const gotD = recorder(d);
  c.send(d.local, 1, sendOnly(4, new Uint8Array([1, 2, 3, 4])));
  c.sendRaw(d.local, 1, Uint8Array.from([...sendOnly(4, new Uint8Array(4)).flatMap((p) => [...p]), 9, 9, 9, 9]));
  clock.run();
  // The field is there, so the receiver's parser finds the payload whole (A17: the ICRC ends every packet).
  t.same([...(gotD[0]?.payload ?? [])].slice(-8), [1, 2, 3, 4, 0, 0, 0, 0], 'send: the ICRC field is present, zero');
  t.equal(gotD[0]?.meta.icrc, 'unchecked');
  t.equal(gotD[1]?.payload.length, 12 + 4 + 4, 'sendRaw: the bytes as given, nothing added');
  t.same([...(gotD[1]?.payload ?? [])].slice(-4), [9, 9, 9, 9]);
  t.end();
});

t.test('misaddressed, malformed and closed', async (t) => {
  const clock = new VirtualClock();
  const [a, b] = MemoryLink.pair(clock);
  a.send({ address: '10.0.0.3', port: 4791 }, 1, sendOnly(1, new Uint8Array(4)));
  a.send({ address: '10.0.0.2', port: 4792 }, 1, sendOnly(1, new Uint8Array(4)));
  a.send(b.local, 1, [new Uint8Array(4)]);
  t.equal(a.drops.sendError, 3);
  a.sendRaw(b.local, 1, new Uint8Array(8));
  const bad = new Uint8Array(20);
  bad[1] = 0x05;
  a.sendRaw(b.local, 1, bad);
  clock.run();
  t.equal(b.drops.tooShort, 1);
  t.equal(b.drops.notRoce, 1);
  a.send(b.local, 1, sendOnly(1, new Uint8Array(4)));
  await b.close();
  clock.run();
  t.equal(b.drops.closed, 1, 'arrived at a closed link');
  await a.close();
  a.send(b.local, 1, sendOnly(1, new Uint8Array(4)));
  t.equal(a.drops.closed, 1);
  t.throws(() => MemoryLink.pair(clock, { a: { address: '10.0.0.1', port: 1 }, b: { address: 'fd00::1', port: 1 } }), RangeError);
});

t.test('TraceLink prints each datagram with formatPacket, or hex', (t) => {
  const clock = new VirtualClock();
  const [a0, b0] = MemoryLink.pair(clock);
  const lines: string[] = [];
  const a = new TraceLink(a0, (l) => lines.push(`A ${l}`));
  const b = new TraceLink(b0, (l) => lines.push(`B ${l}`));
  const got = recorder(b);
  a.send(b.local, 0xc123, sendOnly(5, new Uint8Array(64)));
  const junk = new Uint8Array(20).fill(0xab);
  a.sendRaw(b.local, 0xc123, junk); // BTH version 0xb: dropped by b before its trace sees it
  clock.run();
  t.equal(got.length, 1, 'the handler behind the tracer still gets the packet');
  t.same(lines, [
    'A tx 10.0.0.2:4791 sport=49443 RC_SEND_ONLY qp=0x000011 psn=0x000005 ack payload=64',
    'A tx 10.0.0.2:4791 sport=49443 20B unparseable (BAD_TVER: TVer 11): abababababababababababababababababababab',
    'B rx 10.0.0.1:49443 icrc=ok RC_SEND_ONLY qp=0x000011 psn=0x000005 ack payload=64',
  ]);
  t.equal(b.drops.notRoce, 1);
  t.end();
});

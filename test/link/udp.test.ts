/**
 * UdpLink over loopback: real sockets, real kernel. Covers the start-up checks (IP_PMTUDISC_DO
 * proven by the ICRC, UDP_NO_CHECK6_RX read back and exercised with a zero-checksum sender),
 * strict and recovering receivers, drops, garbage, per-flow source ports, and close.
 */

import t from 'tap';
import { UdpLink, type LinkWarning } from '../../src/link/udp.js';
import { openIpv4Observer, setsockoptInt, socketFd, SOL_UDP, UDP_NO_CHECK6_RX, UDP_NO_CHECK6_TX } from '../../src/link/sockopt.js';
import { Xorshift32 } from '../../src/link/fault.js';
import { checkIcrc, checkIcrcOfIpDatagram, icrcImplementation, icrcOfUdpPayload, writeIcrc, type UdpDatagramInfo } from '../../src/wire/icrc.js';
import { parseIpAddress } from '../../src/wire/frame.js';
import { closeSocket, concat, freePorts, plainSocket, psnOf, recorder, sendOnly, settle, until, type Received } from './helpers.js';
import type { PeerAddress } from '../../src/link/link.js';
import { runChild } from '../helpers/child.js';

const warnings: LinkWarning[] = [];
const warn = (w: LinkWarning): void => {
  warnings.push(w);
};

async function open(address: string, extra: Partial<Parameters<typeof UdpLink.open>[0]> = {}): Promise<UdpLink> {
  const l = await UdpLink.open({ address, port: 0, warn, ...extra });
  t.teardown(() => l.close());
  return l;
}

/** A valid RoCEv2 datagram (ICRC for ID 0 + DF) as it would come from `from` to `to`. */
function datagram(from: { address: string; port: number }, to: { address: string; port: number }, psn: number, ipId = 0): Uint8Array {
  const d = concat([...sendOnly(psn, new Uint8Array(8).fill(0x5a)), new Uint8Array(4)]);
  const src = parseIpAddress(from.address)!;
  const info: UdpDatagramInfo = { family: src.length === 4 ? 4 : 6, srcAddr: src, dstAddr: parseIpAddress(to.address)!, srcPort: from.port, dstPort: to.port, ipId };
  writeIcrc(d, icrcOfUdpPayload(info, d));
  return d;
}

t.test('IPv4 start-up: IP_PMTUDISC_DO read back and proven by the probe', async (t) => {
  const a = await open('127.0.0.1');
  t.comment(`startup ${JSON.stringify(a.startup)}`);
  t.same(a.startup.ffi, { ok: true }, 'koffi + libc loaded');
  t.equal(a.startup.pmtuDiscover, 2, 'IP_MTU_DISCOVER reads back IP_PMTUDISC_DO');
  t.equal(a.startup.probe, 'ok', 'the probe to itself verified with ID 0 + DF');
  t.equal(a.startup.probeIpId, 0);
  t.equal(a.ipIdZero, true);
  t.ok(a.startup.recvBufferBytes >= 4 << 20, `receive buffer granted: ${a.startup.recvBufferBytes}`);
  t.ok(a.startup.sendBufferBytes >= 1 << 20, `send buffer granted: ${a.startup.sendBufferBytes}`);
  t.same(a.caps, { family: 4, icrcGenerate: true, icrcVerify: 'recover', maxDatagram: 65507 });
  t.equal(a.counters.received, 0, 'the probe is not delivered as traffic');
  t.same(warnings, [], 'no warnings');
});

t.test('IPv4 127.0.0.1 → 127.0.0.1: delivery, and the ICRC is valid for ID 0 in strict mode', async (t) => {
  const a = await open('127.0.0.1');
  const b = await open('127.0.0.1');
  const strict = await open('127.0.0.1', { icrcVerify: 'strict' });
  const gotB = recorder(b);
  const gotS = recorder(strict);
  for (let psn = 0; psn < 5; psn++) {
    const parts = sendOnly(psn, new Uint8Array(13).fill(psn));
    a.send(b.local, 0xc000, parts);
    a.send(strict.local, 0xc000, parts);
    parts[1]!.fill(0xee); // the caller may reuse its parts at once
  }
  await until(() => gotB.length === 5 && gotS.length === 5, 2000, '5 + 5 datagrams');
  t.same(gotB.map((r) => psnOf(r.payload)), [0, 1, 2, 3, 4], 'in order, all there');
  const r = gotB[2]!;
  t.same(r.payload.subarray(12, 25), new Uint8Array(13).fill(2), 'payload as sent, not as reused');
  t.equal(r.payload.length, 12 + 13 + 3 + 4, 'BTH + payload + pad + ICRC');
  t.same(r.meta.src, a.local, 'src address and port');
  t.equal(r.meta.icrc, 'ok', 'recover mode: matched at once with ID 0');
  t.equal(r.meta.ipId, 0, 'the ID the ICRC implies is 0');
  t.equal(r.meta.ce, false);
  t.type(r.meta.at, 'number');
  const info: UdpDatagramInfo = { family: 4, srcAddr: parseIpAddress('127.0.0.1')!, dstAddr: parseIpAddress('127.0.0.1')!, srcPort: a.local.port, dstPort: b.local.port };
  t.equal(checkIcrc(info, r.payload, 'strict').status, 'ok', 'strict check with ID 0 + DF passes');
  t.equal(gotS.length, 5, 'a strict receiver accepts every datagram');
  t.equal(gotS[0]!.meta.icrc, 'ok');
  t.equal(strict.drops.badIcrc, 0);
  t.equal(a.counters.sent, 10);
});

t.test('IPv4 127.0.0.1 → 127.0.0.2 (all of 127/8 is local)', async (t) => {
  const a = await open('127.0.0.1');
  const b = await open('127.0.0.2', { icrcVerify: 'strict' });
  t.equal(b.ipIdZero, true);
  const got = recorder(b);
  a.send(b.local, 0xc123, sendOnly(7, new Uint8Array(64)));
  await until(() => got.length === 1);
  t.same(got[0]!.meta.src, { address: '127.0.0.1', port: a.local.port });
  t.equal(got[0]!.meta.icrc, 'ok');
  // And back.
  const gotA = recorder(a);
  b.send(a.local, 0xc123, sendOnly(8, new Uint8Array(64)));
  await until(() => gotA.length === 1);
  t.same(gotA[0]!.meta.src, { address: '127.0.0.2', port: b.local.port });
});

for (const batchIo of [true, false]) t.test(`each datagram reports its own sender, as senders alternate by address and by port (${batchIo ? 'batched' : 'dgram'} path)`, async (t) => {
  const rx = await open('127.0.0.3', { batchIo });
  const senders = await Promise.all(['127.0.0.1', '127.0.0.1'].map((a) => plainSocket(a)));
  // The third on another address with the first one's port.
  senders.push(await plainSocket('127.0.0.2', senders[0]!.address().port));
  t.teardown(() => Promise.all(senders.map(closeSocket)));
  const got: Received[] = [];
  const records: PeerAddress[] = [];
  rx.onReceive((payload, meta) => {
    got.push({ payload: payload.slice(), meta: { ...meta, src: { ...meta.src } } });
    records.push(meta.src);
  });
  // Runs of one sender, then changes of the port only (0 ↔ 1), of the address only (0 ↔ 2), of both.
  const order = [0, 0, 1, 1, 0, 2, 2, 0, 1, 2];
  order.forEach((k, psn) => {
    const s = senders[k]!;
    const from = { address: s.address().address, port: s.address().port };
    s.send(datagram(from, rx.local, psn), rx.local.port, '127.0.0.3');
  });
  await until(() => got.length === order.length, 2000, 'every datagram');
  const want = new Map(order.map((k, psn) => [psn, { address: senders[k]!.address().address, port: senders[k]!.address().port }]));
  t.same(got.map((r) => r.meta.src), got.map((r) => want.get(psnOf(r.payload))), 'the sender of each, by its PSN');
  t.equal(new Set(got.map((r) => psnOf(r.payload))).size, order.length);
  // A sender's datagrams share one record: the receive path makes none per datagram.
  const bySender = senders.map((_, k) => new Set(records.filter((_, i) => order[psnOf(got[i]!.payload)] === k)));
  t.same(bySender.map((r) => r.size), [1, 1, 1], 'one record per sender');
});

t.test('on the wire (raw socket): the link sends ID 0 + DF, a default socket does not', async (t) => {
  const obs = openIpv4Observer(parseIpAddress('127.0.0.9')!);
  if (!obs.ok) throw new Error(`this test needs CAP_NET_RAW: ${obs.message}`);
  t.teardown(() => obs.value.close());
  const a = await open('127.0.0.1');
  const sink = { address: '127.0.0.9', port: 9 }; // nobody listens: the raw socket still sees it
  const plain = await plainSocket('127.0.0.1'); // node's default: IP_PMTUDISC_WANT
  t.teardown(() => closeSocket(plain));
  a.send(sink, 0, sendOnly(1, new Uint8Array(8)));
  plain.send(datagram({ address: '127.0.0.1', port: plain.address().port }, sink, 2), sink.port, sink.address);
  const seen: Uint8Array[] = [];
  await until(() => (seen.push(...obs.value.poll()), seen.length >= 2), 2000, 'both datagrams on the wire');
  const ours = seen.find((ip) => ((ip[20]! << 8) | ip[21]!) === a.local.port)!;
  const theirs = seen.find((ip) => ((ip[20]! << 8) | ip[21]!) === plain.address().port)!;
  const idOf = (ip: Uint8Array): number => (ip[4]! << 8) | ip[5]!;
  t.equal(idOf(ours), 0, 'the link: ID 0');
  t.equal(ours[6]! & 0x40, 0x40, 'the link: DF');
  t.equal(checkIcrcOfIpDatagram(ours).status, 'ok', 'the link: ICRC right for the real header (what rxe checks)');
  t.comment(`a default socket sent ID 0x${idOf(theirs).toString(16)}`);
  t.not(idOf(theirs), 0, 'a default socket: the kernel picks a non-zero ID');
  t.equal(checkIcrcOfIpDatagram(theirs).status, 'bad', 'so its ICRC, computed for ID 0, is wrong on the wire');
});

t.test('an rxe-like sender (ICRC for its own non-zero ID): recover mode finds the ID, strict drops', async (t) => {
  const rec = await open('127.0.0.1');
  const strict = await open('127.0.0.1', { icrcVerify: 'strict' });
  const plain = await plainSocket('127.0.0.1');
  t.teardown(() => closeSocket(plain));
  const got = recorder(rec);
  const gotS = recorder(strict);
  const from = { address: '127.0.0.1', port: plain.address().port };
  for (let i = 0; i < 4; i++) {
    plain.send(datagram(from, rec.local, i, 0x24b0 + i), rec.local.port, '127.0.0.1');
    plain.send(datagram(from, strict.local, i, 0x24b0 + i), strict.local.port, '127.0.0.1');
  }
  await until(() => got.length === 4 && strict.drops.badIcrc === 4, 2000, 'recovered and dropped');
  t.same(got.map((r) => r.meta.icrc), ['ok-recovered', 'ok-recovered', 'ok-recovered', 'ok-recovered']);
  t.same(got.map((r) => r.meta.ipId), [0x24b0, 0x24b1, 0x24b2, 0x24b3], 'the IDs the sender computed with');
  t.equal(gotS.length, 0, 'the strict receiver accepted none');
});

t.test('corrupted ICRC, too short, not RoCE: dropped and counted', async (t) => {
  const b = await open('127.0.0.1');
  const plain = await plainSocket('127.0.0.1');
  t.teardown(() => closeSocket(plain));
  const got = recorder(b);
  const from = { address: '127.0.0.1', port: plain.address().port };
  const bad = datagram(from, b.local, 1);
  bad[bad.length - 1]! ^= 0x01;
  plain.send(bad, b.local.port, '127.0.0.1');
  const payloadFlip = datagram(from, b.local, 2);
  payloadFlip[14]! ^= 0x80;
  plain.send(payloadFlip, b.local.port, '127.0.0.1');
  plain.send(new Uint8Array(15), b.local.port, '127.0.0.1');
  const tver = datagram(from, b.local, 3);
  tver[1]! |= 0x03;
  plain.send(tver, b.local.port, '127.0.0.1');
  plain.send(datagram(from, b.local, 4), b.local.port, '127.0.0.1');
  await until(() => got.length === 1, 2000, 'the good one');
  t.equal(psnOf(got[0]!.payload), 4, 'only the good datagram is delivered');
  t.equal(b.drops.badIcrc, 2, 'bad ICRC and flipped payload bit');
  t.equal(b.drops.tooShort, 1);
  t.equal(b.drops.notRoce, 1);
});

t.test('random garbage datagrams are counted as drops and never throw', async (t) => {
  const b = await open('127.0.0.1');
  const plain = await plainSocket('127.0.0.1');
  t.teardown(() => closeSocket(plain));
  const got = recorder(b);
  const rng = new Xorshift32(0xdecaf);
  const N = 300;
  for (let i = 0; i < N; i++) {
    const len = rng.next() % 200;
    const d = new Uint8Array(len);
    for (let j = 0; j < len; j++) d[j] = rng.next() & 0xff;
    plain.send(d, b.local.port, '127.0.0.1');
    if (i % 25 === 24) await settle(5); // stay well under the socket buffer
  }
  const total = (): number => Object.values(b.drops).reduce((x, y) => x + y, 0);
  await until(() => total() === N, 3000, `${N} drops`);
  t.equal(got.length, 0, 'nothing reached the handler');
  t.ok(b.drops.tooShort > 0 && b.drops.badIcrc > 0 && b.drops.notRoce > 0, JSON.stringify(b.drops));
});

t.test('IPv6 over ::1: UDP_NO_CHECK6_RX read back, exact ICRC, zero-checksum senders heard', async (t) => {
  const a = await open('::1');
  const b = await open('::1');
  t.comment(`startup ${JSON.stringify(b.startup)}`);
  t.equal(b.startup.noCheck6Rx, true, 'UDP_NO_CHECK6_RX reads back 1');
  t.equal(b.noCheck6Rx, true);
  const r = b.readSocketOption(SOL_UDP, UDP_NO_CHECK6_RX);
  t.same(r, { ok: true, value: 1 }, 'getsockopt on the live socket');
  t.equal(b.ipIdZero, true, 'no IP ID in IPv6');
  t.equal(b.caps.family, 6);

  const got = recorder(b);
  a.send(b.local, 0xc001, sendOnly(1, new Uint8Array(32).fill(1)));
  await until(() => got.length === 1);
  t.same(got[0]!.meta.src, { address: '::1', port: a.local.port });
  t.equal(got[0]!.meta.icrc, 'ok', 'exact check');
  t.equal(got[0]!.meta.ipId, undefined);

  // rxe's way: UDP checksum 0 (UDP_NO_CHECK6_TX on the sender).
  const rxeLike = await plainSocket('::1');
  t.teardown(() => closeSocket(rxeLike));
  t.same(setsockoptInt(socketFd(rxeLike)!, SOL_UDP, UDP_NO_CHECK6_TX, 1), { ok: true, value: undefined });
  const from = { address: '::1', port: rxeLike.address().port };
  rxeLike.send(datagram(from, b.local, 2), b.local.port, '::1');
  await until(() => got.length === 2, 2000, 'the zero-checksum datagram');
  t.equal(psnOf(got[1]!.payload), 2, 'heard a zero-checksum datagram');

  // The ICRC covers the source address, which the receive path keeps as key words per peer: an
  // ICRC computed for another address is dropped, and the good datagrams around it, from two peers
  // in turn, are heard; on the `dgram` path too.
  for (const [rx, first] of [[b, 2], [await open('::1', { batchIo: false }), 0]] as const) {
    const heardHere = rx === b ? got : recorder(rx);
    rxeLike.send(datagram({ address: '::2', port: from.port }, rx.local, 5), rx.local.port, '::1');
    rxeLike.send(datagram(from, rx.local, 6), rx.local.port, '::1');
    await until(() => heardHere.length === first + 1, 2000, 'the good datagram after the bad one');
    // One at a time: two senders' datagrams keep no order between them.
    a.send(rx.local, 0xc001, sendOnly(7, new Uint8Array(32).fill(1)));
    await until(() => heardHere.length === first + 2, 2000, 'the other peer');
    rxeLike.send(datagram(from, rx.local, 8), rx.local.port, '::1');
    await until(() => heardHere.length === first + 3, 2000, 'the first peer again');
    a.send(rx.local, 0xc001, sendOnly(9, new Uint8Array(32).fill(1)));
    await until(() => heardHere.length === first + 4, 2000, 'the other peer again');
    t.same(heardHere.slice(first).map((g) => psnOf(g.payload)), [6, 7, 8, 9]);
    t.same(heardHere.slice(first).map((g) => g.meta.icrc), ['ok', 'ok', 'ok', 'ok']);
    t.equal(rx.drops.badIcrc, 1, 'the ICRC computed for ::2');
  }

  // Control: a plain udp6 socket never hears it (the kernel drops it), only the next normal one.
  const deaf = await plainSocket('::1');
  t.teardown(() => closeSocket(deaf));
  const heard: number[] = [];
  deaf.on('message', (m) => heard.push(psnOf(m)));
  const to = { address: '::1', port: deaf.address().port };
  rxeLike.send(datagram(from, to, 3), to.port, '::1');
  a.send(to, 0, sendOnly(4, new Uint8Array(4)));
  await until(() => heard.length > 0, 2000, 'the normal datagram');
  await settle(20);
  t.same(heard, [4], 'without UDP_NO_CHECK6_RX the zero-checksum datagram is lost');
});

t.test("per-flow source ports: the receiver sees rxe-style ports, ICRCs valid", async (t) => {
  // No GSO trains: a strict receiver on a UDP socket assumes ID 0 for every datagram.
  const a = await open('127.0.0.1', { sourcePorts: 'per-flow', maxFlowSockets: 2, gso: false });
  const b = await open('127.0.0.1', { icrcVerify: 'strict' });
  // Picked while both links hold their ports: a port freed before `a` bound could come back as
  // a's own port, and a datagram asking for the bound port is no fallback.
  const [p1, p2, p3] = await freePorts('127.0.0.1', 3);
  t.notOk([p1, p2, p3].some((p) => p === a.local.port || p === b.local.port), 'flow ports are not the links\' ports');
  const got = recorder(b);
  a.send(b.local, p1!, sendOnly(1, new Uint8Array(4)));
  a.send(b.local, p2!, sendOnly(2, new Uint8Array(4)));
  a.send(b.local, p1!, sendOnly(3, new Uint8Array(4)));
  a.send(b.local, p3!, sendOnly(4, new Uint8Array(4))); // over the cap: bound port
  a.send(b.local, a.local.port, sendOnly(5, new Uint8Array(4)));
  await until(() => got.length === 5, 2000, '5 datagrams');
  const byPsn = new Map(got.map((r) => [psnOf(r.payload), r.meta]));
  t.equal(byPsn.get(1)?.src.port, p1);
  t.equal(byPsn.get(2)?.src.port, p2);
  t.equal(byPsn.get(3)?.src.port, p1);
  t.equal(byPsn.get(4)?.src.port, a.local.port, 'beyond the cap: the bound port');
  t.equal(byPsn.get(5)?.src.port, a.local.port);
  t.ok(got.every((r) => r.meta.icrc === 'ok'), 'every ICRC computed for the port actually used');
  t.equal(a.counters.flowSockets, 2);
  t.equal(a.counters.flowFallbacks, 1);
  t.equal(a.counters.flowOptionFailures, 0);
  t.equal(b.drops.badIcrc, 0);
});

t.test('per-flow: a port that cannot be bound falls back to the bound port, nothing lost', async (t) => {
  const a = await open('127.0.0.1', { sourcePorts: 'per-flow', gso: false });
  const b = await open('127.0.0.1', { icrcVerify: 'strict' });
  const got = recorder(b);
  const taken = b.local.port; // bound by b
  // The sockets resolve literals synchronously, so the bind fails inside the first send and that
  // very datagram already leaves from the bound port.
  a.send(b.local, taken, sendOnly(1, new Uint8Array(4)));
  a.send(b.local, taken, sendOnly(2, new Uint8Array(4)));
  await until(() => got.length === 2);
  t.same(got.map((r) => psnOf(r.payload)).sort(), [1, 2]);
  t.ok(got.every((r) => r.meta.src.port === a.local.port), 'sent from the bound port');
  t.ok(got.every((r) => r.meta.icrc === 'ok'), 'ICRC computed for the port actually used');
  t.equal(a.drops.sendError, 0);
  t.equal(a.counters.flowSockets, 1);
  t.equal(a.counters.flowFallbacks, 2);
});

t.test('send errors and close', async (t) => {
  const a = await UdpLink.open({ address: '127.0.0.1', port: 0, warn });
  const b = await open('127.0.0.1');
  a.send({ address: '::1', port: 4791 }, 0, sendOnly(1, new Uint8Array(4)));
  a.send({ address: 'nonsense', port: 4791 }, 0, sendOnly(1, new Uint8Array(4)));
  a.send(b.local, 0, sendOnly(1, new Uint8Array(70000)));
  a.send(b.local, 0, [new Uint8Array(3)]);
  t.equal(a.drops.sendError, 4, 'wrong family, bad address, too long, too short');
  const port = a.local.port;
  await a.close();
  a.send(b.local, 0, sendOnly(1, new Uint8Array(4)));
  t.equal(a.drops.closed, 1, 'sends after close are counted');
  await a.close(); // idempotent
  const again = await open('127.0.0.1', { port });
  t.equal(again.local.port, port, 'the port is free again');
  await t.rejects(UdpLink.open({ address: '127.0.0.1', port, warn }), { code: 'EADDRINUSE' }, 'a taken port fails open');
  await t.rejects(UdpLink.open({ address: 'localhost', port: 0, warn }), RangeError, 'a host name is not an address');
});

t.test('send paths: a burst from reused header memory arrives intact, ICRC strict: dgram ring, dgram scatter, batched', async (t) => {
  const paths = [
    { name: 'dgram ring', opts: { batchIo: false, sendMode: 'ring' as const } },
    { name: 'dgram scatter', opts: { batchIo: false, sendMode: 'scatter' as const } },
    // No GSO trains: the strict receiver below assumes ID 0 for every datagram.
    { name: 'batched', opts: { gso: false } },
  ];
  for (const { name: sendMode, opts } of paths) {
    const a = await open('127.0.0.1', opts);
    const b = await open('127.0.0.1', { icrcVerify: 'strict' });
    const got = recorder(b);
    const rng = new Xorshift32(7);
    const mem = new Uint8Array(64 * 1024);
    for (let i = 0; i < mem.length; i++) mem[i] = rng.next() & 0xff;
    // Sizes below and above the scatter copy threshold, odd ones with a pad part; the header parts
    // come from one reused array, as the engines' header builders do.
    const sizes = [0, 1, 7, 300, 511, 512, 1021, 4096];
    const n = 120;
    for (let i = 0; i < n; i++) {
      const size = sizes[i % sizes.length]!;
      const at = (i * 997) % (mem.length - size);
      const parts = sendOnly(i, mem.subarray(at, at + size));
      a.send(b.local, a.local.port, parts);
      parts[0]!.fill(0xee); // the caller reuses its header memory at once
    }
    await until(() => got.length === n, 5000, `${n} datagrams (${sendMode})`);
    let intact = 0;
    for (const r of got) {
      const i = psnOf(r.payload);
      const size = sizes[i % sizes.length]!;
      const at = (i * 997) % (mem.length - size);
      const body = r.payload.subarray(12, 12 + size);
      if (r.meta.icrc === 'ok' && Buffer.compare(Buffer.from(body), Buffer.from(mem.subarray(at, at + size))) === 0) intact++;
    }
    t.equal(intact, n, `${sendMode}: every datagram intact with a strict ICRC`);
    t.equal(b.drops.badIcrc, 0);
    await a.close();
    await b.close();
  }
});

// Both ways of making the two system calls (UdpLinkOptions.calls): the addon's and koffi's.
for (const calls of ['addon', 'koffi'] as const) t.test(`batched path, GSO trains (${calls}'s sendmmsg and recvmmsg): a burst of equal-size datagrams arrives intact and in order, segment k with IPv4 ID k`, async (t) => {
  const a = await open('127.0.0.1', { calls });
  const b = await open('127.0.0.1', { calls }); // recover: the receiver cannot see the IDs, the ICRC tells them
  t.equal(a.startup.calls, calls, 'the sender makes the calls asked for');
  t.equal(b.startup.calls, calls, 'the receiver too');
  const got = recorder(b);
  const rng = new Xorshift32(11);
  const n = 40; // trains of up to 15 at 4112 bytes (64 KiB each), then a short tail
  const bodies: Uint8Array[] = [];
  for (let i = 0; i < n; i++) {
    const body = new Uint8Array(i === n - 1 ? 100 : 4096);
    for (let j = 0; j < body.length; j++) body[j] = rng.next() & 0xff;
    bodies.push(body);
    a.send(b.local, a.local.port, sendOnly(i, body));
  }
  await until(() => got.length === n, 5000, `${n} datagrams`);
  t.same(got.map((r) => psnOf(r.payload)), [...Array(n).keys()], 'in send order');
  t.ok(got.every((r, i) => Buffer.compare(Buffer.from(r.payload.subarray(12, 12 + bodies[i]!.length)), Buffer.from(bodies[i]!)) === 0), 'every body intact');
  const ids = got.map((r) => r.meta.ipId ?? 0);
  t.ok(ids.some((id) => id > 0), `some datagrams left inside a train (IDs ${ids.join(',')})`);
  // Each ID is its index in its train: 0 where a train starts, then one more per datagram.
  t.ok(ids.every((id, i) => id === 0 || id === ids[i - 1]! + 1), 'IDs count up within each train');
  t.equal(b.drops.badIcrc, 0);
  t.equal(a.counters.sent, n);
});

t.test('batched path, UDP_GRO: trains arrive whole and are cut into their datagrams, in order, intact, as without GRO', async (t) => {
  const a = await open('127.0.0.1');
  const withGro = await open('127.0.0.1');
  const without = await open('127.0.0.1', { gro: false });
  t.equal(withGro.startup.gro, true, 'UDP_GRO set on loopback by default');
  t.equal(without.startup.gro, false);
  const strict = await open('127.0.0.1', { icrcVerify: 'strict' });
  t.equal(strict.startup.gro, false, 'not with strict IPv4 checks');
  const rng = new Xorshift32(12);
  // ACK-sized, MTU-sized and odd sizes, runs of each (trains, the last one short), all to both receivers.
  const sizes: number[] = [];
  for (let i = 0; i < 70; i++) sizes.push(8); // 20-byte datagrams: over the 64-segment limit
  for (let i = 0; i < 20; i++) sizes.push(4096);
  sizes.push(100, 1000, 1000, 1000, 996, 4096);
  const bodies = sizes.map((n) => {
    const b = new Uint8Array(n);
    for (let j = 0; j < n; j++) b[j] = rng.next() & 0xff;
    return b;
  });
  for (const to of [withGro, without]) {
    const got = recorder(to);
    bodies.forEach((body, i) => a.send(to.local, a.local.port, sendOnly(i, body)));
    await until(() => got.length === bodies.length, 5000, `${bodies.length} datagrams`);
    t.same(got.map((r) => psnOf(r.payload)), [...bodies.keys()], 'in send order');
    t.ok(got.every((r, i) => r.payload.length === 12 + bodies[i]!.length + 4 &&
      Buffer.compare(Buffer.from(r.payload.subarray(12, 12 + bodies[i]!.length)), Buffer.from(bodies[i]!)) === 0), 'every datagram intact, of its own length');
    t.equal(to.drops.badIcrc, 0);
    t.equal(to.counters.received, bodies.length);
    // Segment k of a train left with IPv4 ID k. Read whole, the train tells k, and the check's
    // first guess is right ('ok'); cut by the kernel, each datagram is checked for ID 0 first and
    // the IDs past it are recovered.
    const ids = got.map((r) => r.meta.ipId);
    t.ok(ids.some((id) => id !== undefined && id > 0), 'some datagrams left inside a train');
    const want = got.map((r) => (to === withGro || r.meta.ipId === 0 ? 'ok' : 'ok-recovered'));
    t.same(got.map((r) => r.meta.icrc), want, to === withGro ? 'every ID known from the train' : 'IDs past 0 recovered');
  }
  t.ok(withGro.counters.groTrains >= 3, `trains read whole (${withGro.counters.groTrains})`);
  t.equal(without.counters.groTrains, 0);
});

t.test('batched path: a batch\'s ICRCs are checked with it, not where a receive hook may change the bytes first', async (t) => {
  const a = await open('127.0.0.1');
  const b = await open('127.0.0.1');
  const got = recorder(b);
  const perBatch = icrcImplementation === 'addon' ? 1 : 0; // without the addon each is checked in JavaScript
  const probe = b.counters.batchChecked; // the start-up probe's datagram, where it came through the ring
  const burst = async (from: number, n: number, what: string): Promise<void> => {
    for (let i = from; i < from + n; i++) a.send(b.local, a.local.port, sendOnly(i, new Uint8Array(i % 3 === 0 ? 1000 : 64)));
    await until(() => got.length + b.drops.badIcrc === from + n, 5000, what);
  };
  await burst(0, 40, '40 datagrams');
  t.equal(b.counters.batchChecked - probe, 40 * perBatch, `checked with their batch (${icrcImplementation})`);
  t.ok(got.every((r) => r.meta.icrc === 'ok'), 'each ok, its ID known from its train');
  // A hook that flips a covered bit and passes the datagram on: the check must see the flipped bytes.
  b.setRxHook((d, _src, accept) => {
    d[20] = d[20]! ^ 0x01;
    accept(d);
  });
  await burst(40, 10, 'ten through the hook');
  t.equal(b.drops.badIcrc, 10, 'every flipped datagram dropped');
  t.equal(got.length, 40, 'none delivered');
  t.equal(b.counters.batchChecked - probe, 40 * perBatch, 'none checked ahead of the hook');
  b.setRxHook(undefined);
  await burst(50, 10, 'ten more');
  t.equal(got.length, 50);
  t.equal(b.counters.batchChecked - probe, 50 * perBatch, 'checked with their batch again');
});

t.test('batched path: a batch of trains, good and bad, is judged a chunk at a time, each verdict with its own datagram', async (t) => {
  const a = await open('127.0.0.1');
  const c = await open('127.0.0.1', { icrcGenerate: false }); // its datagrams carry ICRC 0: bad
  const b = await open('127.0.0.1');
  const got = recorder(b);
  const probe = b.counters.batchChecked;
  const perBatch = icrcImplementation === 'addon' ? 1 : 0;
  // Trains of several sizes from both senders, all sent in one stretch so that the receiver reads
  // them as one batch of messages (or a few), longer than a chunk: 40 and 50 segments, and shorter
  // trains that a chunk groups with the next message.
  const good: number[] = [];
  const plan: [UdpLink, number, number][] = [[a, 40, 1000], [c, 20, 500], [a, 10, 64], [c, 5, 200], [a, 50, 64], [c, 3, 300], [a, 7, 600], [c, 33, 100]];
  let psn = 0;
  let bad = 0;
  for (const [from, n, size] of plan) {
    for (let i = 0; i < n; i++, psn++) {
      if (from === a) {
        a.send(b.local, a.local.port, sendOnly(psn, new Uint8Array(size).fill(psn & 0xff)));
        good.push(psn);
      } else {
        c.send(b.local, c.local.port, [...sendOnly(psn, new Uint8Array(size)), new Uint8Array(4)]);
        bad++;
      }
    }
  }
  await until(() => got.length + b.drops.badIcrc === psn, 5000, `${psn} datagrams`);
  t.equal(b.drops.badIcrc, bad, `each of the ${bad} bad datagrams dropped`);
  t.same(got.map((r) => psnOf(r.payload)).sort((x, y) => x - y), good, `each of the ${good.length} good ones delivered`);
  t.ok(got.every((r) => r.meta.icrc === 'ok' && r.payload[12] === (psnOf(r.payload) & 0xff)), 'each ok, with its own bytes');
  t.equal(b.counters.batchChecked - probe, psn * perBatch, `all judged with their batch (${icrcImplementation})`);
  t.ok(b.counters.groTrains > 1, `read as trains (${b.counters.groTrains})`);
});

t.test('batched path: the receive-batch hook (where the device answers) runs after at most 32 datagrams', async (t) => {
  const a = await open('127.0.0.1', { gso: false });
  const b = await open('127.0.0.1');
  const got = recorder(b);
  let calls = 0;
  const seenAtCall: number[] = [];
  b.onReceiveBatchEnd(() => {
    calls++;
    seenAtCall.push(got.length);
  });
  const n = 200;
  for (let i = 0; i < n; i++) a.send(b.local, a.local.port, sendOnly(i, new Uint8Array(64)));
  await until(() => got.length === n, 5000, `${n} datagrams`);
  t.ok(calls >= Math.ceil(n / 32), `${calls} calls for ${n} datagrams`);
  const gaps = seenAtCall.map((x, i) => x - (seenAtCall[i - 1] ?? 0));
  t.ok(gaps.every((g) => g <= 32), `at most 32 datagrams between calls (${gaps.join(',')})`);
});

t.test("batched path: a batch's hook runs after the promise reactions of what the batch delivered", async (t) => {
  // What the application does in answer to a completion runs in a promise reaction; the device's
  // answer to the batch (ACKs, the responses) must come after it so that both leave together.
  const a = await open('127.0.0.1', { gso: false });
  const b = await open('127.0.0.1');
  let received = 0;
  let reacted = 0;
  const atHook: { reacted: number; received: number }[] = [];
  b.onReceive(() => {
    received++;
    void Promise.resolve().then(() => reacted++);
  });
  b.onReceiveBatchEnd(() => atHook.push({ reacted, received }));
  const rounds = 6;
  for (let i = 0; i < rounds; i++) {
    a.send(b.local, a.local.port, sendOnly(i, new Uint8Array(32)));
    await until(() => atHook.length > 0 && received === i + 1, 2000, `datagram ${i}`);
    await settle();
  }
  t.equal(received, rounds);
  const seen = atHook.map((h) => `${h.reacted}/${h.received}`).join(' ');
  t.ok(atHook.every((h) => h.reacted === h.received), `every reaction ran before its batch's hook (reacted/received at each hook: ${seen})`);
});

t.test('batched path: a datagram longer than any RoCEv2 packet is not RoCE, with GRO slots or without', async (t) => {
  for (const gro of [true, false]) {
    const b = await open('127.0.0.1', { gro });
    const s = await plainSocket('127.0.0.1');
    t.teardown(() => closeSocket(s));
    s.send(new Uint8Array(20000), b.local.port, '127.0.0.1'); // zeros: a valid BTH version, no valid ICRC
    const good = datagram(s.address() as { address: string; port: number }, b.local, 78);
    s.send(good, b.local.port, '127.0.0.1');
    const got = recorder(b);
    await until(() => got.length === 1, 2000, 'the valid datagram');
    t.equal(b.drops.notRoce, 1, `gro ${gro}: counted as not RoCE`);
    t.equal(b.drops.badIcrc, 0);
  }
});

t.test('batched path: a handler that throws loses nothing: the rest of its recvmmsg batch is delivered, then the exception is thrown', async (t) => {
  // In a child process: the exception comes out of the socket's readable callback, an uncaught one.
  const { code, out } = await runChild(new URL('./batch-throw-process.js', import.meta.url));
  t.equal(code, 0, 'the child exits normally');
  const r = JSON.parse(out) as { psns: number[]; uncaught: string[]; watch: string; received: number };
  t.not(r.watch, 'dgram', `read by recvmmsg (watch: ${r.watch})`);
  t.same(r.psns, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9], 'every datagram reached the handler, in order');
  t.same(r.uncaught, ['handler bug'], 'and the exception was thrown once');
});

t.test('batched path: the receiver reads with recvmmsg, survives garbage and over-long datagrams', async (t) => {
  const b = await open('127.0.0.1');
  const got = recorder(b);
  const s = await plainSocket('127.0.0.1');
  t.teardown(() => closeSocket(s));
  const rng = new Xorshift32(3);
  for (let i = 0; i < 200; i++) {
    const g = new Uint8Array(rng.next() % 2000);
    for (let j = 0; j < g.length; j++) g[j] = rng.next() & 0xff;
    s.send(g, b.local.port, '127.0.0.1');
  }
  s.send(new Uint8Array(20000), b.local.port, '127.0.0.1'); // longer than any RoCEv2 packet: truncated
  const good = datagram(s.address() as { address: string; port: number }, b.local, 77);
  s.send(good, b.local.port, '127.0.0.1');
  await until(() => got.length === 1, 2000, 'the valid datagram');
  t.equal(psnOf(got[0]!.payload), 77);
  const d = b.drops;
  t.equal(d.tooShort + d.notRoce + d.badIcrc, 201, `201 dropped and counted (${JSON.stringify(d)})`);
});

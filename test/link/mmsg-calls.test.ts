/**
 * The batched link's two system calls as the addon makes them (`src/native/mmsg.c`) and as
 * `mmsgCalls` hands them to `mmsg.ts`: on real loopback sockets, a datagram laid out in a message
 * vector goes out with `sendmmsg` and comes back with `recvmmsg`, byte for byte, with its source; a
 * failure is -errno from the addon and -1 with that errno through `mmsgCalls`, as koffi's libc calls
 * report it; bad arguments are a TypeError or RangeError, never a call with them.
 */
import dgram from 'node:dgram';
import t, { type Test } from 'tap';
import { batchIoFfi, mmsgCalls, socketFd, stopDgramReading, type BatchIoFfi } from '../../src/link/sockopt.js';
import { addonMissing, icrcAddon } from '../../src/wire/addon.js';

const EAGAIN = 11;
const EBADF = 9;
const MSG_DONTWAIT = 0x40;

const addon = icrcAddon;
t.ok(addon?.sendmmsg !== undefined && addon.recvmmsg !== undefined, `the addon has sendmmsg and recvmmsg (${addonMissing ?? 'loaded'}); npm run build:addon builds it`);
const ffi = batchIoFfi();
t.ok(ffi, 'the FFI loads');

/** A bound receiver read through a duplicate descriptor (as UdpLink reads), and a sender's descriptor. */
async function pair(t: Test): Promise<{ rxFd: number; txFd: number; rxPort: number; txPort: number }> {
  const rx = dgram.createSocket('udp4');
  const tx = dgram.createSocket('udp4');
  await Promise.all([new Promise<void>((r) => rx.bind(0, '127.0.0.1', r)), new Promise<void>((r) => tx.bind(0, '127.0.0.1', r))]);
  const rxFd = ffi!.dup(socketFd(rx)!);
  t.ok(rxFd >= 0 && stopDgramReading(rx), 'a duplicate descriptor reads the receiver');
  t.teardown(() => {
    ffi!.close(rxFd);
    rx.close();
    tx.close();
  });
  return { rxFd, txFd: socketFd(tx)!, rxPort: rx.address().port, txPort: tx.address().port };
}

/**
 * One `struct mmsghdr` (Linux LP64: msg_name at 0, msg_namelen at 8, msg_iov at 16, msg_iovlen at
 * 24, msg_len at 56) pointing at a sockaddr_in and one iovec in the same memory, and the data.
 */
function vector(calls: BatchIoFfi): { vec: Uint8Array; data: Uint8Array; name: DataView; setName: (port: number) => void } {
  const mem = calls.alloc(64 + 16 + 16 + 256);
  const base = mem.address;
  const dv = new DataView(mem.view);
  dv.setBigUint64(0, base + 64n, true); // msg_name → sockaddr_in
  dv.setUint32(8, 16, true);
  dv.setBigUint64(16, base + 80n, true); // msg_iov → one iovec
  dv.setBigUint64(24, 1n, true);
  dv.setBigUint64(80, base + 96n, true); // iov_base → the data
  dv.setBigUint64(88, 256n, true);
  const setName = (port: number): void => {
    dv.setUint16(64, 2, true); // AF_INET
    dv.setUint16(66, port, false);
    dv.setUint32(68, 0x7f000001, false);
    dv.setUint32(8, 16, true);
  };
  return { vec: new Uint8Array(mem.view, 0, 64), data: new Uint8Array(mem.view, 96, 256), name: new DataView(mem.view, 64, 16), setName };
}

for (const which of ['addon', 'koffi'] as const) {
  t.test(`${which}: a datagram goes out with sendmmsg and comes back whole with recvmmsg, with its source`, async (t) => {
    const calls = batchIoFfi(which)!;
    t.equal(calls.calls, which);
    const { rxFd, txFd, rxPort, txPort } = await pair(t);
    const out = vector(calls);
    for (let i = 0; i < 100; i++) out.data[i] = (i * 37 + 5) & 0xff;
    out.setName(rxPort);
    new DataView(out.vec.buffer).setBigUint64(88, 100n, true); // iov_len: 100 bytes
    t.equal(calls.sendmmsg(txFd, out.vec, 1, MSG_DONTWAIT), 1, 'one message sent');
    const back = vector(calls);
    let r = -1;
    for (let tries = 0; tries < 200 && r <= 0; tries++) {
      r = calls.recvmmsg(rxFd, back.vec, 1, MSG_DONTWAIT, null);
      if (r <= 0) await new Promise((resolve) => setTimeout(resolve, 5));
    }
    t.equal(r, 1, 'one message read');
    t.equal(new DataView(back.vec.buffer).getUint32(56, true), 100, 'msg_len: its 100 bytes');
    t.same([...back.data.subarray(0, 100)], [...out.data.subarray(0, 100)], 'byte for byte');
    t.equal(back.name.getUint16(2, false), txPort, "the sender's port");
    t.equal(back.name.getUint32(4, false), 0x7f000001, "the sender's address");
    t.equal(calls.recvmmsg(rxFd, back.vec, 1, MSG_DONTWAIT, null), -1, 'then nothing left to read: -1');
    t.equal(calls.errno(), EAGAIN, 'with EAGAIN');
    t.equal(calls.recvmmsg(1 << 20, back.vec, 1, MSG_DONTWAIT, null), -1, 'a descriptor that is not open: -1');
    t.equal(calls.errno(), EBADF, 'with EBADF');
  });
}

t.test('the addon: -errno rather than -1, and arguments checked before any call', async (t) => {
  const a = addon!;
  const { rxFd } = await pair(t);
  const v = vector(ffi!);
  t.equal(a.recvmmsg!(rxFd, v.vec, 1, MSG_DONTWAIT), -EAGAIN, 'an empty socket: -EAGAIN');
  t.equal(a.sendmmsg!(1 << 20, v.vec, 1, MSG_DONTWAIT), -EBADF, 'a descriptor that is not open: -EBADF');
  t.equal(a.recvmmsg!(rxFd, v.vec, 0, MSG_DONTWAIT), 0, 'no messages asked for: 0');
  const call = a.recvmmsg! as (...args: unknown[]) => number;
  t.throws(() => call(rxFd, new Uint16Array(32), 1, MSG_DONTWAIT), TypeError, 'a vector that is not a Uint8Array');
  t.throws(() => call(rxFd, v.vec, 1), TypeError, 'flags missing');
  t.throws(() => call('3', v.vec, 1, MSG_DONTWAIT), TypeError, 'a descriptor that is not a number');
  t.throws(() => call(rxFd, v.vec, 2, MSG_DONTWAIT), RangeError, 'more messages than the vector holds');
  t.throws(() => call(rxFd, v.vec, -1, MSG_DONTWAIT), RangeError, 'a negative count');
  t.throws(() => call(-1, v.vec, 1, MSG_DONTWAIT), RangeError, 'a negative descriptor');
  t.throws(() => call(rxFd, new Uint8Array(v.vec.buffer, 4, 60), 0, MSG_DONTWAIT), RangeError, 'a vector that is not 8-aligned');
});

t.test('mmsgCalls: the addon\'s where it has both calls, the given ones otherwise', (t) => {
  const given = { sendmmsg: (): number => -1, recvmmsg: (): number => -1, errno: (): number => 42 };
  const none = mmsgCalls(given.sendmmsg, given.recvmmsg, given.errno, undefined);
  t.equal(none.calls, 'koffi');
  t.equal(none.sendmmsg, given.sendmmsg, 'no addon: the given sendmmsg');
  t.equal(none.errno(), 42, 'and the given errno');
  const half = mmsgCalls(given.sendmmsg, given.recvmmsg, given.errno, { sendmmsg: () => 0 });
  t.equal(half.calls, 'koffi', 'an addon with one of the two: the given ones');
  let seen: unknown[] = [];
  const fake = {
    sendmmsg: (...args: unknown[]): number => ((seen = args), -EBADF),
    recvmmsg: (): number => 3,
  };
  const both = mmsgCalls(given.sendmmsg, given.recvmmsg, given.errno, fake);
  t.equal(both.calls, 'addon');
  const vec = new Uint8Array(64);
  t.equal(both.sendmmsg(7, vec, 1, MSG_DONTWAIT), -1, '-errno from the addon is -1');
  t.same(seen, [7, vec, 1, MSG_DONTWAIT], 'the arguments passed through');
  t.equal(both.errno(), EBADF, 'and errno is what it said');
  t.equal(both.recvmmsg(7, vec, 1, MSG_DONTWAIT, null), 3, 'a count is the count');
  t.equal(both.errno(), EBADF, 'errno unchanged by a call that succeeded');
  t.end();
});

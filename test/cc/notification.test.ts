/** The notification point's CNP pacing, per sending QP. */

import t from 'tap';
import { NotificationPoint, isCongestionMarked } from '../../src/cc/notification.js';
import { createNotificationPoint } from '../../src/cc/controller.js';
import { setBthFecn } from '../../src/wire/bth.js';

t.test('at most one CNP per interval per QP, counted from the last CNP sent', async (t) => {
  const np = new NotificationPoint({ minTimeBetweenCnpsUs: 50 });
  t.equal(np.onMarkedPacket(0, 0x11), true, 'the first mark answers at once');
  t.equal(np.onMarkedPacket(10, 0x11), false);
  t.equal(np.onMarkedPacket(49.9, 0x11), false);
  t.equal(np.onMarkedPacket(10, 0x22), true, 'another QP has its own interval');
  t.equal(np.onMarkedPacket(50, 0x11), true, '50 µs after the last CNP');
  t.equal(np.onMarkedPacket(99, 0x11), false, 'the interval restarts at the CNP, not at the first mark');
  t.equal(np.onMarkedPacket(100, 0x11), true);
  t.same(np.counters, { marked: 7, cnps: 4, suppressed: 3 });
  t.equal(np.onPacket(200, 0x11, false), false, 'unmarked packets never produce a CNP');
  t.equal(np.onPacket(200, 0x11, true), true);
  np.forget(0x11);
  t.equal(np.onMarkedPacket(201, 0x11), true, 'a forgotten QP starts afresh');
});

t.test('interval 0 answers every mark; profiles choose 50 µs (paper) and 4 µs (ConnectX)', async (t) => {
  const np = new NotificationPoint({ minTimeBetweenCnpsUs: 0 });
  t.equal(np.onMarkedPacket(1, 1), true);
  t.equal(np.onMarkedPacket(1, 1), true);
  t.equal(createNotificationPoint('paper').minTimeBetweenCnpsUs, 50);
  const cx = createNotificationPoint('cx');
  t.equal(cx.minTimeBetweenCnpsUs, 4);
  t.equal(cx.onMarkedPacket(0, 7), true);
  t.equal(cx.onMarkedPacket(3.99, 7), false);
  t.equal(cx.onMarkedPacket(4, 7), true);
  t.throws(() => new NotificationPoint({ minTimeBetweenCnpsUs: -1 }));
});

t.test('a packet is marked by IP CE or by BTH FECN', async (t) => {
  const pkt = new Uint8Array(12 + 4);
  t.equal(isCongestionMarked(false, pkt), false);
  t.equal(isCongestionMarked(true, pkt), true);
  setBthFecn(pkt, 0, true);
  t.equal(isCongestionMarked(false, pkt), true);
  const shifted = new Uint8Array(30);
  setBthFecn(shifted, 10, true);
  t.equal(isCongestionMarked(false, shifted, 10), true);
  t.equal(isCongestionMarked(false, shifted, 0), false);
});

/**
 * What reports the batched link's socket readable (`ReadableWatch`, `mmsg.ts`), on real loopback
 * sockets: the addon's watch (`src/native/watch.c`) and koffi's poll behind two immediates. Both must
 * run the read's promise reactions before `answer`, and `answer`'s own microtasks (the send flush)
 * before the event loop goes on; the addon's reads in the poll phase, before the immediates queued
 * earlier, which is the hop it saves. Closing stops it, twice is harmless, and an exception thrown by
 * `read` is an uncaught exception like one thrown by any listener.
 */
import dgram from 'node:dgram';
import t, { type Test } from 'tap';
import { addonWatch, pollWatch, RxRing, type ReadableWatch } from '../../src/link/mmsg.js';
import { batchIoFfi, socketFd, stopDgramReading } from '../../src/link/sockopt.js';
import { addonMissing } from '../../src/wire/addon.js';
import { runChild } from '../helpers/child.js';

const ffi = batchIoFfi();

t.ok(ffi, 'the FFI loads');
t.ok(addonWatch, `the addon has its watch (${addonMissing ?? 'loaded'}); npm run build:addon builds it`);

/**
 * A bound socket whose reading is moved to a duplicate descriptor, as UdpLink does, and a sender. The
 * descriptor is the caller's to close (an RxRing closes its own).
 */
async function sockets(t: Test): Promise<{ fd: number; port: number; send: (n: number) => Promise<void> }> {
  const rx = dgram.createSocket('udp4');
  await new Promise<void>((resolve) => rx.bind(0, '127.0.0.1', resolve));
  const fd = ffi!.dup(socketFd(rx)!);
  t.ok(fd >= 0 && stopDgramReading(rx), 'a duplicate descriptor reads the socket');
  const tx = dgram.createSocket('udp4');
  t.teardown(() => {
    rx.close();
    tx.close();
  });
  const port = rx.address().port;
  const send = (n: number): Promise<void> =>
    new Promise((resolve, reject) => tx.send(new Uint8Array(n).fill(7), port, '127.0.0.1', (e) => (e ? reject(e) : resolve())));
  return { fd, port, send };
}

const watches: [string, () => ReadableWatch][] = [
  ['addon', () => addonWatch!],
  ['poll', () => pollWatch(ffi!)],
];

for (const [name, make] of watches) {
  t.test(`${name}: the read's reactions run before answer, answer's microtasks before the next turn`, async (t) => {
    const { fd, send } = await sockets(t);
    const log: string[] = [];
    let done: () => void = () => {};
    const finished = new Promise<void>((resolve) => (done = resolve));
    const watch = make();
    const logged: ReadableWatch = (f, read, answer) =>
      watch(f, () => { log.push('read'); read(); }, () => { log.push('answer'); answer(); });
    const ring = new RxRing(
      ffi!, fd, 4,
      (d) => {
        log.push(`deliver ${d.length}`);
        void Promise.resolve().then(() => log.push('reaction'));
        setImmediate(() => {
          log.push('next turn');
          done();
        });
      },
      () => {},
      (last) => {
        if (!last) return;
        log.push('after');
        queueMicrotask(() => log.push('flush'));
      },
      false, undefined, undefined, logged,
    );
    t.teardown(() => ring.close());
    // Sent from an immediate (the check phase): the next poll phase finds the datagram waiting, and
    // `marker`, queued now, runs in the check phase after it.
    await new Promise<void>((resolve) => setImmediate(() => {
      void send(40).then(() => {
        setImmediate(() => log.push('marker'));
        resolve();
      });
    }));
    await finished;
    const body = log.filter((x) => x !== 'marker');
    t.same(body, ['read', 'deliver 40', 'reaction', 'answer', 'after', 'flush', 'next turn'], 'in order');
    const readBeforeMarker = log.indexOf('read') < log.indexOf('marker');
    if (name === 'addon') t.ok(readBeforeMarker, `read in the poll phase, before an immediate queued earlier: ${log.join(', ')}`);
    else t.notOk(readBeforeMarker, `read in an immediate, after one queued earlier: ${log.join(', ')}`);
  });

  t.test(`${name}: closed, it reads nothing more; a second close does nothing`, async (t) => {
    const { fd, send } = await sockets(t);
    t.teardown(() => void ffi!.close(fd));
    let reads = 0;
    const w = make()(fd, () => reads++, () => {});
    // Level-triggered: a datagram left unread reports the socket readable on every turn.
    await send(10);
    await new Promise((r) => setTimeout(r, 20));
    t.ok(reads >= 1, `read called ${reads} times while open`);
    w.close();
    w.close();
    const before = reads;
    await send(10);
    await new Promise((r) => setTimeout(r, 20));
    t.equal(reads, before, 'no read after close');
  });
}

t.test('addon: a watch closed from inside read does not answer', async (t) => {
  const { fd, send } = await sockets(t);
  t.teardown(() => void ffi!.close(fd));
  let answers = 0;
  let reads = 0;
  const w: { close(): void } = addonWatch!(fd, () => {
    reads++;
    w.close();
  }, () => answers++);
  await send(10);
  await new Promise((r) => setTimeout(r, 20));
  t.equal(reads, 1, 'one read, then closed');
  t.equal(answers, 0, 'no answer after the close');
});

t.test('addon: bad arguments are a TypeError', async (t) => {
  t.throws(() => addonWatch!(-1, () => {}, () => {}), TypeError);
  t.throws(() => (addonWatch as unknown as (a: unknown, b: unknown, c: unknown) => unknown)(0, 'read', () => {}), TypeError);
});

t.test('addon: an exception thrown by read is an uncaught exception, and the process goes on', async (t) => {
  const { code, out } = await runChild(new URL('./watch-throw-process.js', import.meta.url));
  t.equal(code, 0, 'exits normally');
  t.match(out, /uncaught: read failed\nstill running\n/, out);
});

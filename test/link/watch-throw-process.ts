/**
 * Child of watch.test.ts: an addon watch whose `read` throws. Prints what the process's
 * `uncaughtException` handler saw, then that the event loop still runs, and exits 0.
 */
import dgram from 'node:dgram';
import { addonWatch } from '../../src/link/mmsg.js';
import { batchIoFfi, socketFd, stopDgramReading } from '../../src/link/sockopt.js';

const rx = dgram.createSocket('udp4');
await new Promise<void>((resolve) => rx.bind(0, '127.0.0.1', resolve));
const fd = batchIoFfi()!.dup(socketFd(rx)!);
stopDgramReading(rx);
const w = addonWatch!(fd, () => {
  throw new Error('read failed');
}, () => {
  console.log('answered after a throw');
});
process.once('uncaughtException', (e) => {
  console.log(`uncaught: ${e.message}`);
  w.close();
  setTimeout(() => {
    console.log('still running');
    rx.close();
    tx.close();
  }, 10);
});
const tx = dgram.createSocket('udp4');
tx.send(new Uint8Array(8), rx.address().port, '127.0.0.1');

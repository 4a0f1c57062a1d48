/**
 * Child of udp.test.ts: a batched-path UdpLink whose handler throws at the first of ten datagrams that
 * arrive together. Prints, as one JSON line, the PSNs the handler was given, the exceptions the
 * process's `uncaughtException` handler saw, and the link's receive path; exits 0.
 */
import { UdpLink } from '../../src/link/udp.js';
import { parseIpAddress } from '../../src/wire/frame.js';
import { icrcOfUdpPayload, writeIcrc } from '../../src/wire/icrc.js';
import { closeSocket, concat, plainSocket, psnOf, sendOnly } from './helpers.js';

const link = await UdpLink.open({ address: '127.0.0.1', port: 0, warn: () => {} });
const psns: number[] = [];
const uncaught: string[] = [];
link.onReceive((payload) => {
  const psn = psnOf(payload);
  psns.push(psn);
  if (psn === 0) throw new Error('handler bug');
});
process.on('uncaughtException', (e) => uncaught.push(e.message));

const s = await plainSocket('127.0.0.1');
const from = s.address();
const addr = parseIpAddress('127.0.0.1')!;
// All ten are sent before the event loop polls again: the receiver reads them in one recvmmsg.
for (let psn = 0; psn < 10; psn++) {
  const d = concat([...sendOnly(psn, new Uint8Array(8).fill(psn)), new Uint8Array(4)]);
  writeIcrc(d, icrcOfUdpPayload({ family: 4, srcAddr: addr, dstAddr: addr, srcPort: from.port, dstPort: link.local.port, ipId: 0 }, d));
  s.send(d, link.local.port, '127.0.0.1');
}
setTimeout(() => {
  console.log(JSON.stringify({ psns, uncaught, watch: link.startup.watch ?? 'dgram', received: link.counters.received }));
  void closeSocket(s);
  link.close();
}, 300);

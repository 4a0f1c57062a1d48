/** The socket-option FFI: loads, finds the fd without DEP0112, sets and reads back, reports errors. */

import t from 'tap';
import dgram from 'node:dgram';
import { once } from 'node:events';
import {
  ffiStatus,
  getsockoptInt,
  IP_MTU_DISCOVER,
  IP_PMTUDISC_DO,
  IPPROTO_IP,
  readSocketOption,
  setAndReadBack,
  setsockoptInt,
  SO_RCVBUF,
  SOL_SOCKET,
  socketFd,
} from '../../src/link/sockopt.js';

t.test('koffi + libc load, the fd is found without a deprecation warning', async (t) => {
  t.same(ffiStatus(), { ok: true });
  const warnings: string[] = [];
  const onWarning = (w: Error & { code?: string }): void => {
    warnings.push(`${w.code ?? ''} ${w.message}`);
  };
  process.on('warning', onWarning);
  t.teardown(() => process.off('warning', onWarning));
  const s = dgram.createSocket('udp4');
  t.equal(socketFd(s), undefined, 'no fd before bind');
  t.equal(readSocketOption(s, SOL_SOCKET, SO_RCVBUF).ok, false);
  s.bind(0, '127.0.0.1');
  await once(s, 'listening');
  const fd = socketFd(s);
  t.type(fd, 'number');
  t.same(setAndReadBack(s, IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO), { ok: true, value: IP_PMTUDISC_DO });
  t.same(setsockoptInt(fd!, SOL_SOCKET, SO_RCVBUF, 65536), { ok: true, value: undefined });
  t.same(getsockoptInt(fd!, SOL_SOCKET, SO_RCVBUF), { ok: true, value: 131072 }, 'Linux doubles SO_RCVBUF');
  await new Promise<void>((r) => s.close(() => r()));
  await new Promise((r) => setImmediate(r));
  t.same(warnings.filter((w) => w.includes('DEP0112')), [], 'no DEP0112');
});

t.test('errors are values', (t) => {
  const bad = setsockoptInt(1_000_000, IPPROTO_IP, IP_MTU_DISCOVER, 2);
  t.match(bad, { ok: false, code: 'ERR_SOCKOPT', errno: 9, message: /EBADF/ });
  t.match(getsockoptInt(-1, IPPROTO_IP, IP_MTU_DISCOVER), { ok: false, code: 'ERR_NO_FD' });
  t.end();
});

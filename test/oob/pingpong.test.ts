// The ibv_*_pingpong out-of-band exchange: codec, golden bytes from the rxe lab, both roles
// over 127.0.0.1, and the lines the tools print.
import t from 'tap';
import net from 'node:net';
import {
  OobError, PINGPONG_DONE, PINGPONG_MESSAGE_SIZE, formatPingpongAddress, formatPingpongMessage,
  gidToString, parsePingpongMessage, pingpongClientExchange, pingpongServerExchange, type PingpongDest,
} from '../../src/oob/pingpong.js';
import { cAltHex, cFixed } from '../../src/oob/common.js';

const v4gid = (last: number): Uint8Array => new Uint8Array([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, last]);
const hex = (b: Uint8Array): string => Buffer.from(b).toString('hex');

// Captured in the rxe lab (two guests, `ibv_rc_pingpong -d rxe0 -g 1 -n 1 -p 18600`, server
// 10.77.0.2, client 10.77.0.3; tshark -e tcp.payload of the TCP stream on port 18600):
const CLIENT_MSG = '303030303a3030303031313a6138646539373a303030303030303030303030303030303030303066666666306134643030303300';
const SERVER_MSG = '303030303a3030303031313a3665363034323a303030303030303030303030303030303030303066666666306134643030303200';
const DONE = '646f6e6500';
// Same lab, `ibv_ud_pingpong -d rxe0 -g 1 -n 1 -s 512 -p 18602`: the same form.
const UD_CLIENT_MSG = Buffer.from('0000:000013:f48b8a:00000000000000000000ffff0a4d0003\0', 'latin1');
// `ibv_rc_pingpong -d rxe0 -g 2` (IPv6 GID fd77::3):
const V6_CLIENT_MSG = Buffer.from('0000:000014:74079a:fd770000000000000000000000000003\0', 'latin1');

t.test('golden bytes from the lab', async (t) => {
  const client: PingpongDest = { lid: 0, qpn: 0x11, psn: 0xa8de97, gid: v4gid(3) };
  const server: PingpongDest = { lid: 0, qpn: 0x11, psn: 0x6e6042, gid: v4gid(2) };
  t.equal(hex(formatPingpongMessage(client)), CLIENT_MSG);
  t.equal(hex(formatPingpongMessage(server)), SERVER_MSG);
  t.equal(hex(PINGPONG_DONE), DONE);
  t.same(parsePingpongMessage(Buffer.from(SERVER_MSG, 'hex')), server);
  t.same(parsePingpongMessage(UD_CLIENT_MSG), { lid: 0, qpn: 0x13, psn: 0xf48b8a, gid: v4gid(3) });
  const v6 = parsePingpongMessage(V6_CLIENT_MSG);
  t.notOk(v6 instanceof OobError);
  if (!(v6 instanceof OobError)) t.equal(gidToString(v6.gid), 'fd77::3');
  t.equal(formatPingpongMessage(client).length, PINGPONG_MESSAGE_SIZE);
});

t.test('round trips', async (t) => {
  const cases: PingpongDest[] = [
    { lid: 0, qpn: 0, psn: 0, gid: new Uint8Array(16) },
    { lid: 0xffff, qpn: 0xffffff, psn: 0xffffff, gid: new Uint8Array(16).fill(0xff) },
    { lid: 0x1234, qpn: 0xabcdef, psn: 0x10203, gid: Uint8Array.from({ length: 16 }, (_, i) => i * 17) },
  ];
  for (const c of cases) t.same(parsePingpongMessage(formatPingpongMessage(c)), c);
  for (let i = 0; i < 200; i++) {
    const d: PingpongDest = {
      lid: Math.floor(Math.random() * 0x10000), qpn: Math.floor(Math.random() * 0x1000000),
      psn: Math.floor(Math.random() * 0x1000000), gid: Uint8Array.from({ length: 16 }, () => Math.floor(Math.random() * 256)),
    };
    const m = formatPingpongMessage(d);
    if (m.length !== 52) t.fail(`length ${m.length}`);
    t.same(parsePingpongMessage(m), d);
  }
  t.throws(() => formatPingpongMessage({ lid: 0x10000, qpn: 0, psn: 0, gid: new Uint8Array(16) }), RangeError);
  t.throws(() => formatPingpongMessage({ lid: 0, qpn: 0x1000000, psn: 0, gid: new Uint8Array(16) }), RangeError);
  t.throws(() => formatPingpongMessage({ lid: 0, qpn: 0, psn: -1, gid: new Uint8Array(16) }), RangeError);
  t.throws(() => formatPingpongMessage({ lid: 0, qpn: 0, psn: 0, gid: new Uint8Array(15) }), RangeError);
});

t.test('malformed messages give typed errors', async (t) => {
  const good = Buffer.from(CLIENT_MSG, 'hex');
  const bad: [string, Buffer][] = [
    ['short', good.subarray(0, 51)],
    ['long', Buffer.concat([good, Buffer.from([0])])],
    ['no NUL', Buffer.from(good.toString('latin1').replace('\0', '0'), 'latin1')],
    ['bad separator', Buffer.from(good.toString('latin1').replace(':', ';'), 'latin1')],
    ['non-hex', Buffer.from(good.toString('latin1').replace('a8de97', 'a8de9z'), 'latin1')],
    ['done instead', Buffer.concat([PINGPONG_DONE, Buffer.alloc(47)])],
    ['empty', Buffer.alloc(0)],
  ];
  for (const [name, b] of bad) {
    const r = parsePingpongMessage(b);
    t.ok(r instanceof OobError, name);
    if (r instanceof OobError) t.equal(r.code, 'ERR_OOB_MALFORMED', name);
  }
});

t.test('printed lines', async (t) => {
  const d: PingpongDest = { lid: 0, qpn: 0x11, psn: 0x6e6042, gid: v4gid(2) };
  t.equal(formatPingpongAddress('local', d), '  local address:  LID 0x0000, QPN 0x000011, PSN 0x6e6042, GID ::ffff:10.77.0.2');
  t.equal(formatPingpongAddress('remote', d), '  remote address: LID 0x0000, QPN 0x000011, PSN 0x6e6042, GID ::ffff:10.77.0.2');
  t.equal(formatPingpongAddress('local', d, 'ud'), '  local address:  LID 0x0000, QPN 0x000011, PSN 0x6e6042: GID ::ffff:10.77.0.2');
  t.equal(gidToString(new Uint8Array(16)), '::');
  t.equal(gidToString(Buffer.from('fe800000000000005054' + '00fffe770002', 'hex')), 'fe80::5054:ff:fe77:2');
  t.equal(gidToString(Buffer.from('20010db8000000010000000000000001', 'hex')), '2001:db8:0:1::1');
  t.equal(gidToString(Buffer.from('00000000000000000000000000000001', 'hex')), '::1');
  t.equal(gidToString(Buffer.from('00000000000000000000000001020304', 'hex')), '::1.2.3.4');
  t.equal(gidToString(Buffer.from('20010db8000000000001000000000000', 'hex')), '2001:db8:0:0:1::');
  t.equal(cFixed(0.125, 2), '0.12');
  t.equal(cFixed(0.375, 2), '0.38');
  t.equal(cFixed(2.5, 0), '2');
  t.equal(cFixed(1.005, 2), '1.00');
  t.equal(cFixed(12.3456, 2), '12.35');
  t.equal(cAltHex(0, 4), '0000');
  t.equal(cAltHex(0x15, 6), '0x0015');
  t.equal(cAltHex(0x5566dbb70000n, 16), '0x005566dbb70000');
});

const LOCAL_SERVER: PingpongDest = { lid: 0, qpn: 0x22, psn: 0x123456, gid: v4gid(1) };
const LOCAL_CLIENT: PingpongDest = { lid: 0, qpn: 0x11, psn: 0xabcdef, gid: v4gid(2) };

function listening(): Promise<{ port: number; sockets: Promise<net.Socket>; close: () => void }> {
  return new Promise((resolve) => {
    let give: (s: net.Socket) => void = () => undefined;
    const sockets = new Promise<net.Socket>((r) => { give = r; });
    const srv = net.createServer((s) => give(s));
    srv.listen(0, '127.0.0.1', () => resolve({ port: (srv.address() as net.AddressInfo).port, sockets, close: () => srv.close() }));
  });
}

t.test('both roles against each other on 127.0.0.1', async (t) => {
  let port = 0;
  let seen: PingpongDest | undefined;
  const server = pingpongServerExchange(0, LOCAL_SERVER, {
    host: '127.0.0.1',
    onListening: (a) => { port = a.port; },
    onRemote: (r) => { seen = r; },
  });
  while (port === 0) await new Promise((r) => setTimeout(r, 5));
  const c = await pingpongClientExchange('127.0.0.1', port, LOCAL_CLIENT);
  const s = await server;
  t.same(c.remote, LOCAL_SERVER);
  t.same(s.remote, LOCAL_CLIENT);
  t.same(seen, LOCAL_CLIENT);
  t.equal(c.peerPort, port);
});

t.test('the client retries until the server listens', async (t) => {
  const probe = net.createServer();
  await new Promise<void>((r) => probe.listen(0, '127.0.0.1', () => r()));
  const port = (probe.address() as net.AddressInfo).port;
  await new Promise<void>((r) => probe.close(() => r()));
  const client = pingpongClientExchange('127.0.0.1', port, LOCAL_CLIENT, { connectTimeoutMs: 5000, retryDelayMs: 50 });
  await new Promise((r) => setTimeout(r, 400));
  const s = await pingpongServerExchange(port, LOCAL_SERVER, { host: '127.0.0.1' });
  t.same((await client).remote, LOCAL_SERVER);
  t.same(s.remote, LOCAL_CLIENT);
});

t.test('no server: a bounded, clear error', async (t) => {
  const probe = net.createServer();
  await new Promise<void>((r) => probe.listen(0, '127.0.0.1', () => r()));
  const port = (probe.address() as net.AddressInfo).port;
  await new Promise<void>((r) => probe.close(() => r()));
  const t0 = Date.now();
  const err = await pingpongClientExchange('127.0.0.1', port, LOCAL_CLIENT, { connectTimeoutMs: 300 }).catch((e: unknown) => e);
  t.ok(err instanceof OobError);
  t.equal((err as OobError).code, 'ERR_OOB_CONNECT');
  t.match((err as OobError).message, new RegExp(`^no pingpong server at 127\\.0\\.0\\.1:${port} after 0\\.3 s`));
  t.ok(Date.now() - t0 < 2000);
});

t.test('byte sequence of the client, as the C server sees it', async (t) => {
  const l = await listening();
  const client = pingpongClientExchange('127.0.0.1', l.port, LOCAL_CLIENT);
  const s = await l.sockets;
  l.close();
  const got: Buffer[] = [];
  s.on('data', (d: Buffer) => {
    got.push(d);
    const all = Buffer.concat(got);
    if (all.length === 52) s.write(formatPingpongMessage(LOCAL_SERVER));
  });
  await new Promise((r) => s.on('close', r));
  await client;
  const all = Buffer.concat(got);
  t.equal(all.length, 57, 'our address then "done\\0", nothing else');
  t.same(all.subarray(0, 52), formatPingpongMessage(LOCAL_CLIENT));
  t.same(all.subarray(52), PINGPONG_DONE);
});

t.test('server: a garbage client, a silent client, a client that never says done', async (t) => {
  // garbage
  {
    let port = 0;
    const server = pingpongServerExchange(0, LOCAL_SERVER, { host: '127.0.0.1', onListening: (a) => { port = a.port; } });
    while (port === 0) await new Promise((r) => setTimeout(r, 5));
    const c = net.connect(port, '127.0.0.1');
    c.on('error', () => undefined);
    c.write(Buffer.alloc(52, 0x41));
    const err = await server.catch((e: unknown) => e);
    t.ok(err instanceof OobError);
    t.equal((err as OobError).code, 'ERR_OOB_MALFORMED');
    c.destroy();
  }
  // silent
  {
    let port = 0;
    const server = pingpongServerExchange(0, LOCAL_SERVER, { host: '127.0.0.1', readTimeoutMs: 200, onListening: (a) => { port = a.port; } });
    while (port === 0) await new Promise((r) => setTimeout(r, 5));
    const c = net.connect(port, '127.0.0.1');
    c.on('error', () => undefined);
    const err = await server.catch((e: unknown) => e);
    t.equal((err as OobError).code, 'ERR_OOB_TIMEOUT');
    t.match((err as OobError).message, /no address message from pingpong client 127\.0\.0\.1:\d+ after 0\.2 s/);
    c.destroy();
  }
  // closes instead of "done"
  {
    let port = 0;
    const server = pingpongServerExchange(0, LOCAL_SERVER, { host: '127.0.0.1', onListening: (a) => { port = a.port; } });
    while (port === 0) await new Promise((r) => setTimeout(r, 5));
    const c = net.connect(port, '127.0.0.1');
    c.on('error', () => undefined);
    c.write(formatPingpongMessage(LOCAL_CLIENT));
    c.on('data', () => c.end());
    const err = await server.catch((e: unknown) => e);
    t.equal((err as OobError).code, 'ERR_OOB_CLOSED');
  }
  // nobody connects
  {
    const err = await pingpongServerExchange(0, LOCAL_SERVER, { host: '127.0.0.1', acceptTimeoutMs: 150 }).catch((e: unknown) => e);
    t.equal((err as OobError).code, 'ERR_OOB_TIMEOUT');
  }
});

t.test('the client rejects a malformed reply', async (t) => {
  const l = await listening();
  const client = pingpongClientExchange('127.0.0.1', l.port, LOCAL_CLIENT).catch((e: unknown) => e);
  const s = await l.sockets;
  l.close();
  s.on('error', () => undefined);
  s.once('data', () => s.write(Buffer.from('0000:000011:zzzzzz:00000000000000000000ffff0a4d0002\0', 'latin1')));
  const err = await client;
  t.ok(err instanceof OobError);
  t.equal((err as OobError).code, 'ERR_OOB_MALFORMED');
  s.destroy();
});

// perftest 6.06's out-of-band exchange: codecs, golden bytes from the rxe lab, both roles over
// 127.0.0.1 for every verb, and the typed refusals of a peer that runs something else.
import t from 'tap';
import net from 'node:net';
import {
  OobError, PERFTEST_DONE, formatInt32, formatPerftestBwReport, formatPerftestKey, formatPerftestMtu,
  formatPerftestVersion, parsePerftestBwReport, parsePerftestKey, parsePerftestMtu, parsePerftestVersion,
  perftestClientExchange, perftestServerExchange, type PerftestBwReport, type PerftestKey, type PerftestVerb,
} from '../../src/oob/perftest.js';

const v4gid = (last: number): Uint8Array => new Uint8Array([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, last]);
const hex = (b: Uint8Array): string => Buffer.from(b).toString('hex');
const ascii = (s: string): Buffer => Buffer.from(s, 'latin1');

// Captured in the rxe lab, perftest 4.5+0.17 (6.06) in both guests, server 10.77.0.2, client
// 10.77.0.3: `ib_write_bw -d rxe0 -x 1 -n 5 -s 64 -p 18610`; tshark -e tcp.payload, in order
// (C = client → server, S = server → client):
const W = {
  version: '362e3036000000000000000000000000', // C and S: "6.06", NUL-padded to 16
  cycle: '00001000', // C and S: 4096
  line: '00000040', // C and S: 64
  mtu: '3300', // C and S: "3\0" (IBV_MTU_1024)
  clientKey: '0000:0001:000015:29baf0:00000692:000055fb36b1a000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:4d:00:03:00000000:\0',
  serverKey: '0000:0001:000015:4b839e:0000067b:00005566dbb70000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:4d:00:02:00000000:\0',
  // after 4 hand shakes: the client's report, field by field (the server answers each with 8
  // bytes of its own uninitialised struct)
  report: ['0000000000000040', '0000000000000005', '3fa2ccc05a368961', '3f93d25a75bb93c3', '3f34c8d85b99e90b'],
  done: '646f6e6500',
};
// `ib_read_bw … -p 18613`: out_reads 0x80 (rxe's max_qp_rd_atom).
const READ_CLIENT_KEY = '0000:0080:000018:eb5513:000009a9:00005603d3201000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:4d:00:03:00000000:\0';
// `ib_send_bw … -c UD -p 18615`: rkey 0 (rxe MR without remote access).
const SEND_UD_CLIENT_KEY = '0000:0001:00001a:59d132:00000000:000055b361bf2000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:4d:00:03:00000000:\0';
// `ib_write_bw -d rxe0 -x 2 …` (IPv6 GID fd77::3):
const V6_CLIENT_KEY = '0000:0001:000022:7f4078:00001374:00005641e362c000:fd:77:00:00:00:00:00:00:00:00:00:00:00:00:00:03:00000000:\0';
// `ib_send_bw -m 256 …`: the MTU field is "1\0".
const MTU256 = '3100';

t.test('golden bytes from the lab', async (t) => {
  t.equal(hex(formatPerftestVersion()), W.version);
  t.equal(hex(formatInt32(4096)), W.cycle);
  t.equal(hex(formatInt32(64)), W.line);
  t.equal(hex(formatPerftestMtu(3)), W.mtu);
  t.equal(hex(formatPerftestMtu(1)), MTU256);
  const client: PerftestKey = { lid: 0, outReads: 1, qpn: 0x15, psn: 0x29baf0, rkey: 0x692, vaddr: 0x55fb36b1a000n, gid: v4gid(3), srqn: 0 };
  t.equal(formatPerftestKey(client).toString('latin1'), W.clientKey);
  t.equal(formatPerftestKey(client).length, 108);
  t.same(parsePerftestKey(ascii(W.serverKey)), { lid: 0, outReads: 1, qpn: 0x15, psn: 0x4b839e, rkey: 0x67b, vaddr: 0x5566dbb70000n, gid: v4gid(2), srqn: 0 });
  const rd = parsePerftestKey(ascii(READ_CLIENT_KEY));
  t.equal((rd as PerftestKey).outReads, 0x80);
  t.equal((parsePerftestKey(ascii(SEND_UD_CLIENT_KEY)) as PerftestKey).rkey, 0);
  t.same((parsePerftestKey(ascii(V6_CLIENT_KEY)) as PerftestKey).gid, Buffer.from('fd770000000000000000000000000003', 'hex'));
  t.same(parsePerftestVersion(Buffer.from(W.version, 'hex')), { version: '6.06', value: 6.06 });
  t.equal(parsePerftestMtu(Buffer.from(W.mtu, 'hex')), 3);
  const r = parsePerftestBwReport(Buffer.from(W.report.join(''), 'hex')) as PerftestBwReport;
  t.equal(r.size, 64n);
  t.equal(r.iters, 5n);
  // The client printed "64  5  0.04  0.02  0.000317" for these.
  t.equal(r.bwPeak.toFixed(2), '0.04');
  t.equal(r.bwAvg.toFixed(2), '0.02');
  t.equal(r.msgRateAvg.toFixed(6), '0.000317');
  t.equal(hex(formatPerftestBwReport(r)), W.report.join(''));
  t.equal(hex(PERFTEST_DONE), W.done);
});

t.test('key round trips, both forms', async (t) => {
  for (let i = 0; i < 200; i++) {
    const k: PerftestKey = {
      lid: Math.floor(Math.random() * 0x10000), outReads: Math.floor(Math.random() * 0x10000),
      qpn: Math.floor(Math.random() * 0x1000000), psn: Math.floor(Math.random() * 0x1000000),
      rkey: Math.floor(Math.random() * 2 ** 32), vaddr: BigInt.asUintN(64, BigInt(Math.floor(Math.random() * 2 ** 53)) << 11n),
      srqn: Math.floor(Math.random() * 2 ** 32),
    };
    if (i % 2) k.gid = Uint8Array.from({ length: 16 }, () => Math.floor(Math.random() * 256));
    const m = formatPerftestKey(k);
    if (m.length !== (k.gid ? 108 : 59)) t.fail(`length ${m.length}`);
    t.same(parsePerftestKey(m), k);
  }
  // 59-byte form: "%04x:%04x:%06x:%06x:%08x:%016llx:%08x\0"
  t.equal(formatPerftestKey({ lid: 1, outReads: 1, qpn: 2, psn: 3, rkey: 4, vaddr: 5n, srqn: 6 }).toString('latin1'),
    '0001:0001:000002:000003:00000004:0000000000000005:00000006\0');
  t.throws(() => formatPerftestKey({ lid: 0, outReads: 1, qpn: 1 << 24, psn: 0, rkey: 0, vaddr: 0n, srqn: 0 }), RangeError);
  t.throws(() => formatPerftestKey({ lid: 0, outReads: 1, qpn: 0, psn: 0, rkey: 0, vaddr: 1n << 64n, srqn: 0 }), RangeError);
});

t.test('malformed fields give typed errors', async (t) => {
  const bad: [string, unknown][] = [
    ['key: short', parsePerftestKey(ascii(W.clientKey).subarray(0, 107))],
    ['key: no NUL', parsePerftestKey(ascii(W.clientKey.replace('\0', ':')))],
    ['key: bad hex', parsePerftestKey(ascii(W.clientKey.replace('29baf0', '29bxf0')))],
    ['key: 17 GID bytes', parsePerftestKey(ascii(W.clientKey.replace('00:00:00:00:00:00:00:00:00:00:ff', '00:00:00:00:00:00:00:00:00:00:0:ff')))],
    ['version: garbage', parsePerftestVersion(Buffer.alloc(16, 0x41))],
    ['version: short', parsePerftestVersion(Buffer.alloc(4))],
    ['mtu: 7', parsePerftestMtu(ascii('7\0'))],
    ['mtu: 1024 as text', parsePerftestMtu(ascii('10'))],
    ['report: short', parsePerftestBwReport(Buffer.alloc(39))],
  ];
  for (const [name, r] of bad) {
    t.ok(r instanceof OobError, name);
    t.equal((r as OobError).code, 'ERR_OOB_MALFORMED', name);
  }
});

function key(verb: PerftestVerb, qpn: number, last: number, gid = true): PerftestKey {
  const k: PerftestKey = {
    lid: 0, outReads: verb === 'read' || verb === 'atomic' ? 128 : 1, qpn, psn: 0x100000 + qpn,
    rkey: verb === 'send' ? 0 : 0x600 + qpn, vaddr: 0x55000000000n + BigInt(qpn << 12), srqn: 0,
  };
  if (gid) k.gid = v4gid(last);
  return k;
}

async function freePort(): Promise<number> {
  const probe = net.createServer();
  await new Promise<void>((r) => probe.listen(0, '127.0.0.1', () => r()));
  const port = (probe.address() as net.AddressInfo).port;
  await new Promise<void>((r) => probe.close(() => r()));
  return port;
}

for (const verb of ['write', 'read', 'send', 'atomic'] as const) {
  t.test(`${verb}: both roles against each other on 127.0.0.1`, async (t) => {
    const port = await freePort();
    const report: PerftestBwReport = { size: 64n, iters: 5n, bwPeak: 1.5, bwAvg: 1.25, msgRateAvg: 0.02 };
    const server = (async () => {
      const s = await perftestServerExchange(port, { verb, host: '127.0.0.1', local: key(verb, 0x15, 2), mtu: 5, cycleBuffer: 8192 });
      await s.ready();
      const r = await s.finish();
      return { s, r };
    })();
    const c = await perftestClientExchange('127.0.0.1', port, {
      verb, mtu: 3,
      local: (n) => {
        t.equal(n.mtu, 3);
        t.equal(n.remoteMtu, 5);
        t.equal(n.cycleBuffer, 8192);
        t.equal(n.cacheLineSize, 64);
        t.equal(n.remoteVersion, '6.06');
        return key(verb, 0x16, 3);
      },
    });
    t.same(c.remote, [key(verb, 0x15, 2)]);
    await c.ready();
    const cr = await c.finish(report);
    const { s, r } = await server;
    t.same(s.remote, [key(verb, 0x16, 3)]);
    t.equal(s.mtu, 3);
    if (verb === 'send') {
      t.equal(r, undefined);
      t.equal(cr, undefined);
    } else {
      t.same(r, report, 'the server gets the client\'s report');
      t.same(cr, { size: 0n, iters: 0n, bwPeak: 0, bwAvg: 0, msgRateAvg: 0 });
    }
  });
}

t.test('two QPs against each other', async (t) => {
  const port = await freePort();
  const server = (async () => {
    const s = await perftestServerExchange(port, { verb: 'write', host: '127.0.0.1', local: [key('write', 0x23, 2), key('write', 0x24, 2)] });
    await s.ready();
    await s.finish();
    return s;
  })();
  const c = await perftestClientExchange('127.0.0.1', port, { verb: 'write', local: [key('write', 0x33, 3), key('write', 0x34, 3)] });
  await c.ready();
  await c.finish();
  t.same((await server).remote.map((k) => k.qpn), [0x33, 0x34]);
  t.same(c.remote.map((k) => k.qpn), [0x23, 0x24]);
});

/**
 * A scripted peer playing perftest's server: it replays ctx_xchg_data steps (read then write)
 * and records what we sent.
 */
async function fakeServer(port: number, steps: { read: number | 'cstr'; reply: Buffer | undefined }[]): Promise<Buffer[]> {
  const sock = await new Promise<net.Socket>((resolve) => {
    const srv = net.createServer((s) => { srv.close(); resolve(s); });
    srv.listen(port, '127.0.0.1');
  });
  sock.on('error', () => undefined);
  let buf = Buffer.alloc(0);
  let wake: () => void = () => undefined;
  let closed = false;
  sock.on('data', (d: Buffer) => { buf = Buffer.concat([buf, d]); wake(); });
  sock.on('close', () => { closed = true; wake(); });
  const got: Buffer[] = [];
  for (const st of steps) {
    for (;;) {
      const n = st.read === 'cstr' ? buf.indexOf(0) + 1 : buf.length >= st.read ? st.read : 0;
      if (n > 0) {
        got.push(buf.subarray(0, n));
        buf = buf.subarray(n);
        break;
      }
      if (closed) return got;
      await new Promise<void>((r) => { wake = r; });
    }
    if (st.reply) sock.write(st.reply);
  }
  sock.end();
  return got;
}

const preamble = (mtu = '3300', version = W.version) => [
  { read: 16, reply: Buffer.from(version, 'hex') },
  { read: 4, reply: Buffer.from(W.cycle, 'hex') },
  { read: 4, reply: Buffer.from(W.line, 'hex') },
  { read: 2, reply: Buffer.from(mtu, 'hex') },
];

t.test('our client against a scripted ib_write_bw server: the exact byte sequence', async (t) => {
  const port = await freePort();
  const sk = ascii(W.serverKey);
  const steps = [
    ...preamble(),
    { read: 'cstr' as const, reply: sk }, { read: 'cstr' as const, reply: sk }, { read: 'cstr' as const, reply: sk },
    { read: 'cstr' as const, reply: sk },
    ...W.report.map(() => ({ read: 8, reply: Buffer.alloc(8) })),
    { read: 'cstr' as const, reply: Buffer.concat([sk, PERFTEST_DONE]) },
    { read: 'cstr' as const, reply: undefined },
  ];
  const peer = fakeServer(port, steps);
  const ck = { lid: 0, outReads: 1, qpn: 0x15, psn: 0x29baf0, rkey: 0x692, vaddr: 0x55fb36b1a000n, gid: v4gid(3), srqn: 0 };
  const c = await perftestClientExchange('127.0.0.1', port, { verb: 'write', local: ck, connectTimeoutMs: 2000 });
  await c.ready();
  const rep = parsePerftestBwReport(Buffer.from(W.report.join(''), 'hex')) as PerftestBwReport;
  await c.finish(rep);
  const got = (await peer).map(hex);
  t.same(got, [
    W.version, W.cycle, W.line, W.mtu,
    hex(ascii(W.clientKey)), hex(ascii(W.clientKey)), hex(ascii(W.clientKey)), hex(ascii(W.clientKey)),
    ...W.report, hex(ascii(W.clientKey)), W.done,
  ], 'what ib_write_bw\'s client sent in the lab, byte for byte');
});

t.test('our client against a scripted ib_send_bw server: no hand shake after the test, "done" not awaited', async (t) => {
  const sk = ascii(W.serverKey);
  const ck = { lid: 0, outReads: 1, qpn: 0x15, psn: 0x29baf0, rkey: 0, vaddr: 0x55fb36b1a000n, gid: v4gid(3), srqn: 0 };
  // send_bw.c (RUN_REGULAR): keys, the hand shake after connecting, one per QP, one before the
  // test; after it only ctx_close_connection: a hand shake, "done", close. The peer here
  // closes without any "done" of its own: ours must still go out, and finish() resolve.
  for (const peerDone of [true, false]) {
    const port = await freePort();
    const peer = fakeServer(port, [
      ...preamble(),
      ...Array.from({ length: 4 }, () => ({ read: 'cstr' as const, reply: sk })),
      { read: 'cstr' as const, reply: peerDone ? Buffer.concat([sk, PERFTEST_DONE]) : sk },
      { read: 'cstr' as const, reply: undefined },
    ]);
    const c = await perftestClientExchange('127.0.0.1', port, { verb: 'send', local: ck, connectTimeoutMs: 2000, stepTimeoutMs: 2000, runTimeoutMs: 2000 });
    await c.ready();
    t.equal(await c.finish(), undefined, `finish() resolves (peer's "done" ${peerDone ? 'sent' : 'never sent'})`);
    const got = (await peer).map(hex);
    t.same(got, [
      W.version, W.cycle, W.line, W.mtu,
      ...Array.from({ length: 5 }, () => hex(formatPerftestKey(ck))),
      W.done,
    ], 'versions, sizes, MTU, five key messages, "done"');
  }
});

t.test('refusals', async (t) => {
  const sk = ascii(W.serverKey);
  const run = async (verb: PerftestVerb, steps: Parameters<typeof fakeServer>[1], local: PerftestKey | PerftestKey[], phase: 'start' | 'ready' | 'finish' = 'start') => {
    const port = await freePort();
    const peer = fakeServer(port, steps);
    const err = await (async () => {
      const c = await perftestClientExchange('127.0.0.1', port, { verb, local, stepTimeoutMs: 1000, runTimeoutMs: 1000 });
      if (phase === 'start') return undefined;
      await c.ready();
      if (phase === 'ready') return undefined;
      await c.finish();
      return undefined;
    })().catch((e: unknown) => e);
    await peer;
    return err as OobError;
  };
  const ck = key('write', 0x15, 3);

  let e = await run('write', [...preamble('3300', '352e363000000000000000000000000000'.slice(0, 32))], ck);
  t.equal(e?.code, 'ERR_OOB_MISMATCH', 'old version');
  t.match(e?.message, /older than 5\.70/);

  e = await run('write', [...preamble('3900')], ck);
  t.equal(e?.code, 'ERR_OOB_MALFORMED', 'bad MTU');

  // A peer without a GID (59-byte keys).
  e = await run('write', [...preamble(), { read: 'cstr', reply: formatPerftestKey({ ...key('write', 0x15, 2), gid: undefined as never }) }], ck);
  t.equal(e?.code, 'ERR_OOB_MISMATCH', 'no GID');
  t.match(e?.message, /without a GID/);

  // IPv6 GID against our IPv4 one.
  e = await run('write', [...preamble(), { read: 'cstr', reply: ascii(V6_CLIENT_KEY) }], ck);
  t.equal(e?.code, 'ERR_OOB_MISMATCH', 'GID types');
  t.match(e?.message, /GID types/);

  // We run write, the peer read (out_reads 0x80).
  e = await run('write', [...preamble(), { read: 'cstr', reply: ascii(READ_CLIENT_KEY) }], ck);
  t.equal(e?.code, 'ERR_OOB_MISMATCH', 'read peer');
  t.match(e?.message, /ib_read_bw or ib_atomic_bw/);

  // We run write, the peer send (rkey 0).
  e = await run('write', [...preamble(), { read: 'cstr', reply: ascii(SEND_UD_CLIENT_KEY) }], ck);
  t.equal(e?.code, 'ERR_OOB_MISMATCH', 'send peer');
  t.match(e?.message, /ib_send_bw/);

  // A peer with two QPs: its second first-round key arrives in our second hand shake.
  const q2 = formatPerftestKey({ ...key('write', 0x16, 2) });
  e = await run('write', [...preamble(), { read: 'cstr', reply: sk }, { read: 'cstr', reply: q2 }], ck, 'ready');
  t.equal(e?.code, 'ERR_OOB_MISMATCH', '-q 2 peer');
  t.match(e?.message, /number of QPs/);

  // We run send, the peer write: after the test, its report arrives where send's keys are due.
  const sendKey = key('send', 0x15, 3);
  e = await run('send', [
    ...preamble(), { read: 'cstr', reply: sk }, { read: 'cstr', reply: sk }, { read: 'cstr', reply: sk }, { read: 'cstr', reply: sk },
    { read: 'cstr', reply: Buffer.from(W.report[0] ?? '', 'hex') },
  ], sendKey, 'finish');
  t.equal(e?.code, 'ERR_OOB_MISMATCH', 'write peer for send');

  // The peer goes away mid-exchange.
  e = await run('write', [...preamble().slice(0, 2)], ck);
  t.equal(e?.code, 'ERR_OOB_CLOSED', 'peer closes');

  // Nobody listens.
  const port = await freePort();
  const err = await perftestClientExchange('127.0.0.1', port, { verb: 'write', local: ck, connectTimeoutMs: 300 }).catch((x: unknown) => x);
  t.equal((err as OobError).code, 'ERR_OOB_CONNECT');
  t.match((err as OobError).message, /^no perftest server at 127\.0\.0\.1:\d+ after 0\.3 s/);
});

// The transfer protocol's probe request (src/app/probe.ts): its messages are validated like the
// others, a bad probe is refused on the channel (never a crash), and the scratch memory a probe
// offers is the same from one session to the next.
import t from 'tap';
import net from 'node:net';
import { once } from 'node:events';
import { Channel, PROTOCOL_VERSION, validate, type Message } from '../../src/app/protocol.js';
import { PROBE_MEM_BYTES, PROBE_RO_BYTES } from '../../src/app/probe.js';
import { bench } from './helpers.js';

const probe = (o: Record<string, unknown> = {}): Record<string, unknown> => ({
  type: 'probe', qpn: 0x123, psn: 5, address: '127.0.0.1', port: 4791, mtu: 1024, recvs: 4, access: ['read', 'write'], retryCnt: 3, timeout: 14, ...o,
});

t.test('probe messages are validated', async (t) => {
  t.ok(validate(probe()), 'a well-formed probe');
  for (const [what, bad] of [
    ['an unknown right', { access: ['read', 'exec'] }],
    ['retry_cnt above 7', { retryCnt: 8 }],
    ['timeout above 31', { timeout: 32 }],
    ['a QPN above 24 bits', { qpn: 0x1000000 }],
    ['a negative receive count', { recvs: -1 }],
    ['no access list', { access: 'read' }],
  ] as const) t.equal(validate(probe(bad)), undefined, `refused: ${what}`);
  const region = { rkey: 1, va: 'ab', length: 8 };
  t.ok(validate({ ...probe(), type: 'probed', mem: region, ro: region }), 'a well-formed probed');
  t.equal(validate({ ...probe(), type: 'probed', mem: { ...region, va: '0xab' }, ro: region }), undefined, 'refused: a VA that is not bare hex');
  t.ok(validate({ type: 'probe-read', rkey: 1, va: '1000', length: 8 }), 'a well-formed probe-read');
  t.equal(validate({ type: 'probe-read', rkey: -1, va: '1000', length: 8 }), undefined, 'refused: a negative rkey');
});

async function client(port: number): Promise<Channel> {
  const s = net.connect({ host: '127.0.0.2', port });
  await once(s, 'connect');
  const ch = new Channel(s, 'server');
  ch.send({ type: 'hello', v: PROTOCOL_VERSION, qpn: 0x77, psn: 1, gid: '::ffff:127.0.0.1', address: '127.0.0.1', port: 4791, mtu: 1024 });
  await ch.expect('hello', 5000);
  return ch;
}

t.test('roce serve answers probes', async (t) => {
  const b = await bench();
  t.teardown(() => b.close());
  const a = await client(b.server.oobPort);
  a.send(probe({ mtu: 100 }) as Message);
  await t.rejects(a.next(5000), { code: 'BAD_REQUEST', message: /MTU 100/ }, 'an MTU that is not 256..4096 is refused');
  await t.rejects(a.next(5000), { message: /closed/ }, 'and the connection ends');
  a.close();

  const c1 = await client(b.server.oobPort);
  c1.send(probe() as Message);
  const p1 = await c1.expect('probed', 5000);
  t.equal(p1.mem.length, PROBE_MEM_BYTES, 'the read/write/atomic region');
  t.equal(p1.ro.length, PROBE_RO_BYTES, 'the read-only region');
  t.same(p1.access, ['read', 'write'], 'the rights asked for');
  t.equal(p1.port, b.ctx.port, 'the server\'s UDP port');
  c1.send({ type: 'probe-read', rkey: 0x42, va: '1000', length: 8 });
  t.equal((await c1.next(5000)).type, 'probe-posted', 'probe-read posts a READ');
  c1.send({ type: 'done' });
  await t.rejects(c1.next(5000), { code: 'BAD_REQUEST', message: /unexpected 'done'/ }, 'anything else is refused');
  c1.close();

  const c2 = await client(b.server.oobPort);
  c2.send(probe({ recvs: 0, access: [] }) as Message);
  const p2 = await c2.expect('probed', 5000);
  t.not(p2.qpn, p1.qpn, 'a new QP');
  t.same([p2.mem, p2.ro], [p1.mem, p1.ro], 'the same memory as the session before');
  t.equal(p2.recvs, 0);
  c2.close();
});

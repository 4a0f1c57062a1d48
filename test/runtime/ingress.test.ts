/**
 * Device ingress in rxe_rcv's order: every drop reason is counted, nothing throws, and a packet
 * that passes reaches the QP. Packets are handed straight to `Device.receive`.
 */
import t from 'tap';
import fc from 'fast-check';
import { modifyQp, postRecv, regMr } from '../../src/api/verbs.js';
import { emitPacket, packetLength, type RocePacket } from '../../src/wire/packet.js';
import { toHex } from '../../src/wire/bytes.js';
import { DROP_COUNTERS } from '../../src/core/counters.js';
import { ALL_ACCESS, bth, connectPair, memoryPair, pattern } from '../helpers/engine.js';

function bytes(p: RocePacket): Uint8Array {
  const b = new Uint8Array(packetLength(p));
  emitPacket(p, b, 0);
  return b;
}
const meta = (address: string) => ({ src: { address, port: 49441 }, icrc: 'ok' as const, ce: false, at: 0 });

t.test('drop reasons, in order', async (t) => {
  const p = await memoryPair();
  const [, rc] = connectPair(p, 'RC');
  const [, ud] = connectPair(p, 'UD', { qkey: 0x1234 });
  const dev = p.b.ctx.device;
  const peer = p.a.ctx.address;
  const c = () => p.b.ctx.counters;
  const payload = new Uint8Array(0);

  dev.receive(new Uint8Array(7), meta(peer));
  t.equal(c().malformed, 1, 'too short');
  dev.receive(bytes({ bth: bth('RC_SEND_ONLY', 0x200, { destQp: 0x999 }), payload, icrc: 0 }), meta(peer));
  t.equal(c().noQp, 1, 'unknown QPN');
  dev.receive(bytes({ bth: bth('UC_SEND_ONLY', 0x200, { destQp: rc.qpNum }), payload, icrc: 0 }), meta(peer));
  t.equal(c().badTransport, 1, 'UC opcode to an RC QP');
  dev.receive(bytes({ bth: bth('RC_SEND_ONLY', 0x200, { destQp: rc.qpNum, pkey: 0x1234 }), payload, icrc: 0 }), meta(peer));
  t.equal(c().badPkey, 1, 'a P_Key of another partition');
  dev.receive(bytes({ bth: bth('RC_SEND_ONLY', 0x200, { destQp: rc.qpNum }), payload, icrc: 0 }), meta('10.9.9.9'));
  t.equal(c().badAddr, 1, 'RC packet from a stranger');
  dev.receive(bytes({ bth: bth('UD_SEND_ONLY', 0, { destQp: ud.qpNum }), deth: { qkey: 0x4321, srcQp: 5 }, payload, icrc: 0 }), meta(peer));
  t.equal(c().badQkey, 1, 'wrong Q_Key');
  dev.receive(bytes({ bth: bth('RC_ACKNOWLEDGE', 0, { destQp: rc.qpNum }), aeth: { syndrome: 0x1f, msn: 0 }, payload, icrc: 0 }), meta('::ffff:' + peer));
  t.equal(c().badAddr, 1, 'IPv4-mapped source text is the same peer');
  modifyQp(rc, { qpState: 'RESET' });
  dev.receive(bytes({ bth: bth('RC_SEND_ONLY', 0x200, { destQp: rc.qpNum }), payload, icrc: 0 }), meta(peer));
  t.equal(c().badState, 1, 'QP in RESET');

  const dst = regMr(p.b.pd, new Uint8Array(64), ALL_ACCESS);
  postRecv(ud, { wrId: 1, sgList: [dst.sge(0, 64)] });
  const before = c().rcvdPkts;
  dev.receive(bytes({ bth: bth('UD_SEND_ONLY', 0, { destQp: ud.qpNum }), deth: { qkey: 0x1234, srcQp: 5 }, payload: pattern(8), icrc: 0 }), meta(peer));
  t.equal(c().rcvdPkts, before + 1, 'a good datagram is accepted');
  t.match(p.b.cq.poll(1), [{ wrId: 1, status: 'SUCCESS', byteLen: 48, srcQp: 5 }]);
});

t.test('random bytes never throw and are always counted', async (t) => {
  const p = await memoryPair();
  connectPair(p, 'RC');
  const dev = p.b.ctx.device;
  fc.assert(fc.property(fc.uint8Array({ maxLength: 200 }), (b) => {
    const c0 = p.b.ctx.counters;
    const sum0 = DROP_COUNTERS.reduce((n, k) => n + c0[k], 0) + c0.rcvdPkts + c0.cnpRcvd;
    dev.receive(b, meta(p.a.ctx.address));
    const c1 = p.b.ctx.counters;
    const sum1 = DROP_COUNTERS.reduce((n, k) => n + c1[k], 0) + c1.rcvdPkts + c1.cnpRcvd;
    return sum1 === sum0 + 1;
  }), { seed: 42, numRuns: 3000 });
  t.pass('3000 random datagrams, each accounted for once');
});

t.test('a packet received while another is being delivered is parsed apart from it', async (t) => {
  // The device parses into one reused record, which the engines read until their call returns; the
  // responder reads the PSN again after pushing the receive completion, whose hook may feed the
  // device at once. Here it does, with a UD datagram of another PSN, QP and shape.
  const p = await memoryPair();
  const [, rc] = connectPair(p, 'RC');
  const [, ud] = connectPair(p, 'UD', { qkey: 0x1234 });
  const dev = p.b.ctx.device;
  const peer = p.a.ctx.address;
  const dst = regMr(p.b.pd, new Uint8Array(128), ALL_ACCESS);
  postRecv(rc, { wrId: 1, sgList: [dst.sge(0, 64)] });
  postRecv(ud, { wrId: 2, sgList: [dst.sge(64, 64)] });
  let nested = 0;
  p.b.cq.core.onCompletion = () => {
    if (nested++ > 0) return;
    dev.receive(bytes({ bth: bth('UD_SEND_ONLY', 0x777, { destQp: ud.qpNum }), deth: { qkey: 0x1234, srcQp: 5 }, payload: pattern(4, 3), icrc: 0 }), meta(peer));
  };
  dev.receive(bytes({ bth: bth('RC_SEND_ONLY', 0x100, { destQp: rc.qpNum, ackReq: true }), payload: pattern(8, 2), icrc: 0 }), meta(peer));
  t.equal(nested, 2, 'the RC completion fed the device, whose UD completion followed');
  t.equal(rc.core.respPsn, 0x101, 'the RC QP expects the PSN after the outer packet');
  t.equal(rc.core.respAckPsn, 0x100, 'and acknowledges the outer packet, not the nested one');
  t.equal(p.b.ctx.counters.rcvdPkts, 2, 'both packets accepted');
  t.match(p.b.cq.poll(2), [{ wrId: 1, status: 'SUCCESS', byteLen: 8 }, { wrId: 2, status: 'SUCCESS', byteLen: 44, srcQp: 5 }]);
  t.equal(toHex(dst.buffer.subarray(0, 8)), toHex(pattern(8, 2)), 'the RC payload in place');
  t.equal(toHex(dst.buffer.subarray(64 + 40, 64 + 44)), toHex(pattern(4, 3)), 'the UD payload after its GRH');
});

/**
 * The scripted cases. Each one crafts every packet itself, names the IBTA rule it checks
 * (Vol. 1 chapter 9 and Annex A17, RoCEv2) and the answer that rule requires, and judges what
 * came back. Cases that need something the session cannot offer (memory for READ, a peer that
 * sends requests of its own, no posted receives…) say so through `requires`.
 */

import { ackSyndrome, NAK_CODE } from '../wire/aeth.js';
import { cnpPacket } from '../wire/cnp.js';
import { psnAdd, psnDiff } from '../wire/psn.js';
import type { RocePacket } from '../wire/packet.js';
import { Prober, sleep, type ReqOptions, type Rx } from './prober.js';
import type { PeerSession, SessionVariant } from './exchange.js';
import { describeRx, hex, isAck, isNak, isRnrNak } from './describe.js';

export interface Timing {
  /** How long to wait for an answer that should come. */
  responseMs: number;
  /** How long silence must last to conclude that a packet was dropped. */
  quietMs: number;
}

export type Verdict = 'pass' | 'deviation' | 'peer-stopped' | 'not-applicable' | 'error';

export interface Outcome {
  verdict: 'pass' | 'deviation' | 'peer-stopped';
  observed: string;
}

export interface GoodOp {
  pkt: RocePacket;
  ok: (r: Rx) => boolean;
  what: string;
}

export interface CaseCtx {
  readonly p: Prober;
  readonly s: PeerSession;
  readonly t: Timing;
  /** A known-good request at `psn` (SEND, WRITE or READ, whichever the session allows) and its expected answer. */
  goodOp(psn: number, o?: Partial<ReqOptions>): GoodOp;
  /** Makes `waitResponse` look only at what arrives from now on. */
  fresh(): void;
  /** Waits for a response from the peer (since the case started, or `fresh`) matching `pred`. */
  waitResponse(pred: (r: Rx) => boolean, ms?: number): Promise<Rx | undefined>;
  /** Waits `ms` (default quietMs) and returns the responses that arrived since `from` (default: now). */
  quiet(ms?: number): Promise<Rx[]>;
  /** Checks the peer still expects PSN `epsn`: a good request at epsn+1 must draw NAK PSN sequence error with epsn. */
  probe(epsn: number): Promise<{ ok: boolean; observed: string }>;
  /** WRITE `data` at `off` of the peer's memory at the next PSN; true when ACKed. */
  write(off: number, data: Uint8Array): Promise<boolean>;
  /** READ `len` bytes at `off`; undefined without an answer. */
  read(off: number, len: number, mem?: PeerSession['memory']): Promise<Uint8Array | undefined>;
  note(s: string): void;
}

export interface CaseDef {
  id: string;
  title: string;
  /** The IBTA rule: chapter/section and compliance statement where there is one. */
  rule: string;
  expected: string;
  /** A session variant to connect with; undefined = the default session. */
  variant?: (exchange: string) => SessionVariant | undefined;
  /** Why the case cannot run in this session, or undefined. */
  requires?: (s: PeerSession) => string | undefined;
  /** IBTA puts the peer's QP in the Error state afterwards (responder class A/C/J, requester retry exhaustion). */
  fatal?: boolean;
  run(c: CaseCtx): Promise<Outcome>;
  /** Runs on the next healthy session (after liveness or a reconnect): e.g. memory left untouched. */
  after?(c: CaseCtx, first: Outcome): Promise<Outcome>;
}

const pass = (observed: string): Outcome => ({ verdict: 'pass', observed });
const dev = (observed: string): Outcome => ({ verdict: 'deviation', observed });
const list = (rs: Rx[]): string => (rs.length ? rs.map(describeRx).join('; ') : 'nothing');
const pattern = (n: number, seed: number): Uint8Array => Uint8Array.from({ length: n }, (_, i) => (seed + i * 7) & 0xff);
const same = (a: Uint8Array | undefined, b: Uint8Array): boolean => a !== undefined && a.length === b.length && a.every((v, i) => v === b[i]);

const can = (s: PeerSession, a: 'read' | 'write' | 'atomic'): boolean => s.access.includes(a) && s.memory !== undefined;
const needRead = (s: PeerSession): string | undefined => (can(s, 'read') ? undefined : `no RDMA READ target: the ${s.exchange} exchange gives no rkey/VA with remote read access`);
const needWrite = (s: PeerSession): string | undefined => (can(s, 'write') ? undefined : `no RDMA WRITE target: the ${s.exchange} exchange gives no rkey/VA with remote write access`);
const needAtomic = (s: PeerSession): string | undefined => (can(s, 'atomic') ? undefined : `no atomic target: the ${s.exchange} exchange gives no rkey/VA with remote atomic access`);
const needRecv = (s: PeerSession): string | undefined => (s.recvPosted ? undefined : `the ${s.exchange} peer posts no receives, so SENDs are not accepted`);
const needEcho = (s: PeerSession): string | undefined => (s.echoes ? undefined : `the ${s.exchange} peer never sends requests of its own, so it has nothing to retransmit`);
const needAnyMem = (s: PeerSession): string | undefined => (s.memory && s.access.length ? undefined : `the ${s.exchange} exchange gives no rkey/VA`);

/** Offsets in the peer's buffer the cases use (the liveness WRITE uses 0..7). */
const OFF = { dupWrite: 512, rkey: 768, atomic: 1024, read: 256 };

/** A silent-drop case: the packet must draw no answer and leave the ePSN where it was. */
function silentDrop(c: CaseCtx, send: (P: number) => void, what: string): Promise<Outcome> {
  return (async () => {
    const P = c.p.nextPsn;
    send(P);
    const got = await c.quiet();
    const pr = await c.probe(P);
    if (got.length === 0 && pr.ok) return pass(`${what}: no answer; ${pr.observed}`);
    return dev(`${what}: answered with ${list(got)}; ${pr.observed}`);
  })();
}

export const CASES: readonly CaseDef[] = [
  {
    id: 'psn-gap-nak-once',
    title: 'PSN ahead of expected: one NAK per gap',
    rule: 'IBTA Vol.1 §9.7.4.1.1 / §9.9.3.1.2 (responder class B, PSN sequence error), C9-106 area: NAK once, then drop until ePSN',
    expected: 'exactly one NAK (PSN sequence error) carrying the expected PSN for two requests beyond it; nothing executed',
    async run(c) {
      const P = c.p.nextPsn;
      c.p.send(c.goodOp(psnAdd(P, 2)).pkt);
      c.p.send(c.goodOp(psnAdd(P, 3)).pkt);
      const got = await c.quiet(c.t.quietMs + c.t.responseMs / 2);
      const naks = got.filter((r) => isNak(r, NAK_CODE.PSN_SEQUENCE_ERROR, P));
      if (naks.length === 1 && got.length === 1) return pass(`one NAK PSN_SEQUENCE_ERROR psn ${hex(P)}`);
      return dev(`expected one NAK PSN_SEQUENCE_ERROR psn ${hex(P)}, got ${list(got)}`);
    },
  },
  {
    id: 'dup-send',
    title: 'Duplicate SEND: re-ACKed, not executed again',
    rule: 'IBTA Vol.1 §9.7.4.1.2 (duplicate requests), C9-104: a duplicate SEND is acknowledged and not re-executed',
    expected: 'ACK of the duplicate PSN; no second receive completion (no second echo from a pingpong peer)',
    requires: needRecv,
    async run(c) {
      // Let the echo of the previous liveness SEND arrive first: only echoes of this case count.
      await sleep(c.t.quietMs);
      const P = c.p.nextPsn;
      const op = c.goodOp(P);
      const echoes0 = c.p.peerRequests.length;
      c.p.send(op.pkt);
      const first = await c.waitResponse((r) => isAck(r, P) || Prober.isResponse(r));
      if (!first || !isAck(first, P)) return dev(`the original SEND drew ${first ? describeRx(first) : 'nothing'}`);
      c.p.nextPsn = psnAdd(P, 1);
      c.p.send(op.pkt);
      const again = await c.waitResponse((r) => r !== first && Prober.isResponse(r));
      await c.quiet();
      const echoes = c.p.peerRequests.length - echoes0;
      if (!again || !isAck(again, P)) return dev(`duplicate drew ${again ? describeRx(again) : 'no answer'} (expected ACK psn ${hex(P)})`);
      if (c.s.echoes && echoes !== 1) return dev(`duplicate ACKed, but the peer answered ${echoes} SENDs for one message: executed twice`);
      return pass(`duplicate ACKed with psn ${hex(P)}${c.s.echoes ? '; one echo only' : ''}`);
    },
  },
  {
    id: 'dup-write',
    title: 'Duplicate RDMA WRITE: re-ACKed, memory not written again',
    rule: 'IBTA Vol.1 §9.7.4.1.2, C9-104: duplicate WRITE requests are acknowledged without being executed',
    expected: 'ACK of the duplicate PSN; memory keeps the original data (checked by READ when allowed)',
    requires: needWrite,
    async run(c) {
      const P = c.p.nextPsn;
      const m = c.s.memory!;
      const a = pattern(16, 0xa0);
      const b = pattern(16, 0xb0);
      const w = (data: Uint8Array): RocePacket =>
        c.p.request('RC_RDMA_WRITE_ONLY', { psn: P, reth: { va: m.va + BigInt(OFF.dupWrite), rkey: m.rkey, dmaLength: 16 }, payload: data });
      c.p.send(w(a));
      const first = await c.waitResponse((r) => Prober.isResponse(r));
      if (!first || !isAck(first, P)) return dev(`the original WRITE drew ${first ? describeRx(first) : 'nothing'}`);
      c.p.nextPsn = psnAdd(P, 1);
      c.p.send(w(b));
      const again = await c.waitResponse((r) => r !== first && Prober.isResponse(r));
      if (!again || !isAck(again, P)) return dev(`duplicate WRITE drew ${again ? describeRx(again) : 'no answer'} (expected ACK psn ${hex(P)})`);
      if (!can(c.s, 'read')) {
        c.note('memory not checked: the session allows no READ');
        return pass(`duplicate ACKed with psn ${hex(P)}`);
      }
      const got = await c.read(OFF.dupWrite, 16);
      if (same(got, a)) return pass(`duplicate ACKed with psn ${hex(P)}; memory still holds the first WRITE's data`);
      return dev(`duplicate ACKed, but memory holds ${got ? Buffer.from(got).toString('hex') : '(READ failed)'}: the duplicate was executed`);
    },
  },
  {
    id: 'dup-read',
    title: 'Duplicate RDMA READ: executed again',
    rule: 'IBTA Vol.1 §9.7.4.1.2, C9-112 area: a duplicate READ request is re-executed and its responses resent',
    expected: 'READ response with the duplicate PSN and the same data',
    requires: needRead,
    async run(c) {
      const P = c.p.nextPsn;
      const m = c.s.memory!;
      const req = c.p.request('RC_RDMA_READ_REQUEST', { psn: P, reth: { va: m.va + BigInt(OFF.read), rkey: m.rkey, dmaLength: 16 } });
      c.p.send(req);
      const first = await c.waitResponse((r) => Prober.isResponse(r));
      if (!first?.parsed.ok || first.parsed.info.kind !== 'readResponse') return dev(`the READ drew ${first ? describeRx(first) : 'nothing'}`);
      c.p.nextPsn = psnAdd(P, 1);
      c.p.send(req);
      const again = await c.waitResponse((r) => r !== first && Prober.isResponse(r));
      if (!again?.parsed.ok || again.parsed.info.kind !== 'readResponse' || again.parsed.packet.bth.psn !== P) {
        return dev(`duplicate READ drew ${again ? describeRx(again) : 'no answer'}`);
      }
      if (!same(again.parsed.packet.payload, first.parsed.packet.payload)) return dev('duplicate READ returned different data');
      return pass(`duplicate READ answered again with psn ${hex(P)} and the same 16 bytes`);
    },
  },
  {
    id: 'dup-atomic',
    title: 'Duplicate atomic: replayed from the responder\'s cache',
    rule: 'IBTA Vol.1 §9.7.4.1.2, C9-111: a duplicate atomic returns the saved original value and is not executed again',
    expected: 'ATOMIC ACK with the same original value; a following FetchAdd(0) sees one increment only',
    requires: needAtomic,
    async run(c) {
      const P = c.p.nextPsn;
      const m = c.s.memory!;
      const fa = (psn: number, add: bigint): RocePacket =>
        c.p.request('RC_FETCH_ADD', { psn, atomicEth: { va: m.va + BigInt(OFF.atomic), rkey: m.rkey, swapAdd: add, compare: 0n } });
      c.p.send(fa(P, 1n));
      const first = await c.waitResponse((r) => Prober.isResponse(r));
      if (!first?.parsed.ok || !first.parsed.packet.atomicAckEth) return dev(`FetchAdd drew ${first ? describeRx(first) : 'nothing'}`);
      const orig = first.parsed.packet.atomicAckEth.originalData;
      c.p.nextPsn = psnAdd(P, 1);
      c.p.send(fa(P, 1n));
      const again = await c.waitResponse((r) => r !== first && Prober.isResponse(r));
      if (!again?.parsed.ok || !again.parsed.packet.atomicAckEth || again.parsed.packet.bth.psn !== P) {
        return dev(`duplicate FetchAdd drew ${again ? describeRx(again) : 'no answer'}`);
      }
      if (again.parsed.packet.atomicAckEth.originalData !== orig) {
        return dev(`duplicate returned 0x${again.parsed.packet.atomicAckEth.originalData.toString(16)}, original 0x${orig.toString(16)}: executed again`);
      }
      const Q = c.p.nextPsn;
      c.p.send(fa(Q, 0n));
      const check = await c.waitResponse((r) => Prober.isResponse(r) && r.parsed.ok && r.parsed.packet.bth.psn === Q);
      c.p.nextPsn = psnAdd(Q, 1);
      const now = check?.parsed.ok ? check.parsed.packet.atomicAckEth?.originalData : undefined;
      if (now !== BigInt.asUintN(64, orig + 1n)) return dev(`after the duplicate the value is ${now === undefined ? '?' : '0x' + now.toString(16)}, expected 0x${(orig + 1n).toString(16)}`);
      return pass(`duplicate replayed original 0x${orig.toString(16)}; value incremented once`);
    },
  },
  {
    id: 'ghost-ack',
    title: 'Ghost ACK: acknowledgement of a PSN never sent',
    rule: 'IBTA Vol.1 §9.7.5.1.2 (requester: responses outside the outstanding PSN range are ghosts), C9-115..C9-119 area: silently dropped',
    expected: 'no answer; the peer\'s QP unaffected',
    async run(c) {
      const got0 = c.quiet.bind(c);
      c.p.send(c.p.ack(psnAdd(c.p.peerPsn, 0x1000), ackSyndrome()));
      c.p.send(c.p.ack(psnAdd(c.p.peerPsn, 0x1001), 0x60 | NAK_CODE.PSN_SEQUENCE_ERROR));
      const got = await got0();
      if (got.length) return dev(`ghost ACK/NAK drew ${list(got)}`);
      return pass('ghost ACK and ghost NAK ignored');
    },
  },
  {
    id: 'ack-reserved-bit',
    title: 'ACK with the syndrome\'s reserved bit set, for the peer\'s outstanding request',
    rule: 'IBTA Vol.1 §9.3.5 (AETH, table 43: syndrome bit 7 is reserved; bits 6..5 = 00 make the syndrome an ACK)',
    expected: 'taken as the ACK it is: the peer\'s request completes, is not sent again, and its QP keeps answering',
    requires: needEcho,
    async run(c) {
      const sent = await provokeWholePeerSend(c);
      if ('verdict' in sent) return sent;
      const { first, last, ours } = sent;
      // Acknowledge the whole message, as the prober's own ACK would, with bit 7 of the syndrome set.
      c.p.peerPsn = psnAdd(last, 1);
      c.p.msn = (c.p.msn + 1) & 0xffffff;
      const syndrome = 0x80 | ackSyndrome();
      const ackAt = c.p.now();
      c.p.send(c.p.ack(last, syndrome));
      c.p.autoAck = true;
      // Not taken as an ACK, the request would be sent again after the local ACK timeout.
      const window = timeoutWindow(c);
      const again = await c.waitResponse((r) => r.at > ackAt && ours(r) && r.parsed.ok && psnDiff(r.parsed.packet.bth.psn, first.psn) >= 0 &&
        psnDiff(r.parsed.packet.bth.psn, last) <= 0, window);
      const what = `ACK psn ${hex(last)} with syndrome 0x${syndrome.toString(16)}`;
      if (again) return dev(`${what}: psn ${hex(first.psn)}..${hex(last)} sent again ${(again.at - ackAt).toFixed(0)} ms later, the ACK not taken`);
      return pass(`${what}: the request not sent again within ${window} ms`);
    },
  },
  {
    id: 'read-response-to-send',
    title: 'An RDMA READ response for the peer\'s outstanding SEND',
    rule: 'IBTA Vol.1 §9.7.5.1 (requester: a response whose opcode does not fit the request at its PSN is a bad response), ' +
      'the completion status Bad Response (libibverbs IBV_WC_BAD_RESP_ERR: "an unexpected transport layer opcode was returned by the responder")',
    expected: 'taken as a bad response: the peer\'s SEND completes in error, is not sent again, and its QP goes to the Error state',
    requires: needEcho,
    fatal: true,
    async run(c) {
      // The whole SEND first, so that its own later packets are not taken for a retransmission.
      const sent = await provokeWholePeerSend(c);
      if ('verdict' in sent) return sent;
      const { first, last, ours } = sent;
      // At the SEND's first PSN, where a response reaches its WQE whatever the SEND's length.
      const resp = c.p.request('RC_RDMA_READ_RESPONSE_ONLY', { psn: first.psn, ackReq: false });
      resp.aeth = { syndrome: ackSyndrome(), msn: (c.p.msn + 1) & 0xffffff };
      const at = c.p.now();
      c.p.send(resp);
      // Dropped instead, the response would leave the SEND unacknowledged: it would be sent again
      // after the local ACK timeout.
      const window = timeoutWindow(c);
      const again = await c.waitResponse((r) => r.at > at && ours(r) && r.parsed.ok && psnDiff(r.parsed.packet.bth.psn, first.psn) >= 0 &&
        psnDiff(r.parsed.packet.bth.psn, last) <= 0, window);
      const what = `READ RESPONSE ONLY psn ${hex(first.psn)}`;
      if (again) return dev(`${what}: the peer's request sent again ${(again.at - at).toFixed(0)} ms later (${describeRx(again)}), the response ignored`);
      return pass(`${what}: the peer's request not sent again within ${window} ms`);
    },
  },
  {
    id: 'implied-nak',
    title: 'Implied NAK: an ACK beyond an outstanding READ',
    rule: 'IBTA Vol.1 §9.7.5.1.4 (requester: a response PSN later than an outstanding RDMA READ/atomic implies its responses were lost), C9-121 area',
    expected: 'the peer retransmits the RDMA READ request (before its local ACK timeout could have made it)',
    requires: (s) => (s.readThenSend || s.readsOnItsOwn ? undefined : `the ${s.exchange} peer never issues RDMA READs (needs a peer that reads from us)`),
    async run(c) {
      if (!c.s.readThenSend) return impliedNakOnReads(c);
      // Echoes of earlier requests must be acknowledged (and out of the way) before we stop
      // acknowledging: one taken for the READ's SEND would make the ACK below a plain one.
      await sleep(c.t.quietMs / 2);
      c.fresh();
      c.p.autoAck = false;
      const rkey = 0x4242;
      const va = 0x1000n;
      await c.s.readThenSend!(rkey, va, 8);
      const isReq = (r: Rx, name: string): boolean => r.parsed.ok && r.parsed.info.name === name && r.parsed.packet.bth.destQp === c.p.ourQpn;
      const rd = await c.waitResponse((r) => isReq(r, 'RC_RDMA_READ_REQUEST'));
      const q = rd?.parsed.ok ? rd.parsed.packet.bth.psn : -1;
      const sd = rd ? await c.waitResponse((r) => isReq(r, 'RC_SEND_ONLY') && r.parsed.ok && r.parsed.packet.bth.psn === psnAdd(q, 1)) : undefined;
      if (!rd?.parsed.ok || !sd?.parsed.ok) return dev(`the peer did not send READ + SEND: ${rd ? describeRx(rd) : '-'} / ${sd ? describeRx(sd) : '-'}`);
      const q1 = sd.parsed.packet.bth.psn;
      c.p.msn++;
      const ackAt = c.p.now();
      c.p.send(c.p.ack(q1));
      const again = await c.waitResponse((r) => r !== rd && isReq(r, 'RC_RDMA_READ_REQUEST') && r.parsed.ok && r.parsed.packet.bth.psn === q, c.t.responseMs * 2);
      // Finish the exchange properly so the peer's QP stays healthy.
      const resp = c.p.request('RC_RDMA_READ_RESPONSE_ONLY', { psn: q, destQp: c.p.peerQpn, ackReq: false, payload: new Uint8Array(8) });
      resp.aeth = { syndrome: ackSyndrome(), msn: c.p.msn };
      c.p.send(resp);
      c.p.send(c.p.ack(q1));
      c.p.peerPsn = psnAdd(q1, 1);
      c.p.autoAck = true;
      await sleep(c.t.quietMs / 2);
      if (again) {
        // A retransmission the local ACK timer could not have caused yet is the implied NAK's.
        const tmo = c.s.timeout !== undefined ? expectedTimeoutMs(c) : undefined;
        const after = `${(again.at - ackAt).toFixed(1)} ms after the ACK of psn ${hex(q1)}`;
        if (tmo === undefined || again.at - rd.at < tmo) return pass(`READ psn ${hex(q)} retransmitted ${after}${tmo !== undefined ? `, before its local ACK timeout (${tmo.toFixed(1)} ms)` : ''}`);
        return dev(`READ psn ${hex(q)} retransmitted only ${(again.at - rd.at).toFixed(1)} ms after it was first sent (${after}): no sooner than the local ACK timeout (${tmo.toFixed(1)} ms) would have`);
      }
      return dev(`the READ psn ${hex(q)} was not retransmitted after the ACK of ${hex(q1)}`);
    },
  },
  {
    id: 'invalid-opcode-sequence',
    title: 'Opcode out of sequence (MIDDLE without FIRST)',
    rule: 'IBTA Vol.1 §9.7.4.1.3 / §9.9.3.1.3 (responder class C, invalid request), C9-91 area: NAK Invalid Request, QP to Error',
    expected: 'NAK Invalid Request with the packet\'s PSN; the peer\'s QP then stops answering',
    fatal: true,
    async run(c) {
      const P = c.p.nextPsn;
      const name = c.s.recvPosted ? 'RC_SEND_MIDDLE' : 'RC_RDMA_WRITE_MIDDLE';
      c.p.send(c.p.request(name, { psn: P, payload: new Uint8Array(c.s.mtu) }));
      const r = await c.waitResponse((x) => Prober.isResponse(x));
      await c.quiet(c.t.quietMs / 2);
      if (r && isNak(r, NAK_CODE.INVALID_REQUEST, P)) return pass(`${name}: NAK INVALID_REQUEST psn ${hex(P)}`);
      return dev(`${name} at ePSN drew ${r ? describeRx(r) : 'no answer'}`);
    },
  },
  {
    id: 'short-first',
    title: 'A FIRST packet shorter than the PMTU',
    rule: 'IBTA Vol.1 C9-92 (packet length checks, as rxe\'s responder cites it: FIRST and MIDDLE packets carry exactly the path MTU of payload); §9.9.3.1.3 (responder class C): NAK Invalid Request, QP to Error',
    expected: 'NAK Invalid Request with the packet\'s PSN; the peer\'s QP then stops answering',
    fatal: true,
    requires: (s) => (s.recvPosted || (s.memory && s.access.includes('write')) ? undefined : `the ${s.exchange} peer accepts neither SENDs nor RDMA WRITEs`),
    async run(c) {
      const P = c.p.nextPsn;
      const m = c.s.memory;
      // A message of two PMTUs whose first packet carries 8 bytes: a length error however it continues.
      const pkt = c.s.recvPosted
        ? c.p.request('RC_SEND_FIRST', { psn: P, payload: pattern(8, 0x21) })
        : c.p.request('RC_RDMA_WRITE_FIRST', { psn: P, reth: { va: m!.va, rkey: m!.rkey, dmaLength: 2 * c.s.mtu }, payload: pattern(8, 0x21) });
      const name = c.s.recvPosted ? 'SEND_FIRST' : 'RDMA_WRITE_FIRST';
      c.p.send(pkt);
      const r = await c.waitResponse((x) => Prober.isResponse(x));
      await c.quiet(c.t.quietMs / 2);
      if (r && isNak(r, NAK_CODE.INVALID_REQUEST, P)) return pass(`${name} with 8 of ${c.s.mtu} bytes: NAK INVALID_REQUEST psn ${hex(P)}`);
      return dev(`${name} with 8 bytes at a PMTU of ${c.s.mtu} drew ${r ? describeRx(r) : 'no answer'}`);
    },
  },
  rkeyCase('rkey-violation', 'R_Key violation', 'a wrong R_Key', (m) => ({ va: m.va + BigInt(OFF.rkey), rkey: (m.rkey ^ 0x5a5a5a00) >>> 0 })),
  rkeyCase('out-of-bounds', 'Access beyond the region', 'an address past the end of the region',
    (m) => ({ va: m.exactLength ? m.va + BigInt(m.length - 8) : m.va + (1n << 32n), rkey: m.rkey })),
  {
    id: 'missing-access',
    title: 'Region without the access right (WRITE to a read-only region)',
    rule: 'IBTA Vol.1 §9.7.4.1.6 (R_Key checks: access rights), C9-89; §9.9.3.1.3: NAK Remote Access Error, QP to Error',
    expected: 'NAK Remote Access Error; the region untouched (checked by a later READ)',
    fatal: true,
    requires: (s) => (s.readOnlyMemory && s.access.includes('write') ? undefined : `the ${s.exchange} exchange exposes no region registered without remote write`),
    async run(c) {
      const P = c.p.nextPsn;
      const m = c.s.readOnlyMemory!;
      c.p.send(c.p.request('RC_RDMA_WRITE_ONLY', { psn: P, reth: { va: m.va, rkey: m.rkey, dmaLength: 16 }, payload: pattern(16, 0xee) }));
      const r = await c.waitResponse((x) => Prober.isResponse(x));
      if (r && isNak(r, NAK_CODE.REMOTE_ACCESS_ERROR, P)) return pass(`NAK REMOTE_ACCESS_ERROR psn ${hex(P)}`);
      return dev(`WRITE to the read-only region drew ${r ? describeRx(r) : 'no answer'}`);
    },
    async after(c, first) {
      const got = await c.read(0, 16, c.s.readOnlyMemory);
      if (same(got, new Uint8Array(16))) return { ...first, observed: first.observed + '; region untouched (READ after reconnect)' };
      return dev(first.observed + `; region now holds ${got ? Buffer.from(got).toString('hex') : '(READ failed)'}`);
    },
  },
  {
    id: 'op-not-enabled',
    title: 'Operation the QP is not enabled for',
    rule: 'IBTA Vol.1 §9.7.4.1.3 / §9.9.3.1.3 (responder class C): a request the QP\'s access flags do not allow is NAKed Invalid Request, QP to Error',
    expected: 'NAK Invalid Request',
    fatal: true,
    variant: (ex) => (ex === 'roce' ? { access: ['write'] } : undefined),
    requires: (s) => (!s.access.includes('write') || !s.access.includes('read') ? undefined : 'the QP allows every operation'),
    async run(c) {
      const P = c.p.nextPsn;
      const m = c.s.memory;
      const va = m?.va ?? 0x1000n;
      const rkey = m?.rkey ?? 0x1234;
      const pkt = !c.s.access.includes('write')
        ? c.p.request('RC_RDMA_WRITE_ONLY', { psn: P, reth: { va, rkey, dmaLength: 8 }, payload: new Uint8Array(8) })
        : c.p.request('RC_RDMA_READ_REQUEST', { psn: P, reth: { va, rkey, dmaLength: 8 } });
      c.p.send(pkt);
      const r = await c.waitResponse((x) => Prober.isResponse(x));
      const what = pkt.reth && pkt.payload.length ? 'WRITE' : 'READ';
      if (r && isNak(r, NAK_CODE.INVALID_REQUEST, P)) return pass(`${what} to a QP without that right: NAK INVALID_REQUEST psn ${hex(P)}`);
      return dev(`${what} to a QP without that right drew ${r ? describeRx(r) : 'no answer'} (expected NAK INVALID_REQUEST)`);
    },
  },
  {
    id: 'rnr',
    title: 'SEND with no receive posted: RNR NAK',
    rule: 'IBTA Vol.1 §9.7.5.2.8 (RNR NAK) / §9.9.3.1.2 (responder class B): RNR NAK with the request\'s PSN; QP stays usable',
    expected: 'RNR NAK with the SEND\'s PSN; the QP keeps working',
    variant: (ex) => (ex === 'roce' ? { noRecv: true } : undefined),
    requires: (s) => (s.recvPosted ? `the ${s.exchange} peer always has receives posted` : undefined),
    async run(c) {
      const P = c.p.nextPsn;
      c.p.send(c.p.request('RC_SEND_ONLY', { psn: P, payload: pattern(8, 1) }));
      const r = await c.waitResponse((x) => Prober.isResponse(x));
      if (r && isRnrNak(r, P)) return pass(`RNR NAK psn ${hex(P)} (${describeRx(r)})`);
      return dev(`SEND without a receive drew ${r ? describeRx(r) : 'no answer'}`);
    },
  },
  {
    id: 'ack-timeout',
    title: 'Local ACK timeout: the peer retransmits when we stay silent',
    rule: 'IBTA Vol.1 §9.7.6.1.3 (local ACK timeout, 4.096 µs × 2^timeout), C9-140 area: retransmit the unacknowledged request',
    expected: 'the peer resends its request with the same PSN after about its timeout',
    requires: needEcho,
    async run(c) {
      const first = await provokePeerSend(c);
      if (!first) return dev('the peer did not answer our SEND with one of its own');
      const again = await c.waitResponse((r) => r !== first.rx && r.parsed.ok && r.parsed.packet.bth.destQp === c.p.ourQpn && r.parsed.packet.bth.psn === first.psn,
        timeoutWindow(c) + c.t.responseMs);
      c.p.autoAck = true;
      if (!again) return dev(`no retransmission of psn ${hex(first.psn)} within ${timeoutWindow(c) + c.t.responseMs} ms`);
      // The retransmission arrived while auto-ACK was off: ACK it now. Left to the next one, the
      // peer's request could still be outstanding when the next case starts, and its late copies
      // be taken for that case's traffic.
      c.p.respondTo(again);
      await c.quiet(Math.max(c.t.quietMs, expectedTimeoutMs(c) * 2));
      return pass(`psn ${hex(first.psn)} retransmitted after ${(again.at - first.rx.at).toFixed(0)} ms (timeout ${c.s.timeout ?? '?'} → ${expectedTimeoutMs(c).toFixed(1)} ms)`);
    },
  },
  {
    id: 'retry-exhaustion',
    title: 'Retry exhaustion: the peer gives up after retry_cnt retries',
    rule: 'IBTA Vol.1 §9.7.6.1.3 / §9.9.2 (requester: retry counter exhausted → error completion, QP to Error), C9-141 area; only rnr_retry 7 means "infinite"',
    expected: 'retry_cnt + 1 transmissions of the request, then silence',
    fatal: true,
    requires: (s) => needEcho(s) ?? (s.retryCnt === undefined ? 'the peer\'s retry_cnt is unknown' : undefined),
    async run(c) {
      const first = await provokePeerSend(c);
      if (!first) return dev('the peer did not answer our SEND with one of its own');
      const window = Math.round(Math.min(15_000, (c.s.retryCnt! + 2) * expectedTimeoutMs(c) * 3 + c.t.responseMs * 2));
      await sleep(window);
      const tx = c.p.received({ rx: 0 }).filter((r) => r.at >= first.rx.at && r.parsed.ok && r.parsed.packet.bth.destQp === c.p.ourQpn && r.parsed.packet.bth.psn === first.psn);
      const n = tx.length;
      const want = c.s.retryCnt! + 1;
      const lastGap = tx.length ? c.p.now() - tx[tx.length - 1]!.at : 0;
      if (n === want) return pass(`${n} transmissions of psn ${hex(first.psn)} (retry_cnt ${c.s.retryCnt}), then silence for ${lastGap.toFixed(0)} ms`);
      return dev(`${n} transmissions of psn ${hex(first.psn)} in ${window} ms, last ${lastGap.toFixed(0)} ms ago; retry_cnt ${c.s.retryCnt} allows ${want}`);
    },
  },
  {
    id: 'bad-icrc',
    title: 'Bad ICRC: silently dropped',
    rule: 'IBTA Annex A17.3.3 (RoCEv2 ICRC) with Vol.1 §7.8.1 / §9.6.1: a packet whose ICRC does not check is discarded without a response',
    expected: 'no answer; not executed (the ePSN does not move)',
    run: (c) => silentDrop(c, (P) => c.p.send(c.goodOp(P).pkt, 'bad'), 'request with a wrong ICRC'),
  },
  {
    id: 'truncated',
    title: 'Truncated packets: silently dropped',
    rule: 'IBTA Vol.1 §9.6.1.1 (packet length checks before the transport header is used): malformed packets are discarded silently',
    expected: 'no answer to a WRITE cut inside its RETH (valid ICRC) nor to an 8-byte runt; ePSN unchanged',
    run: (c) => silentDrop(c, (P) => {
      const m = c.s.memory;
      const body = Prober.bytes(c.p.request('RC_RDMA_WRITE_ONLY', { psn: P, reth: { va: m?.va ?? 0n, rkey: m?.rkey ?? 0, dmaLength: 8 }, payload: new Uint8Array(8) }));
      c.p.sendBytes(body.subarray(0, 12 + 8), 'good');
      c.p.sendBytes(body.subarray(0, 8), 'none');
    }, 'truncated WRITE and runt'),
  },
  {
    id: 'bad-padcnt',
    title: 'PadCnt larger than the bytes present',
    rule: 'IBTA Vol.1 §9.2 (BTH PadCnt) and §9.6.1.1 (length checks): a packet too short for headers + pad + ICRC is malformed and dropped',
    expected: 'no answer; ePSN unchanged',
    run: (c) => silentDrop(c, (P) => {
      const op = c.goodOp(P);
      const pkt = { ...op.pkt, bth: { ...op.pkt.bth, padCount: 0 } };
      const body = Prober.bytes({ ...pkt, payload: new Uint8Array(0) });
      if (pkt.reth) body[12 + 12] = 0, body[12 + 13] = 0, body[12 + 14] = 0, body[12 + 15] = 0;
      body[1] = (body[1]! & 0xcf) | (3 << 4);
      c.p.sendBytes(body, 'good');
    }, 'request with PadCnt 3 and no pad bytes'),
  },
  {
    id: 'bad-tver',
    title: 'Transport header version other than 0',
    rule: 'IBTA Vol.1 §9.2 (BTH TVer) / §9.6.1: packets with an unsupported TVer are silently dropped',
    expected: 'no answer; ePSN unchanged',
    run: (c) => silentDrop(c, (P) => c.p.send(c.goodOp(P, { tver: 1 }).pkt), 'request with TVer 1'),
  },
  {
    id: 'wrong-pkey',
    title: 'P_Key of another partition',
    rule: 'IBTA Vol.1 §9.6.1.2 / §10.9.3 (P_Key check): a packet whose P_Key does not match the QP\'s partition (low 15 bits differ) is silently dropped',
    expected: 'no answer; ePSN unchanged',
    run: (c) => silentDrop(c, (P) => c.p.send(c.goodOp(P, { pkey: 0x1234 }).pkt), 'request with P_Key 0x1234'),
  },
  {
    id: 'pkey-limited-member',
    title: 'P_Key 0x7fff: limited member of the default partition',
    rule: 'IBTA Vol.1 §10.9.3 (P_Key matching): keys match when their low 15 bits are equal and at least one is a full member; 0x7fff matches the QP\'s 0xffff',
    expected: 'accepted and answered like a 0xffff request',
    async run(c) {
      const P = c.p.nextPsn;
      const op = c.goodOp(P, { pkey: 0x7fff });
      c.p.send(op.pkt);
      const r = await c.waitResponse((x) => Prober.isResponse(x));
      if (r && op.ok(r)) {
        c.p.nextPsn = psnAdd(P, 1);
        return pass(`${op.what} with P_Key 0x7fff answered: ${describeRx(r)}`);
      }
      return dev(`${op.what} with P_Key 0x7fff drew ${r ? describeRx(r) : 'no answer'}`);
    },
  },
  {
    id: 'unknown-qp',
    title: 'Destination QP that does not exist',
    rule: 'IBTA Vol.1 §9.6.1.2 (destination QP check): packets for an invalid QP are silently dropped',
    expected: 'no answer; the real QP unaffected',
    run: (c) => silentDrop(c, (P) => c.p.send(c.goodOp(P, { destQp: (c.p.peerQpn ^ 0x800001) & 0xffffff }).pkt), 'request to QP ' + 'peer^0x800001'),
  },
  {
    id: 'cnp-to-rc',
    title: 'CNP to an RC QP',
    rule: 'IBTA Annex A17.9.2 (CNP: BTH opcode 0x81, consumed by congestion control, no transport effect)',
    expected: 'no answer; no effect on the QP\'s PSNs',
    run: (c) => silentDrop(c, () => c.p.send(cnpPacket(c.p.peerQpn)), 'CNP'),
  },
  {
    id: 'zero-length-send',
    title: 'Zero-length SEND',
    rule: 'IBTA Vol.1 §9.4.1 (SEND: zero-length messages are valid, one packet)',
    expected: 'ACK with the PSN',
    requires: needRecv,
    async run(c) {
      const P = c.p.nextPsn;
      c.p.send(c.p.request('RC_SEND_ONLY', { psn: P }));
      const r = await c.waitResponse((x) => Prober.isResponse(x));
      if (r && isAck(r, P)) {
        c.p.nextPsn = psnAdd(P, 1);
        return pass(`ACK psn ${hex(P)}`);
      }
      return dev(`zero-length SEND drew ${r ? describeRx(r) : 'no answer'}`);
    },
  },
  {
    id: 'zero-length-write',
    title: 'Zero-length RDMA WRITE with a meaningless R_Key',
    rule: 'IBTA Vol.1 §9.4.4 / §9.7.4.1.6 (C9-88 area): a zero-length RDMA operation performs no R_Key or address check',
    expected: 'ACK with the PSN',
    requires: (s) => (s.access.includes('write') ? undefined : `the ${s.exchange} peer's QP does not allow RDMA WRITE`),
    async run(c) {
      const P = c.p.nextPsn;
      c.p.send(c.p.request('RC_RDMA_WRITE_ONLY', { psn: P, reth: { va: 0xdead0000n, rkey: 0xdeadbeef, dmaLength: 0 } }));
      const r = await c.waitResponse((x) => Prober.isResponse(x));
      if (r && isAck(r, P)) {
        c.p.nextPsn = psnAdd(P, 1);
        return pass(`ACK psn ${hex(P)}`);
      }
      return dev(`zero-length WRITE drew ${r ? describeRx(r) : 'no answer'}`);
    },
  },
  {
    id: 'zero-length-read',
    title: 'Zero-length RDMA READ with a meaningless R_Key',
    rule: 'IBTA Vol.1 §9.4.3 / §9.7.4.1.6 (C9-88 area): a zero-length READ is answered by one empty READ response, no R_Key check',
    expected: 'RDMA READ response Only with the PSN and no payload',
    requires: (s) => (s.access.includes('read') ? undefined : `the ${s.exchange} peer's QP does not allow RDMA READ`),
    async run(c) {
      const P = c.p.nextPsn;
      c.p.send(c.p.request('RC_RDMA_READ_REQUEST', { psn: P, reth: { va: 0xdead0000n, rkey: 0xdeadbeef, dmaLength: 0 } }));
      const r = await c.waitResponse((x) => Prober.isResponse(x));
      if (r?.parsed.ok && r.parsed.info.name === 'RC_RDMA_READ_RESPONSE_ONLY' && r.parsed.packet.bth.psn === P && r.parsed.packet.payload.length === 0) {
        c.p.nextPsn = psnAdd(P, 1);
        return pass(`empty READ response psn ${hex(P)}`);
      }
      if (r && !isNak(r, NAK_CODE.PSN_SEQUENCE_ERROR)) c.p.nextPsn = psnAdd(P, 1);
      return dev(`zero-length READ drew ${r ? describeRx(r) : 'no answer'}`);
    },
  },
  {
    id: 'psn-wrap',
    title: 'PSN wrap from 0xffffff to 0',
    rule: 'IBTA Vol.1 §9.7.1 (PSNs are 24-bit, modulo 2^24)',
    expected: 'requests at 0xfffffe, 0xffffff, 0x000000 all acknowledged in order',
    variant: () => ({ ourPsn: 0xfffffe }),
    async run(c) {
      const seen: string[] = [];
      for (const psn of [0xfffffe, 0xffffff, 0]) {
        if (c.p.nextPsn !== psn) return dev(`session did not start at 0xfffffe (next ${hex(c.p.nextPsn)})`);
        const op = c.goodOp(psn);
        c.p.send(op.pkt);
        const r = await c.waitResponse((x) => Prober.isResponse(x) && x.parsed.ok && x.parsed.packet.bth.psn === psn);
        if (!r || !op.ok(r)) return dev(`${op.what} psn ${hex(psn)} drew ${r ? describeRx(r) : 'no answer'} (after ${seen.join(', ') || 'nothing'})`);
        seen.push(hex(psn));
        c.p.nextPsn = psnAdd(psn, 1);
      }
      return pass(`answered ${seen.join(', ')}`);
    },
  },
];

/** WRITE (or READ, when WRITE is not allowed) with a bad R_Key or address: NAK remote access, memory untouched. */
/**
 * The implied-NAK case with a peer that keeps RDMA READs outstanding on its own (a perftest
 * READ client): with two of them unanswered, we answer only the later one. Its response PSN is
 * beyond the earlier READ, so the earlier READ's responses were lost: the peer must resend it.
 */
async function impliedNakOnReads(c: CaseCtx): Promise<Outcome> {
  c.p.autoAck = false;
  const q = c.p.peerPsn;
  const isRead = (r: Rx): boolean => r.parsed.ok && r.parsed.info.name === 'RC_RDMA_READ_REQUEST' && r.parsed.packet.bth.destQp === c.p.ourQpn;
  const rd = await c.waitResponse((r) => isRead(r) && r.parsed.ok && r.parsed.packet.bth.psn === q);
  const rd2 = rd ? await c.waitResponse((r) => isRead(r) && r.parsed.ok && psnDiff(r.parsed.packet.bth.psn, q) > 0) : undefined;
  const restore = (): void => {
    c.p.peerPsn = q;
    c.p.autoAck = true;
  };
  if (!rd?.parsed.ok || !rd2?.parsed.ok) {
    restore();
    return dev(`the peer did not keep two READs outstanding: ${rd ? describeRx(rd) : 'no READ at ' + hex(q)} / ${rd2 ? describeRx(rd2) : '-'}`);
  }
  const q2 = rd2.parsed.packet.bth.psn;
  const ackAt = c.p.now();
  for (const r of c.p.readResponses(q2, rd2.parsed.packet.reth?.dmaLength ?? 0)) c.p.send(r);
  const again = await c.waitResponse((r) => r !== rd && isRead(r) && r.parsed.ok && r.parsed.packet.bth.psn === q, c.t.responseMs * 2);
  // Answer the resent READ by hand, then let the auto-responder take the rest of the resent ones.
  const len = rd.parsed.packet.reth?.dmaLength ?? 0;
  for (const r of c.p.readResponses(q, len)) c.p.send(r);
  c.p.msn = (c.p.msn + 1) & 0xffffff;
  restore();
  c.p.peerPsn = psnAdd(q, c.p.readPackets(len));
  await sleep(c.t.quietMs);
  if (!again) return dev(`the READ psn ${hex(q)} was not resent after a READ response for psn ${hex(q2)}`);
  const tmo = c.s.timeout !== undefined ? expectedTimeoutMs(c) : undefined;
  const after = `${(again.at - ackAt).toFixed(1)} ms after the READ response for psn ${hex(q2)}`;
  if (tmo === undefined || again.at - rd.at < tmo) return pass(`READ psn ${hex(q)} resent ${after}${tmo !== undefined ? `, before its local ACK timeout (${tmo.toFixed(1)} ms)` : ''}`);
  return dev(`READ psn ${hex(q)} resent only ${(again.at - rd.at).toFixed(1)} ms after it was first sent (${after}): no sooner than the local ACK timeout (${tmo.toFixed(1)} ms) would have`);
}

function rkeyCase(id: string, title: string, what: string, target: (m: NonNullable<PeerSession['memory']>) => { va: bigint; rkey: number }): CaseDef {
  const original = pattern(16, 0x5c);
  return {
    id,
    title,
    rule: 'IBTA Vol.1 §9.7.4.1.6 (R_Key, bounds and rights checks), C9-88..C9-91; §9.9.3.1.3 (class C): NAK Remote Access Error, QP to Error, memory not modified',
    expected: `NAK Remote Access Error for ${what}; the memory untouched (checked by a READ on the next session, where possible)`,
    fatal: true,
    requires: needAnyMem,
    async run(c) {
      const m = c.s.memory!;
      const useWrite = c.s.access.includes('write');
      const t = target(m);
      if (useWrite) {
        // Known contents first, so "untouched" can be checked afterwards.
        const at = Number(t.va - m.va);
        if (at >= 0 && at + 16 <= m.length && !(await c.write(at, original))) return dev('the preparatory WRITE was not ACKed');
        if (t.rkey !== m.rkey && !(await c.write(OFF.rkey, original))) return dev('the preparatory WRITE was not ACKed');
      }
      const P = c.p.nextPsn;
      c.fresh();
      const len = id === 'out-of-bounds' ? 64 : 16;
      // The access must be one the QP allows, or the answer is about the QP (Invalid Request), not the R_Key.
      const kind = useWrite ? 'write' : c.s.access.includes('read') ? 'read' : 'atomic';
      const pkt = kind === 'write'
        ? c.p.request('RC_RDMA_WRITE_ONLY', { psn: P, reth: { va: t.va, rkey: t.rkey, dmaLength: len }, payload: pattern(len, 0x11) })
        : kind === 'read'
          ? c.p.request('RC_RDMA_READ_REQUEST', { psn: P, reth: { va: t.va, rkey: t.rkey, dmaLength: len } })
          // An atomic is 8 bytes: out of bounds means its address is past the end (aligned, as atomics must be).
          : c.p.request('RC_FETCH_ADD', { psn: P, atomicEth: { va: id === 'out-of-bounds' ? t.va + 64n : t.va, rkey: t.rkey, swapAdd: 1n, compare: 0n } });
      c.p.send(pkt);
      const r = await c.waitResponse((x) => Prober.isResponse(x));
      const op = kind === 'write' ? 'WRITE' : kind === 'read' ? 'READ' : 'FetchAdd';
      if (r && isNak(r, NAK_CODE.REMOTE_ACCESS_ERROR, P)) return pass(`${op} with ${what}: NAK REMOTE_ACCESS_ERROR psn ${hex(P)}`);
      return dev(`${op} with ${what} drew ${r ? describeRx(r) : 'no answer'} (expected NAK REMOTE_ACCESS_ERROR psn ${hex(P)})`);
    },
    async after(c, first) {
      if (!c.s.memoryPersists || !can(c.s, 'read') || !c.s.access.includes('write')) {
        c.note('memory not re-read: the next session has another buffer or no READ access');
        return first;
      }
      const m = c.s.memory!;
      const t = target(m);
      const at = t.rkey !== m.rkey ? OFF.rkey : Number(t.va - m.va);
      if (at < 0 || at + 16 > m.length) return first;
      const got = await c.read(at, 16);
      if (same(got, original)) return { ...first, observed: first.observed + '; memory untouched (READ on the next session)' };
      return dev(first.observed + `; memory now ${got ? Buffer.from(got).toString('hex') : '(READ failed)'}`);
    },
  };
}

function expectedTimeoutMs(c: CaseCtx): number {
  return (4.096 * 2 ** (c.s.timeout ?? 14)) / 1000;
}

function timeoutWindow(c: CaseCtx): number {
  return Math.max(1000, expectedTimeoutMs(c) * 8);
}

/** Sends a SEND and waits for the peer's own SEND in reply, without acknowledging it. */
async function provokePeerSend(c: CaseCtx): Promise<{ rx: Rx; psn: number } | undefined> {
  const P = c.p.nextPsn;
  c.p.autoAck = false;
  c.p.send(c.goodOp(P).pkt);
  const ack = await c.waitResponse((r) => isAck(r, P));
  if (ack) c.p.nextPsn = psnAdd(P, 1);
  // The peer's next request, not a late copy of one already acknowledged (older than the PSN
  // expected next from the peer).
  const rx = await c.waitResponse((r) => r.parsed.ok && r.parsed.info.request && r.parsed.packet.bth.destQp === c.p.ourQpn &&
    psnDiff(r.parsed.packet.bth.psn, c.p.peerPsn) >= 0, c.t.responseMs * 2);
  if (!rx?.parsed.ok) return undefined;
  return { rx, psn: rx.parsed.packet.bth.psn };
}

/**
 * `provokePeerSend`, then the rest of the peer's message: its first and last PSN, and a test for the
 * peer's requests; a deviation if it sent none or did not end it.
 */
async function provokeWholePeerSend(c: CaseCtx): Promise<{ first: { rx: Rx; psn: number }; last: number; ours: (r: Rx) => boolean } | Outcome> {
  const first = await provokePeerSend(c);
  if (!first) return dev('the peer did not answer our SEND with one of its own');
  const ours = (r: Rx): boolean => r.parsed.ok && r.parsed.info.request && r.parsed.packet.bth.destQp === c.p.ourQpn;
  const end = first.rx.parsed.ok && first.rx.parsed.info.end ? first.rx
    : await c.waitResponse((r) => ours(r) && r.parsed.ok && r.parsed.info.end && psnDiff(r.parsed.packet.bth.psn, first.psn) >= 0, c.t.responseMs * 2);
  if (!end?.parsed.ok) return dev(`the peer's request from psn ${hex(first.psn)} did not end`);
  return { first, last: end.parsed.packet.bth.psn, ours };
}

export const SUITES: Readonly<Record<string, readonly string[]>> = {
  all: CASES.map((c) => c.id),
  psn: ['psn-gap-nak-once', 'dup-send', 'dup-write', 'dup-read', 'dup-atomic', 'psn-wrap'],
  malformed: ['bad-icrc', 'truncated', 'bad-padcnt', 'bad-tver', 'wrong-pkey', 'pkey-limited-member', 'unknown-qp', 'cnp-to-rc'],
  errors: ['invalid-opcode-sequence', 'short-first', 'rkey-violation', 'out-of-bounds', 'missing-access', 'op-not-enabled', 'rnr'],
  requester: ['ghost-ack', 'ack-reserved-bit', 'read-response-to-send', 'implied-nak', 'ack-timeout', 'retry-exhaustion'],
  quick: ['psn-gap-nak-once', 'dup-send', 'bad-icrc', 'unknown-qp', 'zero-length-send'],
};

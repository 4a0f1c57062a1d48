/**
 * `explainCapture` on the real rdma_rxe captures: the sentences a learner relies on must be
 * true to the packets. Frame numbers below were checked against `roce decode` of each file.
 */

import t from 'tap';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { decodeCapture } from '../../src/analyze/decode.js';
import { explainCapture, parseFrameSelection, renderExplanation, type Explanation } from '../../src/analyze/explain.js';
import { describeMad } from '../../src/analyze/mad.js';
import { CM_REJ_REASON, cmMadBytes, cmMadHeader } from '../../src/cm/messages.js';
import { readCapture } from '../../src/pcap/reader.js';
import { parseFrame } from '../../src/wire/frame.js';

const FIX = join(import.meta.dirname, '../../../test/fixtures/rxe');

function explain(file: string, select?: string): Explanation {
  const bytes = readFileSync(join(FIX, file));
  return explainCapture(decodeCapture(bytes, { icrc: 'strict', port: 4791 }), select ? { select: parseFrameSelection(select) } : {});
}

/** The explanation of one frame as a single string. */
function frameText(e: Explanation, frame: number): string {
  const p = e.packets.find((x) => x.frame === frame);
  if (!p) throw new Error(`frame ${frame} not explained`);
  return [p.header, ...p.lines].join('\n');
}

t.test('rc_pingpong: messages, and ACKs matched to the PSNs they acknowledge', async (t) => {
  const e = explain('rc_pingpong.pcap');
  t.equal(e.total, 200);
  t.equal(e.badTotal, 0);
  t.match(frameText(e, 18), /^#18 {2}\+0\.000000 s {2}10\.77\.0\.3 → 10\.77\.0\.2 {2}RC_SEND_FIRST qp=0x000011 psn=0x5d2907/);
  t.match(frameText(e, 18), 'SEND First (RC, reliable connection): the first packet of a multi-packet SEND');
  t.match(frameText(e, 18), 'Starts message 1 of 10.77.0.3 → QP 0x000011 at PSN 0x5d2907.');
  t.match(frameText(e, 20), 'Packet 3 of message 1');
  t.match(frameText(e, 21), 'AckReq: asks the responder to acknowledge');
  t.match(frameText(e, 21), 'Ends message 1 of 10.77.0.3 → QP 0x000011: PSNs 0x5d2907–0x5d290a (4 × 1024 B), frames 18–21.');
  const ack = frameText(e, 22);
  t.match(ack, 'ACK for PSNs up to 0x5d290a, MSN 1: acknowledges PSNs 0x5d2907–0x5d290a (4 packets, frames 18–21), completing message 1 (SEND, 4 × 1024 B).');
  t.match(ack, 'AETH: syndrome 0x1f = ACK, credit code 31 (no end-to-end credit limit advertised)');
  // The other direction has its own PSNs and message numbers.
  t.match(frameText(e, 27), 'acknowledges PSNs 0x2d91f7–0x2d91fa (4 packets, frames 23–26), completing message 1');
  t.match(frameText(e, 42), 'ACK for PSNs up to 0x5d2912, MSN 3');
  t.match(frameText(e, 41), 'Ends message 3 of 10.77.0.3');
  const summary = e.summary.join('\n');
  t.match(summary, 'RC 10.77.0.2 QP 0x000011 ⇄ 10.77.0.3 QP 0x000012:');
  t.match(summary, '10.77.0.3 → 10.77.0.2 QP 0x000011: 20 messages (SEND ×20) in 80 request packets; responses: ACK ×20');
  t.match(summary, 'Packets per opcode: RC_SEND_FIRST ×40, RC_SEND_MIDDLE ×80, RC_SEND_LAST ×40, RC_ACKNOWLEDGE ×40.');
  t.match(summary, 'Retransmissions: 0.');
  t.ok(e.packets.every((p) => p.lines.at(-1) === 'ICRC ok.'));
});

t.test('both sides with the same QPN and PSN: state is keyed by direction', async (t) => {
  // rc_mtu4096: both QPs are 0x11 and both start at PSN 0x07fc22.
  const e = explain('rc_mtu4096.pcap');
  t.match(frameText(e, 19), 'acknowledges PSNs 0x07fc22–0x07fc25 (4 packets, frames 15–18)');
  t.match(frameText(e, 24), 'acknowledges PSNs 0x07fc22–0x07fc25 (4 packets, frames 20–23)');
  // …and its one spurious retransmission, and the responder's answer to it.
  t.match(frameText(e, 170), 'Duplicate of PSN 0x07fc5e (message 16, packet 1), first sent in frame 165, which the responder had already acknowledged (frame 169)');
  t.match(frameText(e, 171), 'repeats the ACK of frame 169; nothing new is acknowledged');
  t.match(frameText(e, 172), 'Starts message 16 of 10.77.0.2 → QP 0x000011', 'the other direction with the same PSN is new, not a duplicate');
  t.match(e.summary.join('\n'), 'Retransmissions: 4 (spurious, already acknowledged ×4).');
});

t.test('loss_write_bw: gaps, NAK PSN sequence errors and go-back-N', async (t) => {
  const e = explain('loss_write_bw.pcap');
  t.match(frameText(e, 62), 'RDMA WRITE First (RC, reliable connection): the first packet of a multi-packet RDMA WRITE; its RETH says where the whole write lands: 8192 bytes at 0x55eafe92a000 under R_Key 0x000002ad');
  t.match(frameText(e, 70), 'PSN gap: expected 0x106196, got 0x106197: 1 packet (PSN 0x106196) never reached this capture point.');
  const nak = frameText(e, 74);
  t.match(nak, 'AETH: syndrome 0x60 = NAK, code 0 (PSN_SEQUENCE_ERROR); MSN 5');
  t.match(nak, 'NAK PSN sequence error: the responder expected PSN 0x106196; it got a later one instead (PSN 0x106197 in frame 70)');
  t.match(nak, 'resend everything from 0x106196 on (go-back-N)');
  t.match(nak, 'The requester goes back to PSN 0x106196 in frame 76');
  t.match(frameText(e, 76), 'Retransmission of PSN 0x106196 (message 6, packet 1), whose first transmission never reached this capture point (the PSN gap seen at frame 70): go-back-N after the NAK in frame 74');
  t.match(frameText(e, 77), 'Retransmission of PSN 0x106197 (message 6, packet 2), first sent in frame 70: go-back-N after the NAK in frame 74');
  t.match(frameText(e, 75), 'Packet 6 of message 6', 'sent before the requester saw the NAK: still new');
  t.match(frameText(e, 81), 'Retransmission of PSN 0x10619b (message 6, packet 6), first sent in frame 75: go-back-N after the NAK in frame 74');
  t.match(frameText(e, 86), 'ACK for PSNs up to 0x10619d, MSN 6: acknowledges PSNs 0x106196–0x10619d');
  t.match(frameText(e, 87), 'It also acknowledges PSN 0x10619e (frame 84).');
  t.match(frameText(e, 101), 'go-back-N after the NAK in frame 87 (the responder wanted 0x10619f next). It resumes mid-message');
  // A packet of the resend itself is lost, and the next NAK names it.
  t.match(frameText(e, 111), 'PSN gap in the resend: expected 0x1061a8, got 0x1061a9');
  t.match(frameText(e, 113), 'the responder expected PSN 0x1061a8; it got a later one instead (PSN 0x1061a9 in frame 111)');
  t.match(frameText(e, 114), 'go-back-N after the NAK in frame 87', 'the older resend goes on until the requester reacts to the new NAK');
  t.match(frameText(e, 117), 'Retransmission of PSN 0x1061a8 (message 8, packet 3), first sent in frame 95: go-back-N after the NAK in frame 113');
  const summary = e.summary.join('\n');
  t.match(summary, 'NAKs: NAK PSN_SEQUENCE_ERROR ×5.');
  t.match(summary, 'Retransmissions: 39 (go-back-N after a NAK ×39).');
  t.match(summary, 'PSN gaps: 6 (6 packets never reached the capture point).');
  t.match(summary, '20 messages (RDMA WRITE ×20)');
});

t.test('rnr_rc: the RNR NAK timer, the wait and the retry', async (t) => {
  const e = explain('rnr_rc.pcap');
  const rnr = frameText(e, 12);
  t.match(rnr, 'AETH: syndrome 0x36 = RNR NAK, timer code 22 = wait at least 20.48 ms; MSN 0');
  t.match(rnr, 'RNR NAK (receiver not ready) for PSN 0x7ae173 (the SEND first sent in frame 11): the responder had no receive buffer posted for it. The requester waits at least 20.48 ms (timer code 22)');
  t.match(rnr, /The requester retries this SEND in frame 13, \d+\.\d\d ms later\./);
  t.match(frameText(e, 13), /Retry 1 of PSN 0x7ae173 \(message 1\), first sent in frame 11: after the RNR NAK in frame 12 the requester waited \d+\.\d\d ms \(the NAK asked for at least 20\.48 ms\)\./);
  t.match(frameText(e, 14), 'RNR NAK again for PSN 0x7ae173 (the SEND first sent in frame 11), 2nd in a row since frame 12');
  t.match(frameText(e, 21), 'Retry 5 of PSN 0x7ae173');
  t.match(frameText(e, 22), 'acknowledges PSN 0x7ae173 (frame 11), completing message 1 (SEND, 64 B)');
  t.match(frameText(e, 22), 'the 5 RNR NAKs since frame 12 are over');
  t.match(frameText(e, 11), 'ImmDt 0x01020304: 4 bytes handed to the receiver in its work completion');
  const summary = e.summary.join('\n');
  t.match(summary, 'NAKs: RNR NAK ×5.');
  t.match(summary, /RNR waits: 5, each asking for at least 20\.48 ms; measured waits \d+\.\d\d–\d+\.\d\d ms\./);
  t.match(summary, 'Retransmissions: 5 (retry after an RNR NAK ×5).');
  // Every measured wait honours the timer.
  for (const p of e.packets) {
    const m = /waited (\d+\.\d\d) ms/.exec(p.lines.join(' '));
    if (m) t.ok(Number(m[1]) >= 20.48, `frame ${p.frame} waited ${m[1]} ms`);
  }
});

t.test('read_bw: READ responses matched to their request', async (t) => {
  const e = explain('read_bw.pcap');
  t.match(frameText(e, 23), 'asks the responder for 65536 bytes of its memory at 0x7f43f4a34000 under R_Key 0x000002c2');
  t.match(frameText(e, 23), 'Answered in frames 26–89.');
  t.match(frameText(e, 24), 'It reserves PSNs 0x498ce8–0x498d27 for its 64 response packets (PMTU 1024); the next request from this side uses PSN 0x498d28.');
  t.match(frameText(e, 26), 'Response 1 of 64 to the READ request in frame 23 (PSN 0x498ca8): bytes 0–1023 of 65536.');
  t.match(frameText(e, 28), 'Response 3 of 64 to the READ request in frame 23 (PSN 0x498ca8): bytes 2048–3071 of 65536.');
  t.match(frameText(e, 89), 'Response 64 of 64 to the READ request in frame 23');
  t.match(frameText(e, 89), 'Completes that READ: 65536 bytes in 64 packets, frames 26–89');
  t.match(frameText(e, 90), 'Response 1 of 64 to the READ request in frame 24 (PSN 0x498ce8)');
  t.match(frameText(e, 96), 'Response 6 of 64 to the READ request in frame 24', 'a new READ request in between does not confuse the count');
  t.match(e.summary.join('\n'), 'PSN gaps: 0.', 'the PSNs a READ reserves are not a gap');
});

t.test('atomics: the ATOMIC Acknowledge matched to its request, with the original value', async (t) => {
  const cas = explain('atomic_cas.pcap');
  t.match(frameText(cas, 23), 'CmpSwap (RC, reliable connection): if the 8 bytes at 0x5597e9b77000 under R_Key 0x000002ff equal 0x0, replace them with 0x0');
  t.match(frameText(cas, 43), 'Answers the CmpSwap in frame 23 (PSN 0x3d41ce): the original value at 0x5597e9b77000 was 0x6b624512e2e367b4; it differs from the compare value 0x0, so nothing was swapped.');
  t.match(frameText(cas, 23), 'Answered in frame 43: the original value was 0x6b624512e2e367b4.');
  const faa = explain('atomic_faa.pcap');
  t.match(frameText(faa, 43), 'Answers the FetchAdd in frame 23 (PSN 0x71767a): the original value at 0x564e847a3000 was 0xce2301baedfe9b27; the memory now holds 0xce2301baedfe9b28 (original + 0x1).');
});

t.test('rping: CM MADs to QP1, and the QPs and PSNs they announce', async (t) => {
  const e = explain('rping.pcap');
  const names: [number, string][] = [
    [4, 'ConnectRequest (0x0010)'], [5, 'ConnectReply (0x0013)'], [6, 'ReadyToUse (0x0014)'],
    [247, 'DisconnectRequest (0x0015)'], [248, 'DisconnectReply (0x0016)'],
  ];
  for (const [frame, attr] of names) {
    const s = frameText(e, frame);
    t.match(s, 'A Communication Management MAD to QP1, the GSI (General Services Interface): see IBTA ch. 12.');
    t.match(s, `MAD: base version 1, class 0x07 Communication Management v2, method Send (0x03), attribute ${attr}`);
    t.match(s, 'DETH: Q_Key 0x80010000, the well-known GSI Q_Key');
  }
  t.match(frameText(e, 4), 'The active side asks to connect: 10.77.0.3 offers its QP 0x000011 and expects the first request it receives there to carry PSN 0x9da108; service ID 0x0000000001061c06 (RDMA CM, TCP port 7174); path MTU 1024.');
  t.match(frameText(e, 5), '10.77.0.2 offers its QP 0x000011 and expects the first request it receives there to carry PSN 0x31ede7');
  t.match(frameText(e, 7), 'QP 0x000011 is the QP 10.77.0.2 offered in its ConnectReply (frame 5), and PSN 0x31ede7 the starting PSN it said to expect.');
  t.match(frameText(e, 9), 'QP 0x000011 is the QP 10.77.0.3 offered in its ConnectRequest (frame 4), and PSN 0x9da108 the starting PSN it said to expect.');
  t.match(frameText(e, 10), 'The whole answer to the READ request in frame 9 (PSN 0x9da108): 64 bytes from 0x556a231dcd50.');
  t.match(e.summary.join('\n'), 'CM MADs: ConnectRequest ×1, ConnectReply ×1, ReadyToUse ×1, DisconnectRequest ×1, DisconnectReply ×1.');

  // The MAD decoder on its own.
  const rec = [...decodeCapture(readFileSync(join(FIX, 'rping.pcap')), { icrc: 'off', port: 4791 })].find((d) => d.frame === 247)!;
  const r = describeMad(rec.packet!.payload);
  t.match(r, { ok: true, mad: { header: { baseVersion: 1, mgmtClass: 7, classVersion: 2, method: 3, attributeId: 0x15 }, attributeName: 'DisconnectRequest', cm: { kind: 'DREQ', remoteQpn: 0x11 } } });
  t.match(describeMad(new Uint8Array(10)), { ok: false, error: 'TOO_SHORT' });
});

t.test('rping with its REP replaced by a REJ, and a short MAD', async (t) => {
  const frames = [...decodeCapture(readFileSync(join(FIX, 'rping.pcap')), { icrc: 'off', port: 4791 })];
  const rep = frames.find((d) => d.frame === 5)!.packet!;
  rep.payload.set(cmMadBytes({
    header: cmMadHeader('REJ', 0x299ee5ca1n),
    msg: {
      kind: 'REJ', localCommId: 1, remoteCommId: 2, messageRejected: 0, rejectedInfoLength: 0,
      reason: CM_REJ_REASON.INVALID_SERVICE_ID, ari: new Uint8Array(0), privateData: new Uint8Array(0),
    },
  }));
  const rtu = frames.find((d) => d.frame === 6)!.packet!;
  rtu.payload = rtu.payload.subarray(0, 100);
  const e = explainCapture(frames);
  t.match(frameText(e, 5), 'attribute ConnectReject (0x0012)');
  t.match(frameText(e, 5), 'The connection is refused: reason 8 (Invalid Service ID).');
  t.match(frameText(e, 6), 'Its payload is too short to be a MAD (100 bytes; every MAD is 256), so QP1 drops it.');
});

t.test('UD: Q_Key and source QP from the DETH', async (t) => {
  const e = explain('ud_pingpong.pcap');
  const s = frameText(e, 15);
  t.match(s, 'SEND Only (UD, unreliable datagram)');
  t.match(s, 'DETH: Q_Key 0x11111111, the receiving QP accepts the datagram only if this matches its own Q_Key; source QP 0x000011, where a reply would go.');
  t.match(s, 'Datagram 1 from 10.77.0.3 QP 0x000011 to 10.77.0.2 QP 0x000011: 512 bytes. UD is never acknowledged');
  t.match(e.summary.join('\n'), 'UD 10.77.0.3 QP 0x000011 → 10.77.0.2 QP 0x000011: 20 datagrams');
});

t.test('IPv6 addresses', async (t) => {
  const e = explain('v6_rc_pingpong.pcap');
  t.match(frameText(e, 28), /^#28 {2}\+0\.000000 s {2}fd77::3 → fd77::2 {2}RC_SEND_FIRST/);
  t.match(frameText(e, 32), 'acknowledges PSNs 0xdff76d–0xdff770 (4 packets, frames 28–31)');
  t.match(e.summary.join('\n'), 'RC fd77::2 QP 0x000011 ⇄ fd77::3 QP 0x000011:');
});

t.test('immediate data and invalidate, UC', async (t) => {
  const e = explain('imm_rc.pcap');
  const inv = e.packets.find((p) => p.header.includes('RC_SEND_LAST_WITH_INVALIDATE'))!;
  t.match(inv.lines.join('\n'), /IETH: once the message is placed, the receiver invalidates R_Key 0x[0-9a-f]{8}/);
  const wimm = e.packets.find((p) => p.header.includes('RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE'))!;
  t.match(wimm.lines[0]!, 'with 4 bytes of immediate data for the receiver (so this WRITE does consume a receive buffer)');
  const uc = explain('uc_pingpong.pcap');
  t.match(uc.packets.find((p) => p.header.includes('UC_SEND_LAST'))!.lines.join('\n'), 'UC: no acknowledgement will come');
});

t.test('timeouts: a peer that never answers', async (t) => {
  const e = explain('hostpeer_listen.pcap');
  const re = e.packets.find((p) => p.lines.some((l) => l.startsWith('Retransmission 2 of PSN 0x9a35fc')))!;
  t.match(re.lines.join('\n'), /after its previous send in frame \d+, with no ACK or NAK in between: the requester's retry timer expired/);
  t.match(e.summary.join('\n'), 'no response to its requests in the capture');
});

t.test('--frames: selection prints some frames but tracks all', async (t) => {
  const sel = parseFrameSelection('3,5-7,100-');
  t.same([1, 3, 4, 5, 7, 8, 99, 100, 5000].filter(sel), [3, 5, 7, 100, 5000]);
  t.throws(() => parseFrameSelection('a-b'), RangeError);
  t.throws(() => parseFrameSelection('9-3'), RangeError);
  t.throws(() => parseFrameSelection('0'), RangeError);
  t.throws(() => parseFrameSelection(''), RangeError);
  const e = explain('rc_pingpong.pcap', '22');
  t.same(e.packets.map((p) => p.frame), [22]);
  t.match(frameText(e, 22), 'acknowledges PSNs 0x5d2907–0x5d290a (4 packets, frames 18–21)', 'relations use the frames not printed');
  t.equal(e.total, 200);
  const some = explain('rc_pingpong.pcap', '18-30');
  t.same(some.packets.map((p) => p.frame), [18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30]);
  const text = renderExplanation(some);
  t.equal(text[0], some.packets[0]!.header);
  t.match(text[1]!, /^ {4}SEND First/);
});

t.test('a corrupted packet: ICRC bad, no part in the connection', async (t) => {
  const bytes = new Uint8Array(readFileSync(join(FIX, 'rnr_rc.pcap')));
  const at = [...readCapture(bytes)].flatMap((rec) => {
    const f = parseFrame(rec.linkType, rec.data);
    return f.ok && f.frame.udp.dstPort === 4791 ? [{ frame: rec.frame, off: rec.data.byteOffset + f.frame.payloadOffset + (f.frame.payloadLength >> 1) }] : [];
  })[2]!;
  const bad = bytes.slice();
  bad[at.off]! ^= 0x01;
  const e = explainCapture(decodeCapture(bad, { icrc: 'strict', port: 4791 }));
  t.equal(e.badTotal, 1);
  t.equal(e.badSelected, 1);
  const p = e.packets.find((x) => x.frame === at.frame)!;
  t.equal(p.good, false);
  t.match(p.lines.join('\n'), 'A receiver drops it before looking at the PSN');
  t.match(p.lines.at(-1)!, /^ICRC bad/);
  t.match(e.summary.join('\n'), 'bad ICRC: 1');
  const off = explainCapture(decodeCapture(bad, { icrc: 'off', port: 4791 }));
  t.equal(off.badTotal, 0);
  t.equal(off.packets[0]!.lines.at(-1), 'ICRC not checked (--icrc off).');
});

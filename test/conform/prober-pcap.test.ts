/**
 * The prober's pcaps (saved with each deviation and fuzz finding) must check strictly in Wireshark
 * and `roce decode`. The peer's IPv4 ID never reaches us through the socket, and rxe numbers its
 * packets, so the prober writes the ID that the ICRC implies; a packet whose ICRC is broken keeps
 * ID 0, and stays bad.
 */
import dgram from 'node:dgram';
import t from 'tap';
import { Prober, sleep } from '../../src/conform/prober.js';
import { readCapture } from '../../src/pcap/reader.js';
import { parseFrame } from '../../src/wire/frame.js';
import { checkIcrcOfIpDatagram, icrcOfUdpPayload, writeIcrc } from '../../src/wire/icrc.js';
import { opcodeOf } from '../../src/wire/opcode.js';
import { emitPacket, packetLength, type RocePacket } from '../../src/wire/packet.js';

/** An RC SEND ONLY whose ICRC is right for the given IPv4 ID, as rxe would send it. */
function sendOnly(destQp: number, srcPort: number, dstPort: number, ipId: number): Uint8Array {
  const p: RocePacket = {
    bth: {
      opcode: opcodeOf('RC_SEND_ONLY'), se: false, m: false, padCount: 0, tver: 0, pkey: 0xffff, fecn: false, becn: false, resv6: 0,
      destQp, ackReq: true, resv7: 0, psn: 0x1234,
    },
    payload: new Uint8Array(16).fill(0x5e), icrc: 0,
  };
  const b = new Uint8Array(packetLength(p));
  emitPacket(p, b, 0);
  writeIcrc(b, icrcOfUdpPayload({
    family: 4, srcAddr: Uint8Array.of(127, 0, 0, 2), dstAddr: Uint8Array.of(127, 0, 0, 1), srcPort, dstPort, ipId, ipFlagsFrag: 0x4000,
  }, b));
  return b;
}

t.test('received IPv4 packets are written with the ID their ICRC implies', async (t) => {
  const peer = dgram.createSocket('udp4');
  await new Promise<void>((resolve) => peer.bind(0, '127.0.0.2', resolve));
  const peerPort = peer.address().port;
  const prober = await Prober.open({ bind: '127.0.0.1', port: 0, peer: { address: '127.0.0.2', port: peerPort } });
  t.teardown(async () => {
    await prober.close();
    peer.close();
  });
  const ourPort = prober.link.local.port;
  const from = prober.mark();
  const good = sendOnly(prober.ourQpn, peerPort, ourPort, 0x7a31);
  const broken = sendOnly(prober.ourQpn, peerPort, ourPort, 0x0102);
  broken[16] = broken[16]! ^ 0x01;
  for (const d of [good, broken]) peer.send(d, ourPort, '127.0.0.1');
  // The prober answers the good SEND with an ACK of its own: three packets in all.
  const rxCount = (): number => prober.log.slice(from.log).filter((l) => l.dir === 'rx').length;
  for (let i = 0; i < 200 && rxCount() < 2; i++) await sleep(10);
  t.equal(rxCount(), 2, 'both datagrams logged');

  const frames = [...readCapture(prober.pcap(from))].map((r) => {
    const f = parseFrame(r.linkType, r.data);
    if (!f.ok) throw new Error(`frame ${r.frame}: ${f.error}`);
    return { ...f.frame, data: r.data };
  });
  const fromPeer = frames.filter((f) => f.ip.src[3] === 2);
  const ours = frames.filter((f) => f.ip.src[3] === 1);
  t.equal(fromPeer.length, 2);
  const [a, b] = fromPeer;
  t.equal(a!.ip.family === 4 && a!.ip.id, 0x7a31, 'the ID the sender used, recovered from the ICRC');
  t.equal(checkIcrcOfIpDatagram(a!.data, a!.ipOffset).status, 'ok', 'checks strictly');
  t.equal(b!.ip.family === 4 && b!.ip.id, 0, 'a broken ICRC implies no ID: 0, as written before');
  t.equal(checkIcrcOfIpDatagram(b!.data, b!.ipOffset).status, 'bad', 'and the packet stays bad');
  t.ok(ours.length >= 1, 'our ACK is in the capture too');
  for (const f of ours) t.equal(checkIcrcOfIpDatagram(f.data, f.ipOffset).status, 'ok', 'ours: ID 0 with DF, as sent');
});

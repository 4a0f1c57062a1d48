/**
 * From a capture to RoCEv2 packets: link layer → IP → UDP (destination port 4791 by
 * default; the source port says nothing, hardware uses any) → transport packet → ICRC
 * verdict. Shared by `roce decode`, `roce explain` and the tests that compare us with tshark.
 */

import { aethKind, aethValue, nakCodeName, RNR_TIMER_US, CREDIT_COUNT } from '../wire/aeth.js';
import { ROCEV2_UDP_PORT } from '../wire/constants.js';
import { formatIpAddress, parseFrame, type ParsedFrame } from '../wire/frame.js';
import { checkIcrc, checkIcrcOfIpDatagram, type IcrcCheck, type IcrcMode, type IcrcStatus } from '../wire/icrc.js';
import { opcodeName, opcodeTransport } from '../wire/opcode.js';
import { parsePacket, type PacketErrorCode, type RocePacket } from '../wire/packet.js';
import { readCapture } from '../pcap/reader.js';

export interface DecodeOptions {
  icrc: IcrcMode;
  /** UDP destination port that marks RoCEv2. */
  port: number;
}

export const DEFAULT_DECODE_OPTIONS: DecodeOptions = { icrc: 'strict', port: ROCEV2_UDP_PORT };

export interface DecodedFrame {
  frame: number;
  timestampNs: bigint;
  src: string;
  dst: string;
  sport: number;
  dport: number;
  family: 4 | 6;
  /** IPv4 Identification, when the capture shows the IP header. */
  ipId?: number;
  /** The parsed transport packet, or why it is malformed. */
  packet?: RocePacket;
  error?: { code: PacketErrorCode | 'CAPTURE_TRUNCATED'; detail: string };
  /** The opcode byte, even when the packet did not parse. */
  opcode?: number;
  icrc: IcrcCheck;
  /** The UDP payload (BTH … ICRC), a view into the capture. */
  udpPayload: Uint8Array;
}

/** A packet is good when it parsed and its ICRC is ok, recovered or unchecked by choice. */
export function isGood(d: DecodedFrame): boolean {
  return d.packet !== undefined && d.icrc.status !== 'bad';
}

/**
 * Yields every RoCEv2 frame of a capture in order. Throws only `CaptureError` (unreadable or
 * truncated capture container); everything wrong inside a frame is reported in the frame.
 */
export function* decodeCapture(bytes: Uint8Array, opts: DecodeOptions = DEFAULT_DECODE_OPTIONS): Generator<DecodedFrame> {
  for (const rec of readCapture(bytes)) {
    const f = parseFrame(rec.linkType, rec.data);
    if (!f.ok || f.frame.udp.dstPort !== opts.port) continue;
    yield decodeFrame(rec.frame, rec.timestampNs, rec.data, f.frame, rec.data.length < rec.originalLength, opts.icrc);
  }
}

function decodeFrame(frameNo: number, ts: bigint, data: Uint8Array, fr: ParsedFrame, cut: boolean, mode: IcrcMode): DecodedFrame {
  const payload = data.subarray(fr.payloadOffset, fr.payloadOffset + fr.payloadLength);
  const d: DecodedFrame = {
    frame: frameNo,
    timestampNs: ts,
    src: formatIpAddress(fr.ip.src),
    dst: formatIpAddress(fr.ip.dst),
    sport: fr.udp.srcPort,
    dport: fr.udp.dstPort,
    family: fr.ip.family,
    icrc: { status: 'unchecked', value: 0 },
    udpPayload: payload,
  };
  if (fr.ip.family === 4) d.ipId = fr.ip.id;
  if (payload.length > 0) d.opcode = payload[0]!;
  if (cut) {
    d.error = { code: 'CAPTURE_TRUNCATED', detail: 'the capture holds only part of this frame (snap length)' };
    return d;
  }
  const r = parsePacket(payload);
  if (r.ok) d.packet = r.packet;
  else d.error = { code: r.error, detail: r.detail };
  d.icrc = judgeIcrc(data, fr, payload, mode);
  return d;
}

function judgeIcrc(data: Uint8Array, fr: ParsedFrame, payload: Uint8Array, mode: IcrcMode): IcrcCheck {
  if (mode === 'off') return { status: 'unchecked', value: payload.length >= 4 ? readLe32(payload, payload.length - 4) : 0 };
  // strict: the capture shows the real IP header, so use it as is.
  if (mode === 'strict') return checkIcrcOfIpDatagram(data.subarray(fr.ipOffset, fr.payloadOffset + fr.payloadLength));
  // recover: judge the packet from what a UDP socket would know, with the IP ID hidden.
  return checkIcrc(
    { family: fr.ip.family, srcAddr: fr.ip.src, dstAddr: fr.ip.dst, srcPort: fr.udp.srcPort, dstPort: fr.udp.dstPort },
    payload,
    'recover',
  );
}

function readLe32(b: Uint8Array, o: number): number {
  return (b[o]! | (b[o + 1]! << 8) | (b[o + 2]! << 16) | (b[o + 3]! << 24)) >>> 0;
}

const hex64 = (v: bigint): string => '0x' + v.toString(16).padStart(16, '0');

/**
 * The JSON shape of `roce decode --json`: every BTH field by name, one object per extension
 * header present, 64-bit values as hex strings (JSON numbers lose precision above 2^53).
 */
export function toJsonRecord(d: DecodedFrame): Record<string, unknown> {
  const o: Record<string, unknown> = {
    frame: d.frame,
    src: d.src,
    dst: d.dst,
    sport: d.sport,
    dport: d.dport,
  };
  if (d.opcode !== undefined) {
    o['opcode'] = d.opcode;
    o['opname'] = opcodeName(d.opcode);
    o['transport'] = opcodeTransport(d.opcode);
  }
  const p = d.packet;
  if (p) {
    const b = p.bth;
    Object.assign(o, {
      se: b.se, m: b.m, padCount: b.padCount, tver: b.tver, pkey: b.pkey, fecn: b.fecn, becn: b.becn,
      destQp: b.destQp, ackReq: b.ackReq, psn: b.psn,
    });
    if (p.deth) o['deth'] = { qkey: p.deth.qkey, srcQp: p.deth.srcQp };
    if (p.feth) o['feth'] = { ...p.feth };
    if (p.reth) o['reth'] = { va: hex64(p.reth.va), rkey: p.reth.rkey, dmaLength: p.reth.dmaLength };
    if (p.atomicEth) {
      o['atomicEth'] = { va: hex64(p.atomicEth.va), rkey: p.atomicEth.rkey, swapAdd: hex64(p.atomicEth.swapAdd), compare: hex64(p.atomicEth.compare) };
    }
    if (p.aeth) o['aeth'] = aethJson(p.aeth.syndrome, p.aeth.msn);
    if (p.atomicAckEth) o['atomicAckEth'] = { originalData: hex64(p.atomicAckEth.originalData) };
    if (p.immDt) o['immDt'] = { data: p.immDt.data };
    if (p.ieth) o['ieth'] = { rkey: p.ieth.rkey };
    o['payloadLength'] = p.payload.length;
  }
  if (d.error) o['error'] = d.error;
  const icrc: Record<string, unknown> = { value: d.icrc.value, status: d.icrc.status as IcrcStatus };
  if (d.icrc.status === 'ok-recovered' && d.icrc.ipId !== undefined) icrc['ipId'] = d.icrc.ipId;
  o['icrc'] = icrc;
  return o;
}

function aethJson(syndrome: number, msn: number): Record<string, unknown> {
  const kind = aethKind(syndrome);
  const v = aethValue(syndrome);
  const o: Record<string, unknown> = { syndrome, kind, msn };
  if (kind === 'ACK') {
    o['creditCode'] = v;
    o['credits'] = v === 31 ? 'unlimited' : CREDIT_COUNT[v];
  } else if (kind === 'RNR_NAK') {
    o['timerCode'] = v;
    o['timerUs'] = RNR_TIMER_US[v];
  } else if (kind === 'NAK') {
    o['nakCode'] = v;
    o['nakName'] = nakCodeName(v);
  }
  return o;
}

/**
 * `roce explain`: a capture walked packet by packet in plain words, for people learning RDMA.
 *
 * For every RoCEv2 packet: what its opcode does (from the opcode table, not per-opcode prose),
 * what its notable header fields mean here, and how it relates to earlier packets of the same
 * connection — which request packets an ACK acknowledges, which message a packet belongs to,
 * which READ request a response answers, whether it is a retransmission and why (go-back-N
 * after a NAK, a retry after an RNR NAK, a timeout, a spurious resend), and which PSNs never
 * reached the capture point. A short summary follows.
 *
 * State is kept per direction — (source address, destination address, destination QP) —
 * because both sides of a test often pick the same QPN and the same starting PSN. A response
 * travels the reverse direction of the requests it answers; the two directions of one RC
 * connection are paired the first time a response names a PSN of the requests.
 *
 * Pure: takes decoded frames, returns lines. Read first: IBTA Vol. 1 §9.7 (reliable service:
 * ACKs, NAKs, PSN checks, go-back-N), §9.7.5.2.8 (RNR NAK), §9.4.3–9.4.5 (READ and atomics).
 */

import { aethKind, aethValue, CREDIT_COUNT, CREDIT_UNLIMITED, NAK_CODE, nakCodeName, RNR_TIMER_US } from '../wire/aeth.js';
import { hex24, hex32 } from '../wire/bytes.js';
import { DEFAULT_PKEY, GSI_QKEY, PATH_MTUS } from '../wire/constants.js';
import { opcodeInfo, opcodeName, type OpcodeInfo, type OpKind, type Position, type Transport } from '../wire/opcode.js';
import type { RocePacket } from '../wire/packet.js';
import { formatPacket } from '../wire/pretty.js';
import { psnAdd, psnDiff } from '../wire/psn.js';
import type { DecodedFrame } from './decode.js';
import { MGMT_CLASS } from '../cm/mad.js';
import { CM_ATTR, CM_REJ_REASON, mtuOfCode, rejReasonName } from '../cm/messages.js';
import { describeMad, describeServiceId, type NamedMad } from './mad.js';

export interface ExplainOptions {
  /** Which frames to print; every frame is still tracked so relations stay right. */
  select?: (frame: number) => boolean;
}

export interface ExplainedPacket {
  frame: number;
  /** `#18  +0.000412 s  10.77.0.3 → 10.77.0.2  RC_SEND_FIRST qp=0x000011 psn=0x5d2907 payload=1024` */
  header: string;
  /** What the opcode does, what its fields mean, how it relates to other packets, the ICRC verdict. */
  lines: string[];
  /** Well formed with an ICRC that is ok, recovered or unchecked by choice. */
  good: boolean;
}

export interface Explanation {
  packets: ExplainedPacket[];
  summary: string[];
  /** RoCEv2 packets in the capture, printed or not. */
  total: number;
  /** Printed packets that are malformed or carry a bad ICRC. */
  badSelected: number;
  /** All packets that are malformed or carry a bad ICRC. */
  badTotal: number;
}

/** The rendered text: each packet's header, its lines indented, a blank line; then the summary. */
export function renderExplanation(e: Explanation): string[] {
  const out: string[] = [];
  for (const p of e.packets) {
    out.push(p.header);
    for (const l of p.lines) out.push('    ' + l);
    out.push('');
  }
  out.push(...e.summary);
  return out;
}

/**
 * `1-20`, `7`, `100-`, `3,5,9-12`: which frames to print. Throws RangeError on anything else.
 */
export function parseFrameSelection(spec: string): (frame: number) => boolean {
  const parts = spec.split(',').map((s) => s.trim());
  const ranges: [number, number][] = [];
  for (const part of parts) {
    const m = /^(\d+)(?:(-)(\d*))?$/.exec(part);
    if (!m) throw new RangeError(`--frames: '${part}' is not N, N-M, N- or a comma-separated list of them`);
    const lo = Number(m[1]);
    const hi = m[2] === undefined ? lo : m[3] === '' || m[3] === undefined ? Infinity : Number(m[3]);
    if (lo < 1 || hi < lo) throw new RangeError(`--frames: '${part}' is an empty range (frames are numbered from 1)`);
    ranges.push([lo, hi]);
  }
  return (f) => ranges.some(([lo, hi]) => f >= lo && f <= hi);
}

// ---------------------------------------------------------------------------------------------
// What each opcode does: built from the opcode table's kind, position and transport.

const TRANSPORT_WORDS: Readonly<Record<Transport, string>> = {
  RC: 'reliable connection', UC: 'unreliable connection', RD: 'reliable datagram', UD: 'unreliable datagram',
  CNP: 'congestion control', XRC: 'extended reliable connection',
};

/** The noun of a message kind, and what the whole operation does (said on its first packet). */
const KIND_WORDS: Readonly<Record<OpKind, { noun: string; does: string }>> = {
  send: { noun: 'SEND', does: 'the message lands in the next receive buffer the receiver posted and completes a receive work request there' },
  write: { noun: 'RDMA WRITE', does: "the data goes straight into the responder's memory; its CPU is not involved and no receive buffer is used" },
  readRequest: { noun: 'RDMA READ', does: 'the responder answers with READ response packets that carry the data back; the request itself carries none' },
  readResponse: { noun: 'RDMA READ response', does: 'carries data back to the requester that asked for it with a READ request' },
  ack: { noun: 'Acknowledge', does: 'the responder tells the requester how far it got; the AETH syndrome makes it an ACK, an RNR NAK or a NAK' },
  atomicAck: { noun: 'ATOMIC Acknowledge', does: 'answers an atomic request with the 8-byte value the memory held before the operation' },
  atomic: { noun: 'atomic', does: 'an indivisible read-modify-write of 8 bytes of responder memory; the answer brings back the old value' },
  flush: { noun: 'FLUSH', does: 'asks the responder to make earlier RDMA WRITEs to a region visible or persistent' },
  atomicWrite: { noun: 'ATOMIC WRITE', does: 'writes 8 bytes of responder memory in one indivisible store' },
  cnp: { noun: 'CNP', does: 'a congestion notification: the receiver of ECN-marked packets asks their sender to slow down (RoCEv2 Annex A17.9)' },
};

const MULTI_PACKET: ReadonlySet<OpKind> = new Set<OpKind>(['send', 'write', 'readResponse']);

function positionWords(position: Position, noun: string): string {
  switch (position) {
    case 'first': return `the first packet of a multi-packet ${noun}`;
    case 'middle': return `a middle packet of a multi-packet ${noun}: a full PMTU of payload and no extension header`;
    case 'last': return `the last packet of a multi-packet ${noun}`;
    case 'only': return `a whole ${noun} in one packet`;
  }
}

const hex64 = (v: bigint): string => '0x' + v.toString(16);
const hexQp = (qp: number): string => hex24(qp);
const plural = (n: number, one: string, many = one + 's'): string => `${n} ${n === 1 ? one : many}`;

/** One sentence (or two) on what this opcode does, with the numbers of this packet. */
export function describeOpcode(info: OpcodeInfo, p: RocePacket): string {
  const k = KIND_WORDS[info.kind];
  let s = `${info.ibtaName} (${info.transport}, ${TRANSPORT_WORDS[info.transport]}): `;
  if (MULTI_PACKET.has(info.kind)) {
    s += positionWords(info.position, k.noun);
    if (info.kind === 'write' && p.reth) {
      s += `; its RETH says where the whole write lands: ${p.reth.dmaLength} bytes at ${hex64(p.reth.va)} under R_Key ${hex32(p.reth.rkey)}`;
    }
    if (info.immediate) s += `, with 4 bytes of immediate data for the receiver${info.kind === 'write' ? ' (so this WRITE does consume a receive buffer)' : ''}`;
    if (info.invalidate && p.ieth) s += `, asking the receiver to invalidate R_Key ${hex32(p.ieth.rkey)}`;
    if (info.start) s += `; ${k.does}`;
  } else if (info.kind === 'readRequest' && p.reth) {
    s += `asks the responder for ${p.reth.dmaLength} bytes of its memory at ${hex64(p.reth.va)} under R_Key ${hex32(p.reth.rkey)}; ${k.does}`;
  } else if (info.kind === 'atomic' && p.atomicEth) {
    const a = p.atomicEth;
    const where = `the 8 bytes at ${hex64(a.va)} under R_Key ${hex32(a.rkey)}`;
    s += info.ibtaName === 'CmpSwap'
      ? `if ${where} equal ${hex64(a.compare)}, replace them with ${hex64(a.swapAdd)}; either way the old value comes back in an ATOMIC Acknowledge`
      : `add ${hex64(a.swapAdd)} to ${where}; the old value comes back in an ATOMIC Acknowledge`;
  } else {
    s += k.does;
  }
  return s + '.';
}

/** What the notable BTH and extension-header fields mean on this packet. */
export function describeFields(info: OpcodeInfo, p: RocePacket): string[] {
  const h = p.bth;
  const out: string[] = [];
  if (h.ackReq) {
    if (info.kind === 'readRequest' || info.kind === 'atomic') out.push('AckReq: set on every READ and atomic request; the response that carries the data is the acknowledgement.');
    else if (info.transport === 'RC' && info.request) out.push('AckReq: asks the responder to acknowledge (set on the last packet of a message, or to keep ACKs flowing).');
    else out.push(`AckReq is set but means nothing here: ${info.transport === 'UD' ? 'datagrams' : 'UC packets'} are never acknowledged.`);
  }
  if (h.se) out.push("SE (solicited event): the receiver's completion for this message wakes a consumer waiting only for solicited events.");
  if (h.m) out.push("MigReq: the sender's path-migration state is 'migrated' (automatic path migration).");
  if (h.padCount) out.push(`PadCnt ${h.padCount}: ${plural(h.padCount, 'pad byte')} round the ${p.payload.length}-byte payload up to a multiple of 4.`);
  if (h.fecn) out.push('FECN: a switch on the way marked this packet congested (ECN CE); the receiver should answer its sender with a CNP.');
  if (h.becn) out.push('BECN: congestion is being reported back toward the sender.');
  if (h.pkey !== DEFAULT_PKEY) out.push(`P_Key 0x${h.pkey.toString(16).padStart(4, '0')}: the partition; both QPs must be members (0xffff is the default partition).`);
  if (p.deth) {
    const q = p.deth.qkey;
    const qkeyWords = q === GSI_QKEY
      ? 'the well-known GSI Q_Key; its high bit makes it a controlled Q_Key, which only privileged senders may use'
      : (q & 0x80000000) !== 0
        ? 'a controlled Q_Key (high bit set): only privileged senders may use it'
        : 'the receiving QP accepts the datagram only if this matches its own Q_Key';
    out.push(`DETH: Q_Key ${hex32(q)}, ${qkeyWords}; source QP ${hexQp(p.deth.srcQp)}, where a reply would go.`);
  }
  if (p.aeth) out.push(describeAeth(p.aeth.syndrome, p.aeth.msn));
  if (p.immDt) out.push(`ImmDt ${hex32(p.immDt.data)}: 4 bytes handed to the receiver in its work completion (wc.imm_data), not placed in memory.`);
  if (p.ieth) out.push(`IETH: once the message is placed, the receiver invalidates R_Key ${hex32(p.ieth.rkey)}, revoking the sender's remote access to that memory.`);
  return out;
}

/** The AETH in words: the syndrome decoded, and what the MSN counts. */
export function describeAeth(syndrome: number, msn: number): string {
  const v = aethValue(syndrome);
  const syn = `0x${syndrome.toString(16).padStart(2, '0')}`;
  let s: string;
  switch (aethKind(syndrome)) {
    case 'ACK':
      s = v === CREDIT_UNLIMITED
        ? `ACK, credit code 31 (no end-to-end credit limit advertised)`
        : `ACK, credit code ${v}: ${CREDIT_COUNT[v]} receive buffers ready for more SENDs`;
      break;
    case 'RNR_NAK':
      s = `RNR NAK, timer code ${v} = wait at least ${((RNR_TIMER_US[v] ?? 0) / 1000).toFixed(2)} ms`;
      break;
    case 'NAK':
      s = `NAK, code ${v} (${nakCodeName(v)})`;
      break;
    default:
      s = 'reserved (bits 6..5 = 10): a requester treats it as an error';
  }
  return `AETH: syndrome ${syn} = ${s}; MSN ${msn} = request messages the responder has completed on this connection.`;
}

function describeIcrc(d: DecodedFrame): string {
  switch (d.icrc.status) {
    case 'ok': return 'ICRC ok.';
    case 'ok-recovered': return `ICRC ok with the IPv4 ID taken as 0x${(d.icrc.ipId ?? 0).toString(16)} (recovered: judged from what a UDP socket sees).`;
    case 'bad': return 'ICRC bad: the packet changed after its sender computed the CRC; a receiver drops it silently, with no NAK.';
    case 'unchecked': return 'ICRC not checked (--icrc off).';
  }
}

// ---------------------------------------------------------------------------------------------
// Connection tracking.

interface Item {
  frame: number;
  header: string;
  what: string[];
  fields: string[];
  rel: string[];
  later: string[];
  icrc: string;
  good: boolean;
}

interface Message {
  n: number;
  kind: OpKind;
  noun: string;
  firstPsn: number;
  lastPsn: number;
  firstFrame: number;
  lastFrame: number;
  packets: number;
  bytes: number;
  /** Payload size of the first full packet, to say "4 × 1024 B". */
  sizes: number[];
  /** The first packet(s) never reached the capture. */
  partial: boolean;
  ended: boolean;
  item: Item | undefined;
  read?: { va: bigint; rkey: number; len: number; n: number | undefined; got: number; firstFrame?: number; lastFrame?: number };
  atomic?: { op: string; va: bigint; swapAdd: bigint; compare: bigint };
}

interface Sent {
  psn: number;
  frame: number;
  ts: bigint;
  msg: Message;
  /** 1-based position of this packet in its message. */
  index: number;
  /** The latest transmission of this PSN. */
  lastFrame: number;
  lastTs: bigint;
}

interface Lost {
  psn: number;
  /** The frame whose PSN revealed the gap. */
  frame: number;
  arrived: number;
  msg: Message | undefined;
}

interface NakEvent {
  kind: 'NAK' | 'RNR';
  frame: number;
  ts: bigint;
  psn: number;
  timerUs: number;
  item: Item | undefined;
  /** RNR: the first RNR NAK of this run of RNR NAKs for the same PSN, and how many so far. */
  since: number;
  count: number;
  /** The requester has begun resending. */
  followed: boolean;
}

type RetransmitCause = 'go-back-N after a NAK' | 'retry after an RNR NAK' | 'timeout' | 'spurious, already acknowledged';

interface Flow {
  key: string;
  src: string;
  dst: string;
  qp: number;
  transport: Transport;
  peer: Flow | undefined;
  /** UD: the source QP from the DETH, when constant. */
  udSrcQp?: number;
  requests: number;
  responses: number;
  // As requester (packets of this flow that are requests).
  expected: number | undefined;
  maxPsn: number | undefined;
  sent: Map<number, Sent>;
  lost: Map<number, Lost>;
  outstanding: Sent[];
  current: Message | undefined;
  messages: number;
  byNoun: Map<string, number>;
  pending: Message[];
  ackedPsn: number | undefined;
  ackedFrame: number | undefined;
  nak: NakEvent | undefined;
  /** The resend a NAK or RNR NAK started, and the PSN it reaches next. */
  replay: { nak: NakEvent; next: number } | undefined;
  retries: Map<number, number>;
  lastDup: { frame: number; psn: number } | undefined;
  retransmissions: number;
  // As responder (packets of this flow that are responses).
  lastAck: { frame: number; psn: number; msn: number } | undefined;
  acks: Map<string, number>;
}

/** A REQ or REP: the sender's QP, and the PSN it expects on the first request it receives. */
interface CmAnnouncement { frame: number; host: string; qpn: number; psn: number; what: string }

const MAX_LOST_TRACKED = 4096;
const SENT_HISTORY = 8192;

class Tracker {
  readonly flows = new Map<string, Flow>();
  readonly opcodes = new Map<string, number>();
  readonly retransmits = new Map<RetransmitCause, number>();
  readonly naks = new Map<string, number>();
  readonly rnrWaits: number[] = [];
  readonly rnrAsked: number[] = [];
  readonly cm: CmAnnouncement[] = [];
  readonly cmMessages = new Map<string, number>();
  readonly pmtu = new Map<string, number>();
  gaps = 0;
  lostPackets = 0;
  malformed = 0;
  badIcrc = 0;
  total = 0;
  firstFrame = 0;
  lastFrame = 0;
  firstTs: bigint | undefined;
  lastTs = 0n;

  flow(d: DecodedFrame, p: RocePacket, transport: Transport): Flow {
    const key = `${d.src}>${d.dst}/${p.bth.destQp}`;
    let f = this.flows.get(key);
    if (!f) {
      f = {
        key, src: d.src, dst: d.dst, qp: p.bth.destQp, transport, peer: undefined, requests: 0, responses: 0,
        expected: undefined, maxPsn: undefined, sent: new Map(), lost: new Map(), outstanding: [], current: undefined,
        messages: 0, byNoun: new Map(), pending: [], ackedPsn: undefined, ackedFrame: undefined, nak: undefined,
        replay: undefined, retries: new Map(), lastDup: undefined, retransmissions: 0, lastAck: undefined, acks: new Map(),
      };
      this.flows.set(key, f);
    }
    return f;
  }

  pairKey(a: string, b: string): string {
    return a < b ? `${a}|${b}` : `${b}|${a}`;
  }

  /** The flow whose requests a response on `f` answers: the reverse direction of the same connection. */
  requestsAnsweredBy(f: Flow, psn: number): Flow | undefined {
    if (f.peer) return f.peer;
    const cands = [...this.flows.values()].filter(
      (g) => g.src === f.dst && g.dst === f.src && g.transport === f.transport && g.maxPsn !== undefined && (g.peer === undefined || g.peer === f),
    );
    const pick = cands.length === 1
      ? cands[0]
      : cands.find((g) => g.sent.has(psn) || g.lost.has(psn))
        ?? cands.find((g) => g.maxPsn !== undefined && psnDiff(psn, g.maxPsn) <= 0 && psnDiff(psn, g.maxPsn) > -SENT_HISTORY);
    if (pick) {
      f.peer = pick;
      pick.peer = f;
    }
    return pick;
  }
}

/** Walks the frames, returning the selected packets explained and a summary of all of them. */
export function explainCapture(frames: Iterable<DecodedFrame>, opts: ExplainOptions = {}): Explanation {
  const select = opts.select ?? ((): boolean => true);
  const t = new Tracker();
  const items: Item[] = [];
  let badSelected = 0;
  for (const d of frames) {
    const selected = select(d.frame);
    const item = explainOne(t, d);
    if (!item.good) {
      if (selected) badSelected++;
    }
    if (selected) items.push(item);
  }
  return {
    packets: items.map((i) => ({
      frame: i.frame,
      header: i.header,
      lines: [...i.what, ...i.fields, ...i.rel, ...i.later, i.icrc],
      good: i.good,
    })),
    summary: summarize(t),
    total: t.total,
    badSelected,
    badTotal: t.malformed + t.badIcrc,
  };
}

function explainOne(t: Tracker, d: DecodedFrame): Item {
  t.total++;
  if (t.firstTs === undefined) {
    t.firstTs = d.timestampNs;
    t.firstFrame = d.frame;
  }
  t.lastTs = d.timestampNs;
  t.lastFrame = d.frame;
  const secs = Number(d.timestampNs - t.firstTs) / 1e9;
  const head = `#${d.frame}  +${secs.toFixed(6)} s  ${d.src} → ${d.dst}  `;
  const p = d.packet;
  const item: Item = {
    frame: d.frame,
    header: head + (p ? formatPacket(p) : `MALFORMED ${d.error?.code ?? ''}`.trimEnd()),
    what: [], fields: [], rel: [], later: [],
    icrc: describeIcrc(d),
    good: p !== undefined && d.icrc.status !== 'bad',
  };
  if (d.icrc.status === 'bad') t.badIcrc++;
  const name = d.opcode === undefined ? '(empty)' : opcodeName(d.opcode);
  t.opcodes.set(name, (t.opcodes.get(name) ?? 0) + 1);
  if (!p) {
    t.malformed++;
    item.what.push(`Malformed (${d.error?.code}): ${d.error?.detail}. A receiver drops it without any response.`);
    return item;
  }
  const info = opcodeInfo(p.bth.opcode)!;
  item.what.push(describeOpcode(info, p));
  item.fields.push(...describeFields(info, p));
  if (info.kind === 'cnp') return item;
  // A packet with a bad ICRC never reaches the transport: it changes no state.
  if (d.icrc.status === 'bad') {
    item.rel.push('A receiver drops it before looking at the PSN, so it plays no part in the connection.');
    return item;
  }
  const f = t.flow(d, p, info.transport);
  if (info.transport === 'UD') explainDatagram(t, f, d, p, item);
  else if (info.request) explainRequest(t, f, d, p, info, item);
  else explainResponse(t, f, d, p, info, item);
  return item;
}

// ---------------------------------------------------------------------------------------------
// UD, and CM MADs to QP1.

function explainDatagram(t: Tracker, f: Flow, d: DecodedFrame, p: RocePacket, item: Item): void {
  f.requests++;
  f.messages++;
  f.byNoun.set('SEND', (f.byNoun.get('SEND') ?? 0) + 1);
  if (p.deth) f.udSrcQp = p.deth.srcQp;
  const src = p.deth ? ` QP ${hexQp(p.deth.srcQp)}` : '';
  item.rel.push(`Datagram ${f.messages} from ${d.src}${src} to ${d.dst} QP ${hexQp(p.bth.destQp)}: ${p.payload.length} bytes. UD is never acknowledged and never retransmitted; its PSN is not checked.`);
  if (p.bth.destQp !== 1) return;
  item.rel.push('A Communication Management MAD to QP1, the GSI (General Services Interface): see IBTA ch. 12.');
  const r = describeMad(p.payload);
  if (!r.ok) {
    item.rel.push(r.error === 'TOO_SHORT'
      ? `Its payload is too short to be a MAD (${p.payload.length} bytes; every MAD is 256), so QP1 drops it.`
      : 'Its payload does not start like a MAD (base version 1).');
    return;
  }
  const mad = r.mad;
  const h = mad.header;
  item.rel.push(
    `MAD: base version ${h.baseVersion}, class 0x${h.mgmtClass.toString(16).padStart(2, '0')} ${mad.className} v${h.classVersion}, ` +
      `method ${mad.methodName} (0x${mad.methodByte.toString(16).padStart(2, '0')}), attribute ${mad.attributeName} (0x${h.attributeId.toString(16).padStart(4, '0')}), ` +
      `transaction ${hex64(h.transactionId)}${h.status ? `, status 0x${h.status.toString(16)}` : ''}.`,
  );
  if (h.mgmtClass === MGMT_CLASS.CM) {
    t.cmMessages.set(mad.attributeName, (t.cmMessages.get(mad.attributeName) ?? 0) + 1);
    const s = describeCm(t, d, mad);
    if (s) item.rel.push(s);
  }
}

const KNOWN_REJ_REASONS: ReadonlySet<number> = new Set(Object.values(CM_REJ_REASON));

/** What a CM message does; `mad.cm` is absent when `src/cm` could not decode the body. */
function describeCm(t: Tracker, d: DecodedFrame, mad: NamedMad): string | undefined {
  const m = mad.cm;
  switch (mad.header.attributeId) {
    case CM_ATTR.REQ: {
      if (m?.kind !== 'REQ') return 'The active side asks to connect.';
      t.cm.push({ frame: d.frame, host: d.src, qpn: m.localQpn, psn: m.startingPsn, what: mad.attributeName });
      const mtu = mtuOfCode(m.pathMtu);
      return `The active side asks to connect: ${d.src} offers its QP ${hexQp(m.localQpn)} and expects the first request it receives there to carry PSN ${hex24(m.startingPsn)}` +
        `; service ID ${describeServiceId(m.serviceId)}${mtu ? `; path MTU ${mtu}` : ''}.`;
    }
    case CM_ATTR.REP:
      if (m?.kind !== 'REP') return 'The passive side accepts the connection.';
      t.cm.push({ frame: d.frame, host: d.src, qpn: m.localQpn, psn: m.startingPsn, what: mad.attributeName });
      return `The passive side accepts: ${d.src} offers its QP ${hexQp(m.localQpn)} and expects the first request it receives there to carry PSN ${hex24(m.startingPsn)}.`;
    case CM_ATTR.RTU:
      return 'The active side confirms the reply: both QPs are now ready to send (RTS), and traffic may start.';
    case CM_ATTR.MRA:
      return 'Message Receipt Acknowledgement: "I got your message, but need more time to answer".';
    case CM_ATTR.REJ: {
      if (m?.kind !== 'REJ') return 'The connection is refused.';
      const r = m.reason;
      return `The connection is refused: reason ${r}${KNOWN_REJ_REASONS.has(r) ? ` (${rejReasonName(r)})` : ''}.`;
    }
    case CM_ATTR.DREQ:
      return `Asks to tear the connection down${m?.kind === 'DREQ' ? ` (the peer's QP ${hexQp(m.remoteQpn)})` : ''}; the QPs stop sending.`;
    case CM_ATTR.DREP:
      return 'Confirms the disconnect: the connection is gone.';
    default:
      return undefined;
  }
}

// ---------------------------------------------------------------------------------------------
// RC/UC requests.

function nounOf(info: OpcodeInfo): string {
  return info.kind === 'atomic' ? info.ibtaName : KIND_WORDS[info.kind].noun;
}

function sizeWords(m: Message): string {
  if (m.packets === 1 && m.kind !== 'readRequest') return `${m.bytes} B`;
  const span = psnDiff(m.lastPsn, m.firstPsn) + 1;
  if (m.kind !== 'readRequest' && span !== m.packets) return `${m.packets} of its ${span} packets in the capture, ${m.bytes} B`;
  const first = m.sizes[0];
  if (m.packets > 1 && first !== undefined && m.sizes.every((s) => s === first)) return `${m.packets} × ${first} B`;
  return `${plural(m.packets, 'packet')}, ${m.bytes} B`;
}

function psnRange(a: number, b: number): string {
  return a === b ? `PSN ${hex24(a)}` : `PSNs ${hex24(a)}–${hex24(b)}`;
}

function frameRange(a: number, b: number): string {
  return a === b ? `frame ${a}` : `frames ${a}–${b}`;
}

function ordinal(n: number): string {
  const s = n % 100 >= 11 && n % 100 <= 13 ? 'th' : (['th', 'st', 'nd', 'rd'][n % 10] ?? 'th');
  return `${n}${s}`;
}

function ms(ns: bigint): string {
  return (Number(ns) / 1e6).toFixed(2);
}

function explainRequest(t: Tracker, f: Flow, d: DecodedFrame, p: RocePacket, info: OpcodeInfo, item: Item): void {
  f.requests++;
  const psn = p.bth.psn;
  const fresh = f.maxPsn === undefined || psnDiff(psn, f.maxPsn) > 0;
  if (!fresh) {
    explainResend(t, f, d, p, info, item);
    return;
  }
  // A new PSN: first of the flow, the next in order, or after a gap.
  const gap: Lost[] = [];
  if (f.maxPsn === undefined) {
    item.rel.push(`The first request from ${d.src} to QP ${hexQp(f.qp)} in this capture.`);
    const ann = t.cm.find((a) => a.host === d.dst && a.qpn === f.qp);
    if (ann) {
      item.rel.push(
        `QP ${hexQp(f.qp)} is the QP ${d.dst} offered in its ${ann.what} (frame ${ann.frame})` +
          (ann.psn === psn ? `, and PSN ${hex24(psn)} the starting PSN it said to expect.` : `; it said to expect PSN ${hex24(ann.psn)} first.`),
      );
    }
  } else if (f.expected === undefined) {
    // After a READ whose response count was unknown: the PSN distance tells it.
    inferReadSpan(t, f, psn, d);
  } else if (psnDiff(psn, f.expected) > 0) {
    const missing = psnDiff(psn, f.expected);
    t.gaps++;
    t.lostPackets += missing;
    item.rel.push(
      `PSN gap: expected ${hex24(f.expected)}, got ${hex24(psn)}: ${plural(missing, 'packet')} (${psnRange(f.expected, psnAdd(psn, -1))}) never reached this capture point.`,
    );
    for (let i = 0; i < Math.min(missing, MAX_LOST_TRACKED); i++) {
      const l: Lost = { psn: psnAdd(f.expected, i), frame: d.frame, arrived: psn, msg: undefined };
      gap.push(l);
      f.lost.set(l.psn, l);
    }
  }

  // Which message does it belong to?
  let msg: Message;
  const cur = f.current;
  if (info.start) {
    if (cur && !cur.ended) item.rel.push(`Message ${cur.n} never got its last packet in this capture.`);
    msg = newMessage(f, info, psn, d.frame, item, false);
  } else if (cur && !cur.ended && cur.kind === info.kind) {
    msg = cur;
  } else {
    msg = newMessage(f, info, psn, d.frame, item, true);
  }
  for (const l of gap) l.msg = msg;
  // A message whose first packets fell into the gap starts at the first missing PSN.
  if (msg.partial && msg.packets === 0 && gap[0]) msg.firstPsn = gap[0].psn;
  msg.packets++;
  msg.bytes += p.payload.length;
  if (info.position === 'first' || info.position === 'middle') {
    msg.sizes.push(p.payload.length);
    t.pmtu.set(t.pairKey(f.src, f.dst), p.payload.length);
  } else if (info.position === 'last') msg.sizes.push(p.payload.length);
  msg.lastPsn = psn;
  msg.lastFrame = d.frame;
  const sent: Sent = { psn, frame: d.frame, ts: d.timestampNs, msg, index: psnDiff(psn, msg.firstPsn) + 1, lastFrame: d.frame, lastTs: d.timestampNs };
  remember(f, sent);
  if (info.transport === 'RC') f.outstanding.push(sent);
  f.maxPsn = psn;
  f.expected = psnAdd(psn, 1);

  const who = `${d.src} → QP ${hexQp(f.qp)}`;
  const partial = msg.partial && msg.packets === 1 ? ` (its first ${gap.length > 1 ? 'packets' : 'packet'} never reached the capture point)` : '';
  switch (info.position) {
    case 'first':
      item.rel.push(`Starts message ${msg.n} of ${who} at PSN ${hex24(psn)}.`);
      break;
    case 'middle':
      item.rel.push(`Packet ${sent.index} of message ${msg.n} of ${who}${partial}.`);
      break;
    case 'last':
    case 'only':
      msg.ended = true;
      if (info.transport === 'RC') f.pending.push(msg);
      if (info.kind === 'readRequest' || info.kind === 'atomic') {
        item.rel.push(`Message ${msg.n} of ${who}: ${info.kind === 'atomic' ? `a ${info.ibtaName}` : 'a READ'} request.`);
      } else if (info.position === 'only') {
        item.rel.push(`Message ${msg.n} of ${who}: one packet${p.payload.length ? `, ${p.payload.length} B` : ''}.`);
      } else {
        item.rel.push(
          `Ends message ${msg.n} of ${who}${partial}: ${psnRange(msg.firstPsn, psn)} (${sizeWords(msg)}), ${frameRange(msg.firstFrame, d.frame)}.`,
        );
      }
      break;
  }

  if (info.kind === 'readRequest' && p.reth) {
    const pmtu = t.pmtu.get(t.pairKey(f.src, f.dst));
    const n = pmtu ? Math.max(1, Math.ceil(p.reth.dmaLength / pmtu)) : p.reth.dmaLength === 0 ? 1 : undefined;
    msg.read = { va: p.reth.va, rkey: p.reth.rkey, len: p.reth.dmaLength, n, got: 0 };
    if (n !== undefined) {
      f.expected = psnAdd(psn, n);
      item.rel.push(
        n === 1
          ? `One response packet will answer it, with PSN ${hex24(psn)}; the next request from this side uses PSN ${hex24(f.expected)}.`
          : `It reserves ${psnRange(psn, psnAdd(psn, n - 1))} for its ${n} response packets${pmtu ? ` (PMTU ${pmtu})` : ''}; the next request from this side uses PSN ${hex24(f.expected)}.`,
      );
    } else {
      f.expected = undefined;
      item.rel.push('Its responses take one PSN each, starting at this one; the next request from this side skips past them.');
    }
  }
  if (info.kind === 'atomic' && p.atomicEth) {
    msg.atomic = { op: info.ibtaName, va: p.atomicEth.va, swapAdd: p.atomicEth.swapAdd, compare: p.atomicEth.compare };
  }
  if (info.transport === 'UC' && info.end) item.rel.push('UC: no acknowledgement will come; had a packet of this message been lost, the receiver would drop the whole message.');
}

function newMessage(f: Flow, info: OpcodeInfo, psn: number, frame: number, item: Item, partial: boolean): Message {
  f.messages++;
  const noun = nounOf(info);
  f.byNoun.set(noun, (f.byNoun.get(noun) ?? 0) + 1);
  const m: Message = {
    n: f.messages, kind: info.kind, noun, firstPsn: psn, lastPsn: psn, firstFrame: frame, lastFrame: frame,
    packets: 0, bytes: 0, sizes: [], partial, ended: false, item,
  };
  f.current = m;
  return m;
}

function remember(f: Flow, s: Sent): void {
  f.sent.set(s.psn, s);
  f.lost.delete(s.psn);
  if (f.sent.size > SENT_HISTORY) {
    const oldest = f.sent.keys().next();
    if (!oldest.done) f.sent.delete(oldest.value);
  }
}

/** A READ with an unknown response count, followed by the next request: the PSN distance is the count. */
function inferReadSpan(t: Tracker, f: Flow, psn: number, d: DecodedFrame): void {
  const r = f.current?.read;
  if (!r || f.maxPsn === undefined) return;
  const n = psnDiff(psn, f.maxPsn);
  if (n < 1) return;
  r.n = n;
  const mtu = PATH_MTUS.find((m) => Math.max(1, Math.ceil(r.len / m)) === n);
  if (mtu) t.pmtu.set(t.pairKey(f.src, d.dst), mtu);
}

function explainResend(t: Tracker, f: Flow, d: DecodedFrame, p: RocePacket, info: OpcodeInfo, item: Item): void {
  const psn = p.bth.psn;
  const orig = f.sent.get(psn);
  const lost = f.lost.get(psn);
  const msg = orig?.msg ?? lost?.msg;
  const tries = (f.retries.get(psn) ?? 0) + 1;
  f.retries.set(psn, tries);
  f.retransmissions++;
  const first = orig
    ? `first sent in frame ${orig.frame}`
    : lost
      ? `whose first transmission never reached this capture point (the PSN gap seen at frame ${lost.frame})`
      : 'first sent before this capture began';
  const multi = msg !== undefined && (msg.packets > 1 || !msg.ended);
  const inMsg = msg ? ` (message ${msg.n}${multi ? `, packet ${psnDiff(psn, msg.firstPsn) + 1}` : ''})` : '';
  let cause: RetransmitCause;
  // A NAK (or RNR NAK) starts a resend at its PSN; the resend goes on while PSNs keep rising.
  const pending = f.nak !== undefined && !f.nak.followed ? f.nak : undefined;
  const replay = f.replay;
  let starts = pending !== undefined && psn === pending.psn;
  const continues = !starts && replay !== undefined && psnDiff(psn, replay.next) >= 0;
  if (!starts && !continues && pending && psnDiff(psn, pending.psn) >= 0) starts = true;
  const nak = starts ? pending : continues ? replay?.nak : undefined;
  if (nak && (starts || continues)) {
    const waited = ms(d.timestampNs - nak.ts);
    const missing = continues && replay ? psnDiff(psn, replay.next) : 0;
    if (missing > 0 && replay) {
      t.gaps++;
      t.lostPackets += missing;
      item.rel.push(`PSN gap in the resend: expected ${hex24(replay.next)}, got ${hex24(psn)}: ${plural(missing, 'packet')} (${psnRange(replay.next, psnAdd(psn, -1))}) never reached this capture point.`);
      for (let i = 0; i < Math.min(missing, MAX_LOST_TRACKED); i++) {
        const q = psnAdd(replay.next, i);
        f.lost.set(q, { psn: q, frame: d.frame, arrived: psn, msg: f.sent.get(q)?.msg });
      }
    }
    // The resend is over once it catches up with the newest PSN sent.
    f.replay = psn === f.maxPsn ? undefined : { nak, next: psnAdd(psn, 1) };
    if (nak.kind === 'RNR') {
      cause = 'retry after an RNR NAK';
      if (starts) {
        t.rnrWaits.push(Number(d.timestampNs - nak.ts) / 1e6);
        item.rel.push(
          `Retry ${tries} of PSN ${hex24(psn)}${inMsg}, ${first}: after the RNR NAK in frame ${nak.frame} the requester waited ${waited} ms (the NAK asked for at least ${(nak.timerUs / 1000).toFixed(2)} ms).`,
        );
        nak.item?.later.push(`The requester retries this ${msg?.noun ?? 'request'} in frame ${d.frame}, ${waited} ms later.`);
      } else {
        item.rel.push(`Retransmission of PSN ${hex24(psn)}${inMsg}, ${first}: the rest of the retry after the RNR NAK in frame ${nak.frame}.`);
      }
    } else {
      cause = 'go-back-N after a NAK';
      const resume = starts && psn === nak.psn && (info.position === 'middle' || info.position === 'last')
        ? ' It resumes mid-message: the responder already placed the earlier packets of this message, so only the rest is sent again.'
        : '';
      item.rel.push(`Retransmission of PSN ${hex24(psn)}${inMsg}, ${first}: go-back-N after the NAK in frame ${nak.frame} (the responder wanted ${hex24(nak.psn)} next).${resume}`);
      if (starts) nak.item?.later.push(`The requester goes back to PSN ${hex24(nak.psn)} in frame ${d.frame}, ${waited} ms later, and resends from there.`);
    }
    nak.followed = true;
  } else if (f.ackedPsn !== undefined && psnDiff(psn, f.ackedPsn) <= 0) {
    cause = 'spurious, already acknowledged';
    f.lastDup = { frame: d.frame, psn };
    item.rel.push(
      `Duplicate of PSN ${hex24(psn)}${inMsg}, ${first}, which the responder had already acknowledged (frame ${f.ackedFrame}): a spurious retransmission — the requester's retry timer fired before it processed that ACK. The responder drops the data and acknowledges again.`,
    );
  } else {
    cause = 'timeout';
    const since = orig
      ? orig.lastFrame === orig.frame
        ? `, ${ms(d.timestampNs - orig.ts)} ms later`
        : `; ${ms(d.timestampNs - orig.lastTs)} ms after its previous send in frame ${orig.lastFrame}`
      : '';
    const nth = tries > 1 ? `Retransmission ${tries}` : 'Retransmission';
    item.rel.push(`${nth} of PSN ${hex24(psn)}${inMsg}, ${first}${since}, with no ACK or NAK in between: the requester's retry timer expired (transport timeout).`);
  }
  if (orig) {
    orig.lastFrame = d.frame;
    orig.lastTs = d.timestampNs;
  }
  t.retransmits.set(cause, (t.retransmits.get(cause) ?? 0) + 1);
  f.lost.delete(psn);
  if (!orig && msg) {
    // The lost packet finally appears: count it in its message, keep the outstanding list ordered by PSN.
    msg.packets++;
    msg.bytes += p.payload.length;
    if (info.position === 'first' || info.position === 'middle') msg.sizes.unshift(p.payload.length);
    const s: Sent = { psn, frame: d.frame, ts: d.timestampNs, msg, index: psnDiff(psn, msg.firstPsn) + 1, lastFrame: d.frame, lastTs: d.timestampNs };
    remember(f, s);
    if (info.transport === 'RC' && (f.ackedPsn === undefined || psnDiff(psn, f.ackedPsn) > 0)) {
      const at = f.outstanding.findIndex((o) => psnDiff(o.psn, psn) > 0);
      if (at < 0) f.outstanding.push(s);
      else f.outstanding.splice(at, 0, s);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// RC responses: ACK/NAK, READ responses, atomic acknowledgements.

interface Acked { packets: Sent[]; messages: Message[] }

function ackLabel(syndrome: number): string {
  switch (aethKind(syndrome)) {
    case 'ACK': return 'ACK';
    case 'RNR_NAK': return 'RNR NAK';
    case 'NAK': return `NAK ${nakCodeName(aethValue(syndrome))}`;
    default: return 'reserved syndrome';
  }
}

/** Everything up to and including `psn` is acknowledged. */
function acknowledge(f: Flow, psn: number, frame: number): Acked {
  const packets: Sent[] = [];
  while (f.outstanding.length > 0 && psnDiff(f.outstanding[0]!.psn, psn) <= 0) packets.push(f.outstanding.shift()!);
  const messages: Message[] = [];
  while (f.pending.length > 0) {
    const m = f.pending[0]!;
    const end = m.read?.n !== undefined ? psnAdd(m.firstPsn, m.read.n - 1) : m.lastPsn;
    if (psnDiff(end, psn) > 0) break;
    messages.push(f.pending.shift()!);
  }
  if (f.ackedPsn === undefined || psnDiff(psn, f.ackedPsn) > 0) {
    f.ackedPsn = psn;
    f.ackedFrame = frame;
  }
  return { packets, messages };
}

function ackedWords(a: Acked): string {
  let s = '';
  const first = a.packets[0];
  const last = a.packets[a.packets.length - 1];
  if (first && last) {
    const frames = a.packets.map((x) => x.frame);
    s = `${psnRange(first.psn, last.psn)} (${a.packets.length > 1 ? `${a.packets.length} packets, ` : ''}${frameRange(Math.min(...frames), Math.max(...frames))})`;
  }
  const m0 = a.messages[0];
  const m1 = a.messages[a.messages.length - 1];
  if (m0 && m1) {
    s += s ? ', completing ' : 'completing ';
    s += m0 === m1 ? `message ${m0.n} (${m0.noun}, ${sizeWords(m0)})` : `messages ${m0.n}–${m1.n}`;
  }
  return s;
}

function explainResponse(t: Tracker, f: Flow, d: DecodedFrame, p: RocePacket, info: OpcodeInfo, item: Item): void {
  f.responses++;
  const psn = p.bth.psn;
  const g = t.requestsAnsweredBy(f, psn);
  const aeth = p.aeth;
  const kindOfResponse = info.kind === 'ack' && aeth ? ackLabel(aeth.syndrome) : info.ibtaName;
  f.acks.set(kindOfResponse, (f.acks.get(kindOfResponse) ?? 0) + 1);
  if (!aeth) {
    // READ response middle: no AETH.
    if (info.kind === 'readResponse') explainReadResponse(t, g, d, p, info, item);
    return;
  }
  const kind = aethKind(aeth.syndrome);
  const v = aethValue(aeth.syndrome);
  const before = (): string => `Its AETH also acknowledges every request before PSN ${hex24(psn)}.`;

  if (info.kind === 'readResponse') {
    explainReadResponse(t, g, d, p, info, item);
    if (kind === 'ACK' && info.position === 'first') {
      if (g) acknowledge(g, psnAdd(psn, -1), d.frame);
      item.rel.push(before());
    }
    f.lastAck = { frame: d.frame, psn, msn: aeth.msn };
    return;
  }
  if (info.kind === 'atomicAck') {
    explainAtomicAck(g, d, p, item);
    if (g) acknowledge(g, psn, d.frame);
    f.lastAck = { frame: d.frame, psn, msn: aeth.msn };
    return;
  }

  if (kind === 'ACK') {
    const prev = f.lastAck;
    const a = g ? acknowledge(g, psn, d.frame) : undefined;
    if (!g) {
      item.rel.push(`ACK for PSNs up to ${hex24(psn)}, MSN ${aeth.msn}; the requests it acknowledges are not in this capture.`);
    } else if (a && (a.packets.length > 0 || a.messages.length > 0)) {
      item.rel.push(`ACK for PSNs up to ${hex24(psn)}, MSN ${aeth.msn}: acknowledges ${ackedWords(a)}.`);
      if (a.packets.length > 0 && new Set(a.packets.map((x) => x.msg)).size > 1) {
        item.rel.push('One coalesced ACK covers several messages: an ACK for a PSN acknowledges every packet before it too.');
      }
    } else {
      const dup = g.lastDup;
      const again = prev && prev.psn === psn ? `repeats the ACK of frame ${prev.frame}` : `acknowledges PSN ${hex24(psn)} again`;
      item.rel.push(
        `ACK for PSNs up to ${hex24(psn)}, MSN ${aeth.msn}: ${again}; nothing new is acknowledged${dup && psnDiff(dup.psn, psn) <= 0 ? ` — the responder's answer to the duplicate it received (last one in frame ${dup.frame})` : ''}.`,
      );
    }
    if (g?.nak?.kind === 'RNR' && psnDiff(psn, g.nak.psn) >= 0) {
      item.rel.push(`A receive buffer was posted by the time of this try: the ${plural(g.nak.count, 'RNR NAK')} since frame ${g.nak.since} are over.`);
      g.nak = undefined;
    }
  } else if (kind === 'RNR_NAK') {
    const timerUs = RNR_TIMER_US[v] ?? 0;
    t.naks.set('RNR NAK', (t.naks.get('RNR NAK') ?? 0) + 1);
    t.rnrAsked.push(timerUs / 1000);
    const req = g?.sent.get(psn);
    const a = g ? acknowledge(g, psnAdd(psn, -1), d.frame) : undefined;
    const implicit = a && (a.packets.length > 0 || a.messages.length > 0) ? ` It also acknowledges ${ackedWords(a)}.` : '';
    const prev = g?.nak?.kind === 'RNR' && g.nak.psn === psn ? g.nak : undefined;
    const what = req ? ` (the ${req.msg.noun} first sent in frame ${req.frame})` : '';
    const wait = `${(timerUs / 1000).toFixed(2)} ms`;
    if (prev) {
      item.rel.push(`RNR NAK again for PSN ${hex24(psn)}${what}, ${ordinal(prev.count + 1)} in a row since frame ${prev.since}: still no receive buffer posted; the requester waits at least ${wait} again.`);
    } else {
      item.rel.push(
        `RNR NAK (receiver not ready) for PSN ${hex24(psn)}${what}: the responder had no receive buffer posted for it. ` +
          `The requester waits at least ${wait} (timer code ${v}) and sends it again; each retry uses up one of its rnr_retry count (7 means retry forever).${implicit}`,
      );
    }
    if (g) {
      g.nak = { kind: 'RNR', frame: d.frame, ts: d.timestampNs, psn, timerUs, item, followed: false, since: prev?.since ?? d.frame, count: (prev?.count ?? 0) + 1 };
    }
  } else if (kind === 'NAK') {
    t.naks.set(`NAK ${nakCodeName(v)}`, (t.naks.get(`NAK ${nakCodeName(v)}`) ?? 0) + 1);
    const a = g ? acknowledge(g, psnAdd(psn, -1), d.frame) : undefined;
    const implicit = a && (a.packets.length > 0 || a.messages.length > 0) ? ` It also acknowledges ${ackedWords(a)}.` : '';
    if (v === NAK_CODE.PSN_SEQUENCE_ERROR) {
      const lost = g?.lost.get(psn);
      const why = lost
        ? `; it got a later one instead (PSN ${hex24(lost.arrived)} in frame ${lost.frame}), because ${hex24(psn)} never arrived`
        : '; it got a later one instead';
      item.rel.push(
        `NAK PSN sequence error: the responder expected PSN ${hex24(psn)}${why}. It discards what comes after the hole and asks the requester to resend everything from ${hex24(psn)} on (go-back-N).${implicit}`,
      );
      if (g) g.nak = { kind: 'NAK', frame: d.frame, ts: d.timestampNs, psn, timerUs: 0, item, followed: false, since: d.frame, count: 1 };
    } else {
      const req = g?.sent.get(psn);
      const wc: Record<number, string> = {
        [NAK_CODE.INVALID_REQUEST]: 'IBV_WC_REM_INV_REQ_ERR',
        [NAK_CODE.REMOTE_ACCESS_ERROR]: 'IBV_WC_REM_ACCESS_ERR',
        [NAK_CODE.REMOTE_OPERATIONAL_ERROR]: 'IBV_WC_REM_OP_ERR',
      };
      item.rel.push(
        `NAK ${nakCodeName(v)} for PSN ${hex24(psn)}${req ? ` (the ${req.msg.noun} in frame ${req.frame})` : ''}: a fatal error, nothing is retried. ` +
          `The requester completes the work request with ${wc[v] ?? 'an error'} and its QP goes to the Error state.${implicit}`,
      );
    }
  }
  f.lastAck = { frame: d.frame, psn, msn: aeth.msn };
}

function explainReadResponse(t: Tracker, g: Flow | undefined, d: DecodedFrame, p: RocePacket, info: OpcodeInfo, item: Item): void {
  const psn = p.bth.psn;
  if (!g) {
    item.rel.push('The READ request it answers is not in this capture.');
    return;
  }
  // The READ whose reserved PSN range holds this PSN: the latest one starting at or before it.
  let m: Message | undefined;
  for (const x of g.pending) {
    if (!x.read || psnDiff(psn, x.firstPsn) < 0) continue;
    if (x.read.n !== undefined && psnDiff(psn, x.firstPsn) >= x.read.n) continue;
    if (!m || psnDiff(x.firstPsn, m.firstPsn) > 0) m = x;
  }
  if (!m || !m.read) {
    item.rel.push(`No outstanding READ request of ${g.src} covers PSN ${hex24(psn)}${g.ackedPsn !== undefined && psnDiff(psn, g.ackedPsn) <= 0 ? ': a repeat of a response already delivered' : ''}.`);
    return;
  }
  const r = m.read;
  if (info.position === 'first' && r.n === undefined) {
    t.pmtu.set(t.pairKey(g.src, g.dst), p.payload.length);
    r.n = Math.max(1, Math.ceil(r.len / p.payload.length));
  }
  const idx = psnDiff(psn, m.firstPsn) + 1;
  const repeat = idx <= r.got;
  r.got = Math.max(r.got, idx);
  r.firstFrame ??= d.frame;
  r.lastFrame = d.frame;
  const pmtu = t.pmtu.get(t.pairKey(g.src, g.dst));
  const offset = pmtu ? (idx - 1) * pmtu : undefined;
  const bytes = offset !== undefined && p.payload.length > 0 ? `: bytes ${offset}–${offset + p.payload.length - 1} of ${r.len}` : '';
  if (info.position === 'only') {
    item.rel.push(`The whole answer to the READ request in frame ${m.firstFrame} (PSN ${hex24(m.firstPsn)}): ${p.payload.length} bytes from ${hex64(r.va)}.`);
  } else {
    item.rel.push(`Response ${idx}${r.n !== undefined ? ` of ${r.n}` : ''} to the READ request in frame ${m.firstFrame} (PSN ${hex24(m.firstPsn)})${bytes}${repeat ? '; a repeat: the READ was asked for again' : ''}.`);
  }
  if (info.end) {
    acknowledge(g, psn, d.frame);
    if (info.position === 'last') item.rel.push(`Completes that READ: ${r.len} bytes in ${plural(idx, 'packet')}, ${frameRange(r.firstFrame, d.frame)}; the requester's work request completes.`);
    m.item?.later.push(`Answered in ${frameRange(r.firstFrame, d.frame)}.`);
  }
}

function explainAtomicAck(g: Flow | undefined, d: DecodedFrame, p: RocePacket, item: Item): void {
  const psn = p.bth.psn;
  const orig = p.atomicAckEth?.originalData;
  const req = g?.sent.get(psn);
  const a = req?.msg.atomic;
  if (orig === undefined) return;
  if (!req || !a) {
    item.rel.push(`The original value was ${hex64(orig)}; the atomic request it answers (PSN ${hex24(psn)}) is not in this capture.`);
    return;
  }
  let outcome: string;
  if (a.op === 'CmpSwap') {
    outcome = orig === a.compare
      ? `it equals the compare value, so the memory now holds the swap value ${hex64(a.swapAdd)}`
      : `it differs from the compare value ${hex64(a.compare)}, so nothing was swapped`;
  } else {
    outcome = `the memory now holds ${hex64((orig + a.swapAdd) & 0xffffffffffffffffn)} (original + ${hex64(a.swapAdd)})`;
  }
  item.rel.push(`Answers the ${a.op} in frame ${req.frame} (PSN ${hex24(psn)}): the original value at ${hex64(a.va)} was ${hex64(orig)}; ${outcome}.`);
  req.msg.item?.later.push(`Answered in frame ${d.frame}: the original value was ${hex64(orig)}.`);
}

// ---------------------------------------------------------------------------------------------
// Summary.

function counts(m: Map<string, number>): string {
  return [...m.entries()].map(([k, n]) => `${k} ×${n}`).join(', ');
}

function summarize(t: Tracker): string[] {
  const out: string[] = [];
  if (t.total === 0) {
    out.push('No RoCEv2 packets in this capture.');
    return out;
  }
  const span = t.firstTs === undefined ? 0 : Number(t.lastTs - t.firstTs) / 1e9;
  out.push(`Summary: ${plural(t.total, 'RoCEv2 packet')} in frames ${t.firstFrame}–${t.lastFrame}, over ${span.toFixed(3)} s.`);
  out.push(`  Packets per opcode: ${counts(t.opcodes)}.`);
  out.push('  Connections:');
  const done = new Set<Flow>();
  const dir = (f: Flow): string => {
    const parts: string[] = [];
    if (f.messages > 0) parts.push(`${plural(f.messages, 'message')} (${counts(f.byNoun)}) in ${plural(f.requests, 'request packet')}`);
    if (f.retransmissions > 0) parts.push(`${plural(f.retransmissions, 'retransmission')}`);
    if (f.acks.size > 0) parts.push(`responses: ${counts(f.acks)}`);
    if (f.transport === 'RC' && f.requests > 0 && (!f.peer || f.peer.responses === 0)) parts.push('no response to its requests in the capture');
    return `      ${f.src} → ${f.dst} QP ${hexQp(f.qp)}: ${parts.join('; ') || 'nothing'}`;
  };
  for (const f of t.flows.values()) {
    if (done.has(f)) continue;
    done.add(f);
    if (f.transport === 'UD') {
      out.push(`    UD ${f.src}${f.udSrcQp !== undefined ? ` QP ${hexQp(f.udSrcQp)}` : ''} → ${f.dst} QP ${hexQp(f.qp)}${f.qp === 1 ? ' (GSI: CM MADs)' : ''}: ${plural(f.messages, 'datagram')}`);
      continue;
    }
    let peer = f.peer;
    if (!peer) {
      const rev = [...t.flows.values()].filter((g) => g.src === f.dst && g.dst === f.src && g.transport === f.transport && !g.peer);
      const fwd = [...t.flows.values()].filter((g) => g.src === f.src && g.dst === f.dst && g.transport === f.transport && !g.peer);
      if (rev.length === 1 && fwd.length === 1) peer = rev[0];
    }
    if (peer) {
      done.add(peer);
      // A flow's destination QP is the QP of its destination host.
      out.push(`    ${f.transport} ${f.dst} QP ${hexQp(f.qp)} ⇄ ${peer.dst} QP ${hexQp(peer.qp)}:`);
      out.push(dir(f), dir(peer));
    } else {
      out.push(`    ${f.transport} ${f.src} → ${f.dst} QP ${hexQp(f.qp)}:`);
      out.push(dir(f));
    }
  }
  if (t.cmMessages.size > 0) out.push(`  CM MADs: ${counts(t.cmMessages)}.`);
  const messages = [...t.flows.values()].reduce((n, f) => n + f.messages, 0);
  out.push(`  Messages: ${messages}.`);
  const retrans = [...t.retransmits.values()].reduce((a, b) => a + b, 0);
  out.push(`  Retransmissions: ${retrans}${retrans ? ` (${counts(t.retransmits)})` : ''}.`);
  out.push(`  NAKs: ${t.naks.size ? counts(t.naks) : 'none'}.`);
  if (t.rnrAsked.length > 0) {
    const asked = [...new Set(t.rnrAsked.map((x) => x.toFixed(2)))].join('/');
    const waits = t.rnrWaits.length ? `; measured waits ${Math.min(...t.rnrWaits).toFixed(2)}–${Math.max(...t.rnrWaits).toFixed(2)} ms` : '';
    out.push(`  RNR waits: ${t.rnrAsked.length}, each asking for at least ${asked} ms${waits}.`);
  } else {
    out.push('  RNR waits: none.');
  }
  out.push(`  PSN gaps: ${t.gaps}${t.gaps ? ` (${plural(t.lostPackets, 'packet')} never reached the capture point)` : ''}.`);
  out.push(`  Malformed: ${t.malformed}; bad ICRC: ${t.badIcrc}.`);
  return out;
}

/**
 * Communication Management messages (IBTA Vol. 1 §12.6, management class 0x07, class
 * version 2): REQ, MRA, REJ, REP, RTU, DREQ, DREP, as records with parse and emit, and the
 * IP-based CM private data (IBTA Annex A11, "CMA header") that rdma_cm puts at the start of
 * a REQ's private data.
 *
 * Offsets below are from the start of the MAD's class data (MAD byte 24). Bit fields are
 * numbered from the most significant bit of their byte, as IBTA draws them.
 *
 * The contract is the wire layer's: `parseCmMad` never throws on untrusted bytes (typed
 * error instead); `emitCmMad` writes all 256 bytes. Reserved bits are ignored on parse and
 * written as zero. Private data, GIDs and the ARI are copies, not views: CM records outlive
 * the receive buffer (they sit in connection state and in retransmission queues).
 */

import { readU16, readU24, readU32, readU64, writeU16, writeU24, writeU32, writeU64 } from '../wire/bytes.js';
import { formatIpAddress, parseIpAddress } from '../wire/frame.js';
import { MAD_BASE_VERSION, MAD_HEADER_LEN, MAD_LEN, MAD_METHOD, MGMT_CLASS, emitMadHeader, parseMad, type MadHeader } from './mad.js';

/** ClassVersion of the CM class this stack speaks (the one Linux and every HCA use). */
export const CM_CLASS_VERSION = 2;

/** CM attribute IDs (IBTA table 100). */
export const CM_ATTR = {
  CLASS_PORT_INFO: 0x0001,
  REQ: 0x0010,
  MRA: 0x0011,
  REJ: 0x0012,
  REP: 0x0013,
  RTU: 0x0014,
  DREQ: 0x0015,
  DREP: 0x0016,
  SIDR_REQ: 0x0017,
  SIDR_REP: 0x0018,
  LAP: 0x0019,
  APR: 0x001a,
} as const;

/** Private data each message carries, bytes (what is left of the 232 after its fields). */
export const CM_PRIVATE_DATA_LEN = {
  REQ: 92,
  MRA: 222,
  REJ: 148,
  REP: 196,
  RTU: 224,
  DREQ: 220,
  DREP: 224,
} as const;

/** Additional Rejection Information, bytes, in a REJ. */
export const CM_REJ_ARI_LEN = 72;

/** Transport Service Type of a REQ (IBTA table 106). */
export const CM_TRANSPORT = { RC: 0, UC: 1, RD: 2 } as const;

/** "Message REJected" / "Message MRAed" codes: which message the REJ or MRA answers. */
export const CM_MSG_CODE = { REQ: 0, REP: 1, OTHER: 2 } as const;

/** Rejection reasons (IBTA table 108, §12.6.7.2). */
export const CM_REJ_REASON = {
  NO_QP: 1,
  NO_EEC: 2,
  NO_RESOURCES: 3,
  TIMEOUT: 4,
  UNSUPPORTED: 5,
  INVALID_COMM_ID: 6,
  INVALID_COMM_INSTANCE: 7,
  /** No listener for the REQ's service ID: what rdma_cm reports as "REJECTED, status 8". */
  INVALID_SERVICE_ID: 8,
  INVALID_TRANSPORT_TYPE: 9,
  STALE_CONN: 10,
  RDC_NOT_EXIST: 11,
  INVALID_GID: 12,
  INVALID_LID: 13,
  INVALID_SL: 14,
  INVALID_TRAFFIC_CLASS: 15,
  INVALID_HOP_LIMIT: 16,
  INVALID_PACKET_RATE: 17,
  INVALID_ALT_GID: 18,
  INVALID_ALT_LID: 19,
  INVALID_ALT_SL: 20,
  INVALID_ALT_TRAFFIC_CLASS: 21,
  INVALID_ALT_HOP_LIMIT: 22,
  INVALID_ALT_PACKET_RATE: 23,
  PORT_CM_REDIRECT: 24,
  PORT_REDIRECT: 25,
  INVALID_MTU: 26,
  INSUFFICIENT_RESP_RESOURCES: 27,
  /** The consumer said no (rdma_reject). */
  CONSUMER_REJECT: 28,
  INVALID_RNR_RETRY: 29,
  DUPLICATE_LOCAL_COMM_ID: 30,
  INVALID_CLASS_VERSION: 31,
  INVALID_FLOW_LABEL: 32,
  INVALID_ALT_FLOW_LABEL: 33,
  VENDOR_OPTION_NOT_SUPPORTED: 35,
} as const;

const REJ_REASON_NAMES: ReadonlyMap<number, string> = new Map([
  [1, 'No QP available'],
  [2, 'No EEC available'],
  [3, 'No resources available'],
  [4, 'Timeout'],
  [5, 'Unsupported request'],
  [6, 'Invalid Communication ID'],
  [7, 'Invalid Communication Instance'],
  [8, 'Invalid Service ID'],
  [9, 'Invalid Transport Service Type'],
  [10, 'Stale connection'],
  [11, 'RDC does not exist'],
  [12, 'Primary Remote Port GID rejected'],
  [13, 'Primary Remote Port LID rejected'],
  [14, 'Invalid Primary SL'],
  [15, 'Invalid Primary Traffic Class'],
  [16, 'Invalid Primary Hop Limit'],
  [17, 'Invalid Primary Packet Rate'],
  [18, 'Alternate Remote Port GID rejected'],
  [19, 'Alternate Remote Port LID rejected'],
  [20, 'Invalid Alternate SL'],
  [21, 'Invalid Alternate Traffic Class'],
  [22, 'Invalid Alternate Hop Limit'],
  [23, 'Invalid Alternate Packet Rate'],
  [24, 'Port and CM Redirection'],
  [25, 'Port Redirection'],
  [26, 'Invalid Path MTU'],
  [27, 'Insufficient Responder Resources'],
  [28, 'Consumer Reject'],
  [29, 'Invalid RNR NAK Retry Count'],
  [30, 'Duplicate Local Communication ID'],
  [31, 'Unsupported Class Version'],
  [32, 'Invalid Primary Flow Label'],
  [33, 'Invalid Alternate Flow Label'],
  [35, 'Vendor option not supported'],
]);

/** The table 108 name of a rejection reason. */
export function rejReasonName(reason: number): string {
  return REJ_REASON_NAMES.get(reason) ?? `reserved reason ${reason}`;
}

/** Path MTU codes of the REQ's "Path Packet Payload MTU" (IBTA table 22 encoding). */
export const CM_MTU_CODE: Readonly<Record<number, number>> = { 1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096 };

export function mtuOfCode(code: number): number | undefined {
  return CM_MTU_CODE[code];
}

export function codeOfMtu(mtu: number): number {
  const code = [256, 512, 1024, 2048, 4096].indexOf(mtu);
  if (code < 0) throw new RangeError(`no path MTU code for ${mtu}`);
  return code + 1;
}

/** CM timeouts are 5-bit exponents: 4.096 µs × 2^t (IBTA 12.6.2, "CM Response Timeout"). */
export function cmTimeoutUs(t: number): number {
  return 4.096 * 2 ** (t & 0x1f);
}

/** A path as a REQ describes it (primary or alternate, IBTA table 106). */
export interface CmPath {
  /** RoCE has no LIDs: rdma_cm writes the permissive LID 0xffff for the primary path. */
  localLid: number;
  remoteLid: number;
  /** 16 bytes; on RoCEv2 the IP address (IPv4 as ::ffff:a.b.c.d). */
  localGid: Uint8Array;
  remoteGid: Uint8Array;
  /** 20 bits. */
  flowLabel: number;
  /** 6 bits (IBTA table 205 rate codes). */
  packetRate: number;
  trafficClass: number;
  hopLimit: number;
  /** 4 bits. */
  sl: number;
  subnetLocal: boolean;
  /** 5 bits: the QP's local ACK timeout exponent. */
  localAckTimeout: number;
}

export interface CmReq {
  kind: 'REQ';
  localCommId: number;
  serviceId: bigint;
  localCaGuid: bigint;
  localQkey: number;
  localQpn: number;
  /** Max RDMA READ/atomic the sender accepts as responder. */
  responderResources: number;
  localEecn: number;
  /** Max RDMA READ/atomic the sender issues as requester. */
  initiatorDepth: number;
  remoteEecn: number;
  /** 5 bits: how long the sender's peer may take to answer, 4.096 µs × 2^t. */
  remoteCmResponseTimeout: number;
  /** 2 bits: CM_TRANSPORT. */
  transportServiceType: number;
  endToEndFlowControl: boolean;
  startingPsn: number;
  /** 5 bits: how long the sender itself takes to answer. */
  localCmResponseTimeout: number;
  /** 3 bits. */
  retryCount: number;
  pkey: number;
  /** 4 bits: CM_MTU_CODE. */
  pathMtu: number;
  rdcExists: boolean;
  /** 3 bits. */
  rnrRetryCount: number;
  /** 4 bits: retries of each CM request before giving up, for both sides. */
  maxCmRetries: number;
  srq: boolean;
  /** 3 bits. */
  extendedTransportType: number;
  primaryPath: CmPath;
  alternatePath: CmPath;
  /** The bit after the alternate local ACK timeout (IBTA 1.4 "SAP supported"). */
  sapSupported: boolean;
  /** 92 bytes; rdma_cm's IP CM header takes the first 36. */
  privateData: Uint8Array;
}

export interface CmMra {
  kind: 'MRA';
  localCommId: number;
  remoteCommId: number;
  /** 2 bits: CM_MSG_CODE of the message being acknowledged. */
  messageMraed: number;
  /** 5 bits: 4.096 µs × 2^t more the sender needs. */
  serviceTimeout: number;
  privateData: Uint8Array;
}

export interface CmRej {
  kind: 'REJ';
  localCommId: number;
  remoteCommId: number;
  /** 2 bits: CM_MSG_CODE of the message being rejected. */
  messageRejected: number;
  /** 7 bits: bytes of `ari` that mean something. */
  rejectedInfoLength: number;
  reason: number;
  /** 72 bytes of Additional Rejection Information. */
  ari: Uint8Array;
  privateData: Uint8Array;
}

export interface CmRep {
  kind: 'REP';
  localCommId: number;
  remoteCommId: number;
  localQkey: number;
  localQpn: number;
  localEecn: number;
  startingPsn: number;
  responderResources: number;
  initiatorDepth: number;
  /** 5 bits. */
  targetAckDelay: number;
  /** 2 bits. */
  failoverAccepted: number;
  endToEndFlowControl: boolean;
  /** 3 bits. */
  rnrRetryCount: number;
  srq: boolean;
  localCaGuid: bigint;
  privateData: Uint8Array;
}

export interface CmRtu {
  kind: 'RTU';
  localCommId: number;
  remoteCommId: number;
  privateData: Uint8Array;
}

export interface CmDreq {
  kind: 'DREQ';
  localCommId: number;
  remoteCommId: number;
  /** The receiver's QPN (or EECN): the connection being torn down. */
  remoteQpn: number;
  privateData: Uint8Array;
}

export interface CmDrep {
  kind: 'DREP';
  localCommId: number;
  remoteCommId: number;
  privateData: Uint8Array;
}

export type CmMessage = CmReq | CmMra | CmRej | CmRep | CmRtu | CmDreq | CmDrep;
export type CmKind = CmMessage['kind'];

/** A CM message with the MAD header it travels under. */
export interface CmMad {
  /**
   * The MAD header. Its attributeId is the message's on emit (the record cannot disagree
   * with itself); the other fields are written as they are.
   */
  header: MadHeader;
  msg: CmMessage;
}

/** The MAD header every CM message uses: BaseVersion 1, class 0x07 version 2, method Send. */
export function cmMadHeader(kind: CmKind, transactionId: bigint): MadHeader {
  return {
    baseVersion: MAD_BASE_VERSION,
    mgmtClass: MGMT_CLASS.CM,
    classVersion: CM_CLASS_VERSION,
    response: false,
    method: MAD_METHOD.SEND,
    status: 0,
    classSpecific: 0,
    transactionId,
    attributeId: CM_ATTR[kind],
    reserved: 0,
    attributeModifier: 0,
  };
}

export type CmErrorCode =
  /** The MAD itself is malformed (see MadErrorCode in the detail). */
  | 'BAD_MAD'
  /** Not management class 0x07. */
  | 'NOT_CM'
  /** CM class version other than 2. */
  | 'BAD_CLASS_VERSION'
  /** A method other than Send, or the R bit set. */
  | 'BAD_METHOD'
  /** A CM attribute this codec does not handle (ClassPortInfo, SIDR, LAP, APR, reserved). */
  | 'UNSUPPORTED_ATTRIBUTE';

export type CmParse = { ok: true; mad: CmMad } | { ok: false; error: CmErrorCode; detail: string; attributeId?: number };

// ---------------------------------------------------------------------------------------------
// Parse

/** A copy as a plain Uint8Array (`slice` on a Node Buffer would give a view, and a Buffer). */
const copy = (b: Uint8Array, at: number, n: number): Uint8Array => new Uint8Array(b.subarray(at, at + n));

function parsePath(b: Uint8Array, o: number): CmPath {
  // o+0 local LID, +2 remote LID, +4 local GID, +20 remote GID, +36 flow label(20) rsvd(6)
  // rate(6), +40 traffic class, +41 hop limit, +42 SL(4) subnet local(1) rsvd(3),
  // +43 local ACK timeout(5) rsvd(3)
  return {
    localLid: readU16(b, o),
    remoteLid: readU16(b, o + 2),
    localGid: copy(b, o + 4, 16),
    remoteGid: copy(b, o + 20, 16),
    flowLabel: readU32(b, o + 36) >>> 12,
    packetRate: b[o + 39]! & 0x3f,
    trafficClass: b[o + 40]!,
    hopLimit: b[o + 41]!,
    sl: b[o + 42]! >>> 4,
    subnetLocal: (b[o + 42]! & 0x08) !== 0,
    localAckTimeout: b[o + 43]! >>> 3,
  };
}

function parseReq(b: Uint8Array, d: number): CmReq {
  return {
    kind: 'REQ',
    localCommId: readU32(b, d),
    serviceId: readU64(b, d + 8),
    localCaGuid: readU64(b, d + 16),
    localQkey: readU32(b, d + 28),
    localQpn: readU24(b, d + 32),
    responderResources: b[d + 35]!,
    localEecn: readU24(b, d + 36),
    initiatorDepth: b[d + 39]!,
    remoteEecn: readU24(b, d + 40),
    remoteCmResponseTimeout: b[d + 43]! >>> 3,
    transportServiceType: (b[d + 43]! >>> 1) & 3,
    endToEndFlowControl: (b[d + 43]! & 1) !== 0,
    startingPsn: readU24(b, d + 44),
    localCmResponseTimeout: b[d + 47]! >>> 3,
    retryCount: b[d + 47]! & 7,
    pkey: readU16(b, d + 48),
    pathMtu: b[d + 50]! >>> 4,
    rdcExists: (b[d + 50]! & 0x08) !== 0,
    rnrRetryCount: b[d + 50]! & 7,
    maxCmRetries: b[d + 51]! >>> 4,
    srq: (b[d + 51]! & 0x08) !== 0,
    extendedTransportType: b[d + 51]! & 7,
    primaryPath: parsePath(b, d + 52),
    alternatePath: parsePath(b, d + 96),
    sapSupported: (b[d + 139]! & 0x04) !== 0,
    privateData: copy(b, d + 140, CM_PRIVATE_DATA_LEN.REQ),
  };
}

function parseBody(attr: number, b: Uint8Array, d: number): CmMessage | undefined {
  const localCommId = readU32(b, d);
  const remoteCommId = readU32(b, d + 4);
  switch (attr) {
    case CM_ATTR.REQ:
      return parseReq(b, d);
    case CM_ATTR.MRA:
      return {
        kind: 'MRA', localCommId, remoteCommId,
        messageMraed: b[d + 8]! >>> 6,
        serviceTimeout: b[d + 9]! >>> 3,
        privateData: copy(b, d + 10, CM_PRIVATE_DATA_LEN.MRA),
      };
    case CM_ATTR.REJ:
      return {
        kind: 'REJ', localCommId, remoteCommId,
        messageRejected: b[d + 8]! >>> 6,
        rejectedInfoLength: b[d + 9]! >>> 1,
        reason: readU16(b, d + 10),
        ari: copy(b, d + 12, CM_REJ_ARI_LEN),
        privateData: copy(b, d + 84, CM_PRIVATE_DATA_LEN.REJ),
      };
    case CM_ATTR.REP:
      return {
        kind: 'REP', localCommId, remoteCommId,
        localQkey: readU32(b, d + 8),
        localQpn: readU24(b, d + 12),
        localEecn: readU24(b, d + 16),
        startingPsn: readU24(b, d + 20),
        responderResources: b[d + 24]!,
        initiatorDepth: b[d + 25]!,
        targetAckDelay: b[d + 26]! >>> 3,
        failoverAccepted: (b[d + 26]! >>> 1) & 3,
        endToEndFlowControl: (b[d + 26]! & 1) !== 0,
        rnrRetryCount: b[d + 27]! >>> 5,
        srq: (b[d + 27]! & 0x10) !== 0,
        localCaGuid: readU64(b, d + 28),
        privateData: copy(b, d + 36, CM_PRIVATE_DATA_LEN.REP),
      };
    case CM_ATTR.RTU:
      return { kind: 'RTU', localCommId, remoteCommId, privateData: copy(b, d + 8, CM_PRIVATE_DATA_LEN.RTU) };
    case CM_ATTR.DREQ:
      return {
        kind: 'DREQ', localCommId, remoteCommId,
        remoteQpn: readU24(b, d + 8),
        privateData: copy(b, d + 12, CM_PRIVATE_DATA_LEN.DREQ),
      };
    case CM_ATTR.DREP:
      return { kind: 'DREP', localCommId, remoteCommId, privateData: copy(b, d + 8, CM_PRIVATE_DATA_LEN.DREP) };
    default:
      return undefined;
  }
}

/**
 * Parses a CM MAD (the UD payload of a SEND to QP1). Checks, in order: MAD length and base
 * version, class 0x07, class version 2, method Send without the R bit, a known attribute.
 */
export function parseCmMad(b: Uint8Array, off = 0, len = b.length - off): CmParse {
  const r = parseMad(b, off, len);
  if (!r.ok) return { ok: false, error: 'BAD_MAD', detail: `${r.error}: ${r.detail}` };
  const h = r.mad.header;
  if (h.mgmtClass !== MGMT_CLASS.CM) return { ok: false, error: 'NOT_CM', detail: `management class 0x${h.mgmtClass.toString(16)}` };
  if (h.classVersion !== CM_CLASS_VERSION) return { ok: false, error: 'BAD_CLASS_VERSION', detail: `CM class version ${h.classVersion}` };
  if (h.method !== MAD_METHOD.SEND || h.response) {
    return { ok: false, error: 'BAD_METHOD', detail: `method 0x${((h.response ? 0x80 : 0) | h.method).toString(16)}` };
  }
  const msg = parseBody(h.attributeId, b, off + MAD_HEADER_LEN);
  if (msg === undefined) {
    return { ok: false, error: 'UNSUPPORTED_ATTRIBUTE', detail: `attribute 0x${h.attributeId.toString(16).padStart(4, '0')}`, attributeId: h.attributeId };
  }
  return { ok: true, mad: { header: h, msg } };
}

// ---------------------------------------------------------------------------------------------
// Emit

export class CmEmitError extends Error {
  readonly code = 'ERR_CM_EMIT';
}

/** Writes `src` into a `len`-byte field at `at`, zero-filling the rest; longer is an error. */
function putBytes(b: Uint8Array, at: number, len: number, src: Uint8Array, what: string): void {
  if (src.length > len) throw new CmEmitError(`${what} is ${src.length} bytes, the field holds ${len}`);
  b.set(src, at);
  b.fill(0, at + src.length, at + len);
}

function emitPath(p: CmPath, b: Uint8Array, o: number, sap: boolean): void {
  writeU16(b, o, p.localLid & 0xffff);
  writeU16(b, o + 2, p.remoteLid & 0xffff);
  putBytes(b, o + 4, 16, p.localGid, 'local GID');
  putBytes(b, o + 20, 16, p.remoteGid, 'remote GID');
  writeU32(b, o + 36, (((p.flowLabel & 0xfffff) << 12) | (p.packetRate & 0x3f)) >>> 0);
  b[o + 40] = p.trafficClass;
  b[o + 41] = p.hopLimit;
  b[o + 42] = ((p.sl & 0xf) << 4) | (p.subnetLocal ? 0x08 : 0);
  b[o + 43] = ((p.localAckTimeout & 0x1f) << 3) | (sap ? 0x04 : 0);
}

function emitBody(m: CmMessage, b: Uint8Array, d: number): void {
  // Every message but REQ starts with local and remote comm IDs; REQ's bytes 4..7 are reserved.
  writeU32(b, d, m.localCommId >>> 0);
  writeU32(b, d + 4, m.kind === 'REQ' ? 0 : m.remoteCommId >>> 0);
  const pd = CM_PRIVATE_DATA_LEN[m.kind];
  switch (m.kind) {
    case 'REQ':
      writeU64(b, d + 8, BigInt.asUintN(64, m.serviceId));
      writeU64(b, d + 16, BigInt.asUintN(64, m.localCaGuid));
      writeU32(b, d + 24, 0);
      writeU32(b, d + 28, m.localQkey >>> 0);
      writeU24(b, d + 32, m.localQpn & 0xffffff);
      b[d + 35] = m.responderResources;
      writeU24(b, d + 36, m.localEecn & 0xffffff);
      b[d + 39] = m.initiatorDepth;
      writeU24(b, d + 40, m.remoteEecn & 0xffffff);
      b[d + 43] = ((m.remoteCmResponseTimeout & 0x1f) << 3) | ((m.transportServiceType & 3) << 1) | (m.endToEndFlowControl ? 1 : 0);
      writeU24(b, d + 44, m.startingPsn & 0xffffff);
      b[d + 47] = ((m.localCmResponseTimeout & 0x1f) << 3) | (m.retryCount & 7);
      writeU16(b, d + 48, m.pkey & 0xffff);
      b[d + 50] = ((m.pathMtu & 0xf) << 4) | (m.rdcExists ? 0x08 : 0) | (m.rnrRetryCount & 7);
      b[d + 51] = ((m.maxCmRetries & 0xf) << 4) | (m.srq ? 0x08 : 0) | (m.extendedTransportType & 7);
      emitPath(m.primaryPath, b, d + 52, false);
      emitPath(m.alternatePath, b, d + 96, m.sapSupported);
      putBytes(b, d + 140, pd, m.privateData, 'REQ private data');
      return;
    case 'MRA':
      b[d + 8] = (m.messageMraed & 3) << 6;
      b[d + 9] = (m.serviceTimeout & 0x1f) << 3;
      putBytes(b, d + 10, pd, m.privateData, 'MRA private data');
      return;
    case 'REJ':
      b[d + 8] = (m.messageRejected & 3) << 6;
      b[d + 9] = (m.rejectedInfoLength & 0x7f) << 1;
      writeU16(b, d + 10, m.reason & 0xffff);
      putBytes(b, d + 12, CM_REJ_ARI_LEN, m.ari, 'REJ ARI');
      putBytes(b, d + 84, pd, m.privateData, 'REJ private data');
      return;
    case 'REP':
      writeU32(b, d + 8, m.localQkey >>> 0);
      writeU24(b, d + 12, m.localQpn & 0xffffff);
      b[d + 15] = 0;
      writeU24(b, d + 16, m.localEecn & 0xffffff);
      b[d + 19] = 0;
      writeU24(b, d + 20, m.startingPsn & 0xffffff);
      b[d + 23] = 0;
      b[d + 24] = m.responderResources;
      b[d + 25] = m.initiatorDepth;
      b[d + 26] = ((m.targetAckDelay & 0x1f) << 3) | ((m.failoverAccepted & 3) << 1) | (m.endToEndFlowControl ? 1 : 0);
      b[d + 27] = ((m.rnrRetryCount & 7) << 5) | (m.srq ? 0x10 : 0);
      writeU64(b, d + 28, BigInt.asUintN(64, m.localCaGuid));
      putBytes(b, d + 36, pd, m.privateData, 'REP private data');
      return;
    case 'RTU':
    case 'DREP':
      putBytes(b, d + 8, pd, m.privateData, `${m.kind} private data`);
      return;
    case 'DREQ':
      writeU24(b, d + 8, m.remoteQpn & 0xffffff);
      b[d + 11] = 0;
      putBytes(b, d + 12, pd, m.privateData, 'DREQ private data');
      return;
  }
}

/** Writes the 256-byte CM MAD at `off`; returns the offset after it. */
export function emitCmMad(m: CmMad, b: Uint8Array, off = 0): number {
  if (off < 0 || off + MAD_LEN > b.length) throw new CmEmitError(`a CM MAD needs ${MAD_LEN} bytes at offset ${off} of ${b.length}`);
  emitMadHeader({ ...m.header, attributeId: CM_ATTR[m.msg.kind] }, b, off);
  emitBody(m.msg, b, off + MAD_HEADER_LEN);
  return off + MAD_LEN;
}

/** The CM MAD as a fresh 256-byte array. */
export function cmMadBytes(m: CmMad): Uint8Array {
  const b = new Uint8Array(MAD_LEN);
  emitCmMad(m, b, 0);
  return b;
}

// ---------------------------------------------------------------------------------------------
// rdma_cm over IP: service IDs and the IP CM private data (IBTA Annex A11)

/** rdma_cm port spaces: librdmacm's RDMA_PS_*. The service ID is (port space << 16) + port. */
export const RDMA_PS = { IPOIB: 0x0002, TCP: 0x0106, UDP: 0x0111, IB: 0x013f } as const;

/**
 * The service ID rdma_cm listens on and connects to: (port space << 16) + port, e.g.
 * 0x0000000001060000 + port for RDMA_PS_TCP. The 0x01 byte IBTA Annex A11.2 reserves for the
 * IP CM service is the high byte of the TCP, UDP and IB port spaces.
 */
export function rdmaCmServiceId(port: number, portSpace: number = RDMA_PS.TCP): bigint {
  return (BigInt(portSpace & 0xffff) << 16n) | BigInt(port & 0xffff);
}

/** Port space and port of an rdma_cm service ID, or undefined when the top 32 bits are not 0. */
export function parseRdmaCmServiceId(serviceId: bigint): { portSpace: number; port: number } | undefined {
  if (serviceId >> 32n !== 0n) return undefined;
  return { portSpace: Number((serviceId >> 16n) & 0xffffn), port: Number(serviceId & 0xffffn) };
}

/** Bytes of the IP CM header at the start of a REQ's private data. */
export const CMA_HEADER_LEN = 36;
/** Consumer private data left in a REQ after the IP CM header (rdma_cm's limit: 56). */
export const CMA_REQ_USER_DATA_LEN = CM_PRIVATE_DATA_LEN.REQ - CMA_HEADER_LEN;

/**
 * The IP CM header (Annex A11.4; Linux `struct cma_hdr`):
 *
 *   0  MajV(4) MinV(4)     -- rdma_cm writes 0x00
 *   1  IPV(4) reserved(4)  -- 4 or 6
 *   2  source port (16)    -- the active side's rdma_cm port
 *   4  source IP (128)     -- IPv4 in the last 4 bytes, the first 12 zero (not ::ffff:)
 *  20  destination IP (128)
 */
export interface CmaHeader {
  majorVersion: number;
  minorVersion: number;
  ipVersion: number;
  srcPort: number;
  /** 16 bytes as on the wire. */
  srcIp: Uint8Array;
  dstIp: Uint8Array;
}

export type CmaParse = { ok: true; header: CmaHeader; userData: Uint8Array } | { ok: false; error: 'TOO_SHORT' | 'BAD_VERSION' | 'BAD_IP_VERSION'; detail: string };

/** Parses the IP CM header at the start of a REQ's private data; `userData` is the rest (a view). */
export function parseCmaHeader(pd: Uint8Array): CmaParse {
  if (pd.length < CMA_HEADER_LEN) return { ok: false, error: 'TOO_SHORT', detail: `${pd.length} bytes of private data` };
  const majorVersion = pd[0]! >>> 4;
  if (majorVersion !== 0) return { ok: false, error: 'BAD_VERSION', detail: `IP CM version ${majorVersion}.${pd[0]! & 0xf}` };
  const ipVersion = pd[1]! >>> 4;
  if (ipVersion !== 4 && ipVersion !== 6) return { ok: false, error: 'BAD_IP_VERSION', detail: `IP version ${ipVersion}` };
  return {
    ok: true,
    header: {
      majorVersion,
      minorVersion: pd[0]! & 0xf,
      ipVersion,
      srcPort: readU16(pd, 2),
      srcIp: copy(pd, 4, 16),
      dstIp: copy(pd, 20, 16),
    },
    userData: pd.subarray(CMA_HEADER_LEN),
  };
}

/** Writes the IP CM header into `pd` (at least 36 bytes) at offset 0. */
export function emitCmaHeader(h: CmaHeader, pd: Uint8Array): void {
  if (pd.length < CMA_HEADER_LEN) throw new CmEmitError(`the IP CM header needs ${CMA_HEADER_LEN} bytes, got ${pd.length}`);
  pd[0] = ((h.majorVersion & 0xf) << 4) | (h.minorVersion & 0xf);
  pd[1] = (h.ipVersion & 0xf) << 4;
  writeU16(pd, 2, h.srcPort & 0xffff);
  putBytes(pd, 4, 16, h.srcIp, 'IP CM source address');
  putBytes(pd, 20, 16, h.dstIp, 'IP CM destination address');
}

/** 16-byte IP CM address field of an IPv4 or IPv6 address text (IPv4: 12 zero bytes first). */
export function cmaAddressBytes(ip: string): Uint8Array {
  const a = parseIpAddress(ip);
  if (a === undefined) throw new RangeError(`not an IP address: ${ip}`);
  if (a.length === 16) return a;
  const out = new Uint8Array(16);
  out.set(a, 12);
  return out;
}

/** The address text of an IP CM address field, read as the header's IP version says. */
export function cmaAddressText(ipVersion: number, field: Uint8Array): string {
  return ipVersion === 4 ? formatIpAddress(field.subarray(12, 16)) : formatIpAddress(field);
}

/** The IP CM header rdma_cm writes for a connection from (srcIp, srcPort) to dstIp. */
export function cmaHeaderFor(srcIp: string, srcPort: number, dstIp: string): CmaHeader {
  const v4 = !srcIp.includes(':');
  if (v4 !== !dstIp.includes(':')) throw new RangeError(`mixed address families: ${srcIp} → ${dstIp}`);
  return { majorVersion: 0, minorVersion: 0, ipVersion: v4 ? 4 : 6, srcPort, srcIp: cmaAddressBytes(srcIp), dstIp: cmaAddressBytes(dstIp) };
}

/** A REQ's private data: the IP CM header, then up to 56 bytes of the consumer's. */
export function reqPrivateData(h: CmaHeader, userData: Uint8Array = new Uint8Array(0)): Uint8Array {
  if (userData.length > CMA_REQ_USER_DATA_LEN) throw new CmEmitError(`REQ user private data is ${userData.length} bytes, rdma_cm allows ${CMA_REQ_USER_DATA_LEN}`);
  const pd = new Uint8Array(CM_PRIVATE_DATA_LEN.REQ);
  emitCmaHeader(h, pd);
  pd.set(userData, CMA_HEADER_LEN);
  return pd;
}

/** The RoCEv2 GID of an IP address: IPv6 as is, IPv4 as ::ffff:a.b.c.d (Annex A17.4.5.1). */
export function gidOfIp(ip: string): Uint8Array {
  const a = parseIpAddress(ip);
  if (a === undefined) throw new RangeError(`not an IP address: ${ip}`);
  if (a.length === 16) return a;
  const gid = new Uint8Array(16);
  gid[10] = 0xff;
  gid[11] = 0xff;
  gid.set(a, 12);
  return gid;
}

/** The IP address text of a RoCEv2 GID (IPv4-mapped GIDs as dotted quads). */
export function ipOfGid(gid: Uint8Array): string {
  const text = formatIpAddress(gid);
  return text.startsWith('::ffff:') && text.includes('.') ? text.slice(7) : text;
}

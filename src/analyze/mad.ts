/**
 * A minimal decoder of Management Datagram headers (IBTA Vol. 1 §13.4.2), for `roce explain`:
 * enough to name a MAD sent to QP1 (the GSI) and, for Communication Management (class 0x07,
 * IBTA ch. 12), the few fields of REQ/REP/DREQ/REJ that tie a connection to its QPs and PSNs.
 *
 * MAD header, 24 bytes, big-endian: BaseVersion(8) MgmtClass(8) ClassVersion(8) R|Method(8)
 * Status(16) ClassSpecific(16) TransactionID(64) AttributeID(16) Reserved(16)
 * AttributeModifier(32). The CM message body follows at byte 24 (§12.6).
 */

import { readU16, readU24, readU32, readU64 } from '../wire/bytes.js';

export const MAD_HEADER_LEN = 24;
/** Every MAD is exactly 256 bytes on QP0/QP1. */
export const MAD_LEN = 256;
export const MGMT_CLASS_CM = 0x07;

export interface MadHeader {
  baseVersion: number;
  mgmtClass: number;
  classVersion: number;
  /** The method with the response bit (0x80) included: 0x03 Send, 0x81 GetResp, … */
  method: number;
  status: number;
  transactionId: bigint;
  attributeId: number;
  attributeModifier: number;
}

/** CM fields worth showing: which QP a side offers, and the PSN its first request will carry. */
export interface CmFields {
  localCommId?: number;
  remoteCommId?: number;
  serviceId?: bigint;
  localQpn?: number;
  startingPsn?: number;
  /** Path MTU in bytes, from the REQ's 4-bit code. */
  pathMtu?: number;
  /** DREQ: the QP to disconnect. */
  remoteQpn?: number;
  /** REJ: the reason code (IBTA table 107). */
  rejectReason?: number;
}

export interface Mad {
  header: MadHeader;
  className: string;
  methodName: string;
  attributeName: string;
  cm?: CmFields;
}

const CLASS_NAMES: Readonly<Record<number, string>> = {
  0x01: 'Subnet Management (LID routed)',
  0x81: 'Subnet Management (directed route)',
  0x03: 'Subnet Administration',
  0x04: 'Performance Management',
  0x05: 'Baseboard Management',
  0x06: 'Device Management',
  0x07: 'Communication Management',
  0x08: 'SNMP Tunneling',
};

const METHOD_NAMES: Readonly<Record<number, string>> = {
  0x01: 'Get', 0x02: 'Set', 0x03: 'Send', 0x05: 'Trap', 0x06: 'Report', 0x07: 'TrapRepress',
  0x81: 'GetResp', 0x86: 'ReportResp',
};

/** CM attribute IDs (IBTA table 99 — §12.6). */
export const CM_ATTRIBUTES: Readonly<Record<number, string>> = {
  0x0001: 'ClassPortInfo',
  0x0010: 'ConnectRequest',
  0x0011: 'MsgRcptAck',
  0x0012: 'ConnectReject',
  0x0013: 'ConnectReply',
  0x0014: 'ReadyToUse',
  0x0015: 'DisconnectRequest',
  0x0016: 'DisconnectReply',
  0x0017: 'ServiceIDResReq',
  0x0018: 'ServiceIDResReqResp',
  0x0019: 'LoadAlternatePath',
  0x001a: 'AlternatePathResponse',
};

const MTU_BY_CODE: readonly number[] = [0, 256, 512, 1024, 2048, 4096];

/** Decodes a MAD header (and CM fields); undefined when the bytes cannot be a MAD. */
export function decodeMad(b: Uint8Array): Mad | undefined {
  if (b.length < MAD_HEADER_LEN || b[0] !== 1) return undefined;
  const header: MadHeader = {
    baseVersion: b[0]!,
    mgmtClass: b[1]!,
    classVersion: b[2]!,
    method: b[3]!,
    status: readU16(b, 4),
    transactionId: readU64(b, 8),
    attributeId: readU16(b, 16),
    attributeModifier: readU32(b, 20),
  };
  const hex = (v: number, w: number): string => '0x' + v.toString(16).padStart(w, '0');
  const mad: Mad = {
    header,
    className: CLASS_NAMES[header.mgmtClass] ?? `class ${hex(header.mgmtClass, 2)}`,
    methodName: METHOD_NAMES[header.method] ?? `method ${hex(header.method, 2)}`,
    attributeName: (header.mgmtClass === MGMT_CLASS_CM ? CM_ATTRIBUTES[header.attributeId] : undefined) ?? `attribute ${hex(header.attributeId, 4)}`,
  };
  if (header.mgmtClass === MGMT_CLASS_CM) {
    const cm = cmFields(b, header.attributeId);
    if (cm) mad.cm = cm;
  }
  return mad;
}

function cmFields(b: Uint8Array, attr: number): CmFields | undefined {
  const at = (off: number, len: number): boolean => b.length >= MAD_HEADER_LEN + off + len;
  const d = MAD_HEADER_LEN;
  switch (attr) {
    case 0x0010: // REQ (§12.6.5)
      if (!at(0, 52)) return undefined;
      return {
        localCommId: readU32(b, d),
        serviceId: readU64(b, d + 8),
        localQpn: readU24(b, d + 32),
        startingPsn: readU24(b, d + 44),
        pathMtu: MTU_BY_CODE[b[d + 50]! >>> 4] ?? 0,
      };
    case 0x0013: // REP (§12.6.8)
      if (!at(0, 24)) return undefined;
      return { localCommId: readU32(b, d), remoteCommId: readU32(b, d + 4), localQpn: readU24(b, d + 12), startingPsn: readU24(b, d + 20) };
    case 0x0012: // REJ (§12.6.7)
      if (!at(0, 12)) return undefined;
      return { localCommId: readU32(b, d), remoteCommId: readU32(b, d + 4), rejectReason: readU16(b, d + 10) };
    case 0x0015: // DREQ (§12.6.10)
      if (!at(0, 12)) return undefined;
      return { localCommId: readU32(b, d), remoteCommId: readU32(b, d + 4), remoteQpn: readU24(b, d + 8) };
    case 0x0011: case 0x0014: case 0x0016: // MRA, RTU, DREP
      if (!at(0, 8)) return undefined;
      return { localCommId: readU32(b, d), remoteCommId: readU32(b, d + 4) };
    default:
      return undefined;
  }
}

/**
 * RDMA CM service IDs are 0x00000000_01PP_NNNN: port space PP (0x06 TCP, 0x11 UDP, 0x02 IPoIB,
 * 0x3f IB) and port NNNN. Anything else is printed as a number.
 */
export function describeServiceId(id: bigint): string {
  const hex = '0x' + id.toString(16).padStart(16, '0');
  if (id >> 24n !== 1n) return hex;
  const space = Number((id >> 16n) & 0xffn);
  const port = Number(id & 0xffffn);
  const names: Record<number, string> = { 0x02: 'IPoIB', 0x06: 'TCP', 0x11: 'UDP', 0x3f: 'IB' };
  return `${hex} (RDMA CM, ${names[space] ?? `port space 0x${space.toString(16)}`} port ${port})`;
}

/** A few REJ reasons (IBTA table 107). */
export const REJECT_REASONS: Readonly<Record<number, string>> = {
  1: 'no QP available', 2: 'no EEC', 3: 'no resources', 4: 'timeout', 5: 'unsupported request',
  6: 'invalid communication ID', 7: 'invalid communication instance', 8: 'invalid service ID',
  9: 'invalid transport service type', 10: 'stale connection', 11: 'RDC does not exist',
  12: 'invalid GID', 13: 'invalid LID', 24: 'port CM redirect', 25: 'port redirect', 26: 'invalid path MTU',
  27: 'insufficient responder resources', 28: 'consumer reject', 29: 'invalid RNR retry count',
  30: 'duplicate local communication ID', 31: 'unsupported class version',
};

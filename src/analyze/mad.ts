/**
 * The words `roce explain` uses for a MAD sent to QP1 (the GSI). Decoding is `src/cm`'s:
 * `parseMad` for the header (IBTA Vol. 1 §13.4.2), `parseCmMad` for the Communication
 * Management message (class 0x07, IBTA ch. 12). What is left here is naming: management
 * classes, methods, CM attributes as IBTA spells them, and rdma_cm service IDs.
 */

import { MAD_METHOD, MGMT_CLASS, parseMad, type MadErrorCode, type MadHeader } from '../cm/mad.js';
import { CM_ATTR, parseCmMad, parseRdmaCmServiceId, RDMA_PS, type CmMessage } from '../cm/messages.js';

export interface NamedMad {
  header: MadHeader;
  /** The method byte as sent: the R bit (0x80) and the 7-bit method. */
  methodByte: number;
  className: string;
  methodName: string;
  attributeName: string;
  /** The CM message, when the MAD is one `parseCmMad` decodes (REQ, MRA, REJ, REP, RTU, DREQ, DREP). */
  cm?: CmMessage;
}

export type NamedMadResult = { ok: true; mad: NamedMad } | { ok: false; error: MadErrorCode; detail: string };

const CLASS_NAMES: Readonly<Record<keyof typeof MGMT_CLASS, string>> = {
  SUBN_LID_ROUTED: 'Subnet Management (LID routed)',
  SUBN_DIRECTED_ROUTE: 'Subnet Management (directed route)',
  SUBN_ADM: 'Subnet Administration',
  PERF: 'Performance Management',
  BM: 'Baseboard Management',
  DEV_MGT: 'Device Management',
  CM: 'Communication Management',
  SNMP: 'SNMP Tunneling',
};

const METHOD_NAMES: Readonly<Record<keyof typeof MAD_METHOD, string>> = {
  GET: 'Get', SET: 'Set', SEND: 'Send', TRAP: 'Trap', REPORT: 'Report', TRAP_REPRESS: 'TrapRepress',
};

/** Methods that exist with the R bit set (IBTA table 145). */
const RESPONSE_NAMES: ReadonlyMap<number, string> = new Map([[MAD_METHOD.GET, 'GetResp'], [MAD_METHOD.REPORT, 'ReportResp']]);

/** CM attribute names as IBTA table 100 spells them. */
const CM_ATTR_NAMES: Readonly<Record<keyof typeof CM_ATTR, string>> = {
  CLASS_PORT_INFO: 'ClassPortInfo',
  REQ: 'ConnectRequest',
  MRA: 'MsgRcptAck',
  REJ: 'ConnectReject',
  REP: 'ConnectReply',
  RTU: 'ReadyToUse',
  DREQ: 'DisconnectRequest',
  DREP: 'DisconnectReply',
  SIDR_REQ: 'ServiceIDResReq',
  SIDR_REP: 'ServiceIDResReqResp',
  LAP: 'LoadAlternatePath',
  APR: 'AlternatePathResponse',
};

const RDMA_PS_NAMES: Readonly<Record<keyof typeof RDMA_PS, string>> = { IPOIB: 'IPoIB', TCP: 'TCP', UDP: 'UDP', IB: 'IB' };

/** value → name, through the constant's key. */
function byValue<K extends string>(codes: Readonly<Record<K, number>>, names: Readonly<Record<K, string>>): ReadonlyMap<number, string> {
  return new Map((Object.keys(codes) as K[]).map((k) => [codes[k], names[k]]));
}

const CLASS_BY_CODE = byValue(MGMT_CLASS, CLASS_NAMES);
const METHOD_BY_CODE = byValue(MAD_METHOD, METHOD_NAMES);
const CM_ATTR_BY_ID = byValue(CM_ATTR, CM_ATTR_NAMES);
const RDMA_PS_BY_CODE = byValue(RDMA_PS, RDMA_PS_NAMES);

const hex = (v: number, w: number): string => '0x' + v.toString(16).padStart(w, '0');

/** The IBTA name of a CM attribute ID, e.g. 'ConnectRequest' for 0x0010. */
export function cmAttributeName(id: number): string | undefined {
  return CM_ATTR_BY_ID.get(id);
}

/** Parses a MAD with `src/cm` and names its class, method and attribute. */
export function describeMad(b: Uint8Array): NamedMadResult {
  const r = parseMad(b);
  if (!r.ok) return r;
  const header = r.mad.header;
  const isCm = header.mgmtClass === MGMT_CLASS.CM;
  const methodByte = (header.response ? 0x80 : 0) | header.method;
  const mad: NamedMad = {
    header,
    methodByte,
    className: CLASS_BY_CODE.get(header.mgmtClass) ?? `class ${hex(header.mgmtClass, 2)}`,
    methodName: (header.response ? RESPONSE_NAMES : METHOD_BY_CODE).get(header.method) ?? `method ${hex(methodByte, 2)}`,
    attributeName: (isCm ? cmAttributeName(header.attributeId) : undefined) ?? `attribute ${hex(header.attributeId, 4)}`,
  };
  if (isCm) {
    const c = parseCmMad(b);
    if (c.ok) mad.cm = c.mad.msg;
  }
  return { ok: true, mad };
}

/**
 * A service ID, with its rdma_cm port space and port when it is one ((port space << 16) + port,
 * port space one of librdmacm's RDMA_PS_*); anything else is printed as a number.
 */
export function describeServiceId(id: bigint): string {
  const text = '0x' + id.toString(16).padStart(16, '0');
  const ps = parseRdmaCmServiceId(id);
  const space = ps && RDMA_PS_BY_CODE.get(ps.portSpace);
  return ps && space ? `${text} (RDMA CM, ${space} port ${ps.port})` : text;
}

/**
 * The opcode table: for every BTH opcode, which extension headers follow the BTH and in
 * what order, whether a payload may follow, where the packet sits in its message, and how
 * IBTA names it.
 *
 * Read first: IBTA Vol. 1 §9.2.1 table 38 (opcodes), §9.2–9.5 (header order), Annex A17.9
 * (CNP). The table is derived from one compact list below: offsets, lengths and names are
 * computed, never typed by hand (rxe's hand-summed table carries typos for exactly that
 * reason).
 */

import {
  AETH_LEN, ATOMIC_ACK_ETH_LEN, ATOMIC_ETH_LEN, BTH_LEN, CNP_RESERVED_LEN, DETH_LEN, FETH_LEN,
  IETH_LEN, IMMDT_LEN, RETH_LEN,
} from './constants.js';

export type Transport = 'RC' | 'UC' | 'RD' | 'UD' | 'CNP' | 'XRC';

/** Extension headers in the order IBTA places them after the BTH (§9.2). */
export type ExtHeader = 'DETH' | 'FETH' | 'RETH' | 'AtomicETH' | 'AETH' | 'AtomicAckETH' | 'ImmDt' | 'IETH' | 'CNP';

export const EXT_HEADER_LEN: Readonly<Record<ExtHeader, number>> = Object.freeze({
  DETH: DETH_LEN,
  FETH: FETH_LEN,
  RETH: RETH_LEN,
  AtomicETH: ATOMIC_ETH_LEN,
  AETH: AETH_LEN,
  AtomicAckETH: ATOMIC_ACK_ETH_LEN,
  ImmDt: IMMDT_LEN,
  IETH: IETH_LEN,
  CNP: CNP_RESERVED_LEN,
});

const HEADER_ORDER: readonly ExtHeader[] = ['DETH', 'FETH', 'RETH', 'AtomicETH', 'AETH', 'AtomicAckETH', 'ImmDt', 'IETH', 'CNP'];

/** Where a packet sits in its message. */
export type Position = 'first' | 'middle' | 'last' | 'only';

/** The operation family of an opcode. */
export type OpKind = 'send' | 'write' | 'readRequest' | 'readResponse' | 'ack' | 'atomicAck' | 'atomic' | 'flush' | 'atomicWrite' | 'cnp';

export interface OpcodeInfo {
  readonly opcode: number;
  readonly transport: Transport;
  /** Upper-case name in the style of the Linux headers, e.g. `RC_RDMA_WRITE_FIRST`. */
  readonly name: string;
  /** The name as IBTA table 38 spells it, e.g. `RDMA WRITE First`. */
  readonly ibtaName: string;
  readonly kind: OpKind;
  readonly position: Position;
  /** Extension headers after the BTH, in wire order. */
  readonly headers: readonly ExtHeader[];
  /** Byte offset of each present extension header from the start of the BTH. */
  readonly offsets: Readonly<Partial<Record<ExtHeader, number>>>;
  /** BTH plus extension headers. */
  readonly headerLength: number;
  readonly payload: boolean;
  /** Sent by a requester (as opposed to a response or acknowledgement from a responder). */
  readonly request: boolean;
  /** Carries immediate data. */
  readonly immediate: boolean;
  /** Carries an R_Key to invalidate. */
  readonly invalidate: boolean;
  /** Starts a message (first or only). */
  readonly start: boolean;
  /** Ends a message (last or only). */
  readonly end: boolean;
  /** The responder consumes a receive WQE for this message (SEND, or WRITE with immediate). */
  readonly consumesRecv: boolean;
}

/** The transport is the top three bits of the opcode (§9.2.1 table 38). */
export function opcodeTransport(opcode: number): Transport {
  switch (opcode >>> 5) {
    case 0: return 'RC';
    case 1: return 'UC';
    case 2: return 'RD';
    case 3: return 'UD';
    case 4: return 'CNP';
    default: return 'XRC';
  }
}

const TRANSPORT_BASE: Readonly<Record<'RC' | 'UC' | 'UD', number>> = { RC: 0x00, UC: 0x20, UD: 0x60 };

interface Op {
  code: number;
  name: string;
  ibta: string;
  kind: OpKind;
  position: Position;
  headers: ExtHeader[];
  payload: boolean;
  transports: ('RC' | 'UC' | 'UD')[];
}

// The compact list: low five opcode bits, name, IBTA name, family, position, headers
// (DETH is added for UD), payload allowed, transports that define it (table 38).
const OPS: readonly Op[] = [
  op(0x00, 'SEND_FIRST', 'SEND First', 'send', 'first', [], true, 'RC UC'),
  op(0x01, 'SEND_MIDDLE', 'SEND Middle', 'send', 'middle', [], true, 'RC UC'),
  op(0x02, 'SEND_LAST', 'SEND Last', 'send', 'last', [], true, 'RC UC'),
  op(0x03, 'SEND_LAST_WITH_IMMEDIATE', 'SEND Last with Immediate', 'send', 'last', ['ImmDt'], true, 'RC UC'),
  op(0x04, 'SEND_ONLY', 'SEND Only', 'send', 'only', [], true, 'RC UC UD'),
  op(0x05, 'SEND_ONLY_WITH_IMMEDIATE', 'SEND Only with Immediate', 'send', 'only', ['ImmDt'], true, 'RC UC UD'),
  op(0x06, 'RDMA_WRITE_FIRST', 'RDMA WRITE First', 'write', 'first', ['RETH'], true, 'RC UC'),
  op(0x07, 'RDMA_WRITE_MIDDLE', 'RDMA WRITE Middle', 'write', 'middle', [], true, 'RC UC'),
  op(0x08, 'RDMA_WRITE_LAST', 'RDMA WRITE Last', 'write', 'last', [], true, 'RC UC'),
  op(0x09, 'RDMA_WRITE_LAST_WITH_IMMEDIATE', 'RDMA WRITE Last with Immediate', 'write', 'last', ['ImmDt'], true, 'RC UC'),
  op(0x0a, 'RDMA_WRITE_ONLY', 'RDMA WRITE Only', 'write', 'only', ['RETH'], true, 'RC UC'),
  op(0x0b, 'RDMA_WRITE_ONLY_WITH_IMMEDIATE', 'RDMA WRITE Only with Immediate', 'write', 'only', ['RETH', 'ImmDt'], true, 'RC UC'),
  op(0x0c, 'RDMA_READ_REQUEST', 'RDMA READ Request', 'readRequest', 'only', ['RETH'], false, 'RC'),
  op(0x0d, 'RDMA_READ_RESPONSE_FIRST', 'RDMA READ response First', 'readResponse', 'first', ['AETH'], true, 'RC'),
  op(0x0e, 'RDMA_READ_RESPONSE_MIDDLE', 'RDMA READ response Middle', 'readResponse', 'middle', [], true, 'RC'),
  op(0x0f, 'RDMA_READ_RESPONSE_LAST', 'RDMA READ response Last', 'readResponse', 'last', ['AETH'], true, 'RC'),
  op(0x10, 'RDMA_READ_RESPONSE_ONLY', 'RDMA READ response Only', 'readResponse', 'only', ['AETH'], true, 'RC'),
  op(0x11, 'ACKNOWLEDGE', 'Acknowledge', 'ack', 'only', ['AETH'], false, 'RC'),
  op(0x12, 'ATOMIC_ACKNOWLEDGE', 'ATOMIC Acknowledge', 'atomicAck', 'only', ['AETH', 'AtomicAckETH'], false, 'RC'),
  op(0x13, 'COMPARE_SWAP', 'CmpSwap', 'atomic', 'only', ['AtomicETH'], false, 'RC'),
  op(0x14, 'FETCH_ADD', 'FetchAdd', 'atomic', 'only', ['AtomicETH'], false, 'RC'),
  op(0x16, 'SEND_LAST_WITH_INVALIDATE', 'SEND Last with Invalidate', 'send', 'last', ['IETH'], true, 'RC'),
  op(0x17, 'SEND_ONLY_WITH_INVALIDATE', 'SEND Only with Invalidate', 'send', 'only', ['IETH'], true, 'RC'),
  // Memory placement extensions (IBTA 1.5), as rdma_rxe implements them: FETH before RETH.
  op(0x1c, 'FLUSH', 'FLUSH', 'flush', 'only', ['FETH', 'RETH'], false, 'RC'),
  op(0x1d, 'ATOMIC_WRITE', 'ATOMIC WRITE', 'atomicWrite', 'only', ['RETH'], true, 'RC'),
];

function op(code: number, name: string, ibta: string, kind: OpKind, position: Position, headers: ExtHeader[], payload: boolean, transports: string): Op {
  return { code, name, ibta, kind, position, headers, payload, transports: transports.split(' ') as Op['transports'] };
}

function build(opcode: number, transport: Transport, o: Omit<Op, 'code' | 'transports'>): OpcodeInfo {
  const headers = HEADER_ORDER.filter((h) => o.headers.includes(h) || (h === 'DETH' && transport === 'UD'));
  const offsets: Partial<Record<ExtHeader, number>> = {};
  let at = BTH_LEN;
  for (const h of headers) {
    offsets[h] = at;
    at += EXT_HEADER_LEN[h];
  }
  const start = o.position === 'first' || o.position === 'only';
  const end = o.position === 'last' || o.position === 'only';
  const immediate = headers.includes('ImmDt');
  return Object.freeze({
    opcode,
    transport,
    name: transport === 'CNP' ? 'CNP' : `${transport}_${o.name}`,
    ibtaName: o.ibta,
    kind: o.kind,
    position: o.position,
    headers: Object.freeze(headers),
    offsets: Object.freeze(offsets),
    headerLength: at,
    payload: o.payload,
    request: o.kind !== 'readResponse' && o.kind !== 'ack' && o.kind !== 'atomicAck' && o.kind !== 'cnp',
    immediate,
    invalidate: headers.includes('IETH'),
    start,
    end,
    // A SEND always lands in a receive WQE; an RDMA WRITE only when it carries immediate data,
    // and then only its last (or only) packet consumes it (IBTA 9.4.3, C9-87).
    consumesRecv: o.kind === 'send' || (o.kind === 'write' && immediate),
  });
}

/** Opcode numbers by name, for code that builds packets: `OPCODE.RC_SEND_ONLY`. */
export const OPCODE: Readonly<Record<string, number>> = {};

/** The congestion notification packet of RoCEv2 (Annex A17.9.2). */
export const CNP_OPCODE = 0x81;

const TABLE: (OpcodeInfo | undefined)[] = new Array(256).fill(undefined);
for (const o of OPS) {
  for (const t of o.transports) {
    const info = build(TRANSPORT_BASE[t] | o.code, t, o);
    TABLE[info.opcode] = info;
    (OPCODE as Record<string, number>)[info.name] = info.opcode;
  }
}
TABLE[CNP_OPCODE] = build(CNP_OPCODE, 'CNP', {
  name: 'CNP', ibta: 'Congestion Notification Packet', kind: 'cnp', position: 'only', headers: ['CNP'], payload: false,
});
(OPCODE as Record<string, number>)['CNP'] = CNP_OPCODE;
Object.freeze(OPCODE);

/** The frozen 256-entry table; undefined where the opcode is not one this stack knows. */
export const OPCODE_TABLE: readonly (OpcodeInfo | undefined)[] = Object.freeze(TABLE);

export function opcodeInfo(opcode: number): OpcodeInfo | undefined {
  return OPCODE_TABLE[opcode & 0xff];
}

/** Every opcode the table defines, ascending. */
export const KNOWN_OPCODES: readonly number[] = Object.freeze(
  TABLE.flatMap((info) => (info ? [info.opcode] : [])),
);

/** Opcode number for a name; throws on a name that is not in the table (a programming error). */
export function opcodeOf(name: string): number {
  const v = OPCODE[name];
  if (v === undefined) throw new RangeError(`unknown opcode name ${name}`);
  return v;
}

/** A printable name for any opcode byte, known or not: `RC_SEND_FIRST` or `OPCODE_0x15`. */
export function opcodeName(opcode: number): string {
  return opcodeInfo(opcode)?.name ?? `OPCODE_0x${(opcode & 0xff).toString(16).padStart(2, '0')}`;
}

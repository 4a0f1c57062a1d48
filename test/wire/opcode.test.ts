import t from 'tap';
import { KNOWN_OPCODES, OPCODE, OPCODE_TABLE, opcodeInfo, opcodeName, opcodeTransport } from '../../src/wire/opcode.js';

t.test('the table defines exactly the opcodes rdma_rxe (6.1) sends or accepts, plus CNP', async (t) => {
  const expected = [
    ...range(0x00, 0x14), 0x16, 0x17, 0x1c, 0x1d, // RC
    ...range(0x20, 0x2b), // UC
    0x64, 0x65, // UD
    0x81, // CNP
  ];
  t.same(KNOWN_OPCODES, expected);
  t.equal(OPCODE_TABLE.length, 256);
  t.ok(Object.isFrozen(OPCODE_TABLE) && Object.isFrozen(opcodeInfo(0)));
  for (const op of [0x15, 0x18, 0x1b, 0x2c, 0x40, 0x63, 0x66, 0x80, 0xa0, 0xff]) t.equal(opcodeInfo(op), undefined, `0x${op.toString(16)} unknown`);
});

// Golden rows: header order and lengths as IBTA table 38 and §9.2–9.5 give them.
const GOLDEN: [string, number, string[], number, boolean, string][] = [
  ['RC_SEND_FIRST', 0x00, [], 12, true, 'first'],
  ['RC_SEND_LAST_WITH_IMMEDIATE', 0x03, ['ImmDt'], 16, true, 'last'],
  ['RC_RDMA_WRITE_FIRST', 0x06, ['RETH'], 28, true, 'first'],
  ['RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE', 0x0b, ['RETH', 'ImmDt'], 32, true, 'only'],
  ['RC_RDMA_READ_REQUEST', 0x0c, ['RETH'], 28, false, 'only'],
  ['RC_RDMA_READ_RESPONSE_FIRST', 0x0d, ['AETH'], 16, true, 'first'],
  ['RC_RDMA_READ_RESPONSE_MIDDLE', 0x0e, [], 12, true, 'middle'],
  ['RC_ACKNOWLEDGE', 0x11, ['AETH'], 16, false, 'only'],
  ['RC_ATOMIC_ACKNOWLEDGE', 0x12, ['AETH', 'AtomicAckETH'], 24, false, 'only'],
  ['RC_COMPARE_SWAP', 0x13, ['AtomicETH'], 40, false, 'only'],
  ['RC_FETCH_ADD', 0x14, ['AtomicETH'], 40, false, 'only'],
  ['RC_SEND_ONLY_WITH_INVALIDATE', 0x17, ['IETH'], 16, true, 'only'],
  ['RC_FLUSH', 0x1c, ['FETH', 'RETH'], 32, false, 'only'],
  ['RC_ATOMIC_WRITE', 0x1d, ['RETH'], 28, true, 'only'],
  ['UC_RDMA_WRITE_LAST_WITH_IMMEDIATE', 0x29, ['ImmDt'], 16, true, 'last'],
  ['UD_SEND_ONLY', 0x64, ['DETH'], 20, true, 'only'],
  ['UD_SEND_ONLY_WITH_IMMEDIATE', 0x65, ['DETH', 'ImmDt'], 24, true, 'only'],
  ['CNP', 0x81, ['CNP'], 28, false, 'only'],
];

for (const [name, opcode, headers, len, payload, position] of GOLDEN) {
  t.test(name, async (t) => {
    const info = opcodeInfo(opcode)!;
    t.equal(info.name, name);
    t.equal(OPCODE[name], opcode);
    t.same(info.headers, headers);
    t.equal(info.headerLength, len);
    t.equal(info.payload, payload);
    t.equal(info.position, position);
  });
}

t.test('offsets are consecutive and derived from the header list', async (t) => {
  const info = opcodeInfo(0x65)!;
  t.same(info.offsets, { DETH: 12, ImmDt: 20 });
  const flush = opcodeInfo(0x1c)!;
  t.same(flush.offsets, { FETH: 12, RETH: 16 });
});

t.test('classes', async (t) => {
  t.equal(opcodeTransport(0x0a), 'RC');
  t.equal(opcodeTransport(0x2a), 'UC');
  t.equal(opcodeTransport(0x64), 'UD');
  t.equal(opcodeTransport(0x81), 'CNP');
  t.ok(opcodeInfo(0x04)!.consumesRecv, 'SEND consumes a receive WQE');
  t.ok(opcodeInfo(0x09)!.consumesRecv, 'WRITE LAST with immediate consumes a receive WQE');
  t.notOk(opcodeInfo(0x08)!.consumesRecv, 'plain WRITE does not');
  t.ok(opcodeInfo(0x0c)!.request);
  t.notOk(opcodeInfo(0x10)!.request, 'READ response is not a request');
  t.notOk(opcodeInfo(0x11)!.request);
  t.equal(opcodeName(0x15), 'OPCODE_0x15');
  t.equal(opcodeInfo(0x0d)!.ibtaName, 'RDMA READ response First');
});

function range(a: number, b: number): number[] {
  const out = [];
  for (let i = a; i <= b; i++) out.push(i);
  return out;
}

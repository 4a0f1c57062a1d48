import t from 'tap';
import fc from 'fast-check';
import { MAD_DATA_LEN, MAD_LEN, emitMad, madBytes, parseMad, parseMadHeader } from '../../src/cm/mad.js';
import { GSI_QKEY } from '../../src/wire/constants.js';
import { arbMadHeader } from './arbitrary.js';
import { rpingMads } from './rping.js';

const SEED = 0x0cafe9;

t.test('every CM MAD of rping.pcap: header fields, and emit(parse(x)) is x', (t) => {
  const mads = rpingMads();
  t.equal(mads.length, 5);
  const attrs = [0x0010, 0x0013, 0x0014, 0x0015, 0x0016];
  mads.forEach((m, i) => {
    const where = `frame ${m.frame}`;
    t.equal(m.packet.deth?.qkey, GSI_QKEY, `${where}: DETH Q_Key is the GSI Q_Key`);
    t.equal(m.packet.deth?.srcQp, 1, `${where}: from QP1`);
    t.equal(m.mad.length, MAD_LEN, `${where}: 256 bytes`);
    const r = parseMad(m.mad);
    if (!r.ok) return t.fail(`${where}: ${r.error}`);
    const h = r.mad.header;
    t.same(
      { ...h },
      {
        baseVersion: 1, mgmtClass: 0x07, classVersion: 2, response: false, method: 0x03, status: 0, classSpecific: 0,
        transactionId: 0x0000000299ee5ca1n, attributeId: attrs[i], reserved: 0, attributeModifier: 0,
      },
      `${where}: header`,
    );
    t.equal(r.mad.data.length, MAD_DATA_LEN);
    t.same(madBytes(r.mad), m.mad, `${where}: round trip`);
  });
  t.end();
});

t.test('header codec: offsets and the R bit', (t) => {
  const b = new Uint8Array(MAD_LEN);
  for (let i = 0; i < 24; i++) b[i] = 0x10 + i;
  b[0] = 1;
  b[3] = 0x81;
  const h = parseMadHeader(b, 0);
  t.equal(h.response, true);
  t.equal(h.method, 1);
  t.equal(h.status, 0x1415);
  t.equal(h.classSpecific, 0x1617);
  t.equal(h.transactionId, 0x18191a1b1c1d1e1fn);
  t.equal(h.attributeId, 0x2021);
  t.equal(h.reserved, 0x2223);
  t.equal(h.attributeModifier, 0x24252627);
  t.end();
});

t.test('typed errors, never a throw', (t) => {
  t.match(parseMad(new Uint8Array(255)), { ok: false, error: 'TOO_SHORT' });
  t.match(parseMad(new Uint8Array(256), 10), { ok: false, error: 'TOO_SHORT' });
  t.match(parseMad(new Uint8Array(256), -1, 256), { ok: false, error: 'TOO_SHORT' });
  const b = new Uint8Array(256);
  b[0] = 0x80;
  t.match(parseMad(b), { ok: false, error: 'BAD_BASE_VERSION' });
  b[0] = 1;
  const longer = new Uint8Array(300);
  longer.set(b);
  t.match(parseMad(longer), { ok: true });
  t.end();
});

t.test('emit writes all 256 bytes at the offset, zero-fills short data, refuses what cannot fit', (t) => {
  const b = new Uint8Array(300).fill(0xee);
  const hdr = parseMadHeader(new Uint8Array([1, 7, 2, 3, ...new Array(20).fill(0)]), 0);
  t.equal(emitMad({ header: hdr, data: new Uint8Array([9, 9]) }, b, 10), 266);
  t.equal(b[9], 0xee);
  t.equal(b[266], 0xee);
  t.equal(b[34], 9);
  t.equal(b[36], 0);
  t.equal(b[265], 0);
  t.throws(() => emitMad({ header: hdr, data: new Uint8Array(233) }, new Uint8Array(256)), { code: 'ERR_MAD_EMIT' });
  t.throws(() => emitMad({ header: hdr, data: new Uint8Array(0) }, new Uint8Array(300), 45), { code: 'ERR_MAD_EMIT' });
  t.end();
});

t.test('property: record → emit → parse is the record', (t) => {
  fc.assert(
    fc.property(arbMadHeader, fc.uint8Array({ minLength: MAD_DATA_LEN, maxLength: MAD_DATA_LEN }), (header, data) => {
      const r = parseMad(madBytes({ header, data }));
      return r.ok && JSON.stringify(r.mad.header, big) === JSON.stringify(header, big) && Buffer.compare(r.mad.data, data) === 0;
    }),
    { seed: SEED, numRuns: 500 },
  );
  t.pass('500 headers');
  t.end();
});

t.test('property: random bytes never throw, and a MAD that parses re-emits to the same bytes', (t) => {
  fc.assert(
    fc.property(fc.uint8Array({ minLength: 0, maxLength: 400 }), fc.boolean(), (bytes, v1) => {
      if (v1 && bytes.length > 0) bytes[0] = 1;
      const r = parseMad(bytes);
      if (!r.ok) return true;
      return Buffer.compare(madBytes(r.mad), bytes.subarray(0, MAD_LEN)) === 0;
    }),
    { seed: SEED, numRuns: 2000 },
  );
  t.pass('2000 inputs');
  t.end();
});

function big(_k: string, v: unknown): unknown {
  return typeof v === 'bigint' ? v.toString() : v;
}

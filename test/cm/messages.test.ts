import t from 'tap';
import fc from 'fast-check';
import { MAD_LEN } from '../../src/cm/mad.js';
import {
  CM_PRIVATE_DATA_LEN,
  CM_REJ_REASON,
  cmaAddressText,
  cmaHeaderFor,
  cmMadBytes,
  cmMadHeader,
  codeOfMtu,
  cmTimeoutUs,
  emitCmMad,
  gidOfIp,
  ipOfGid,
  mtuOfCode,
  parseCmaHeader,
  parseCmMad,
  parseRdmaCmServiceId,
  rdmaCmServiceId,
  rejReasonName,
  reqPrivateData,
  RDMA_PS,
  type CmMad,
  type CmMessage,
} from '../../src/cm/messages.js';
import { arbCmMad } from './arbitrary.js';
import { hexOf, rpingMads } from './rping.js';

const SEED = 0x0cafe9;
const zeros = (n: number): Uint8Array => new Uint8Array(n);
const CLIENT = '10.77.0.3';
const SERVER = '10.77.0.2';

function parsed(frame: number): CmMad {
  const m = rpingMads().find((x) => x.frame === frame);
  if (m === undefined) throw new Error(`no MAD in frame ${frame}`);
  const r = parseCmMad(m.mad);
  if (!r.ok) throw new Error(`frame ${frame}: ${r.error} ${r.detail}`);
  return r.mad;
}

t.test('rping.pcap inventory: five CM messages, one transaction', (t) => {
  const inv = rpingMads().map((m) => {
    const r = parseCmMad(m.mad);
    return r.ok ? `${m.frame} ${m.src}>${m.dst} ${r.mad.msg.kind} tid=${r.mad.header.transactionId.toString(16)}` : `${m.frame} ${r.error}`;
  });
  t.same(inv, [
    `4 ${CLIENT}>${SERVER} REQ tid=299ee5ca1`,
    `5 ${SERVER}>${CLIENT} REP tid=299ee5ca1`,
    `6 ${CLIENT}>${SERVER} RTU tid=299ee5ca1`,
    `247 ${CLIENT}>${SERVER} DREQ tid=299ee5ca1`,
    `248 ${SERVER}>${CLIENT} DREP tid=299ee5ca1`,
  ]);
  t.end();
});

t.test('frame 4: ConnectRequest, every field', (t) => {
  const m = parsed(4).msg;
  if (m.kind !== 'REQ') return t.fail(m.kind);
  const { primaryPath: pp, alternatePath: ap, privateData, ...rest } = m;
  t.same(rest, {
    kind: 'REQ',
    localCommId: 0xa15cee99,
    serviceId: 0x0000000001061c06n,
    localCaGuid: 0x505400fffe770003n,
    localQkey: 0,
    localQpn: 0x11,
    responderResources: 1,
    localEecn: 0,
    initiatorDepth: 1,
    remoteEecn: 0,
    remoteCmResponseTimeout: 20,
    transportServiceType: 0,
    endToEndFlowControl: false,
    startingPsn: 0x9da108,
    localCmResponseTimeout: 20,
    retryCount: 7,
    pkey: 0xffff,
    pathMtu: 3,
    rdcExists: false,
    rnrRetryCount: 7,
    maxCmRetries: 15,
    srq: false,
    extendedTransportType: 0,
    sapSupported: false,
  });
  t.same(
    { ...pp, localGid: ipOfGid(pp.localGid), remoteGid: ipOfGid(pp.remoteGid) },
    {
      localLid: 0xffff, remoteLid: 0xffff, localGid: CLIENT, remoteGid: SERVER, flowLabel: 0x93903, packetRate: 0,
      trafficClass: 0, hopLimit: 64, sl: 0, subnetLocal: false, localAckTimeout: 19,
    },
  );
  t.equal(hexOf(pp.localGid), '00000000000000000000ffff0a4d0003', 'RoCEv2 GID: IPv4-mapped');
  t.same({ ...ap, localGid: hexOf(ap.localGid), remoteGid: hexOf(ap.remoteGid) }, {
    localLid: 0, remoteLid: 0, localGid: '0'.repeat(32), remoteGid: '0'.repeat(32), flowLabel: 0, packetRate: 0,
    trafficClass: 0, hopLimit: 0, sl: 0, subnetLocal: false, localAckTimeout: 0,
  }, 'no alternate path');
  t.equal(privateData.length, 92);
  t.same(parseRdmaCmServiceId(m.serviceId), { portSpace: RDMA_PS.TCP, port: 7174 }, 'rping\'s default port in the TCP port space');
  const cma = parseCmaHeader(privateData);
  if (!cma.ok) return t.fail(cma.error);
  t.same(
    { ...cma.header, srcIp: cmaAddressText(4, cma.header.srcIp), dstIp: cmaAddressText(4, cma.header.dstIp) },
    { majorVersion: 0, minorVersion: 0, ipVersion: 4, srcPort: 0xcf63, srcIp: CLIENT, dstIp: SERVER },
  );
  t.same(cma.userData, zeros(56), 'rping sends no private data of its own');
  t.same(privateData, reqPrivateData(cmaHeaderFor(CLIENT, 0xcf63, SERVER)), 'our IP CM header is rdma_cm\'s');
  t.end();
});

t.test('frame 5: ConnectReply, every field', (t) => {
  t.same(parsed(5).msg, {
    kind: 'REP', localCommId: 0x2818cbea, remoteCommId: 0xa15cee99, localQkey: 0, localQpn: 0x11, localEecn: 0,
    startingPsn: 0x31ede7, responderResources: 1, initiatorDepth: 1, targetAckDelay: 15, failoverAccepted: 0,
    endToEndFlowControl: false, rnrRetryCount: 7, srq: false, localCaGuid: 0x505400fffe770002n, privateData: zeros(196),
  });
  t.end();
});

t.test('frames 6, 247, 248: ReadyToUse, DisconnectRequest, DisconnectReply', (t) => {
  t.same(parsed(6).msg, { kind: 'RTU', localCommId: 0xa15cee99, remoteCommId: 0x2818cbea, privateData: zeros(224) });
  t.same(parsed(247).msg, { kind: 'DREQ', localCommId: 0xa15cee99, remoteCommId: 0x2818cbea, remoteQpn: 0x11, privateData: zeros(220) });
  t.same(parsed(248).msg, { kind: 'DREP', localCommId: 0x2818cbea, remoteCommId: 0xa15cee99, privateData: zeros(224) });
  t.end();
});

t.test('emit(parse(x)) is x for every CM MAD of the capture', (t) => {
  for (const m of rpingMads()) {
    const r = parseCmMad(m.mad);
    if (!r.ok) {
      t.fail(`frame ${m.frame}: ${r.error}`);
      continue;
    }
    t.equal(hexOf(cmMadBytes(r.mad)), hexOf(m.mad), `frame ${m.frame} ${r.mad.msg.kind}`);
  }
  t.end();
});

t.test('bit fields land where IBTA puts them', (t) => {
  const base = parsed(4);
  const req = base.msg as Extract<CmMessage, { kind: 'REQ' }>;
  const b = cmMadBytes({
    header: base.header,
    msg: {
      ...req, transportServiceType: 1, endToEndFlowControl: true, rdcExists: true, srq: true, extendedTransportType: 5, sapSupported: true,
      primaryPath: { ...req.primaryPath, flowLabel: 0xfffff, packetRate: 0x3f, sl: 0xa, subnetLocal: true, localAckTimeout: 0x1f },
    },
  });
  const d = 24;
  t.equal(b[d + 43], (20 << 3) | (1 << 1) | 1, 'remote CM response timeout | transport | e2e');
  t.equal(b[d + 50], (3 << 4) | 0x08 | 7, 'MTU | RDC | RNR retry');
  t.equal(b[d + 51], (15 << 4) | 0x08 | 5, 'max CM retries | SRQ | extended transport');
  t.same([...b.subarray(d + 88, d + 92)], [0xff, 0xff, 0xf0, 0x3f], 'flow label(20) reserved(6) rate(6)');
  t.equal(b[d + 94], 0xa8, 'SL | subnet local');
  t.equal(b[d + 95], 0xf8, 'local ACK timeout');
  t.equal(b[d + 139], 0x04, 'SAP supported');

  const rej = cmMadBytes({
    header: cmMadHeader('REJ', 1n),
    msg: { kind: 'REJ', localCommId: 1, remoteCommId: 2, messageRejected: 2, rejectedInfoLength: 0x7f, reason: 0x0102, ari: new Uint8Array([7]), privateData: new Uint8Array([8]) },
  });
  t.same([rej[16], rej[17], rej[d + 8], rej[d + 9], rej[d + 10], rej[d + 11], rej[d + 12], rej[d + 84]], [0, 0x12, 0x80, 0xfe, 1, 2, 7, 8]);
  const mra = cmMadBytes({
    header: cmMadHeader('MRA', 1n),
    msg: { kind: 'MRA', localCommId: 1, remoteCommId: 2, messageMraed: 1, serviceTimeout: 0x1f, privateData: new Uint8Array([9]) },
  });
  t.same([mra[17], mra[d + 8], mra[d + 9], mra[d + 10]], [0x11, 0x40, 0xf8, 9]);
  const rep = parsed(5);
  const repb = cmMadBytes({ ...rep, msg: { ...(rep.msg as Extract<CmMessage, { kind: 'REP' }>), failoverAccepted: 3, endToEndFlowControl: true, srq: true, rnrRetryCount: 5 } });
  t.same([repb[d + 26], repb[d + 27]], [(15 << 3) | 6 | 1, (5 << 5) | 0x10]);
  t.end();
});

t.test('parse errors are typed', (t) => {
  const req = rpingMads()[0]!.mad;
  const with_ = (i: number, v: number): Uint8Array => {
    const c = new Uint8Array(req);
    c[i] = v;
    return c;
  };
  t.match(parseCmMad(req.subarray(0, 200)), { ok: false, error: 'BAD_MAD' });
  t.match(parseCmMad(with_(1, 0x04)), { ok: false, error: 'NOT_CM' });
  t.match(parseCmMad(with_(2, 1)), { ok: false, error: 'BAD_CLASS_VERSION' });
  t.match(parseCmMad(with_(3, 0x83)), { ok: false, error: 'BAD_METHOD' });
  t.match(parseCmMad(with_(17, 0x19)), { ok: false, error: 'UNSUPPORTED_ATTRIBUTE', attributeId: 0x19 });
  t.end();
});

t.test('emit: short private data is zero-filled, long is refused, other bytes untouched', (t) => {
  const b = new Uint8Array(MAD_LEN + 2).fill(0xaa);
  emitCmMad({ header: cmMadHeader('RTU', 5n), msg: { kind: 'RTU', localCommId: 1, remoteCommId: 2, privateData: new Uint8Array([1, 2, 3]) } }, b, 1);
  t.equal(b[0], 0xaa);
  t.equal(b[MAD_LEN + 1], 0xaa);
  t.same([...b.subarray(1 + 32, 1 + 36)], [1, 2, 3, 0]);
  t.equal(b[MAD_LEN], 0);
  t.throws(() => cmMadBytes({ header: cmMadHeader('RTU', 5n), msg: { kind: 'RTU', localCommId: 1, remoteCommId: 2, privateData: new Uint8Array(225) } }), { code: 'ERR_CM_EMIT' });
  t.throws(() => emitCmMad({ header: cmMadHeader('RTU', 5n), msg: { kind: 'RTU', localCommId: 1, remoteCommId: 2, privateData: new Uint8Array(0) } }, new Uint8Array(255)), { code: 'ERR_CM_EMIT' });
  t.throws(() => reqPrivateData(cmaHeaderFor(CLIENT, 1, SERVER), new Uint8Array(57)), { code: 'ERR_CM_EMIT' });
  t.end();
});

t.test('rdma_cm helpers', (t) => {
  t.equal(rdmaCmServiceId(7174), 0x0000000001061c06n);
  t.equal(rdmaCmServiceId(20079, RDMA_PS.UDP), 0x00000000_0111_4e6fn);
  t.same(parseRdmaCmServiceId(0x1000000001061c06n), undefined);
  t.same([...gidOfIp('10.77.0.3')], [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 3]);
  t.equal(ipOfGid(gidOfIp('fd77::2')), 'fd77::2');
  t.equal(ipOfGid(gidOfIp('10.77.0.2')), '10.77.0.2');
  const v6 = parseCmaHeader(reqPrivateData(cmaHeaderFor('fd77::3', 40000, 'fd77::2'), new Uint8Array([1, 2])));
  if (!v6.ok) return t.fail(v6.error);
  t.equal(v6.header.ipVersion, 6);
  t.equal(cmaAddressText(6, v6.header.srcIp), 'fd77::3');
  t.equal(cmaAddressText(6, v6.header.dstIp), 'fd77::2');
  t.same([...v6.userData.subarray(0, 3)], [1, 2, 0]);
  t.throws(() => cmaHeaderFor('10.0.0.1', 1, 'fd77::2'), { name: 'RangeError' });
  t.match(parseCmaHeader(new Uint8Array(35)), { ok: false, error: 'TOO_SHORT' });
  t.match(parseCmaHeader(new Uint8Array(36).fill(0x10, 0, 1)), { ok: false, error: 'BAD_VERSION' });
  t.match(parseCmaHeader(new Uint8Array(36)), { ok: false, error: 'BAD_IP_VERSION' });
  t.equal(rejReasonName(CM_REJ_REASON.INVALID_SERVICE_ID), 'Invalid Service ID');
  t.equal(rejReasonName(CM_REJ_REASON.CONSUMER_REJECT), 'Consumer Reject');
  t.equal(rejReasonName(34), 'reserved reason 34');
  t.equal(mtuOfCode(3), 1024);
  t.equal(codeOfMtu(4096), 5);
  t.equal(mtuOfCode(0), undefined);
  t.ok(Math.abs(cmTimeoutUs(20) - 4294967.296) < 1e-6, 'CM response timeout 20 ≈ 4.29 s');
  t.same(Object.values(CM_PRIVATE_DATA_LEN), [92, 222, 148, 196, 224, 220, 224]);
  t.end();
});

t.test('property: CM record → emit → parse is the record', (t) => {
  fc.assert(
    fc.property(arbCmMad, (m) => {
      const r = parseCmMad(cmMadBytes(m));
      return r.ok && JSON.stringify(r.mad, replacer) === JSON.stringify(m, replacer);
    }),
    { seed: SEED, numRuns: 1000 },
  );
  t.pass('1000 messages');
  t.end();
});

t.test('property: random bytes never throw; what parses is a fixed point of emit∘parse', (t) => {
  const attrs = [0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x01];
  fc.assert(
    fc.property(fc.uint8Array({ minLength: 0, maxLength: 300 }), fc.nat(100), (bytes, pick) => {
      // Make most inputs look like CM MADs so the message parsers, not the header checks, are exercised.
      if (bytes.length >= 24 && pick < 80) {
        bytes.set([1, 7, 2, 3], 0);
        bytes[16] = 0;
        bytes[17] = attrs[pick % attrs.length]!;
      }
      const r = parseCmMad(bytes);
      if (!r.ok) return true;
      const once = cmMadBytes(r.mad);
      const again = parseCmMad(once);
      return again.ok && Buffer.compare(cmMadBytes(again.mad), once) === 0;
    }),
    { seed: SEED, numRuns: 3000 },
  );
  t.pass('3000 inputs');
  t.end();
});

function replacer(_k: string, v: unknown): unknown {
  if (typeof v === 'bigint') return `${v}n`;
  if (v instanceof Uint8Array) return Buffer.from(v).toString('hex');
  return v;
}

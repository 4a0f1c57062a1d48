/**
 * The naming adapter `roce explain` puts over `src/cm`'s MAD and CM codecs.
 */

import t from 'tap';
import { cmAttributeName, describeMad, describeServiceId } from '../../src/analyze/mad.js';
import { MAD_LEN } from '../../src/cm/mad.js';
import { CM_REJ_REASON, cmMadBytes, cmMadHeader, rdmaCmServiceId, RDMA_PS } from '../../src/cm/messages.js';

t.test('CM attribute names', async (t) => {
  t.equal(cmAttributeName(0x0010), 'ConnectRequest');
  t.equal(cmAttributeName(0x001a), 'AlternatePathResponse');
  t.equal(cmAttributeName(0x0020), undefined);
});

t.test('a REJ decoded by src/cm', async (t) => {
  const b = cmMadBytes({
    header: cmMadHeader('REJ', 7n),
    msg: {
      kind: 'REJ', localCommId: 1, remoteCommId: 2, messageRejected: 0, rejectedInfoLength: 0,
      reason: CM_REJ_REASON.CONSUMER_REJECT, ari: new Uint8Array(0), privateData: new Uint8Array(0),
    },
  });
  t.match(describeMad(b), {
    ok: true,
    mad: { className: 'Communication Management', methodName: 'Send', methodByte: 0x03, attributeName: 'ConnectReject', cm: { kind: 'REJ', reason: 28 } },
  });
});

t.test('non-CM classes, responses, unknown codes', async (t) => {
  const b = new Uint8Array(MAD_LEN);
  b.set([1, 0x04, 1, 0x81]);
  b[17] = 0x12;
  t.match(describeMad(b), { ok: true, mad: { className: 'Performance Management', methodName: 'GetResp', methodByte: 0x81, attributeName: 'attribute 0x0012' } });
  t.notOk((describeMad(b) as { mad: { cm?: unknown } }).mad.cm);
  b.set([1, 0x42, 1, 0x09]);
  t.match(describeMad(b), { ok: true, mad: { className: 'class 0x42', methodName: 'method 0x09' } });
  b[0] = 2;
  t.match(describeMad(b), { ok: false, error: 'BAD_BASE_VERSION' });
  t.match(describeMad(new Uint8Array(100)), { ok: false, error: 'TOO_SHORT' });
});

t.test('rdma_cm service IDs', async (t) => {
  t.equal(describeServiceId(rdmaCmServiceId(7174)), '0x0000000001061c06 (RDMA CM, TCP port 7174)');
  t.equal(describeServiceId(rdmaCmServiceId(4791, RDMA_PS.UDP)), '0x00000000011112b7 (RDMA CM, UDP port 4791)');
  t.equal(describeServiceId(rdmaCmServiceId(1, RDMA_PS.IPOIB)), '0x0000000000020001 (RDMA CM, IPoIB port 1)');
  t.equal(describeServiceId(0x1000000001061c06n), '0x1000000001061c06');
  t.equal(describeServiceId(0x01050001n), '0x0000000001050001');
});

/** fast-check generators for MAD headers and CM messages. */
import fc from 'fast-check';
import type { MadHeader } from '../../src/cm/mad.js';
import { CM_PRIVATE_DATA_LEN, CM_REJ_ARI_LEN, cmMadHeader, type CmMad, type CmMessage, type CmPath } from '../../src/cm/messages.js';

const u = (bits: number) => fc.integer({ min: 0, max: 2 ** bits - 1 });
const u64 = fc.bigInt({ min: 0n, max: (1n << 64n) - 1n });
const bytes = (n: number) => fc.uint8Array({ minLength: n, maxLength: n });

export const arbMadHeader: fc.Arbitrary<MadHeader> = fc.record({
  baseVersion: fc.constant(1),
  mgmtClass: u(8),
  classVersion: u(8),
  response: fc.boolean(),
  method: u(7),
  status: u(16),
  classSpecific: u(16),
  transactionId: u64,
  attributeId: u(16),
  reserved: u(16),
  attributeModifier: u(32),
});

const arbPath: fc.Arbitrary<CmPath> = fc.record({
  localLid: u(16),
  remoteLid: u(16),
  localGid: bytes(16),
  remoteGid: bytes(16),
  flowLabel: u(20),
  packetRate: u(6),
  trafficClass: u(8),
  hopLimit: u(8),
  sl: u(4),
  subnetLocal: fc.boolean(),
  localAckTimeout: u(5),
});

const ids = { localCommId: u(32), remoteCommId: u(32) };

export const arbCmMessage: fc.Arbitrary<CmMessage> = fc.oneof(
  fc.record({
    kind: fc.constant('REQ' as const),
    localCommId: u(32),
    serviceId: u64,
    localCaGuid: u64,
    localQkey: u(32),
    localQpn: u(24),
    responderResources: u(8),
    localEecn: u(24),
    initiatorDepth: u(8),
    remoteEecn: u(24),
    remoteCmResponseTimeout: u(5),
    transportServiceType: u(2),
    endToEndFlowControl: fc.boolean(),
    startingPsn: u(24),
    localCmResponseTimeout: u(5),
    retryCount: u(3),
    pkey: u(16),
    pathMtu: u(4),
    rdcExists: fc.boolean(),
    rnrRetryCount: u(3),
    maxCmRetries: u(4),
    srq: fc.boolean(),
    extendedTransportType: u(3),
    primaryPath: arbPath,
    alternatePath: arbPath,
    sapSupported: fc.boolean(),
    privateData: bytes(CM_PRIVATE_DATA_LEN.REQ),
  }),
  fc.record({ kind: fc.constant('MRA' as const), ...ids, messageMraed: u(2), serviceTimeout: u(5), privateData: bytes(CM_PRIVATE_DATA_LEN.MRA) }),
  fc.record({
    kind: fc.constant('REJ' as const),
    ...ids,
    messageRejected: u(2),
    rejectedInfoLength: u(7),
    reason: u(16),
    ari: bytes(CM_REJ_ARI_LEN),
    privateData: bytes(CM_PRIVATE_DATA_LEN.REJ),
  }),
  fc.record({
    kind: fc.constant('REP' as const),
    ...ids,
    localQkey: u(32),
    localQpn: u(24),
    localEecn: u(24),
    startingPsn: u(24),
    responderResources: u(8),
    initiatorDepth: u(8),
    targetAckDelay: u(5),
    failoverAccepted: u(2),
    endToEndFlowControl: fc.boolean(),
    rnrRetryCount: u(3),
    srq: fc.boolean(),
    localCaGuid: u64,
    privateData: bytes(CM_PRIVATE_DATA_LEN.REP),
  }),
  fc.record({ kind: fc.constant('RTU' as const), ...ids, privateData: bytes(CM_PRIVATE_DATA_LEN.RTU) }),
  fc.record({ kind: fc.constant('DREQ' as const), ...ids, remoteQpn: u(24), privateData: bytes(CM_PRIVATE_DATA_LEN.DREQ) }),
  fc.record({ kind: fc.constant('DREP' as const), ...ids, privateData: bytes(CM_PRIVATE_DATA_LEN.DREP) }),
);

export const arbCmMad: fc.Arbitrary<CmMad> = fc
  .tuple(arbCmMessage, u64, u(32))
  .map(([msg, tid, mod]) => ({ header: { ...cmMadHeader(msg.kind, tid), attributeModifier: mod }, msg }));

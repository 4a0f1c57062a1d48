/**
 * Device counters: one `as const` list of names, from which both the type and the zeroed
 * record are derived, so the two cannot drift (rxe keeps an enum and a name table in sync
 * by hand). The first ten are rdma_rxe's hw counter names in camelCase; the rest name our
 * drop reasons and events, so that every dropped packet is accounted for exactly once.
 */

export const COUNTER_NAMES = [
  // rxe (rxe_hw_counters.h)
  'sentPkts',
  'rcvdPkts',
  'dupReq',
  'outOfSeqReq',
  'rcvRnr',
  'sndRnr',
  'rcvSeqErr',
  'compRetry',
  'retryExceeded',
  'rnrRetryExceeded',
  'rdmaSends',
  'rdmaRecvs',
  'ackDeferred',
  'linkDowned',
  // retransmission and timers
  'retransPkts',
  'ackTimeouts',
  // ingress drops (device demux, in rxe_rcv's order)
  'malformed',
  'noQp',
  'badTransport',
  'badState',
  'badPkey',
  'badAddr',
  'badQkey',
  // responder drops and NAKs
  'badOpcodeSeq',
  'badLength',
  'rkeyViolation',
  'invalidRequest',
  'remoteOpErr',
  'ucDroppedMsg',
  'noRecvWqe',
  'dupReadReplay',
  'dupAtomicReplay',
  'dupNoResource',
  // completer drops
  'staleResponse',
  'unexpectedResponse',
  // congestion notification (RoCEv2 annex A17.9)
  'cnpSent',
  'cnpRcvd',
  // link-level (ICRC is the link's job; the device copies the link's verdict here)
  'icrcErr',
  'cqOverflow',
] as const;

export type CounterName = (typeof COUNTER_NAMES)[number];
export type Counters = Record<CounterName, number>;

export function newCounters(): Counters {
  // Built in one go, not by a store per name: V8 turns an object that gains more than a dozen
  // properties through computed-key stores into a hash table, and every `counters.x++` of the
  // engines (one or two per packet) then went through the generic property lookup.
  return Object.fromEntries(COUNTER_NAMES.map((n) => [n, 0])) as Counters;
}

/** Sum of the counters that record a dropped packet, for "everything accounted for" checks. */
export const DROP_COUNTERS: readonly CounterName[] = [
  'malformed', 'noQp', 'badTransport', 'badState', 'badPkey', 'badAddr', 'badQkey',
  'badOpcodeSeq', 'badLength', 'rkeyViolation', 'invalidRequest', 'ucDroppedMsg', 'noRecvWqe',
  'dupNoResource', 'staleResponse', 'unexpectedResponse',
];

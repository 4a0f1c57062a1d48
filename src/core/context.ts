/**
 * What the three engines may see of their QP: its identity, attributes, memory, counters, and
 * the two ways out (transmit a packet, post a completion). The QP implements it; tests
 * implement it with a harness. Engines never write each other's state: they return actions
 * (`completer.ts`) or outcomes (`responder.ts`) that the QP applies.
 */

import type { Counters } from './counters.js';
import type { MrTable, ProtectionDomain } from './mr.js';
import type { Endpoint, QpState, QpType, Qpn, WorkCompletion } from './types.js';

/** The QP's live attributes, in the units the engines use (bytes, µs codes as given). */
export interface QpAttrs {
  pathMtu: number;
  /** Port MTU: the UD message limit and the cap on pathMtu. */
  portMtu: number;
  destQpNum: Qpn;
  dest: Endpoint | undefined;
  /** 16-byte destination GID (RC/UC). */
  dgid: Uint8Array | undefined;
  srcPort: number;
  accessFlags: number;
  qkey: number;
  pkeyIndex: number;
  portNum: number;
  timeout: number;
  retryCnt: number;
  rnrRetry: number;
  minRnrTimer: number;
  maxRdAtomic: number;
  maxDestRdAtomic: number;
  sqPsn: number;
  rqPsn: number;
  enSqdAsyncNotify: boolean;
  sqSigAll: boolean;
}

export interface EngineContext {
  readonly qpn: Qpn;
  readonly type: QpType;
  readonly state: QpState;
  /**
   * Counts the QP's entries into RESET, ERR and SQE. A send or a completion runs the application's
   * code (a link, a trace printer, a completion handler), which may reset or fail the QP: an engine
   * that goes on after one compares this count and stops if it moved.
   */
  readonly stateEpoch: number;
  readonly pd: ProtectionDomain;
  readonly mrs: MrTable;
  readonly counters: Counters;
  readonly attrs: QpAttrs;
  /** Sends one packet (headers, payload views, pad; no ICRC) from this QP to `dst`. */
  transmit(dst: Endpoint, parts: readonly Uint8Array[]): void;
  /** Posts a receive completion to the QP's receive CQ. */
  postRecvCompletion(wc: WorkCompletion): void;
}

/** Where a request packet came from and went to (the responder needs it to build a UD GRH). */
export interface RxInfo {
  srcAddress: string;
  dstAddress: string;
  /** Length of the whole UDP payload, ICRC included (for the synthesized IP header). */
  udpLength: number;
}

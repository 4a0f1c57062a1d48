/**
 * Verbs vocabulary shared by the core and the API: QP types and states, access and send
 * flags with libibverbs bit values, work requests and completions in libibverbs' shape
 * (camelCase), QP attributes and their mask bits.
 *
 * Read first: IBTA Vol. 1 ch. 11 (verbs), libibverbs `verbs.h`.
 */

/** 24-bit queue pair number. */
export type Qpn = number;
/** 24-bit packet sequence number; arithmetic only through `wire/psn.ts`. */
export type Psn = number;
/** 32-bit local key of a memory region. */
export type Lkey = number;
/** 32-bit remote key of a memory region. */
export type Rkey = number;
/** 32-bit queue key of a UD QP. */
export type Qkey = number;
/** The user's work request id, returned untouched in the completion (u64 in libibverbs). */
export type WrId = number | bigint;

export type QpType = 'RC' | 'UC' | 'UD';

/** IBTA 10.3.1 QP states. */
export type QpState = 'RESET' | 'INIT' | 'RTR' | 'RTS' | 'SQD' | 'SQE' | 'ERR';
export const QP_STATES: readonly QpState[] = ['RESET', 'INIT', 'RTR', 'RTS', 'SQD', 'SQE', 'ERR'];

/** Memory and QP access flags (libibverbs `enum ibv_access_flags` values). */
export const ACCESS = {
  LOCAL_WRITE: 1,
  REMOTE_WRITE: 2,
  REMOTE_READ: 4,
  REMOTE_ATOMIC: 8,
} as const;

/** Send flags (libibverbs `enum ibv_send_flags` values). */
export const SEND_FLAGS = {
  FENCE: 1,
  SIGNALED: 2,
  SOLICITED: 4,
  INLINE: 8,
} as const;

/** Work completion flags (libibverbs `enum ibv_wc_flags` values). */
export const WC_FLAGS = {
  GRH: 1,
  WITH_IMM: 2,
  IP_CSUM_OK: 4,
  WITH_INV: 8,
} as const;

export type WrOpcode =
  | 'RDMA_WRITE'
  | 'RDMA_WRITE_WITH_IMM'
  | 'SEND'
  | 'SEND_WITH_IMM'
  | 'RDMA_READ'
  | 'ATOMIC_CMP_AND_SWP'
  | 'ATOMIC_FETCH_AND_ADD'
  | 'SEND_WITH_INV';

export type WcOpcode = 'SEND' | 'RDMA_WRITE' | 'RDMA_READ' | 'COMP_SWAP' | 'FETCH_ADD' | 'RECV' | 'RECV_RDMA_WITH_IMM';

/** libibverbs `enum ibv_wc_status`, in its order (the index is the numeric value). */
export const WC_STATUS = [
  'SUCCESS',
  'LOC_LEN_ERR',
  'LOC_QP_OP_ERR',
  'LOC_EEC_OP_ERR',
  'LOC_PROT_ERR',
  'WR_FLUSH_ERR',
  'MW_BIND_ERR',
  'BAD_RESP_ERR',
  'LOC_ACCESS_ERR',
  'REM_INV_REQ_ERR',
  'REM_ACCESS_ERR',
  'REM_OP_ERR',
  'RETRY_EXC_ERR',
  'RNR_RETRY_EXC_ERR',
  'LOC_RDD_VIOL_ERR',
  'REM_INV_RD_REQ_ERR',
  'REM_ABORT_ERR',
  'INV_EECN_ERR',
  'INV_EEC_STATE_ERR',
  'FATAL_ERR',
  'RESP_TIMEOUT_ERR',
  'GENERAL_ERR',
] as const;
export type WcStatus = (typeof WC_STATUS)[number];

/** One scatter/gather element, as libibverbs `struct ibv_sge`: a VA inside a registered MR. */
export interface Sge {
  addr: bigint;
  length: number;
  lkey: Lkey;
}

export interface SendWr {
  wrId: WrId;
  opcode: WrOpcode;
  sgList?: readonly Sge[];
  /** `SEND_FLAGS` bits. */
  sendFlags?: number;
  /** SEND_WITH_IMM / RDMA_WRITE_WITH_IMM: 32 bits, delivered in the receive completion. */
  immData?: number;
  /** SEND_WITH_INV: the peer's R_Key to invalidate. */
  invalidateRkey?: Rkey;
  /** RDMA_WRITE*, RDMA_READ. */
  rdma?: { remoteAddr: bigint; rkey: Rkey };
  /** ATOMIC_*: `compareAdd` is the compare value (CmpSwap) or the addend (FetchAdd). */
  atomic?: { remoteAddr: bigint; compareAdd: bigint; swap?: bigint; rkey: Rkey };
  /** UD: destination. A `remoteQkey` with the high bit set means "use the QP's own Q_Key" (IBTA 10.2.5). */
  ud?: { ah: AddressHandle; remoteQpn: Qpn; remoteQkey: Qkey };
}

export interface RecvWr {
  wrId: WrId;
  sgList?: readonly Sge[];
}

export interface WorkCompletion {
  wrId: WrId;
  status: WcStatus;
  opcode: WcOpcode;
  /** Vendor error: the AETH syndrome of a NAK that caused the error, else 0. */
  vendorErr: number;
  byteLen: number;
  /** Set with `WC_FLAGS.WITH_IMM`; otherwise absent (`poll`) or undefined (a reused record, `pollInto`). */
  immData?: number | undefined;
  /** Set with `WC_FLAGS.WITH_INV`; otherwise absent or undefined, as `immData`. */
  invalidatedRkey?: Rkey | undefined;
  qpNum: Qpn;
  /** The sender's QPN (UD receive completions; 0 otherwise). */
  srcQp: Qpn;
  /** `WC_FLAGS` bits. */
  wcFlags: number;
  pkeyIndex: number;
}

/** Where a peer lives: a GID (16 bytes or text) or an IP address, and the UDP port of its stack. */
export interface AhAttr {
  /** Destination GID, as 16 bytes or text (`::ffff:10.0.0.2`, `fd77::2`). */
  dgid?: Uint8Array | string;
  /** Destination IP address text; an alternative to `dgid`. */
  address?: string;
  /** The peer stack's UDP port; default 4791. */
  port?: number;
  /** Accepted for libibverbs familiarity; RoCEv2 carries no SL or hop limit we control. */
  sl?: number;
  hopLimit?: number;
}

/** A resolved address handle: where the link must send. */
export interface AddressHandle {
  readonly address: string;
  readonly port: number;
  readonly dgid: Uint8Array;
}

export interface QpCap {
  maxSendWr: number;
  maxRecvWr: number;
  maxSendSge: number;
  maxRecvSge: number;
  maxInlineData: number;
}

/** Path MTU: bytes, or the libibverbs enum (1 = 256 … 5 = 4096). */
export type MtuValue = 256 | 512 | 1024 | 2048 | 4096 | 1 | 2 | 3 | 4 | 5;

/** `ibv_qp_attr` in camelCase. Every field is optional; the mask (given or derived) says which count. */
export interface QpAttr {
  qpState?: QpState;
  curQpState?: QpState;
  pathMtu?: MtuValue;
  qkey?: Qkey;
  rqPsn?: Psn;
  sqPsn?: Psn;
  destQpNum?: Qpn;
  qpAccessFlags?: number;
  cap?: Partial<QpCap>;
  ahAttr?: AhAttr;
  pkeyIndex?: number;
  enSqdAsyncNotify?: boolean;
  sqDraining?: boolean;
  maxRdAtomic?: number;
  maxDestRdAtomic?: number;
  minRnrTimer?: number;
  portNum?: number;
  timeout?: number;
  retryCnt?: number;
  rnrRetry?: number;
  pathMigState?: 'MIGRATED' | 'REARM' | 'ARMED';
}

/** libibverbs `enum ibv_qp_attr_mask` values. */
export const QP_ATTR_MASK = {
  STATE: 1 << 0,
  CUR_STATE: 1 << 1,
  EN_SQD_ASYNC_NOTIFY: 1 << 2,
  ACCESS_FLAGS: 1 << 3,
  PKEY_INDEX: 1 << 4,
  PORT: 1 << 5,
  QKEY: 1 << 6,
  AV: 1 << 7,
  PATH_MTU: 1 << 8,
  TIMEOUT: 1 << 9,
  RETRY_CNT: 1 << 10,
  RNR_RETRY: 1 << 11,
  RQ_PSN: 1 << 12,
  MAX_QP_RD_ATOMIC: 1 << 13,
  ALT_PATH: 1 << 14,
  MIN_RNR_TIMER: 1 << 15,
  SQ_PSN: 1 << 16,
  MAX_DEST_RD_ATOMIC: 1 << 17,
  PATH_MIG_STATE: 1 << 18,
  CAP: 1 << 19,
  DEST_QPN: 1 << 20,
} as const;
export type QpAttrMaskName = keyof typeof QP_ATTR_MASK;

/** Which `QpAttr` field each mask bit covers (used to derive a mask from the fields present). */
export const ATTR_FIELD_OF_MASK: Readonly<Record<QpAttrMaskName, keyof QpAttr | undefined>> = {
  STATE: 'qpState',
  CUR_STATE: 'curQpState',
  EN_SQD_ASYNC_NOTIFY: 'enSqdAsyncNotify',
  ACCESS_FLAGS: 'qpAccessFlags',
  PKEY_INDEX: 'pkeyIndex',
  PORT: 'portNum',
  QKEY: 'qkey',
  AV: 'ahAttr',
  PATH_MTU: 'pathMtu',
  TIMEOUT: 'timeout',
  RETRY_CNT: 'retryCnt',
  RNR_RETRY: 'rnrRetry',
  RQ_PSN: 'rqPsn',
  MAX_QP_RD_ATOMIC: 'maxRdAtomic',
  ALT_PATH: undefined,
  MIN_RNR_TIMER: 'minRnrTimer',
  SQ_PSN: 'sqPsn',
  MAX_DEST_RD_ATOMIC: 'maxDestRdAtomic',
  PATH_MIG_STATE: 'pathMigState',
  CAP: 'cap',
  DEST_QPN: 'destQpNum',
};

/** Asynchronous events (libibverbs `enum ibv_event_type` subset). */
export type AsyncEventType =
  | 'QP_FATAL'
  | 'QP_REQ_ERR'
  | 'QP_ACCESS_ERR'
  | 'SQ_DRAINED'
  | 'QP_LAST_WQE_REACHED'
  | 'CQ_ERR'
  | 'PORT_ACTIVE'
  | 'PORT_ERR'
  | 'DEVICE_FATAL';

export interface AsyncEvent {
  type: AsyncEventType;
  qpNum?: Qpn;
  cqHandle?: number;
  reason?: string;
}

/** A UDP endpoint: what the link sends to. Same shape as `link/link.ts`'s PeerAddress. */
export interface Endpoint {
  address: string;
  port: number;
}

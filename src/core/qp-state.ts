/**
 * The QP state transition table and the attribute check that precedes every modify.
 *
 * Read first: IBTA Vol. 1 §10.3 (QP and EE state machine, figure 125) and §11.2.4.2 (Modify
 * QP: the required and optional attributes per transition and transport, tables 91–94).
 * The table below is the one Linux keeps as `qp_state_table` behind `ib_modify_qp_is_ok`,
 * restricted to RC, UC and UD. A transition is legal when it is in the table, every required
 * attribute is in the mask, and nothing outside required ∪ optional ∪ {STATE} is.
 *
 * Everything here is pure: `checkModify` decides, the QP applies (check, then apply).
 */

import { InvalidAttrError, InvalidTransitionError } from './errors.js';
import { DEVICE_LIMITS } from './limits.js';
import {
  ACCESS, ATTR_FIELD_OF_MASK, QP_ATTR_MASK, type MtuValue, type QpAttr, type QpAttrMaskName, type QpState, type QpType,
} from './types.js';
import { PATH_MTUS, type PathMtu } from '../wire/constants.js';

type Mask = number;
const M = QP_ATTR_MASK;

interface Rule {
  req?: Partial<Record<QpType, Mask>>;
  opt?: Partial<Record<QpType, Mask>>;
}

const ALL: readonly QpType[] = ['RC', 'UC', 'UD'];

/** table[cur][next]: undefined means "not a legal transition". */
const TABLE: Readonly<Record<QpState, Partial<Record<QpState, Rule>>>> = {
  RESET: {
    RESET: {},
    INIT: {
      req: {
        UD: M.PKEY_INDEX | M.PORT | M.QKEY,
        UC: M.PKEY_INDEX | M.PORT | M.ACCESS_FLAGS,
        RC: M.PKEY_INDEX | M.PORT | M.ACCESS_FLAGS,
      },
    },
    ERR: {},
  },
  INIT: {
    RESET: {},
    ERR: {},
    INIT: {
      opt: {
        UD: M.PKEY_INDEX | M.PORT | M.QKEY,
        UC: M.PKEY_INDEX | M.PORT | M.ACCESS_FLAGS,
        RC: M.PKEY_INDEX | M.PORT | M.ACCESS_FLAGS,
      },
    },
    RTR: {
      req: {
        UC: M.AV | M.PATH_MTU | M.DEST_QPN | M.RQ_PSN,
        RC: M.AV | M.PATH_MTU | M.DEST_QPN | M.RQ_PSN | M.MAX_DEST_RD_ATOMIC | M.MIN_RNR_TIMER,
      },
      opt: {
        UD: M.PKEY_INDEX | M.QKEY,
        UC: M.ALT_PATH | M.ACCESS_FLAGS | M.PKEY_INDEX,
        RC: M.ALT_PATH | M.ACCESS_FLAGS | M.PKEY_INDEX,
      },
    },
  },
  RTR: {
    RESET: {},
    ERR: {},
    RTS: {
      req: {
        UD: M.SQ_PSN,
        UC: M.SQ_PSN,
        RC: M.TIMEOUT | M.RETRY_CNT | M.RNR_RETRY | M.SQ_PSN | M.MAX_QP_RD_ATOMIC,
      },
      opt: {
        UD: M.CUR_STATE | M.QKEY,
        UC: M.CUR_STATE | M.ALT_PATH | M.ACCESS_FLAGS | M.PATH_MIG_STATE,
        RC: M.CUR_STATE | M.ALT_PATH | M.ACCESS_FLAGS | M.MIN_RNR_TIMER | M.PATH_MIG_STATE,
      },
    },
  },
  RTS: {
    RESET: {},
    ERR: {},
    RTS: {
      opt: {
        UD: M.CUR_STATE | M.QKEY,
        UC: M.CUR_STATE | M.ACCESS_FLAGS | M.ALT_PATH | M.PATH_MIG_STATE,
        RC: M.CUR_STATE | M.ACCESS_FLAGS | M.ALT_PATH | M.PATH_MIG_STATE | M.MIN_RNR_TIMER,
      },
    },
    SQD: {
      opt: { UD: M.EN_SQD_ASYNC_NOTIFY, UC: M.EN_SQD_ASYNC_NOTIFY, RC: M.EN_SQD_ASYNC_NOTIFY },
    },
  },
  SQD: {
    RESET: {},
    ERR: {},
    RTS: {
      opt: {
        UD: M.CUR_STATE | M.QKEY,
        UC: M.CUR_STATE | M.ALT_PATH | M.ACCESS_FLAGS | M.PATH_MIG_STATE,
        RC: M.CUR_STATE | M.ALT_PATH | M.ACCESS_FLAGS | M.MIN_RNR_TIMER | M.PATH_MIG_STATE,
      },
    },
    SQD: {
      opt: {
        UD: M.PKEY_INDEX | M.QKEY,
        UC: M.AV | M.ALT_PATH | M.ACCESS_FLAGS | M.PKEY_INDEX | M.PATH_MIG_STATE,
        RC: M.PORT | M.AV | M.TIMEOUT | M.RETRY_CNT | M.RNR_RETRY | M.MAX_QP_RD_ATOMIC | M.MAX_DEST_RD_ATOMIC |
          M.ALT_PATH | M.ACCESS_FLAGS | M.PKEY_INDEX | M.MIN_RNR_TIMER | M.PATH_MIG_STATE,
      },
    },
  },
  SQE: {
    RESET: {},
    ERR: {},
    // SQE exists for UC and UD only (an RC send-queue error takes the whole QP to ERR).
    RTS: { opt: { UD: M.CUR_STATE | M.QKEY, UC: M.CUR_STATE | M.ACCESS_FLAGS } },
  },
  ERR: {
    RESET: {},
    ERR: {},
  },
};

export function maskNames(mask: number): QpAttrMaskName[] {
  return (Object.keys(QP_ATTR_MASK) as QpAttrMaskName[]).filter((k) => (mask & QP_ATTR_MASK[k]) !== 0);
}

/** The mask libibverbs would need for the fields present in `attr`. */
export function maskFromAttr(attr: QpAttr): number {
  let m = 0;
  for (const k of Object.keys(QP_ATTR_MASK) as QpAttrMaskName[]) {
    const f = ATTR_FIELD_OF_MASK[k];
    if (f !== undefined && attr[f] !== undefined) m |= QP_ATTR_MASK[k];
  }
  return m;
}

export function mtuBytes(v: MtuValue): PathMtu | undefined {
  if (v >= 1 && v <= 5) return PATH_MTUS[v - 1];
  return (PATH_MTUS as readonly number[]).includes(v) ? (v as PathMtu) : undefined;
}

/** The facts about the QP and device the check needs. */
export interface ModifyContext {
  type: QpType;
  state: QpState;
  /** The port's active MTU: a path MTU above it is refused. */
  portMtu: number;
}

/** What a valid modify will do, for `applyModify`. */
export interface ModifyPlan {
  from: QpState;
  to: QpState;
  mask: number;
}

/**
 * Validates a modify: transition, mask, and every attribute value. Throws InvalidTransitionError
 * or InvalidAttrError and changes nothing; returns the plan to apply.
 */
export function checkModify(ctx: ModifyContext, attr: QpAttr, mask: number): ModifyPlan {
  if (!Number.isInteger(mask) || mask < 0) throw new InvalidAttrError(`bad attribute mask ${mask}`);
  const to: QpState = (mask & M.STATE) !== 0 ? need(attr.qpState, 'qpState') : ctx.state;
  if ((mask & M.CUR_STATE) !== 0 && attr.curQpState !== undefined && attr.curQpState !== ctx.state) {
    throw new InvalidTransitionError(`curQpState ${attr.curQpState} does not match the QP's state ${ctx.state}`);
  }
  const rule = TABLE[ctx.state][to];
  if (!rule) throw new InvalidTransitionError(`${ctx.type} QP cannot go ${ctx.state} -> ${to}`);
  if (ctx.state === 'SQE' && ctx.type === 'RC') throw new InvalidTransitionError('an RC QP has no SQE state');
  const req = rule.req?.[ctx.type] ?? 0;
  const opt = rule.opt?.[ctx.type] ?? 0;
  const missing = req & ~mask;
  if (missing) {
    throw new InvalidTransitionError(`${ctx.type} ${ctx.state} -> ${to} needs ${maskNames(missing).join(', ')}`);
  }
  const extra = mask & ~(req | opt | M.STATE);
  if (extra) {
    throw new InvalidTransitionError(`${ctx.type} ${ctx.state} -> ${to} does not take ${maskNames(extra).join(', ')}`);
  }
  checkValues(ctx, attr, mask);
  return { from: ctx.state, to, mask };
}

function need<T>(v: T | undefined, name: string): T {
  if (v === undefined) throw new InvalidAttrError(`${name} is in the mask but not given`);
  return v;
}

function intIn(v: number | undefined, name: string, min: number, max: number): void {
  const x = need(v, name);
  if (!Number.isInteger(x) || x < min || x > max) throw new InvalidAttrError(`${name} ${x} outside ${min}..${max}`);
}

function checkValues(ctx: ModifyContext, a: QpAttr, mask: number): void {
  const has = (bit: number): boolean => (mask & bit) !== 0;
  if (has(M.PKEY_INDEX)) intIn(a.pkeyIndex, 'pkeyIndex', 0, 0); // one-entry P_Key table: 0xffff
  if (has(M.PORT)) intIn(a.portNum, 'portNum', 1, 1);
  if (has(M.QKEY)) intIn(a.qkey, 'qkey', 0, 0xffffffff);
  if (has(M.ACCESS_FLAGS)) {
    const f = need(a.qpAccessFlags, 'qpAccessFlags');
    const known = ACCESS.LOCAL_WRITE | ACCESS.REMOTE_WRITE | ACCESS.REMOTE_READ | ACCESS.REMOTE_ATOMIC;
    if (!Number.isInteger(f) || (f & ~known) !== 0) throw new InvalidAttrError(`qpAccessFlags 0x${f.toString(16)} has unknown bits`);
    // REMOTE_READ/REMOTE_ATOMIC on a UC QP are meaningless but accepted, as ib_core and rxe do.
  }
  if (has(M.PATH_MTU)) {
    const v = need(a.pathMtu, 'pathMtu');
    const b = mtuBytes(v);
    if (b === undefined) throw new InvalidAttrError(`pathMtu ${v} is not one of 256..4096 (or 1..5)`);
    if (b > ctx.portMtu) throw new InvalidAttrError(`pathMtu ${b} exceeds the port's active MTU ${ctx.portMtu}`);
  }
  if (has(M.DEST_QPN)) intIn(a.destQpNum, 'destQpNum', 0, 0xffffff);
  if (has(M.RQ_PSN)) intIn(a.rqPsn, 'rqPsn', 0, 0xffffff);
  if (has(M.SQ_PSN)) intIn(a.sqPsn, 'sqPsn', 0, 0xffffff);
  if (has(M.TIMEOUT)) intIn(a.timeout, 'timeout', 0, 31);
  if (has(M.RETRY_CNT)) intIn(a.retryCnt, 'retryCnt', 0, 7);
  if (has(M.RNR_RETRY)) intIn(a.rnrRetry, 'rnrRetry', 0, 7);
  if (has(M.MIN_RNR_TIMER)) intIn(a.minRnrTimer, 'minRnrTimer', 0, 31);
  if (has(M.MAX_QP_RD_ATOMIC)) intIn(a.maxRdAtomic, 'maxRdAtomic', 0, DEVICE_LIMITS.maxQpRdAtom);
  if (has(M.MAX_DEST_RD_ATOMIC)) intIn(a.maxDestRdAtomic, 'maxDestRdAtomic', 0, DEVICE_LIMITS.maxQpRdAtom);
  if (has(M.AV)) {
    const ah = need(a.ahAttr, 'ahAttr');
    if (ah.dgid === undefined && ah.address === undefined) throw new InvalidAttrError('ahAttr needs dgid or address');
    if (ah.port !== undefined && (!Number.isInteger(ah.port) || ah.port < 1 || ah.port > 0xffff)) {
      throw new InvalidAttrError(`ahAttr.port ${ah.port} is not a UDP port`);
    }
  }
}

export const ALL_QP_TYPES = ALL;

/** Every (from, to) pair the table allows for a QP type, for exhaustive tests. */
export function legalTransitions(type: QpType): [QpState, QpState][] {
  const out: [QpState, QpState][] = [];
  for (const from of Object.keys(TABLE) as QpState[]) {
    if (from === 'SQE' && type === 'RC') continue;
    for (const to of Object.keys(TABLE[from]) as QpState[]) out.push([from, to]);
  }
  return out;
}

/** The required mask for a transition, for tests and error messages. */
export function requiredMask(type: QpType, from: QpState, to: QpState): number | undefined {
  const rule = TABLE[from][to];
  if (!rule) return undefined;
  return rule.req?.[type] ?? 0;
}

/**
 * The modify-QP check in isolation: required and optional attributes per transition and type
 * (libibverbs/ib_modify_qp_is_ok), value ranges, and that a refused modify changes nothing.
 */
import t from 'tap';
import { checkModify, legalTransitions, maskFromAttr, requiredMask } from '../../src/core/qp-state.js';
import { InvalidAttrError, InvalidTransitionError } from '../../src/core/errors.js';
import { QP_ATTR_MASK as M, type QpAttr, type QpState, type QpType } from '../../src/core/types.js';

const ctx = (type: QpType, state: QpState) => ({ type, state, portMtu: 4096 });

t.test('required attributes per transition', async (t) => {
  t.equal(requiredMask('RC', 'RESET', 'INIT'), M.PKEY_INDEX | M.PORT | M.ACCESS_FLAGS);
  t.equal(requiredMask('UD', 'RESET', 'INIT'), M.PKEY_INDEX | M.PORT | M.QKEY);
  t.equal(requiredMask('RC', 'INIT', 'RTR'), M.AV | M.PATH_MTU | M.DEST_QPN | M.RQ_PSN | M.MAX_DEST_RD_ATOMIC | M.MIN_RNR_TIMER);
  t.equal(requiredMask('UC', 'INIT', 'RTR'), M.AV | M.PATH_MTU | M.DEST_QPN | M.RQ_PSN);
  t.equal(requiredMask('UD', 'INIT', 'RTR'), 0);
  t.equal(requiredMask('RC', 'RTR', 'RTS'), M.TIMEOUT | M.RETRY_CNT | M.RNR_RETRY | M.SQ_PSN | M.MAX_QP_RD_ATOMIC);
  t.equal(requiredMask('UD', 'RTR', 'RTS'), M.SQ_PSN);
  t.equal(requiredMask('RC', 'RESET', 'RTS'), undefined);
});

const full: Record<string, QpAttr> = {
  'RC RESET INIT': { qpState: 'INIT', pkeyIndex: 0, portNum: 1, qpAccessFlags: 0 },
  'RC INIT RTR': { qpState: 'RTR', ahAttr: { address: '10.0.0.2' }, pathMtu: 1024, destQpNum: 0x12, rqPsn: 5, maxDestRdAtomic: 4, minRnrTimer: 12 },
  'RC RTR RTS': { qpState: 'RTS', sqPsn: 1, timeout: 14, retryCnt: 7, rnrRetry: 7, maxRdAtomic: 4 },
};

t.test('each missing required attribute is refused, naming it', async (t) => {
  for (const [k, attr] of Object.entries(full)) {
    const [type, from] = k.split(' ') as [QpType, QpState];
    t.doesNotThrow(() => checkModify(ctx(type, from), attr, maskFromAttr(attr)), `${k} complete`);
    for (const field of Object.keys(attr)) {
      if (field === 'qpState') continue;
      const partial = { ...attr } as Record<string, unknown>;
      delete partial[field];
      t.throws(() => checkModify(ctx(type, from), partial as QpAttr, maskFromAttr(partial as QpAttr)), InvalidTransitionError, `${k} without ${field}`);
    }
  }
});

t.test('attributes outside required ∪ optional are refused', async (t) => {
  t.throws(() => checkModify(ctx('RC', 'RESET'), { ...full['RC RESET INIT']!, sqPsn: 3 }, maskFromAttr({ ...full['RC RESET INIT']!, sqPsn: 3 })), InvalidTransitionError);
  t.throws(() => checkModify(ctx('UD', 'RESET'), { qpState: 'INIT', pkeyIndex: 0, portNum: 1, qkey: 1, qpAccessFlags: 0 }, maskFromAttr({ qpState: 'INIT', pkeyIndex: 0, portNum: 1, qkey: 1, qpAccessFlags: 0 })), InvalidTransitionError);
  t.doesNotThrow(() => checkModify(ctx('RC', 'RTS'), { minRnrTimer: 3 }, M.MIN_RNR_TIMER), 'RTS→RTS may change minRnrTimer');
});

t.test('value ranges', async (t) => {
  const bad: [QpAttr, string][] = [
    [{ ...full['RC INIT RTR']!, pathMtu: 1500 as 1024 }, 'pathMtu 1500'],
    [{ ...full['RC INIT RTR']!, rqPsn: 0x1000000 }, 'rqPsn 2^24'],
    [{ ...full['RC INIT RTR']!, destQpNum: -1 }, 'negative QPN'],
    [{ ...full['RC INIT RTR']!, minRnrTimer: 32 }, 'minRnrTimer 32'],
    [{ ...full['RC INIT RTR']!, maxDestRdAtomic: 129 }, 'maxDestRdAtomic above the device limit'],
  ];
  for (const [attr, why] of bad) t.throws(() => checkModify(ctx('RC', 'INIT'), attr, maskFromAttr(attr)), InvalidAttrError, why);
  const rts: [QpAttr, string][] = [
    [{ ...full['RC RTR RTS']!, retryCnt: 8 }, 'retryCnt 8'],
    [{ ...full['RC RTR RTS']!, timeout: 32 }, 'timeout 32'],
    [{ ...full['RC RTR RTS']!, rnrRetry: -1 }, 'rnrRetry -1'],
  ];
  for (const [attr, why] of rts) t.throws(() => checkModify(ctx('RC', 'RTR'), attr, maskFromAttr(attr)), InvalidAttrError, why);
  t.throws(() => checkModify({ type: 'RC', state: 'INIT', portMtu: 1024 }, full['RC INIT RTR']!.pathMtu === 1024 ? { ...full['RC INIT RTR']!, pathMtu: 4096 } : {}, maskFromAttr({ ...full['RC INIT RTR']!, pathMtu: 4096 })), InvalidAttrError, 'pathMtu above the port MTU');
  t.doesNotThrow(() => checkModify(ctx('RC', 'INIT'), { ...full['RC INIT RTR']!, pathMtu: 5 }, maskFromAttr(full['RC INIT RTR']!)), 'libibverbs MTU enum 5 = 4096');
});

t.test('curQpState must match', async (t) => {
  t.throws(() => checkModify(ctx('RC', 'RTS'), { qpState: 'RTS', curQpState: 'RTR' }, M.STATE | M.CUR_STATE), InvalidTransitionError);
});

t.test('legal transitions table size', async (t) => {
  t.equal(legalTransitions('RC').length, 20);
  t.equal(legalTransitions('UD').length, 23);
});

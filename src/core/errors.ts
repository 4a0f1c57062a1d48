/**
 * Errors. Two worlds, kept apart:
 *  - API misuse (a bad attribute, an invalid transition, a full queue) throws a `RoceError`
 *    subclass with a stable `code`; `instanceof` works across duplicate package copies via
 *    a `Symbol.for` brand.
 *  - Protocol faults on the datapath never throw: packets are dropped and counted, and
 *    failed work requests complete with a `WcStatus`.
 */

const BRAND = Symbol.for('roce-ts.error');

export type RoceErrorCode =
  /** An attribute value is out of range or not allowed for this QP type. */
  | 'ERR_INVALID_ATTR'
  /** The requested QP state transition is not in the IBTA 10.3 table, or the attribute mask does not fit it. */
  | 'ERR_INVALID_TRANSITION'
  /** The operation is not allowed in the QP's current state (e.g. postSend before RTS). */
  | 'ERR_QP_STATE'
  /** A work request is malformed (unknown opcode, too many SGEs, inline too long, missing fields). */
  | 'ERR_INVALID_WR'
  /** A send or receive queue is full. */
  | 'ERR_QUEUE_FULL'
  /** A memory registration request is invalid. */
  | 'ERR_MR'
  /** A resource belongs to another device or protection domain, or was destroyed. */
  | 'ERR_RESOURCE'
  /**
   * A resource is still in use and cannot be destroyed: a QP still uses the CQ, or a region or QP
   * still belongs to the protection domain (libibverbs' EBUSY).
   */
  | 'ERR_BUSY'
  /** The device is closed. */
  | 'ERR_DEVICE_CLOSED'
  /** A feature this stack does not implement. */
  | 'ERR_NOT_SUPPORTED';

export class RoceError extends Error {
  readonly code: RoceErrorCode;

  constructor(code: RoceErrorCode, message: string) {
    super(message);
    this.code = code;
    this.name = 'RoceError';
  }

  get [BRAND](): true {
    return true;
  }

  static override [Symbol.hasInstance](x: unknown): boolean {
    if (this !== RoceError) return Function.prototype[Symbol.hasInstance].call(this, x);
    return typeof x === 'object' && x !== null && (x as Record<symbol, unknown>)[BRAND] === true;
  }
}

export class InvalidAttrError extends RoceError {
  constructor(message: string) {
    super('ERR_INVALID_ATTR', message);
    this.name = 'InvalidAttrError';
  }
}

export class InvalidTransitionError extends RoceError {
  constructor(message: string) {
    super('ERR_INVALID_TRANSITION', message);
    this.name = 'InvalidTransitionError';
  }
}

export class QpStateError extends RoceError {
  constructor(message: string) {
    super('ERR_QP_STATE', message);
    this.name = 'QpStateError';
  }
}

export class InvalidWrError extends RoceError {
  constructor(message: string) {
    super('ERR_INVALID_WR', message);
    this.name = 'InvalidWrError';
  }
}

export class QueueFullError extends RoceError {
  constructor(message: string) {
    super('ERR_QUEUE_FULL', message);
    this.name = 'QueueFullError';
  }
}

export class MrError extends RoceError {
  constructor(message: string) {
    super('ERR_MR', message);
    this.name = 'MrError';
  }
}

export function isRoceError(x: unknown): x is RoceError {
  return x instanceof RoceError;
}

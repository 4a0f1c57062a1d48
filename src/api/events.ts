/**
 * Asynchronous events (IBTA 11.6.3; libibverbs `ibv_get_async_event`): QP fatal, SQ drained, CQ
 * error, port state. An EventEmitter, used only for these affiliated and unaffiliated events —
 * never for packets or completions.
 *
 * Every event is emitted twice: as `'async'` with the event record, and under its type name
 * (`'QP_FATAL'`, `'SQ_DRAINED'`, …) for listeners that want one kind.
 */

import { EventEmitter } from 'node:events';
import type { AsyncEvent, AsyncEventType } from '../core/types.js';

export type { AsyncEvent, AsyncEventType };

export class DeviceEvents extends EventEmitter {
  /** Every event so far, oldest first (bounded), for callers that attach late. */
  readonly history: AsyncEvent[] = [];

  publish(ev: AsyncEvent): void {
    this.history.push(ev);
    if (this.history.length > 256) this.history.shift();
    this.emit('async', ev);
    this.emit(ev.type, ev);
  }

  /** Resolves with the next event of `type` (optionally for one QP). */
  waitFor(type: AsyncEventType, qpNum?: number, timeoutMs = 10_000): Promise<AsyncEvent> {
    return new Promise((resolve, reject) => {
      const on = (ev: AsyncEvent): void => {
        if (qpNum !== undefined && ev.qpNum !== qpNum) return;
        clearTimeout(timer);
        this.off(type, on);
        resolve(ev);
      };
      const timer = setTimeout(() => {
        this.off(type, on);
        reject(new Error(`no ${type} event within ${timeoutMs} ms`));
      }, timeoutMs);
      timer.unref?.();
      this.on(type, on);
    });
  }
}

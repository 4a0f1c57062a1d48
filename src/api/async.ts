/**
 * Promise and async-iterator sugar over a completion queue. The core CQ is a synchronous ring;
 * this module hangs waiters on its `onCompletion` hook, so nothing here polls or sleeps.
 *
 *   const wc = await cq.next();                       // one completion
 *   const wcs = await waitCompletion(cq, 4);          // four of them
 *   for await (const wc of cq) { … }                  // until the CQ is destroyed / aborted
 */

import type { CompletionQueue } from '../core/cq.js';
import type { WorkCompletion } from '../core/types.js';
import { RoceError } from '../core/errors.js';

export interface WaitOptions {
  /** Reject after this many milliseconds. Default: wait forever. */
  timeoutMs?: number;
  signal?: AbortSignal;
}

interface Waiter {
  resolve: (wc: WorkCompletion) => void;
  reject: (e: Error) => void;
}

/** One waiter list per CQ, installed on first use. */
const waiters = new WeakMap<CompletionQueue, Waiter[]>();

function listFor(cq: CompletionQueue): Waiter[] {
  let list = waiters.get(cq);
  if (!list) {
    const l: Waiter[] = [];
    list = l;
    waiters.set(cq, l);
    const prev = cq.onCompletion;
    cq.onCompletion = (q) => {
      prev?.(q);
      while (l.length > 0 && q.length > 0) l.shift()!.resolve(q.shift()!);
    };
  }
  return list;
}

/** The next completion from `cq` (immediately if one is queued). */
export function nextCompletion(cq: CompletionQueue, opts: WaitOptions = {}): Promise<WorkCompletion> {
  // Rejected rather than left waiting: nothing completes into a destroyed CQ again.
  if (cq.destroyed) return Promise.reject(new RoceError('ERR_RESOURCE', 'CQ destroyed'));
  const ready = cq.length > 0 && listFor(cq).length === 0 ? cq.shift() : undefined;
  if (ready) return Promise.resolve(ready);
  return new Promise<WorkCompletion>((resolve, reject) => {
    const list = listFor(cq);
    let timer: ReturnType<typeof setTimeout> | undefined;
    const w: Waiter = {
      resolve: (wc) => {
        cleanup();
        resolve(wc);
      },
      reject: (e) => {
        cleanup();
        reject(e);
      },
    };
    const onAbort = (): void => {
      const i = list.indexOf(w);
      if (i >= 0) list.splice(i, 1);
      w.reject(new Error('wait aborted'));
    };
    const cleanup = (): void => {
      if (timer) clearTimeout(timer);
      opts.signal?.removeEventListener('abort', onAbort);
    };
    if (opts.timeoutMs !== undefined) {
      timer = setTimeout(() => {
        const i = list.indexOf(w);
        if (i >= 0) list.splice(i, 1);
        w.reject(new Error(`no completion within ${opts.timeoutMs} ms`));
      }, opts.timeoutMs);
    }
    if (opts.signal) {
      if (opts.signal.aborted) return onAbort();
      opts.signal.addEventListener('abort', onAbort, { once: true });
    }
    list.push(w);
  });
}

/** Resolves with `n` completions, in order. */
export async function waitCompletion(cq: CompletionQueue, n = 1, opts: WaitOptions = {}): Promise<WorkCompletion[]> {
  const out: WorkCompletion[] = [];
  while (out.length < n) out.push(await nextCompletion(cq, opts));
  return out;
}

/** Completions as they arrive, until `signal` aborts. */
export async function* completions(cq: CompletionQueue, signal?: AbortSignal): AsyncGenerator<WorkCompletion> {
  for (;;) {
    if (signal?.aborted) return;
    try {
      yield await nextCompletion(cq, signal ? { signal } : {});
    } catch (e) {
      if (signal?.aborted) return;
      throw e;
    }
  }
}

/** Rejects every pending waiter (the CQ is being destroyed) with `why`, or an Error saying it. */
export function abortWaiters(cq: CompletionQueue, why: string | Error): void {
  const list = waiters.get(cq);
  if (!list) return;
  for (const w of list.splice(0)) w.reject(typeof why === 'string' ? new Error(why) : why);
}

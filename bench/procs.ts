/**
 * A two-process (or n-process) benchmark harness: long-lived child node processes, each pinned to its
 * own CPU when `taskset` (util-linux) works here, run named workloads in rounds that the parent drives
 * over the IPC channel. The parent only orchestrates; during a round it sleeps, so the two CPUs of a
 * small machine belong to the two children.
 *
 * One round, for every child at once:
 *
 *   parent → child   { t: 'round', workload, args }     the child calls `workloads[workload](args, ctx)`
 *   child  → parent  { t: 'ready', info }               the workload called `ctx.ready(info)`: its sockets
 *                                                       are open, `info` says how to reach it (port, QPN…)
 *   parent → child   { t: 'start', peers }              once every child is ready; `ctx.ready` resolves
 *                                                       to the other children's `info`, by child name
 *   child  → parent  { t: 'result', value } | { t: 'error', message }
 *   parent → child   { t: 'stop' }                      to the non-primary children, once every primary
 *                                                       one has returned; their `ctx.stopped` resolves
 *
 * Every round is bounded by a timeout: a child that does not answer in time is killed (SIGKILL, with
 * every other child of the group), and the round rejects with `ProcTimeoutError`, so a hanging workload
 * is reported as failed and never hangs `npm run bench`. Children exit by themselves when the parent
 * goes away (IPC disconnect), and the parent kills any child still alive when it exits.
 *
 * ## Adding a workload (e.g. RC WRITE goodput over `UdpLink` once the verbs engine is there)
 *
 * 1. In a module under `bench/` export a record of workloads, `export const workloads = { … }`, each
 *    `async (args, ctx) => result`. A workload opens what it needs (a `UdpLink` from
 *    `../src/link/udp.js` on 127.0.0.1 port 0, a device, a QP…), announces how to reach it with
 *    `const peers = await ctx.ready({ port, qpn, rkey, va })`, runs against `peers.other`, returns a
 *    JSON-serialisable result, and closes what it opened in a `finally`. A workload that runs until
 *    told to stop (a sender, an echo server) polls `ctx.isStopped()` between bursts or awaits
 *    `ctx.stopped`; it must yield to the event loop (`setImmediate`) now and then, or the `stop`
 *    message is never read.
 * 2. In the suite (`run({ quick })`), spawn the pair once and drive rounds:
 *
 *        const g = await ProcGroup.spawn([
 *          { name: 'tx', module: new URL('./rc.bench.js', import.meta.url), cpu: 0 },
 *          { name: 'rx', module: new URL('./rc.bench.js', import.meta.url), cpu: 1 },
 *        ]);
 *        try {
 *          const r = await g.round({ rx: { workload: 'writeTarget', args: { mtu: 4096 } },
 *                                    tx: { workload: 'writeInitiator', args: { mtu: 4096, ms: 1000 } } },
 *                                  { timeoutMs: 10_000 });   // r.tx, r.rx: the results
 *        } finally { await g.close(); }
 *
 *    or let `runCases` interleave rounds of several cases and report medians.
 * 3. Report goodput as a ratio to the `dgram` row of the same datagram size (`dgram.bench.ts`,
 *    `dgramBaselineName`).
 *
 * Child-side code lives in the same module as the suite: the child imports the module through this
 * file's bootstrap (`node dist/bench/procs.js '<json>'`), so the module must not do work at import time
 * beyond defining things (guard a CLI entry with the usual `import.meta.url === argv[1]` check).
 */

import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { availableParallelism, cpus, loadavg, release, type } from 'node:os';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { median } from './harness.js';

// ---------------------------------------------------------------------------------------------------
// Child side

/** What a workload gets besides its args. */
export interface ChildContext {
  /** This child's name in its group. */
  readonly name: string;
  /** The CPU this child is pinned to, or null when it is not pinned. */
  readonly cpu: number | null;
  /**
   * Announces that this child is set up; `info` (JSON) goes to the other children. Resolves, when every
   * child of the round is ready, to the other children's `info` by name.
   */
  ready(info?: unknown): Promise<Record<string, unknown>>;
  /** Resolves when the parent asks this (non-primary) child to stop. */
  readonly stopped: Promise<void>;
  isStopped(): boolean;
}

/** A workload: runs one round in a child and resolves to its (JSON-serialisable) result. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type Workload = (args: any, ctx: ChildContext) => Promise<unknown>;

type ToChild =
  | { t: 'round'; workload: string; args: unknown }
  | { t: 'start'; peers: Record<string, unknown> }
  | { t: 'stop' }
  | { t: 'exit' };
type FromChild =
  | { t: 'boot'; pid: number }
  | { t: 'ready'; info: unknown }
  | { t: 'result'; value: unknown }
  | { t: 'error'; message: string };

interface BootArgs {
  module: string;
  name: string;
  cpu: number | null;
}

function send(msg: FromChild): void {
  process.send?.(msg);
}

/** The child's main loop: import the workload module, then serve rounds until told to exit. */
async function serveChild(boot: BootArgs): Promise<void> {
  process.on('disconnect', () => process.exit(0));
  const mod = (await import(boot.module)) as { workloads?: Record<string, Workload> };
  const workloads = mod.workloads ?? {};
  let onStart: ((peers: Record<string, unknown>) => void) | undefined;
  let onStop: (() => void) | undefined;
  process.on('message', (raw) => {
    const msg = raw as ToChild;
    switch (msg.t) {
      case 'round': {
        const fn = workloads[msg.workload];
        if (fn === undefined) {
          send({ t: 'error', message: `${boot.module}: no workload named ${msg.workload}` });
          return;
        }
        let stopped = false;
        const stoppedP = new Promise<void>((resolve) => {
          onStop = () => {
            stopped = true;
            resolve();
          };
        });
        const ctx: ChildContext = {
          name: boot.name,
          cpu: boot.cpu,
          ready: (info?: unknown) =>
            new Promise((resolve) => {
              onStart = resolve;
              send({ t: 'ready', info: info ?? null });
            }),
          stopped: stoppedP,
          isStopped: () => stopped,
        };
        fn(msg.args, ctx).then(
          (value) => send({ t: 'result', value: value ?? null }),
          (err: unknown) => send({ t: 'error', message: err instanceof Error ? (err.stack ?? err.message) : String(err) }),
        );
        return;
      }
      case 'start':
        onStart?.(msg.peers);
        onStart = undefined;
        return;
      case 'stop':
        onStop?.();
        return;
      case 'exit':
        process.exit(0);
    }
  });
  send({ t: 'boot', pid: process.pid });
}

// ---------------------------------------------------------------------------------------------------
// Parent side

/** One child of a group. */
export interface ProcSpec {
  /** Name used in `round` and in the `peers` record. */
  name: string;
  /** The compiled module that exports `workloads` (a file URL or an absolute path). */
  module: string | URL;
  /** CPU to pin this child to with `taskset`; ignored (and reported) when pinning is unavailable. */
  cpu?: number;
  /** Extra node flags for the child (e.g. `--cpu-prof`). */
  execArgv?: string[];
}

/** One child's part in a round. */
export interface RoundTask {
  workload: string;
  args?: unknown;
  /**
   * The round ends when every primary child has returned; the others are then sent `stop`. Default
   * true. A round needs at least one primary child.
   */
  primary?: boolean;
}

export interface RoundOptions {
  /** The whole round (ready, start, results, stop) must end within this, ms. */
  timeoutMs: number;
}

export class ProcTimeoutError extends Error {
  override name = 'ProcTimeoutError';
}

/** Whether `taskset -c cpu` works here (util-linux present, and the CPU in our affinity mask). */
export function canPin(cpu: number): boolean {
  if (cpu >= availableParallelism()) return false;
  const r = spawnSync('taskset', ['-c', String(cpu), 'true'], { stdio: 'ignore', timeout: 5000 });
  return r.status === 0;
}

interface Child {
  spec: ProcSpec;
  cpu: number | null;
  proc: ChildProcess;
  /** The pending handler for the next message, if any. */
  waiter: ((msg: FromChild) => void) | undefined;
  exited: string | undefined;
  onExit: ((why: string) => void) | undefined;
}

const live = new Set<ChildProcess>();
let exitHookInstalled = false;
function installExitHook(): void {
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  const killAll = (): void => {
    for (const p of live) p.kill('SIGKILL');
  };
  process.on('exit', killAll);
  // An interrupted run takes its children with it (a child in a busy loop never reads the disconnect).
  for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
    const onSignal = (): void => {
      killAll();
      process.removeListener(sig, onSignal);
      process.kill(process.pid, sig);
    };
    process.on(sig, onSignal);
  }
}

/** A set of long-lived child processes that run rounds of workloads together. */
export class ProcGroup {
  private closed = false;

  private constructor(
    private readonly children: Child[],
    /** One line saying where the children run, e.g. "pinned: tx→CPU 0, rx→CPU 1 (taskset)". */
    readonly pinning: string,
    /** Whether every child that asked for a CPU got it. */
    readonly pinned: boolean,
  ) {}

  /** Spawns the children and waits until each has loaded its module. */
  static async spawn(specs: readonly ProcSpec[], opts: { bootTimeoutMs?: number } = {}): Promise<ProcGroup> {
    installExitHook();
    const wanted = specs.filter((s) => s.cpu !== undefined);
    const pinOk = wanted.length > 0 && wanted.every((s) => canPin(s.cpu!));
    const children: Child[] = specs.map((spec) => {
      const cpu = pinOk && spec.cpu !== undefined ? spec.cpu : null;
      const modulePath = spec.module instanceof URL ? spec.module.href : pathToFileURL(spec.module).href;
      const boot: BootArgs = { module: modulePath, name: spec.name, cpu };
      const nodeArgs = [...(spec.execArgv ?? []), fileURLToPath(import.meta.url), JSON.stringify(boot)];
      const [cmd, argv] = cpu !== null ? ['taskset', ['-c', String(cpu), process.execPath, ...nodeArgs]] : [process.execPath, nodeArgs];
      const proc = spawn(cmd as string, argv as string[], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
      live.add(proc);
      const child: Child = { spec, cpu, proc, waiter: undefined, exited: undefined, onExit: undefined };
      proc.on('message', (m) => {
        const w = child.waiter;
        child.waiter = undefined;
        w?.(m as FromChild);
      });
      proc.on('error', (e) => {
        child.exited ??= `spawn failed: ${e.message}`;
        child.onExit?.(child.exited);
      });
      proc.on('exit', (code, signal) => {
        live.delete(proc);
        child.exited ??= `exited (${signal ?? `code ${code}`})`;
        child.onExit?.(child.exited);
      });
      return child;
    });
    const pinning = pinOk
      ? `pinned with taskset: ${children.map((c) => `${c.spec.name}→CPU ${c.cpu}`).join(', ')}`
      : wanted.length === 0
        ? 'not pinned (no CPUs requested)'
        : `not pinned (${availableParallelism() < 2 ? `${availableParallelism()} CPU available` : 'taskset missing or refused'}): the scheduler places the children`;
    const group = new ProcGroup(children, pinning, pinOk || wanted.length === 0);
    try {
      await group.exchange(
        children.map(() => undefined),
        (m) => m.t === 'boot',
        opts.bootTimeoutMs ?? 15_000,
        'boot',
      );
    } catch (e) {
      group.kill();
      throw e;
    }
    return group;
  }

  /** Names of the children, in spawn order. */
  get names(): string[] {
    return this.children.map((c) => c.spec.name);
  }

  /**
   * Sends `msgs[i]` (if any) to child i and waits for each addressed child's next message; rejects on
   * an error message, a child exit, or the deadline.
   */
  private exchange(msgs: (ToChild | undefined)[], expect: (m: FromChild) => boolean, timeoutMs: number, phase: string, only?: boolean[]): Promise<FromChild[]> {
    const deadline = Date.now() + timeoutMs;
    return this.exchangeUntil(msgs, expect, deadline, phase, only);
  }

  private exchangeUntil(msgs: (ToChild | undefined)[], expect: (m: FromChild) => boolean, deadline: number, phase: string, only?: boolean[]): Promise<FromChild[]> {
    return new Promise((resolve, reject) => {
      const out: FromChild[] = [];
      let pending = 0;
      let done = false;
      const finish = (err: Error | undefined): void => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        for (const c of this.children) {
          c.waiter = undefined;
          c.onExit = undefined;
        }
        if (err) reject(err);
        else resolve(out);
      };
      const timer = setTimeout(() => {
        const late = this.children.filter((c, i) => (only?.[i] ?? true) && c.waiter !== undefined).map((c) => c.spec.name);
        this.kill();
        finish(new ProcTimeoutError(`${phase}: no answer from ${late.join(', ') || '?'} in time; children killed`));
      }, Math.max(0, deadline - Date.now()));
      this.children.forEach((c, i) => {
        if (!(only?.[i] ?? true)) return;
        if (c.exited !== undefined) {
          finish(new Error(`${c.spec.name}: ${c.exited}`));
          return;
        }
        pending++;
        c.onExit = (why) => finish(new Error(`${phase}: ${c.spec.name} ${why}`));
        c.waiter = (m) => {
          if (m.t === 'error') return finish(new Error(`${phase}: ${c.spec.name}: ${m.message}`));
          if (!expect(m)) return finish(new Error(`${phase}: ${c.spec.name}: unexpected message ${m.t}`));
          out[i] = m;
          if (--pending === 0) finish(undefined);
        };
        const msg = msgs[i];
        if (msg !== undefined) c.proc.send(msg);
      });
      if (pending === 0) finish(undefined);
    });
  }

  /**
   * Runs one round: every child named in `tasks` runs its workload; resolves to their results by
   * name. On a timeout the whole group is killed (and unusable afterwards: spawn a new one).
   */
  async round(tasks: Record<string, RoundTask>, opts: RoundOptions): Promise<Record<string, unknown>> {
    if (this.closed) throw new Error('ProcGroup: closed');
    const deadline = Date.now() + opts.timeoutMs;
    const inRound = this.children.map((c) => tasks[c.spec.name] !== undefined);
    for (const name of Object.keys(tasks)) if (!this.names.includes(name)) throw new Error(`ProcGroup: no child named ${name}`);
    const primary = this.children.map((c) => {
      const t = tasks[c.spec.name];
      return t !== undefined && (t.primary ?? true);
    });
    if (!primary.some(Boolean)) throw new Error('ProcGroup.round: at least one task must be primary');
    const roundMsgs = this.children.map((c): ToChild | undefined => {
      const t = tasks[c.spec.name];
      return t === undefined ? undefined : { t: 'round', workload: t.workload, args: t.args ?? null };
    });
    const ready = await this.exchangeUntil(roundMsgs, (m) => m.t === 'ready', deadline, 'ready', inRound);
    const infos: Record<string, unknown> = {};
    this.children.forEach((c, i) => {
      const m = ready[i];
      if (m?.t === 'ready') infos[c.spec.name] = m.info;
    });
    // The result of every child arrives after `start`; the non-primary ones get `stop` as soon as all
    // primary ones have answered.
    const results: Record<string, unknown> = {};
    const startMsgs = this.children.map((c, i): ToChild | undefined => {
      if (!inRound[i]) return undefined;
      const peers = { ...infos };
      delete peers[c.spec.name];
      return { t: 'start', peers };
    });
    const waiting = this.children.map((_, i) => inRound[i]!);
    const all = new Promise<void>((resolve, reject) => {
      let pending = waiting.filter(Boolean).length;
      let primaries = primary.filter(Boolean).length;
      let done = false;
      const finish = (err: Error | undefined): void => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        for (const c of this.children) {
          c.waiter = undefined;
          c.onExit = undefined;
        }
        if (err) reject(err);
        else resolve();
      };
      const timer = setTimeout(() => {
        const late = this.children.filter((_, i) => waiting[i]).map((c) => c.spec.name);
        this.kill();
        finish(new ProcTimeoutError(`run: no result from ${late.join(', ')} in time; children killed`));
      }, Math.max(0, deadline - Date.now()));
      this.children.forEach((c, i) => {
        if (!inRound[i]) return;
        c.onExit = (why) => finish(new Error(`run: ${c.spec.name} ${why}`));
        c.waiter = (m) => {
          if (m.t === 'error') return finish(new Error(`run: ${c.spec.name}: ${m.message}`));
          if (m.t !== 'result') return finish(new Error(`run: ${c.spec.name}: unexpected message ${m.t}`));
          results[c.spec.name] = m.value;
          waiting[i] = false;
          if (primary[i] && --primaries === 0) {
            this.children.forEach((o, k) => {
              if (waiting[k] && !primary[k]) o.proc.send({ t: 'stop' } satisfies ToChild);
            });
          }
          if (--pending === 0) finish(undefined);
        };
        c.proc.send(startMsgs[i]!);
      });
    });
    await all;
    return results;
  }

  /** Asks the children to exit and waits (bounded) for them; kills whatever is left. */
  async close(timeoutMs = 3000): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    const exits = this.children.map(
      (c) =>
        new Promise<void>((resolve) => {
          if (c.exited !== undefined || c.proc.exitCode !== null || c.proc.signalCode !== null) return resolve();
          c.proc.once('exit', () => resolve());
          try {
            c.proc.send({ t: 'exit' } satisfies ToChild);
          } catch {
            c.proc.kill('SIGKILL');
          }
        }),
    );
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<void>((resolve) => {
      timer = setTimeout(resolve, timeoutMs);
    });
    await Promise.race([Promise.all(exits), timeout]);
    clearTimeout(timer);
    this.kill();
  }

  /** Kills every child at once (SIGKILL). */
  kill(): void {
    this.closed = true;
    for (const c of this.children) {
      if (c.exited === undefined && c.proc.exitCode === null && c.proc.signalCode === null) c.proc.kill('SIGKILL');
    }
  }
}

/**
 * One line describing the machine and its state now, for the header of every benchmark's output:
 * node version, kernel, CPU count and model, load average.
 */
export function machineLine(): string {
  const cpu = cpus()[0]?.model.trim() ?? 'unknown CPU';
  const load = loadavg().map((x) => x.toFixed(2)).join(' ');
  return `node ${process.version}, ${type()} ${release()}, ${cpus().length} × ${cpu}, load average ${load} (1/5/15 min)`;
}

// ---------------------------------------------------------------------------------------------------
// Rounds of several cases, medians

/** One case of `runCases`: a round's tasks and how to turn its results into named figures. */
export interface ProcCase {
  name: string;
  tasks: Record<string, RoundTask>;
  timeoutMs: number;
  /** Figures of one round, e.g. `{ pps: 2.3e5, gbps: 7.6 }`. */
  measure: (results: Record<string, unknown>) => Record<string, number>;
}

export interface CaseOutcome {
  name: string;
  /** Median of each figure over the rounds that succeeded. */
  medians: Record<string, number>;
  /** Every round's figures. */
  rounds: Record<string, number>[];
  /** Why the case failed, when no round succeeded (or the group died under it). */
  error?: string;
}

/**
 * Runs `rounds` rounds of every case, interleaved (round 1 of each case, then round 2 of each…) so that
 * a load change on a shared machine hits all cases alike, and reports each figure's median. A case
 * whose round fails or times out is marked failed and skipped in the later rounds; when the failure
 * killed the group, a new group is spawned (`spawnGroup`) for the remaining cases.
 */
export async function runCases(
  spawnGroup: () => Promise<ProcGroup>,
  cases: readonly ProcCase[],
  rounds: number,
  onGroup?: (g: ProcGroup) => void,
): Promise<CaseOutcome[]> {
  const out: CaseOutcome[] = cases.map((c) => ({ name: c.name, medians: {}, rounds: [] }));
  let group: ProcGroup | undefined;
  try {
    for (let r = 0; r < rounds; r++) {
      for (let k = 0; k < cases.length; k++) {
        const c = cases[k]!;
        const o = out[k]!;
        if (o.error !== undefined) continue;
        if (group === undefined) {
          group = await spawnGroup();
          onGroup?.(group);
        }
        try {
          o.rounds.push(c.measure(await group.round(c.tasks, { timeoutMs: c.timeoutMs })));
        } catch (e) {
          o.error = e instanceof Error ? e.message : String(e);
          group.kill();
          group = undefined;
        }
      }
    }
  } finally {
    await group?.close();
  }
  for (const o of out) {
    const keys = new Set(o.rounds.flatMap((x) => Object.keys(x)));
    for (const key of keys) o.medians[key] = median(o.rounds.map((x) => x[key] ?? NaN));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Bootstrap: `node dist/bench/procs.js '{"module":…,"name":…,"cpu":…}'` with an IPC channel.

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href && process.send !== undefined) {
  const boot = JSON.parse(process.argv[2] ?? '{}') as BootArgs;
  // Not awaited: the workload module imports this one, which must finish evaluating first.
  serveChild(boot).catch((err: unknown) => {
    send({ t: 'error', message: err instanceof Error ? (err.stack ?? err.message) : String(err) });
    process.exit(1);
  });
}

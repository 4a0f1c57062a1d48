/**
 * Before/after of the RC ping-pong between two built trees, paired round by round: each round runs
 * every case on tree A, then on tree B, each tree in its own pair of long-lived processes (pinger on
 * CPU 0, ponger on CPU 1, as `latency.bench.ts` places them), then the `dgram` ping-pong of 64-byte
 * datagrams, so the two builds and the baseline see the same moment of a shared machine. Prints each
 * tree's median RTT, the median of the per-round B/A ratios, and each tree's median ratio to the
 * `dgram` round trip of its round; then the two sides' CPU time per round trip (user + system), which
 * another process's load moves far less than the round trip, paired the same way.
 *
 *   node dist/bench/latency-ab.js OLD_TREE NEW_TREE [--rounds 8] [--modes SEND,WRITE,WRITE_WITH_IMM] [--ms 2000]
 *
 * A tree is a checkout built with `npx tsc` (e.g. `git archive REV | tar -x -C /tmp/old`, its
 * `node_modules` linked to this one's, and its addon built or copied).
 */

import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { median } from './harness.js';
import type { LatMode, LatResult, PongResult } from './latency.bench.js';
import type { ProcGroup } from './procs.js';

/** Message sizes that make the request datagram 64 bytes, as in `latency.bench.ts`. */
const SIZE: Record<LatMode, number> = { SEND: 48, WRITE: 32, WRITE_WITH_IMM: 28 };
const WARMUP = 2000;

async function main(): Promise<void> {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      rounds: { type: 'string', default: '8' },
      modes: { type: 'string', default: 'SEND,WRITE,WRITE_WITH_IMM' },
      ms: { type: 'string', default: '2000' },
    },
  });
  if (positionals.length !== 2) throw new Error('usage: latency-ab.js OLD_TREE NEW_TREE [--rounds N] [--modes SEND,…] [--ms W]');
  const modes = values.modes.split(',') as LatMode[];
  for (const m of modes) if (!(m in SIZE)) throw new Error(`unknown mode ${m}: SEND, WRITE or WRITE_WITH_IMM`);
  const rounds = Number(values.rounds);
  const windowMs = Number(values.ms);
  const groups: ProcGroup[] = [];
  for (const tree of positionals) {
    const dir = resolve(tree, 'dist/bench');
    const rc = (await import(pathToFileURL(`${dir}/rc.bench.js`).href)) as { spawnPair(m: URL): Promise<ProcGroup> };
    groups.push(await rc.spawnPair(pathToFileURL(`${dir}/latency.bench.js`)));
  }
  const timeoutMs = 20_000 + 3 * windowMs;
  const rtt = new Map<LatMode, number[][]>(modes.map((m) => [m, [[], []]]));
  // Both sides' CPU time per round trip (NaN from a tree whose workloads do not report it).
  const cpu = new Map<LatMode, number[][]>(modes.map((m) => [m, [[], []]]));
  const dgram: number[] = [];
  try {
    for (let r = 0; r < rounds; r++) {
      for (const mode of modes) {
        for (let t = 0; t < 2; t++) {
          const args = { mode, size: SIZE[mode], warmup: WARMUP, windowMs, maxSamples: 2_000_000 };
          const out = await groups[t]!.round(
            { tx: { workload: 'latPinger', args }, rx: { workload: 'latPonger', primary: false, args: { ...args, warmup: 0, maxSamples: 0, cpuAfter: WARMUP } } },
            { timeoutMs },
          );
          rtt.get(mode)![t]!.push((out['tx'] as LatResult).medianUs);
          cpu.get(mode)![t]!.push(((out['tx'] as LatResult).cpuUs ?? NaN) + ((out['rx'] as PongResult).cpuUs ?? NaN));
        }
      }
      const out = await groups[1]!.round(
        { tx: { workload: 'pingPinger', args: { size: 64, warmup: WARMUP, windowMs, maxSamples: 2_000_000 } }, rx: { workload: 'pingPonger', primary: false } },
        { timeoutMs },
      );
      dgram.push((out['tx'] as LatResult).medianUs);
    }
  } finally {
    for (const g of groups) await g.close();
  }
  console.log(`A = ${positionals[0]}, B = ${positionals[1]}; ${rounds} rounds of ${windowMs} ms, paired; dgram ping-pong 64 B ${median(dgram).toFixed(1)} µs`);
  console.log('| case | RTT µs A → B | paired B/A | ratio to dgram A → B | B/A round by round |');
  console.log('|---|---|---|---|---|');
  for (const mode of modes) {
    const [a, b] = rtt.get(mode)! as [number[], number[]];
    const pairs = a.map((x, i) => b[i]! / x);
    const toDgram = (s: number[]): string => median(s.map((x, i) => x / dgram[i]!)).toFixed(2);
    console.log(
      `| ${mode} ${SIZE[mode]} B | ${median(a).toFixed(1)} → ${median(b).toFixed(1)} | ${median(pairs).toFixed(3)} | ` +
        `${toDgram(a)} → ${toDgram(b)} | ${pairs.map((x) => x.toFixed(2)).join(' ')} |`,
    );
  }
  console.log('');
  console.log('| case | CPU µs per round trip, both sides, A → B | paired B/A | B/A round by round |');
  console.log('|---|---|---|---|');
  for (const mode of modes) {
    const [a, b] = cpu.get(mode)! as [number[], number[]];
    const pairs = a.map((x, i) => b[i]! / x);
    console.log(`| ${mode} ${SIZE[mode]} B | ${median(a).toFixed(1)} → ${median(b).toFixed(1)} | ${median(pairs).toFixed(3)} | ${pairs.map((x) => x.toFixed(2)).join(' ')} |`);
  }
}

await main();

/**
 * The socket-free harnesses of the QP scale workload (`bench/target-path.ts`, `bench/initiator-path.ts`)
 * run a child briefly against this build: each child checks its own traffic (every WRITE accepted and
 * answered on the target's side; every posted WRITE sent, answered and completed on the initiator's)
 * and throws otherwise, so a change that breaks what they measure fails here, not in a benchmark run.
 */
import { execFile } from 'node:child_process';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import t from 'tap';

const here = dirname(fileURLToPath(import.meta.url));
const root = resolve(here, '../../..');
const run = promisify(execFile);

for (const harness of ['target-path', 'initiator-path']) {
  for (const qps of [1, 40]) {
    t.test(`${harness}: a child with ${qps} QP${qps === 1 ? '' : 's'} reports its cost per packet`, async (t) => {
      const { stdout } = await run(process.execPath, [resolve(root, 'dist/bench', `${harness}.js`), '--child', root, '--qps', String(qps), '--ms', '100'], { timeout: 60_000 });
      const r = JSON.parse(stdout.trim().split('\n').pop()!) as { nsPerPacket: number; packets: number };
      t.ok(r.packets > 0, `${r.packets} packets`);
      t.ok(Number.isFinite(r.nsPerPacket) && r.nsPerPacket > 0, `${r.nsPerPacket.toFixed(0)} ns per packet`);
    });
  }
}

for (const harness of ['target-path', 'initiator-path']) {
  t.test(`${harness} --interleave: two copies of this build in one process, each window's figure paired`, async (t) => {
    const { stdout } = await run(process.execPath, [resolve(root, 'dist/bench', `${harness}.js`), '--interleave', '--qps', '40', '--rounds', '2', '--ms', '50', root, root], { timeout: 120_000 });
    const lines = stdout.trim().split('\n');
    t.match(lines[0], /^2 rounds of 50 ms per tree in one process, 40 QPs; ns per packet$/);
    const figures = lines.slice(1).map((l) => /: median (\d+), over the first tree paired (\d+\.\d+)$/.exec(l));
    t.equal(figures.length, 2, 'a line per tree');
    t.ok(figures.every((m) => m !== null && Number(m[1]) > 0), 'each with its median');
    t.equal(figures[0]?.[2], '1.000', 'the first tree over itself');
  });
}

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

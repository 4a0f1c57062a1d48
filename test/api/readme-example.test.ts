/**
 * The README's library example, run as a user would run it: the code block is extracted from
 * README.md, imports `roce-ts` through the package's own `exports`, and must print what the
 * README says it prints. A README that drifts from the API fails here.
 */

import t from 'tap';
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const ROOT = join(import.meta.dirname, '../../..');

t.test('README example: RDMA WRITE between two devices', async (t) => {
  const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
  const m = /<!-- example:rdma-write[^>]*-->\s*```js\n([\s\S]*?)```/.exec(readme);
  t.ok(m, 'the example block is in README.md');
  const code = m![1]!;
  const dir = mkdtempSync(join(tmpdir(), 'roce-readme-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  mkdirSync(join(dir, 'node_modules'));
  symlinkSync(ROOT, join(dir, 'node_modules', 'roce-ts'));
  writeFileSync(join(dir, 'example.mjs'), code);
  const r = spawnSync(process.execPath, ['example.mjs'], { cwd: dir, encoding: 'utf8', timeout: 30_000 });
  t.equal(r.status, 0, r.stderr);
  // The outputs the README's comments promise.
  const promised = [...code.matchAll(/console\.log\(.*\);\s*\/\/ (.*)$/gm)].map((x) => x[1]!.trim());
  t.same(r.stdout.trim().split('\n'), promised);
});

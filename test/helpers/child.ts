/**
 * Runs a test's child script with this node, for what only a process of its own can show (an
 * exception that escapes to the event loop is that process's uncaught exception).
 */
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';

/** Runs `script` (a URL, usually `new URL('./x.js', import.meta.url)`) to its exit: its exit code and standard output. */
export async function runChild(script: URL): Promise<{ code: number | null; out: string }> {
  const child = spawn(process.execPath, [fileURLToPath(script)], { stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  const code = await new Promise<number | null>((resolve) => child.on('exit', resolve));
  return { code, out };
}

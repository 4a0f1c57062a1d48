/**
 * Runs tshark for the interop tests. There is no skip: a missing tshark is an error that says how
 * to install it, so `npm run test:interop` fails on a machine without it.
 */
import { execFile } from 'node:child_process';

/** tshark's output can be large (JSON of a whole capture). */
const MAX_OUTPUT = 512 * 1024 * 1024;

export class TsharkMissingError extends Error {
  override readonly name = 'TsharkMissingError';
  constructor() {
    super('tshark is not installed (or not on PATH): install the Debian package `tshark` (apt-get install -y tshark)');
  }
}

/** Runs `tshark ...args` and returns its stdout; rejects on a missing binary or a non-zero exit. */
export function tshark(args: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile('tshark', args, { maxBuffer: MAX_OUTPUT, encoding: 'utf8', env: { ...process.env, LC_ALL: 'C' } }, (err, stdout, stderr) => {
      if (err !== null) {
        if ((err as NodeJS.ErrnoException).code === 'ENOENT') reject(new TsharkMissingError());
        else reject(new Error(`tshark ${args.join(' ')} failed (${String(err.code ?? err.signal)}): ${stderr.trim()}`));
        return;
      }
      resolve(stdout);
    });
  });
}

/**
 * `tshark -r FILE -T json [...extraArgs]`, parsed: one element per frame, each
 * `{ _source: { layers: { frame: {...}, eth: {...}, ... } } }`.
 */
export async function tsharkJson(file: string, extraArgs: string[] = []): Promise<any[]> {
  const out = await tshark(['-r', file, '-T', 'json', ...extraArgs]);
  const parsed: unknown = JSON.parse(out.trim() === '' ? '[]' : out);
  if (!Array.isArray(parsed)) throw new Error(`tshark -T json on ${file} did not give an array`);
  return parsed;
}

/** Flattens a tshark JSON layer tree into field → value (first occurrence wins). */
export function flatten(o: unknown, into: Map<string, string> = new Map()): Map<string, string> {
  if (o && typeof o === 'object') {
    for (const [k, v] of Object.entries(o as Record<string, unknown>)) {
      if (typeof v === 'string') {
        if (!into.has(k)) into.set(k, v);
      } else flatten(v, into);
    }
  }
  return into;
}

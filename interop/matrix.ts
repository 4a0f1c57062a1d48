/**
 * The interop matrix: every test cell against rdma_rxe records its outcome here, one JSON line
 * per cell in `interop/out/matrix.jsonl` (gitignored), and `interop/report.ts` turns the latest
 * run into the table in `interop/README.md`. Recording never throws: a test's verdict is its
 * assertions; this is the record of them.
 */

import { appendFileSync, mkdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

export type Direction = 'ours→rxe' | 'rxe→ours';

export interface MatrixCell {
  /** The test file or family, e.g. `pingpong`, `perftest`, `loss`, `rping`. */
  suite: string;
  transport: 'RC' | 'UC' | 'UD';
  /** The operation: SEND, SEND_WITH_IMM, RDMA_WRITE, RDMA_WRITE_WITH_IMM, RDMA_READ, CMP_SWAP, FETCH_ADD … */
  op: string;
  /** Path MTU in bytes. */
  mtu: number;
  /** Message size in bytes. */
  size: number;
  /** Who is the requester: our stack sending to rxe, or rxe sending to our stack. */
  direction: Direction;
  family: 4 | 6;
  pass: boolean;
  /** Wall time of the cell. */
  ms: number;
  /** The peer tool used, e.g. `ibv_rc_pingpong`, `ib_write_bw`. */
  tool?: string;
  note?: string;
}

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
/** Where cells are recorded; `ROCE_MATRIX_FILE` moves it. */
export const MATRIX_FILE = process.env['ROCE_MATRIX_FILE'] ?? join(ROOT, 'interop', 'out', 'matrix.jsonl');

export function recordCell(cell: MatrixCell): void {
  try {
    mkdirSync(dirname(MATRIX_FILE), { recursive: true });
    appendFileSync(MATRIX_FILE, JSON.stringify({ ...cell, at: new Date().toISOString() }) + '\n');
  } catch {
    // The record is a by-product; a read-only checkout must not fail the cell.
  }
}

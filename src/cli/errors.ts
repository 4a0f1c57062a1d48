/**
 * Exit codes and the one error type the CLI turns into a one-line message. Anything else
 * that escapes is a bug, and is reported as such (still on one line, exit 70).
 */

export const EXIT = {
  /** Everything was fine. */
  OK: 0,
  /** The command ran, and found something wrong in what it looked at (decode: a bad packet). */
  FINDINGS: 1,
  /** Bad usage or unreadable input. */
  USAGE: 2,
  /** The peer could not be reached, refused, or went away. */
  PEER: 3,
  /** A local resource failed: port in use, address not local, disk full. */
  LOCAL: 4,
  /** Interrupted by a signal (Ctrl-C). */
  INTERRUPTED: 130,
  /** An internal error: a bug. */
  INTERNAL: 70,
} as const;

export class CliError extends Error {
  readonly code = 'ERR_CLI';
  constructor(message: string, readonly exitCode: number = EXIT.USAGE) {
    super(message);
  }
}

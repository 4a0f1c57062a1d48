/**
 * Output for the long-running commands (serve, send, get, demo): a line printer that batches
 * writes (a `--trace` of a 64 MiB transfer is ~17 000 lines) yet flushes within a tick, so a
 * server's "listening" line reaches a parent process at once; and a progress display that is a
 * redrawn bar with rate and ETA on a terminal and a plain line every few seconds otherwise
 * (logs and pipes get no carriage returns).
 */

import { fmtBytes } from '../app/transfer.js';

export interface Printer {
  line(s: string): void;
  flush(): void;
}

export function linePrinter(stream: NodeJS.WritableStream = process.stdout): Printer {
  let buf = '';
  let scheduled = false;
  const flush = (): void => {
    scheduled = false;
    if (buf === '') return;
    stream.write(buf);
    buf = '';
  };
  return {
    line(s: string): void {
      buf += s + '\n';
      if (buf.length > 1 << 16) flush();
      else if (!scheduled) {
        scheduled = true;
        setImmediate(flush);
      }
    },
    flush,
  };
}

export interface ProgressOptions {
  /** Redraw a bar in place (a TTY) or print plain lines. */
  tty: boolean;
  /** Where the bar is drawn (raw writes, no newline). */
  write: (s: string) => void;
  /** Where plain lines go. */
  line: (s: string) => void;
  /** Plain mode: seconds between lines. Default 2. */
  intervalSec?: number;
  /** Terminal width for the bar. Default 80. */
  columns?: number;
}

export class Progress {
  private readonly start = Date.now();
  private lastDraw = 0;
  private lastLine = Date.now();
  private done = 0;
  private drawn = false;
  /** Recent (time, bytes) samples: the rate shown is over the last few seconds, not since start. */
  private readonly samples: Array<[number, number]> = [];

  constructor(private readonly label: string, private readonly total: number, private readonly o: ProgressOptions) {
    this.samples.push([this.start, 0]);
  }

  update(done: number): void {
    this.done = done;
    const now = Date.now();
    this.samples.push([now, done]);
    while (this.samples.length > 2 && now - this.samples[0]![0] > 3000) this.samples.shift();
    if (this.o.tty) {
      if (now - this.lastDraw >= 100 || done >= this.total) {
        this.lastDraw = now;
        this.draw(now);
      }
    } else if (now - this.lastLine >= (this.o.intervalSec ?? 2) * 1000 && done < this.total) {
      this.lastLine = now;
      this.o.line(`${this.label}: ${this.text(now)}`);
    }
  }

  /** Ends the bar's line (the summary follows on its own lines). */
  finish(): void {
    if (this.o.tty && this.drawn) {
      this.draw(Date.now());
      this.o.write('\n');
    }
  }

  /** Clears the bar so that an error line is not glued to it. */
  abandon(): void {
    if (this.o.tty && this.drawn) this.o.write('\n');
  }

  private rate(now: number): number {
    const [t0, b0] = this.samples[0]!;
    const dt = (now - t0) / 1000;
    return dt > 0 ? (this.done - b0) / dt : 0;
  }

  private text(now: number): string {
    const rate = this.rate(now);
    const pct = this.total > 0 ? Math.floor((this.done / this.total) * 100) : 100;
    const eta = rate > 0 ? (this.total - this.done) / rate : undefined;
    return `${fmtBytes(this.done)} / ${fmtBytes(this.total)} (${pct}%)  ${fmtBytes(rate)}/s  ETA ${eta === undefined ? '--:--' : fmtEta(eta)}`;
  }

  private draw(now: number): void {
    const text = this.text(now);
    const width = Math.max(10, Math.min(40, (this.o.columns ?? 80) - text.length - this.label.length - 6));
    const filled = this.total > 0 ? Math.round((this.done / this.total) * width) : width;
    const bar = '#'.repeat(filled) + '.'.repeat(width - filled);
    this.o.write(`\r${this.label} [${bar}] ${text}\x1b[K`);
    this.drawn = true;
  }
}

export function fmtEta(secs: number): string {
  const s = Math.max(0, Math.round(secs));
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const ss = String(s % 60).padStart(2, '0');
  return h > 0 ? `${h}:${String(m).padStart(2, '0')}:${ss}` : `${m}:${ss}`;
}

/** `52.0 MiB/s (436.2 Mbit/s)` */
export function fmtRate(bytes: number, seconds: number): string {
  if (seconds <= 0) return 'n/a';
  const bps = bytes / seconds;
  return `${fmtBytes(bps)}/s (${((bps * 8) / 1e6).toFixed(1)} Mbit/s)`;
}

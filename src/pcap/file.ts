/**
 * Capture files on disk: the only pcap module that touches `node:fs`. It adapts the pure writers
 * and reader to file streams and nothing more.
 */

import { createReadStream, createWriteStream } from 'node:fs';
import { once } from 'node:events';
import type { CaptureRecord } from './format.js';
import { readCaptureAsync } from './reader.js';
import { PcapngWriter, type PcapngWriterOptions, PcapWriter, type PcapWriterOptions } from './writer.js';

export interface CaptureFile<W> {
  readonly path: string;
  readonly writer: W;
  /** Flushes and closes the file; rejects with the first write error, if any. */
  close(): Promise<void>;
}

export type PcapFileOptions = PcapWriterOptions & { readonly format?: 'pcap' };
export type PcapngFileOptions = PcapngWriterOptions & { readonly format: 'pcapng' };

/**
 * Creates (or truncates) `path` and returns a writer over it: classic pcap unless
 * `format: 'pcapng'`. Resolves once the file is open, so a bad path fails here and not later.
 * Writes are queued without backpressure: a capture tap must never stall the datapath.
 */
export function openPcapFile(path: string, opts?: PcapFileOptions): Promise<CaptureFile<PcapWriter>>;
export function openPcapFile(path: string, opts: PcapngFileOptions): Promise<CaptureFile<PcapngWriter>>;
export async function openPcapFile(
  path: string,
  opts: PcapFileOptions | PcapngFileOptions = {},
): Promise<CaptureFile<PcapWriter> | CaptureFile<PcapngWriter>> {
  const stream = createWriteStream(path);
  let error: Error | undefined;
  stream.on('error', (e) => {
    error ??= e;
  });
  await once(stream, 'open');
  const sink = (chunk: Uint8Array): void => {
    if (error === undefined) stream.write(chunk);
  };
  const close = async (): Promise<void> => {
    if (!stream.closed) {
      const closed = once(stream, 'close').catch(() => undefined);
      stream.end();
      await closed;
    }
    if (error !== undefined) throw error;
  };
  if (opts.format === 'pcapng') {
    const { format: _format, ...rest } = opts;
    return { path, writer: new PcapngWriter(sink, rest), close };
  }
  const { format: _format, ...rest } = opts;
  return { path, writer: new PcapWriter(sink, rest), close };
}

/** Streams the records of a pcap or pcapng file without reading it whole. */
export async function* readCaptureFile(path: string): AsyncGenerator<CaptureRecord> {
  yield* readCaptureAsync(createReadStream(path));
}

/**
 * Capture reader: classic pcap (either byte order, µs or ns) and pcapng (any number of sections
 * and interfaces, EPB/SPB/obsolete PB; other blocks skipped). Pure; no `node:*` imports.
 *
 * One state machine serves both forms:
 * - `readCapture(bytes)` over a whole capture: every record's `data` is a view into `bytes`.
 * - `CaptureReader` (and the `readCaptureChunks`/`readCaptureAsync` generators) over chunks split
 *   at any byte. Pushed chunks are kept, not copied; only a header or block that straddles two
 *   chunks is assembled into a buffer of its own, so each byte is copied at most a couple of times
 *   however the input is cut. `data` is then a view into a pushed chunk or into such a buffer:
 *   it stays valid as long as the caller does not overwrite the chunks it pushed.
 *
 * Bad input throws `CaptureError` and nothing else. Every length is checked against
 * `MAX_CAPTURE_BLOCK` before waiting for it, and every block consumes at least 12 bytes, so a
 * corrupt length can neither stall the reader nor make it allocate more than that bound.
 */

import {
  CaptureError,
  type CaptureRecord,
  MAX_CAPTURE_BLOCK,
  PCAP_GLOBAL_HEADER_LEN,
  PCAP_RECORD_HEADER_LEN,
  PCAPNG_BLOCK_EPB,
  PCAPNG_BLOCK_IDB,
  PCAPNG_BLOCK_OPB,
  PCAPNG_BLOCK_OVERHEAD,
  PCAPNG_BLOCK_SHB,
  PCAPNG_BLOCK_SPB,
  PCAPNG_BYTE_ORDER_MAGIC,
  PCAPNG_DEFAULT_TSRESOL,
  PCAPNG_OPT_ENDOFOPT,
  PCAPNG_OPT_IF_TSOFFSET,
  PCAPNG_OPT_IF_TSRESOL,
  PCAPNG_VERSION_MAJOR,
  type PcapGlobalHeader,
  pad4,
  parsePcapGlobalHeader,
  tsresolToNs,
} from './format.js';

/** FIFO of pushed chunks with contiguous peeks. */
class ByteQueue {
  private chunks: Uint8Array[] = [];
  private head = 0;
  private headOffset = 0;
  /** Bytes available. */
  length = 0;
  /** Bytes consumed since the start of the stream: the offset reported in errors. */
  consumed = 0;

  push(chunk: Uint8Array): void {
    if (chunk.length === 0) return;
    this.chunks.push(chunk);
    this.length += chunk.length;
  }

  /** The first `n` bytes as one view, or undefined if fewer are buffered. Copies only if they straddle chunks. */
  peek(n: number): Uint8Array | undefined {
    if (this.length < n) return undefined;
    const first = this.chunks[this.head];
    if (first === undefined) return new Uint8Array(0);
    if (first.length - this.headOffset >= n) return first.subarray(this.headOffset, this.headOffset + n);
    const out = new Uint8Array(n);
    let filled = 0;
    for (let i = this.head; filled < n; i++) {
      const c = this.chunks[i];
      if (c === undefined) break;
      const from = i === this.head ? this.headOffset : 0;
      const take = Math.min(c.length - from, n - filled);
      out.set(c.subarray(from, from + take), filled);
      filled += take;
    }
    return out;
  }

  consume(n: number): void {
    this.length -= n;
    this.consumed += n;
    let left = n;
    while (left > 0) {
      const c = this.chunks[this.head];
      if (c === undefined) break;
      const avail = c.length - this.headOffset;
      if (left < avail) {
        this.headOffset += left;
        break;
      }
      left -= avail;
      this.head++;
      this.headOffset = 0;
    }
    // Drop spent chunks in batches so a stream of tiny chunks stays linear.
    if (this.head > 64 && this.head * 2 > this.chunks.length) {
      this.chunks = this.chunks.slice(this.head);
      this.head = 0;
    }
  }
}

interface PcapngInterface {
  readonly linkType: number;
  readonly snapLength: number;
  readonly tsresol: number;
  /** if_tsoffset, in seconds. */
  readonly tsOffsetSec: bigint;
}

type ReaderState =
  | { readonly kind: 'start' }
  | { readonly kind: 'pcap'; readonly header: PcapGlobalHeader }
  | { readonly kind: 'pcapng'; readonly littleEndian: boolean; readonly interfaces: PcapngInterface[] };

const NEED_MORE = Symbol('need more');

function viewOf(b: Uint8Array): DataView {
  return new DataView(b.buffer, b.byteOffset, b.byteLength);
}

/** Streaming capture reader; see the module doc for the lifetime of record data. */
export class CaptureReader {
  private readonly queue = new ByteQueue();
  private state: ReaderState = { kind: 'start' };
  private frame = 0;
  private ended = false;
  private failure: CaptureError | undefined;

  /** Adds a chunk and returns the records it completed. */
  push(chunk: Uint8Array): CaptureRecord[] {
    return [...this.feed(chunk)];
  }

  /**
   * Like `push`, but returns the records lazily, so a big chunk never becomes a big array. The
   * chunk is taken at once; records not iterated stay queued for the next `feed`/`push`/`end`.
   */
  feed(chunk: Uint8Array): Generator<CaptureRecord> {
    this.checkUsable();
    this.queue.push(chunk);
    return this.drain();
  }

  private *drain(): Generator<CaptureRecord> {
    for (;;) {
      const r = this.guard(() => this.next());
      if (r === NEED_MORE) return;
      yield r;
    }
  }

  /**
   * Declares the input complete. Returns records still queued (only if a `feed` was not iterated
   * to the end); throws `ERR_CAPTURE_TRUNCATED` if the input stopped mid-structure.
   */
  end(): CaptureRecord[] {
    this.checkUsable();
    const rest = [...this.drain()];
    this.ended = true;
    this.guard(() => {
      if (this.state.kind === 'start') {
        throw new CaptureError('ERR_CAPTURE_TRUNCATED', this.queue.length === 0 ? 'empty capture' : 'capture header cut short', 0);
      }
      if (this.queue.length > 0) {
        throw new CaptureError('ERR_CAPTURE_TRUNCATED', `capture ends ${this.queue.length} bytes into a record or block`, this.queue.consumed);
      }
    });
    return rest;
  }

  /** Frames read so far. */
  get frames(): number {
    return this.frame;
  }

  private checkUsable(): void {
    if (this.failure !== undefined) throw this.failure;
    if (this.ended) throw new CaptureError('ERR_CAPTURE_STATE', 'capture reader used after end()', this.queue.consumed);
  }

  private guard<T>(f: () => T): T {
    try {
      return f();
    } catch (e) {
      // Anything but a CaptureError here would be a bug in this file; keep the promise anyway.
      const err = e instanceof CaptureError ? e : new CaptureError('ERR_CAPTURE_FORMAT', `unreadable capture: ${String(e)}`, this.queue.consumed);
      this.failure = err;
      throw err;
    }
  }

  private next(): CaptureRecord | typeof NEED_MORE {
    for (;;) {
      const s = this.state;
      if (s.kind === 'start') {
        const magic = this.queue.peek(4);
        if (magic === undefined) return NEED_MORE;
        if (viewOf(magic).getUint32(0) === PCAPNG_BLOCK_SHB) {
          // The SHB type is a byte-order palindrome; the SHB itself sets the section's order.
          this.state = { kind: 'pcapng', littleEndian: true, interfaces: [] };
          continue;
        }
        const h = this.queue.peek(PCAP_GLOBAL_HEADER_LEN);
        if (h === undefined) {
          // Reject a non-capture as soon as its magic is known, rather than at end().
          parsePcapMagicOnly(magic);
          return NEED_MORE;
        }
        this.state = { kind: 'pcap', header: parsePcapGlobalHeader(h, 0, 0) };
        this.queue.consume(PCAP_GLOBAL_HEADER_LEN);
        continue;
      }
      if (s.kind === 'pcap') return this.nextPcapRecord(s.header);
      const r = this.nextPcapngBlock(s);
      if (r !== undefined) return r;
    }
  }

  private nextPcapRecord(h: PcapGlobalHeader): CaptureRecord | typeof NEED_MORE {
    const hdr = this.queue.peek(PCAP_RECORD_HEADER_LEN);
    if (hdr === undefined) return NEED_MORE;
    const v = viewOf(hdr);
    const le = h.littleEndian;
    const capturedLength = v.getUint32(8, le);
    if (capturedLength > MAX_CAPTURE_BLOCK) {
      throw new CaptureError('ERR_CAPTURE_FORMAT', `record of ${capturedLength} bytes exceeds ${MAX_CAPTURE_BLOCK}`, this.queue.consumed);
    }
    const rec = this.queue.peek(PCAP_RECORD_HEADER_LEN + capturedLength);
    if (rec === undefined) return NEED_MORE;
    const sec = BigInt(v.getUint32(0, le));
    const frac = BigInt(v.getUint32(4, le));
    const record: CaptureRecord = {
      frame: ++this.frame,
      timestampNs: sec * 1_000_000_000n + (h.nanosecond ? frac : frac * 1000n),
      linkType: h.linkType,
      data: rec.subarray(PCAP_RECORD_HEADER_LEN),
      originalLength: v.getUint32(12, le),
      interfaceId: 0,
    };
    this.queue.consume(PCAP_RECORD_HEADER_LEN + capturedLength);
    return record;
  }

  /** Consumes one block; returns a record for packet blocks, undefined for the rest. */
  private nextPcapngBlock(s: Extract<ReaderState, { kind: 'pcapng' }>): CaptureRecord | typeof NEED_MORE | undefined {
    const at = this.queue.consumed;
    const head = this.queue.peek(8);
    if (head === undefined) return NEED_MORE;
    const type = viewOf(head).getUint32(0, s.littleEndian);
    let le = s.littleEndian;
    if (type === PCAPNG_BLOCK_SHB) {
      const h = this.queue.peek(12);
      if (h === undefined) return NEED_MORE;
      const bom = viewOf(h);
      if (bom.getUint32(8, true) === PCAPNG_BYTE_ORDER_MAGIC) le = true;
      else if (bom.getUint32(8, false) === PCAPNG_BYTE_ORDER_MAGIC) le = false;
      else throw new CaptureError('ERR_CAPTURE_FORMAT', 'pcapng section header without byte-order magic', at);
    }
    const length = viewOf(head).getUint32(4, le);
    const min = type === PCAPNG_BLOCK_SHB ? 28 : PCAPNG_BLOCK_OVERHEAD;
    if (length < min || length % 4 !== 0 || length > MAX_CAPTURE_BLOCK) {
      throw new CaptureError('ERR_CAPTURE_FORMAT', `pcapng block 0x${type.toString(16)} has bad total length ${length}`, at);
    }
    const block = this.queue.peek(length);
    if (block === undefined) return NEED_MORE;
    const v = viewOf(block);
    if (v.getUint32(length - 4, le) !== length) {
      throw new CaptureError('ERR_CAPTURE_FORMAT', `pcapng block 0x${type.toString(16)} trailing length differs from ${length}`, at);
    }
    let record: CaptureRecord | undefined;
    switch (type) {
      case PCAPNG_BLOCK_SHB: {
        const major = v.getUint16(12, le);
        if (major !== PCAPNG_VERSION_MAJOR) {
          throw new CaptureError('ERR_CAPTURE_UNSUPPORTED', `pcapng version ${major}.${v.getUint16(14, le)}`, at);
        }
        // A new section starts over: new byte order, no interfaces.
        this.state = { kind: 'pcapng', littleEndian: le, interfaces: [] };
        break;
      }
      case PCAPNG_BLOCK_IDB:
        if (length < 20) throw new CaptureError('ERR_CAPTURE_FORMAT', `interface description block of ${length} bytes`, at);
        s.interfaces.push(parseIdb(v, le, length, at));
        break;
      case PCAPNG_BLOCK_EPB:
      case PCAPNG_BLOCK_OPB: {
        /*
         * EPB: interface id(4) ts high(4) ts low(4) captured len(4) original len(4) data options
         * OPB: interface id(2) drops(2)    ts high(4) ts low(4) captured len(4) original len(4) data options
         */
        if (length < 32) throw new CaptureError('ERR_CAPTURE_FORMAT', `packet block of ${length} bytes`, at);
        const ifId = type === PCAPNG_BLOCK_EPB ? v.getUint32(8, le) : v.getUint16(8, le);
        const iface = interfaceAt(s, ifId, at);
        const capLen = v.getUint32(20, le);
        if (28 + capLen > length - 4) {
          throw new CaptureError('ERR_CAPTURE_FORMAT', `packet of ${capLen} bytes overruns its ${length}-byte block`, at);
        }
        const ticks = (BigInt(v.getUint32(12, le)) << 32n) | BigInt(v.getUint32(16, le));
        record = {
          frame: ++this.frame,
          timestampNs: tsresolToNs(ticks, iface.tsresol) + iface.tsOffsetSec * 1_000_000_000n,
          linkType: iface.linkType,
          data: block.subarray(28, 28 + capLen),
          originalLength: v.getUint32(24, le),
          interfaceId: ifId,
        };
        break;
      }
      case PCAPNG_BLOCK_SPB: {
        // SPB: original len(4) data. Captured length is implied: min(original, snaplen, room).
        if (length < 16) throw new CaptureError('ERR_CAPTURE_FORMAT', `simple packet block of ${length} bytes`, at);
        const iface = interfaceAt(s, 0, at);
        const originalLength = v.getUint32(8, le);
        let capLen = Math.min(originalLength, length - 16);
        if (iface.snapLength !== 0) capLen = Math.min(capLen, iface.snapLength);
        record = {
          frame: ++this.frame,
          timestampNs: 0n,
          linkType: iface.linkType,
          data: block.subarray(12, 12 + capLen),
          originalLength,
          interfaceId: 0,
        };
        break;
      }
      default:
        // NRB, ISB, DSB, custom and future blocks carry nothing this reader reports.
        break;
    }
    this.queue.consume(length);
    return record;
  }
}

function parsePcapMagicOnly(magic: Uint8Array): void {
  const padded = new Uint8Array(PCAP_GLOBAL_HEADER_LEN);
  padded.set(magic);
  // Versions are zero here, so a known magic only "fails" as unsupported: ignore that outcome.
  try {
    parsePcapGlobalHeader(padded, 0, 0);
  } catch (e) {
    if (e instanceof CaptureError && e.code === 'ERR_CAPTURE_FORMAT') throw e;
  }
}

function interfaceAt(s: Extract<ReaderState, { kind: 'pcapng' }>, id: number, at: number): PcapngInterface {
  const iface = s.interfaces[id];
  if (iface === undefined) {
    throw new CaptureError('ERR_CAPTURE_FORMAT', `packet for interface ${id}, but the section has ${s.interfaces.length}`, at);
  }
  return iface;
}

/*
 * IDB: link type(2) reserved(2) snaplen(4) options...
 * option: code(2) length(2) value padded to 32 bits; opt_endofopt (0) ends the list.
 */
function parseIdb(v: DataView, le: boolean, length: number, at: number): PcapngInterface {
  let tsresol = PCAPNG_DEFAULT_TSRESOL;
  let tsOffsetSec = 0n;
  const end = length - 4;
  for (let p = 16; p + 4 <= end; ) {
    const code = v.getUint16(p, le);
    const len = v.getUint16(p + 2, le);
    if (code === PCAPNG_OPT_ENDOFOPT) break;
    if (p + 4 + len > end) throw new CaptureError('ERR_CAPTURE_FORMAT', `IDB option ${code} overruns its block`, at);
    if (code === PCAPNG_OPT_IF_TSRESOL && len >= 1) tsresol = v.getUint8(p + 4);
    else if (code === PCAPNG_OPT_IF_TSOFFSET && len >= 8) tsOffsetSec = v.getBigInt64(p + 4, le);
    p += 4 + pad4(len);
  }
  return { linkType: v.getUint16(8, le), snapLength: v.getUint32(12, le), tsresol, tsOffsetSec };
}

/** All records of a complete capture in memory; `data` views point into `bytes`. */
export function* readCapture(bytes: Uint8Array): Generator<CaptureRecord> {
  const reader = new CaptureReader();
  yield* reader.feed(bytes);
  yield* reader.end();
}

/** Records from a capture delivered as chunks cut anywhere. */
export function* readCaptureChunks(chunks: Iterable<Uint8Array>): Generator<CaptureRecord> {
  const reader = new CaptureReader();
  for (const chunk of chunks) yield* reader.feed(chunk);
  yield* reader.end();
}

/** Records from an async source of chunks, such as a `node:fs` read stream. */
export async function* readCaptureAsync(chunks: AsyncIterable<Uint8Array>): AsyncGenerator<CaptureRecord> {
  const reader = new CaptureReader();
  for await (const chunk of chunks) yield* reader.feed(chunk);
  yield* reader.end();
}

/**
 * Views of ranges of byte arrays, handed out again. Each `subarray` makes a view (about 90 bytes of
 * heap), and a hot path cuts the same arrays at the same places again and again: a receive ring's
 * slots, where a stream's packets land at the same offsets batch after batch, and a registered buffer
 * sent or read again, cut at the same path MTU. The table keeps the last view made for each place,
 * direct-mapped on where the range starts in its buffer, and hands it out again for the same array
 * and range, which are the same bytes: as good as a new view for anyone, a caller that keeps it
 * included. Another array at the same place, or a range that ends elsewhere, gets a view of its own.
 */
export class ViewTable {
  private readonly shift: number;
  private readonly of: Uint8Array[];
  private readonly range: Int32Array;
  private readonly views: Uint8Array[];

  /** A table of 2^bits views. */
  constructor(bits: number) {
    const n = 1 << bits;
    this.shift = 32 - bits;
    const none = new Uint8Array(0);
    this.of = new Array<Uint8Array>(n).fill(none);
    this.range = new Int32Array(2 * n);
    this.views = new Array<Uint8Array>(n).fill(none);
  }

  /** `b.subarray(start, end)`, or the view this table made for the same range of the same array. */
  view(b: Uint8Array, start: number, end: number): Uint8Array {
    // Fibonacci hashing of the range's place: a ring's slots, or a buffer's MTU-sized pieces, lie a
    // fixed stride apart, which the low bits alone would map onto a few entries.
    const i = Math.imul(b.byteOffset + start, 0x9e3779b1) >>> this.shift;
    const range = this.range;
    if (this.of[i] === b && range[2 * i] === start && range[2 * i + 1] === end) return this.views[i]!;
    const v = b.subarray(start, end);
    this.of[i] = b;
    range[2 * i] = start;
    range[2 * i + 1] = end;
    this.views[i] = v;
    return v;
  }
}

/**
 * Hand-built captures for the reader tests, written from the format documents and independent of
 * `src/pcap/writer.ts`, so the reader is not only tested against its own writer.
 */

function u16(le: boolean, x: number): number[] {
  return le ? [x & 0xff, (x >> 8) & 0xff] : [(x >> 8) & 0xff, x & 0xff];
}
function u32(le: boolean, x: number): number[] {
  const b = [(x >>> 24) & 0xff, (x >>> 16) & 0xff, (x >>> 8) & 0xff, x & 0xff];
  return le ? b.reverse() : b;
}
function u64(le: boolean, x: bigint): number[] {
  const hi = Number((x >> 32n) & 0xffffffffn);
  const lo = Number(x & 0xffffffffn);
  return le ? [...u32(le, lo), ...u32(le, hi)] : [...u32(le, hi), ...u32(le, lo)];
}
/** Packet block timestamps are two 32-bit words, high first, each in the section's byte order. */
function ts64(le: boolean, x: bigint): number[] {
  return [...u32(le, Number((x >> 32n) & 0xffffffffn)), ...u32(le, Number(x & 0xffffffffn))];
}
const pad = (b: readonly number[]): number[] => [...b, ...new Array((4 - (b.length % 4)) % 4).fill(0)];

export interface ClassicRecord {
  readonly sec: number;
  /** µs or ns, per the file's magic. */
  readonly frac: number;
  readonly data: readonly number[];
  readonly orig?: number;
}

export function classicPcap(le: boolean, ns: boolean, linkType: number, records: readonly ClassicRecord[], snaplen = 65535): Uint8Array {
  const out = [...u32(le, ns ? 0xa1b23c4d : 0xa1b2c3d4), ...u16(le, 2), ...u16(le, 4), ...u32(le, 0), ...u32(le, 0), ...u32(le, snaplen), ...u32(le, linkType)];
  for (const r of records) out.push(...u32(le, r.sec), ...u32(le, r.frac), ...u32(le, r.data.length), ...u32(le, r.orig ?? r.data.length), ...r.data);
  return Uint8Array.from(out);
}

export function block(le: boolean, type: number, body: readonly number[]): number[] {
  const b = pad(body);
  const total = 12 + b.length;
  return [...u32(le, type), ...u32(le, total), ...b, ...u32(le, total)];
}

export function option(le: boolean, code: number, value: readonly number[]): number[] {
  return [...u16(le, code), ...u16(le, value.length), ...pad(value)];
}
export const endOfOpt = (le: boolean): number[] => [...u16(le, 0), ...u16(le, 0)];

export function shb(le: boolean, major = 1, options: readonly number[] = []): number[] {
  return block(le, 0x0a0d0d0a, [...u32(le, 0x1a2b3c4d), ...u16(le, major), ...u16(le, 0), ...u64(le, -1n & 0xffffffffffffffffn), ...options]);
}

export function idb(le: boolean, linkType: number, snaplen: number, opts: { tsresol?: number; tsoffset?: bigint; name?: string } = {}): number[] {
  const o: number[] = [];
  if (opts.name !== undefined) o.push(...option(le, 2, [...Buffer.from(opts.name)]));
  if (opts.tsresol !== undefined) o.push(...option(le, 9, [opts.tsresol]));
  if (opts.tsoffset !== undefined) o.push(...option(le, 14, u64(le, opts.tsoffset)));
  if (o.length > 0) o.push(...endOfOpt(le));
  return block(le, 1, [...u16(le, linkType), ...u16(le, 0), ...u32(le, snaplen), ...o]);
}

export function epb(le: boolean, ifId: number, ticks: bigint, data: readonly number[], orig = data.length, options: readonly number[] = []): number[] {
  return block(le, 6, [...u32(le, ifId), ...ts64(le, ticks), ...u32(le, data.length), ...u32(le, orig), ...pad(data), ...options]);
}

export function spb(le: boolean, data: readonly number[], orig = data.length): number[] {
  return block(le, 3, [...u32(le, orig), ...data]);
}

export function opb(le: boolean, ifId: number, ticks: bigint, data: readonly number[]): number[] {
  return block(le, 2, [...u16(le, ifId), ...u16(le, 0), ...ts64(le, ticks), ...u32(le, data.length), ...u32(le, data.length), ...data]);
}

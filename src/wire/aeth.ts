/**
 * ACK Extended Transport Header (IBTA §9.3.5, figure 102, tables 43–46): syndrome(8) MSN(24).
 *
 * Syndrome bits 6..5 select the kind: 00 ACK (bits 4..0 = credit count code),
 * 01 RNR NAK (bits 4..0 = RNR timer code), 11 NAK (bits 4..0 = NAK code), 10 reserved.
 * Bit 7 is reserved.
 */

import { readU24, writeU24 } from './bytes.js';

export interface Aeth {
  syndrome: number;
  /** Message sequence number: count of completed inbound messages, 24 bits. */
  msn: number;
}

export type AethKind = 'ACK' | 'RNR_NAK' | 'NAK' | 'RESERVED';

export const NAK_CODE = {
  PSN_SEQUENCE_ERROR: 0,
  INVALID_REQUEST: 1,
  REMOTE_ACCESS_ERROR: 2,
  REMOTE_OPERATIONAL_ERROR: 3,
  INVALID_RD_REQUEST: 4,
} as const;

const NAK_NAMES = ['PSN_SEQUENCE_ERROR', 'INVALID_REQUEST', 'REMOTE_ACCESS_ERROR', 'REMOTE_OPERATIONAL_ERROR', 'INVALID_RD_REQUEST'];

/** The credit count code of an ACK that advertises no end-to-end credit limit (table 44). */
export const CREDIT_UNLIMITED = 31;

/** Decoded credit counts, by 5-bit code (table 44); code 31 means "no limit". */
export const CREDIT_COUNT: readonly number[] = Object.freeze([
  0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072,
  4096, 6144, 8192, 12288, 16384, 24576, 32768, Infinity,
]);

/**
 * Minimum RNR NAK timer by 5-bit code (table 45), in microseconds. Code 0 is the longest,
 * 655.36 ms; code 22 is the 20.48 ms seen in rxe captures with `min_rnr_timer = 22`.
 */
export const RNR_TIMER_US: readonly number[] = Object.freeze([
  655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840, 5120, 7680,
  10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520,
]);

export function aethKind(syndrome: number): AethKind {
  switch ((syndrome >>> 5) & 3) {
    case 0: return 'ACK';
    case 1: return 'RNR_NAK';
    case 3: return 'NAK';
    default: return 'RESERVED';
  }
}

/** The low five bits: credit code, RNR timer code or NAK code, depending on the kind. */
export const aethValue = (syndrome: number): number => syndrome & 0x1f;

export const ackSyndrome = (creditCode: number = CREDIT_UNLIMITED): number => creditCode & 0x1f;
export const rnrNakSyndrome = (timerCode: number): number => 0x20 | (timerCode & 0x1f);
export const nakSyndrome = (code: number): number => 0x60 | (code & 0x1f);

export function nakCodeName(code: number): string {
  return NAK_NAMES[code] ?? `RESERVED_${code}`;
}

/** Plain-words rendering of a syndrome: `ACK credit=31`, `RNR_NAK timer=22 (20.48 ms)`, `NAK PSN_SEQUENCE_ERROR`. */
export function describeSyndrome(syndrome: number): string {
  const v = aethValue(syndrome);
  switch (aethKind(syndrome)) {
    case 'ACK': return v === CREDIT_UNLIMITED ? 'ACK (no credit limit)' : `ACK credit=${CREDIT_COUNT[v]}`;
    case 'RNR_NAK': return `RNR_NAK timer=${v} (${(RNR_TIMER_US[v]! / 1000).toFixed(2)} ms)`;
    case 'NAK': return `NAK ${nakCodeName(v)}`;
    default: return `RESERVED syndrome 0x${syndrome.toString(16)}`;
  }
}

export function parseAeth(b: Uint8Array, off: number): Aeth {
  return parseAethInto(b, off, { syndrome: 0, msn: 0 });
}

/** `parseAeth` into a record the caller reuses; returns it. */
export function parseAethInto(b: Uint8Array, off: number, h: Aeth): Aeth {
  h.syndrome = b[off]!;
  h.msn = readU24(b, off + 1);
  return h;
}

export function emitAeth(h: Aeth, b: Uint8Array, off: number): number {
  b[off] = h.syndrome & 0xff;
  writeU24(b, off + 1, h.msn & 0xffffff);
  return off + 4;
}

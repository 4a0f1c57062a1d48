/**
 * 24-bit packet sequence numbers (IBTA 9.7.1). This module is the only place that masks a
 * PSN: everything else adds and compares through it, so wrap-around is handled once.
 */

export const PSN_MASK = 0xffffff;
/** Half the PSN space: the window inside which "a is after b" is meaningful. */
export const PSN_HALF = 0x800000;

export function psnAdd(psn: number, n: number): number {
  return (psn + n) & PSN_MASK;
}

/**
 * Signed distance a − b in the 24-bit circle, in [−2^23, 2^23). Shifting the 24-bit
 * difference into the top of an int32 and back sign-extends it (rxe's psn_compare).
 */
export function psnDiff(a: number, b: number): number {
  return ((a - b) << 8) >> 8;
}

export function psnLt(a: number, b: number): boolean {
  return psnDiff(a, b) < 0;
}

export function psnLe(a: number, b: number): boolean {
  return psnDiff(a, b) <= 0;
}

export function psnValid(psn: number): boolean {
  return Number.isInteger(psn) && psn >= 0 && psn <= PSN_MASK;
}

/**
 * No congestion control: a fixed rate (normally the line rate), paced with a bounded burst.
 * CNPs are ignored, as rdma_rxe ignores them; this is the contrast case for DCQCN.
 */

import type { Micros } from '../runtime/clock.js';
import type { CongestionControl } from './controller.js';
import { PacedController } from './pacer.js';

export class FixedRate extends PacedController implements CongestionControl {
  readonly kind = 'fixed';

  constructor(rateBps: number, burstBytes: number, nowUs: Micros = 0) {
    super(rateBps, burstBytes, nowUs);
  }
}

/** A reference target on 127.0.0.2 and a prober on 127.0.0.1, on free ports. */
import { startTarget, type Target, type TargetOptions } from '../../src/conform/target.js';
import { Prober } from '../../src/conform/prober.js';

export interface Bench {
  target: Target;
  prober: Prober;
  close(): Promise<void>;
}

export async function bench(o: Partial<TargetOptions> = {}): Promise<Bench> {
  const prober = await Prober.open({ bind: '127.0.0.1', port: 0, peer: { address: '127.0.0.2', port: 0 } });
  const target = await startTarget({ address: '127.0.0.2', udpPort: 0, peerUdpPort: prober.link.local.port, pingpongPort: 0, controlPort: 0, ...o });
  prober.peer.port = target.udpPort;
  return {
    target, prober,
    async close() {
      await prober.close();
      await target.close();
    },
  };
}

export const FAST = { responseMs: 400, quietMs: 120 };

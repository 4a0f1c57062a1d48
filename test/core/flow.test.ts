/** UDP source ports as rdma_rxe computes them, against the values measured in the rxe lab. */
import t from 'tap';
import { calcFlowLabel, connectedSourcePort, datagramSourcePort, hash32 } from '../../src/core/flow.js';

t.equal(connectedSourcePort(0x11, 0x11), 49441, 'RC 0x11 <-> 0x11');
t.equal(connectedSourcePort(0x11, 0x12), 49458, 'RC 0x11 <-> 0x12');
t.equal(connectedSourcePort(0x11, 0xabc), 63102, 'RC 0x11 <-> 0xabc');
t.equal(connectedSourcePort(0xabc, 0x11), 63102, 'symmetric');
t.equal(datagramSourcePort(0x11), 57236, 'UD 0x11');
t.equal(datagramSourcePort(0x12), 63494, 'UD 0x12');
t.equal(calcFlowLabel(0xffffff, 0xffffff) >>> 20, 0, 'a flow label is 20 bits');
for (const q of [1, 0x11, 0xabcdef, 0xffffff]) {
  const h = hash32(q, 14);
  t.ok(h >= 0 && h < 1 << 14, `hash_32(${q}, 14) in range`);
  const p = connectedSourcePort(q, 0x77);
  t.ok(p >= 0xc000 && p <= 0xffff, 'source port in 0xC000..0xFFFF');
}

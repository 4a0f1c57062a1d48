/**
 * PcapTap against Wireshark: a capture of real UdpLink traffic over loopback (IPv4 both ways and
 * IPv6, per-flow source ports) opens in tshark with every frame dissected as RoCEv2 and nothing
 * malformed. Needs tshark; fails without it.
 */
import t from 'tap';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openPcapFile } from '../../src/pcap/file.js';
import { PcapTap } from '../../src/link/pcap-tap.js';
import { UdpLink } from '../../src/link/udp.js';
import { SystemClock } from '../../src/runtime/clock.js';
import { recorder, sendOnly, until } from '../link/helpers.js';
import { tsharkJson } from './tshark.js';

const dir = mkdtempSync(join(tmpdir(), 'roce-tap-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));

/** Every value of `key` anywhere in a tshark JSON tree. */
function valuesOf(node: unknown, key: string, acc: unknown[] = []): unknown[] {
  if (Array.isArray(node)) for (const x of node) valuesOf(x, key, acc);
  else if (node !== null && typeof node === 'object') {
    for (const [k, v] of Object.entries(node)) {
      if (k === key) acc.push(v);
      valuesOf(v, key, acc);
    }
  }
  return acc;
}

for (const family of [4, 6] as const) {
  t.test(`IPv${family}: tshark dissects every captured frame as RoCEv2, none malformed`, async (t) => {
    const address = family === 4 ? '127.0.0.1' : '::1';
    const clock = new SystemClock();
    const file = await openPcapFile(join(dir, `tap${family}.pcap`));
    const a0 = await UdpLink.open({ address, port: 0, sourcePorts: 'per-flow', clock });
    const b = await UdpLink.open({ address, port: 0, clock });
    const a = new PcapTap(a0, file.writer, 'both', { clock });
    const gotA = recorder(a);
    const gotB = recorder(b);
    // Even PSNs from per-flow source ports (rxe-style, 0xC000 + i), odd ones from the bound port.
    for (let i = 0; i < 6; i++) a.send(b.local, i % 2 === 0 ? 0xc000 + i : a.local.port, sendOnly(i, new Uint8Array(100 + i).fill(i)));
    await until(() => gotB.length === 6);
    for (let i = 0; i < 3; i++) b.send(a.local, 0, sendOnly(100 + i, new Uint8Array(64)));
    await until(() => gotA.length === 3);
    await a.close();
    await b.close();
    await file.close();
    t.same(a.counters, { written: 9, writeErrors: 0 });

    // Test ports are not 4791: tell Wireshark that both links' ports carry RoCEv2.
    const pkts = await tsharkJson(file.path, ['-d', `udp.port==${a.local.port},infiniband`, '-d', `udp.port==${b.local.port},infiniband`]);
    t.equal(pkts.length, 9, 'tshark reads every frame');
    for (const [i, p] of pkts.entries()) {
      const layers = p._source.layers;
      t.match(layers.frame['frame.protocols'], /:udp:infiniband/, `frame ${i + 1}: RoCEv2`);
      t.same(valuesOf(p, '_ws.malformed'), [], `frame ${i + 1}: not malformed`);
      t.same(valuesOf(layers, '_ws.expert.severity').filter((s) => Number(s) >= 0x00600000), [], `frame ${i + 1}: no expert warnings`);
    }
    const psns = pkts.map((p) => Number(valuesOf(p._source.layers, 'infiniband.bth.psn')[0]));
    t.same(psns, [0, 1, 2, 3, 4, 5, 100, 101, 102]);
  });
}

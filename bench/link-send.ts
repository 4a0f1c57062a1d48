/**
 * CPU per `UdpLink.send`, by send path: what the "what mattered" figures of bench/README.md for the
 * send path were measured with. CPU time (user + system of this process, `process.cpuUsage`) is
 * steadier than a rate on a shared machine: another process taking the CPU delays the sends but
 * does not add to their CPU time.
 *
 * One process sends packets shaped as the requester's ([28-byte header, payload view into a 1 MiB
 * region]) to a sink in another process that never reads (python3, or a node child as fallback:
 * the kernel's drop once its buffer is full costs about what a delivery does), so the figure is the
 * sender's side only: JS, ICRC, dgram and the `sendmsg` syscall with its loopback delivery.
 *
 * - `batched`, `batched GSO`: the default path, `sendmmsg` at the end of each turn (`mmsg.ts`),
 *   without and with UDP GSO trains (consecutive equal-size datagrams to one peer as one buffer).
 * - `ring`, `scatter`: the two `sendMode`s of `UdpLink.send` on the `dgram` path (`batchIo: false`).
 * - `fresh`: `frame` + `sendRaw`, one fresh buffer per datagram with the ICRC at its tail — the
 *   copy the previous `send` made for every datagram (it also resolved the address on a
 *   `process.nextTick`, which this path no longer does, so `fresh` reads a little better than the
 *   old `send` did; compare with the figures in the README, taken against the old build).
 *
 *   node dist/bench/link-send.js [--sizes 32,1024,4096] [--n 50000] [--rounds 5]
 */

import { spawn } from 'node:child_process';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { UdpLink } from '../src/link/udp.js';
import { machineLine } from './procs.js';

type Mode = 'ring' | 'scatter' | 'fresh' | 'batched' | 'batched GSO';

async function sink(): Promise<{ port: number; close: () => void }> {
  const py = "import socket,time\ns=socket.socket(2,2)\ns.bind(('127.0.0.1',0))\nprint(s.getsockname()[1],flush=True)\ntime.sleep(3600)";
  const js = "const s=require('dgram').createSocket('udp4');s.bind(0,'127.0.0.1',()=>{s.recvStop?.();console.log(s.address().port)});setInterval(()=>{},1e6)";
  for (const [cmd, args] of [['python3', ['-c', py]], [process.execPath, ['-e', js]]] as const) {
    const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'ignore'] });
    const port = await new Promise<number | undefined>((resolve) => {
      child.once('error', () => resolve(undefined));
      child.stdout.once('data', (d: Buffer) => resolve(Number(String(d).trim())));
    });
    if (port !== undefined && Number.isInteger(port)) return { port, close: () => child.kill() };
  }
  throw new Error('no sink process');
}

async function main(): Promise<void> {
  const { values } = parseArgs({ options: { sizes: { type: 'string', default: '32,1024,4096' }, n: { type: 'string', default: '50000' }, rounds: { type: 'string', default: '5' } } });
  const sizes = values.sizes.split(',').map(Number);
  const n = Number(values.n);
  const rounds = Number(values.rounds);
  console.log(machineLine());
  const s = await sink();
  const dst = { address: '127.0.0.1', port: s.port };
  const warn = (): void => undefined;
  const links: Record<Mode, UdpLink> = {
    ring: await UdpLink.open({ address: '127.0.0.1', port: 0, warn, sendMode: 'ring', batchIo: false }),
    scatter: await UdpLink.open({ address: '127.0.0.1', port: 0, warn, sendMode: 'scatter', batchIo: false }),
    fresh: await UdpLink.open({ address: '127.0.0.1', port: 0, warn, batchIo: false }),
    batched: await UdpLink.open({ address: '127.0.0.1', port: 0, warn, gso: false }),
    'batched GSO': await UdpLink.open({ address: '127.0.0.1', port: 0, warn, gso: true }),
  };
  const mem = new Uint8Array(1 << 20);
  const hdr = new Uint8Array(28);
  hdr[0] = 0x0a; // RC RDMA WRITE ONLY
  console.log('| payload B | path | CPU µs per send (median of rounds) | rounds |');
  console.log('|---:|---|---:|---|');
  for (const size of sizes) {
    const res: Record<string, number[]> = {};
    for (let r = 0; r < rounds; r++) {
      for (const mode of ['fresh', 'ring', 'scatter', 'batched', 'batched GSO'] as const) {
        const link = links[mode];
        let off = 0;
        const one = (): void => {
          off += size;
          if (off + size > mem.length) off = 0;
          const parts = [hdr, mem.subarray(off, off + size)];
          if (mode === 'fresh') {
            const w = link.frame(dst, link.local.port, parts);
            if (w !== undefined) link.sendRaw(dst, w.srcPort, w.datagram);
          } else {
            link.send(dst, link.local.port, parts);
          }
        };
        const c0 = process.cpuUsage();
        // 32 sends per event-loop turn, as a QP's poll budget would.
        await new Promise<void>((done) => {
          let i = 0;
          const loop = (): void => {
            for (let k = 0; k < 32 && i < n; k++, i++) one();
            if (i < n) setImmediate(loop);
            else done();
          };
          loop();
        });
        const c = process.cpuUsage(c0);
        (res[mode] ??= []).push((c.user + c.system) / n);
      }
    }
    for (const [mode, v] of Object.entries(res)) {
      const sorted = [...v].sort((a, b) => a - b);
      console.log(`| ${size} | ${mode} | ${sorted[sorted.length >> 1]!.toFixed(2)} | ${v.map((x) => x.toFixed(2)).join(' ')} |`);
    }
  }
  for (const l of Object.values(links)) await l.close();
  s.close();
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) await main();

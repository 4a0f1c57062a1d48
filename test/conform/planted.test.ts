// A planted bug in our own responder: a request with a reserved BTH bit set (IBTA: ignored on
// receive) makes `roce serve` deaf on that QP. The fuzzer must find it, minimize it to the one
// datagram and the one byte, save it, and `roce conform --replay` must reproduce it; the same
// seeded run against the healthy server finds nothing.
import t from 'tap';
import { mkdtemp, readFile, readdir } from 'node:fs/promises';
import { writeFile } from 'node:fs/promises';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { fuzzPeer, replayFile, type ReplayFile } from '../../src/conform/fuzz.js';
import { bench } from './helpers.js';

const TIMING = { responseMs: 250, quietMs: 30 };
const main = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../src/cli/main.js');

/** The fault: once a request with BTH resv7 ≠ 0 arrives for a QP, that QP hears nothing more. */
function deafOnReservedBits(): (d: Uint8Array) => boolean {
  const deaf = new Set<number>();
  return (d) => {
    if (d.length < 12) return true;
    const qp = (d[5]! << 16) | (d[6]! << 8) | d[7]!;
    if (deaf.has(qp)) return false;
    if (d[0]! < 0x20 && (d[8]! & 0x7f) !== 0) {
      deaf.add(qp);
      return false;
    }
    return true;
  };
}

t.test('the fuzzer finds, minimizes and replays the planted bug', async (t) => {
  const b = await bench({ rxFilter: deafOnReservedBits() });
  t.teardown(() => b.close());
  const dir = await mkdtemp(path.join(os.tmpdir(), 'conform-planted-'));
  const ex = b.exchange();
  const r = await fuzzPeer({ prober: b.prober, exchange: ex, seed: 7, count: 2000, timeLimitS: 60, timing: TIMING, outDir: dir, writeFile: (f, d) => writeFile(f, d) });
  t.equal(r.findings.length, 1, `found after ${r.tried} inputs`);
  const f = r.findings[0]!;
  t.equal(f.kind, 'liveness');
  t.equal(f.datagrams, 1, 'minimized to one datagram');
  const d = f.file.datagrams[0]!;
  const diff = [...Buffer.from(d.hex, 'hex')].filter((x, i) => x !== Buffer.from(d.template!, 'hex')[i]).length;
  t.equal(diff, 1, 'one byte differs from the valid packet it came from');
  t.not(Buffer.from(d.hex, 'hex')[8]! & 0x7f, 0, 'and it is the reserved bits of BTH byte 8');
  const files = await readdir(dir);
  t.ok(files.some((x) => x.endsWith('.replay.json')) && files.some((x) => x.endsWith('.pcap')), 'replay file and pcap saved');

  const again = await replayFile({ prober: b.prober, exchange: ex, file: JSON.parse(await readFile(f.replay!, 'utf8')) as ReplayFile, timing: TIMING });
  t.ok(again.reproduced, `replay reproduces: ${again.detail}`);

  // The CLI, in its own process, against the same server.
  const { stdout } = await promisify(execFile)(process.execPath, [main, 'conform', '--replay', f.replay!, '--exchange', 'roce', '--peer', '127.0.0.2',
    '--port', String(b.server.oobPort), '--bind', '127.0.0.1', '--udp-port', '0',
    '--response-ms', '250', '--quiet-ms', '30'], { timeout: 30_000 });
  t.match(stdout, /REPRODUCED/, 'roce conform --replay reproduces it');
});

t.test('the same seeded run finds nothing in the healthy server', async (t) => {
  const b = await bench();
  t.teardown(() => b.close());
  const ex = b.exchange();
  const r = await fuzzPeer({ prober: b.prober, exchange: ex, seed: 7, count: 400, timeLimitS: 20, timing: TIMING });
  t.same(r.findings.map((x) => x.detail), [], `${r.tried} inputs, ${r.inputsPerSecond}/s, ${r.reconnects} reconnects`);
  const l = r.liveness;
  t.equal(l.checks, r.batches, 'a liveness check after every batch');
  t.equal(l.ok + l.explainedFailures, l.checks, `each one answered (${l.ok}) or failed after a fatal NAK (${l.explainedFailures})`);
  t.equal(l.explainedFailures, r.reconnects, 'every QP error cost one reconnect');
});

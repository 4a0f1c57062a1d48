/**
 * The records every packet touches stay in V8's fast-property mode (a fixed layout, read by a field
 * load) rather than falling back to a hash table, the link hands its handler one metadata record
 * rather than a fresh object per datagram, and the device its QPs one parsed packet record. Checked
 * in a child with `--allow-natives-syntax` after real traffic over loopback (hot-shapes-process.ts).
 */
import t from 'tap';
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';

t.test('hot records keep fast properties; one receive record per link', async (t) => {
  const script = fileURLToPath(new URL('./hot-shapes-process.js', import.meta.url));
  const out = await new Promise<string>((resolve, reject) => {
    execFile(process.execPath, ['--allow-natives-syntax', script], { timeout: 60_000 }, (err, stdout, stderr) => {
      if (err) reject(new Error(`${err.message}\n${stderr}`));
      else resolve(stdout);
    });
  });
  const r = JSON.parse(out) as Record<string, unknown>;
  t.equal(r['done'], 32, 'every WRITE completed');
  t.equal(r['metaRecords'], 1, 'the initiator was handed one metadata record for all its ACKs');
  t.equal(r['fastMetas'], true, 'that record has fast properties');
  t.equal(r['packetRecords'], 1, "the target's QP was handed one parsed packet record for all the WRITEs");
  t.equal(r['fastPackets'], true, 'that record has fast properties');
  t.equal(r['fastReth'], true, 'so has its RETH record, with the VA in halves');
  t.equal(r['deviceCounters'], true, "the device's counters have fast properties");
  t.equal(r['linkCounters'], true, "the link's counters have fast properties");
  t.equal(r['qp'], true, 'the QP record has fast properties');
  t.equal(r['mr'], true, 'the memory region has fast properties');
});

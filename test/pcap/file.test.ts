import t from 'tap';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openPcapFile, readCaptureFile } from '../../src/pcap/file.js';
import { readCapture } from '../../src/pcap/reader.js';
import { plain, readFixture } from './fixtures.js';

const dir = mkdtempSync(join(tmpdir(), 'roce-pcap-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));

t.test('openPcapFile writes pcap and pcapng files that read back', async (t) => {
  const frames = [...readCapture(readFixture('imm_ud.pcap'))];
  const a = await openPcapFile(join(dir, 'a.pcap'));
  const b = await openPcapFile(join(dir, 'b.pcapng'), { format: 'pcapng', name: 'roce0' });
  for (const f of frames) {
    a.writer.writeFrame(f.timestampNs, f.data);
    b.writer.writeFrame(f.timestampNs, f.data, { direction: 'in' });
  }
  await a.close();
  await b.close();
  const want = frames.map(plain);
  t.same([...readCapture(readFileSync(a.path))].map(plain), want, 'pcap');
  t.same([...readCapture(readFileSync(b.path))].map(plain), want, 'pcapng');
  const streamed = [];
  for await (const r of readCaptureFile(b.path)) streamed.push(plain(r));
  t.same(streamed, want, 'readCaptureFile');
});

t.test('openPcapFile rejects a path it cannot create', async (t) => {
  await t.rejects(openPcapFile(join(dir, 'no', 'such', 'dir.pcap')), { code: 'ENOENT' });
});

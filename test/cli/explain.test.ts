/** `roce explain` as a user runs it: a real process, real files, exit codes and messages. */

import t from 'tap';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { readCapture } from '../../src/pcap/reader.js';
import { parseFrame } from '../../src/wire/frame.js';

const ROOT = join(import.meta.dirname, '../../..');
const CLI = join(ROOT, 'dist/src/cli/main.js');
const FIX = join(ROOT, 'test/fixtures/rxe');
const dir = mkdtempSync(join(tmpdir(), 'roce-explain-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));

function roce(...args: string[]) {
  const r = spawnSync(process.execPath, [CLI, ...args], { encoding: 'utf8', maxBuffer: 64 << 20 });
  return { code: r.status, out: r.stdout, err: r.stderr };
}

t.test('--frames 18-30 on rc_pingpong: those packets, then the summary; exit 0', async (t) => {
  const r = roce('explain', join(FIX, 'rc_pingpong.pcap'), '--frames', '18-30');
  t.equal(r.code, 0, r.err);
  t.equal(r.err, '');
  const heads = r.out.split('\n').filter((l) => l.startsWith('#'));
  t.same(heads.map((l) => Number(/^#(\d+)/.exec(l)![1])), [18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30]);
  t.match(r.out, /^#18 {2}\+0\.000000 s {2}10\.77\.0\.3 → 10\.77\.0\.2 {2}RC_SEND_FIRST qp=0x000011 psn=0x5d2907 payload=1024\n {4}SEND First/);
  t.match(r.out, '    ACK for PSNs up to 0x5d290a, MSN 1: acknowledges PSNs 0x5d2907–0x5d290a (4 packets, frames 18–21)');
  t.match(r.out, /\nSummary: 200 RoCEv2 packets in frames 18–217/);
});

t.test('whole captures: the key sentences', async (t) => {
  const loss = roce('explain', join(FIX, 'loss_write_bw.pcap'), '--frames', '70-77');
  t.equal(loss.code, 0, loss.err);
  t.match(loss.out, 'NAK PSN sequence error: the responder expected PSN 0x106196');
  t.match(loss.out, 'Retransmission of PSN 0x106197 (message 6, packet 2), first sent in frame 70: go-back-N after the NAK in frame 74');
  const rnr = roce('explain', join(FIX, 'rnr_rc.pcap'), '--frames', '12-13');
  t.match(rnr.out, 'wait at least 20.48 ms');
  t.match(rnr.out, 'Retry 1 of PSN 0x7ae173');
  const rping = roce('explain', join(FIX, 'rping.pcap'), '--frames', '4-6,247-');
  for (const a of ['ConnectRequest', 'ConnectReply', 'ReadyToUse', 'DisconnectRequest', 'DisconnectReply']) t.match(rping.out, `attribute ${a}`);
  const v6 = roce('explain', join(FIX, 'v6_rc_pingpong.pcap'), '--frames', '28', '--icrc', 'recover');
  t.equal(v6.code, 0, v6.err);
  t.match(v6.out, 'fd77::3 → fd77::2');
});

t.test('a corrupted packet: exit 1 when printed, 0 when not', async (t) => {
  const bytes = new Uint8Array(readFileSync(join(FIX, 'rnr_rc.pcap')));
  const roceAt = [...readCapture(bytes)].flatMap((rec) => {
    const f = parseFrame(rec.linkType, rec.data);
    return f.ok && f.frame.udp.dstPort === 4791 ? [{ frame: rec.frame, off: rec.data.byteOffset + f.frame.payloadOffset + (f.frame.payloadLength >> 1) }] : [];
  });
  const target = roceAt[2]!;
  const bad = bytes.slice();
  bad[target.off]! ^= 0x01;
  const file = join(dir, 'bad.pcap');
  writeFileSync(file, bad);
  const r = roce('explain', file);
  t.equal(r.code, 1);
  t.match(r.out, 'ICRC bad');
  t.equal(roce('explain', file, '--icrc', 'off').code, 0, 'with --icrc off nothing is judged');
  t.equal(roce('explain', file, '--frames', String(target.frame + 1)).code, 0, 'the bad packet is not among the printed ones');
});

t.test('bad input: exit 2, one line on stderr, no stack trace', async (t) => {
  const junk = join(dir, 'junk.pcap');
  writeFileSync(junk, 'this is not a capture at all, just text that goes on for a while');
  const cases: [string[], RegExp][] = [
    [['explain'], /^roce explain: usage: roce explain FILE/],
    [['explain', join(dir, 'missing.pcap')], /^roce explain: cannot read .*missing\.pcap: ENOENT$/],
    [['explain', junk], /^roce explain: .*junk\.pcap: not a readable capture: /],
    [['explain', join(FIX, 'rc_pingpong.pcap'), '--frames', 'x'], /^roce explain: --frames: 'x' is not N, N-M, N- or a comma-separated list of them$/],
    [['explain', join(FIX, 'rc_pingpong.pcap'), '--frames', '30-20'], /^roce explain: --frames: '30-20' is an empty range/],
    [['explain', join(FIX, 'rc_pingpong.pcap'), '--icrc', 'maybe'], /^roce explain: --icrc must be strict, recover or off, not 'maybe'$/],
    [['explain', join(FIX, 'rc_pingpong.pcap'), '--port', '70000'], /^roce explain: --port must be a UDP port number/],
    [['explain', join(FIX, 'rc_pingpong.pcap'), '--bogus'], /^roce explain: Unknown option '--bogus'/],
  ];
  for (const [args, want] of cases) {
    const r = roce(...args);
    t.equal(r.code, 2, args.join(' '));
    t.equal(r.out, '', args.join(' '));
    const lines = r.err.trimEnd().split('\n');
    t.equal(lines.length, 1, `one line: ${r.err}`);
    t.match(lines[0]!, want);
    t.notMatch(r.err, /\n\s+at /);
  }
});

t.test('another port: no RoCEv2 packets, exit 0', async (t) => {
  const r = roce('explain', join(FIX, 'rc_pingpong.pcap'), '--port', '4792');
  t.equal(r.code, 0, r.err);
  t.equal(r.out.trim(), 'No RoCEv2 packets in this capture.');
});

t.test('listed in roce --help', async (t) => {
  const r = roce('--help');
  t.match(r.out, /explain +walk a capture packet by packet in plain words/);
});

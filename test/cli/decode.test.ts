/** `roce decode` as a user runs it: a real process, real files, exit codes and messages. */

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
const dir = mkdtempSync(join(tmpdir(), 'roce-decode-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));

function roce(...args: string[]) {
  const r = spawnSync(process.execPath, [CLI, ...args], { encoding: 'utf8', maxBuffer: 64 << 20 });
  return { code: r.status, out: r.stdout, err: r.stderr };
}

t.test('a good capture: one line per RoCEv2 packet, exit 0', async (t) => {
  const r = roce('decode', join(FIX, 'rc_pingpong.pcap'));
  t.equal(r.code, 0, r.err);
  const lines = r.out.trimEnd().split('\n');
  t.equal(lines.length, 200, 'the 200 RoCEv2 frames, and not the ARP/TCP ones');
  t.match(lines[0]!, /^\s+\d+ 10\.77\.0\.\d:\d+ > 10\.77\.0\.\d RC_SEND_FIRST qp=0x0000\d\d psn=0x[0-9a-f]{6} payload=1024 icrc=ok$/);
  t.ok(lines.every((l) => l.endsWith('icrc=ok')));
});

t.test('--json: every BTH field by name, extension headers as objects', async (t) => {
  const r = roce('decode', join(FIX, 'read_bw.pcap'), '--json', '--icrc', 'recover');
  t.equal(r.code, 0, r.err);
  const recs = r.out.trim().split('\n').map((l) => JSON.parse(l));
  t.equal(recs.length, 1300);
  const req = recs.find((o) => o.opname === 'RC_RDMA_READ_REQUEST');
  t.match(req, {
    frame: Number, src: '10.77.0.3', dst: '10.77.0.2', sport: Number, dport: 4791, opcode: 12, transport: 'RC',
    se: false, m: false, padCount: 0, tver: 0, pkey: 0xffff, fecn: false, becn: false, destQp: Number, ackReq: true, psn: Number,
    reth: { va: /^0x[0-9a-f]{16}$/, rkey: Number, dmaLength: 65536 }, payloadLength: 0,
    icrc: { value: Number, status: 'ok-recovered', ipId: Number },
  });
  const first = recs.find((o) => o.opname === 'RC_RDMA_READ_RESPONSE_FIRST');
  t.match(first.aeth, { syndrome: 0x1f, kind: 'ACK', msn: Number, creditCode: 31 });
  t.equal(first.payloadLength, 1024);
});

t.test('a corrupted packet: reported bad, exit 1', async (t) => {
  const bytes = new Uint8Array(readFileSync(join(FIX, 'rnr_rc.pcap')));
  // Flip one bit in the middle of the 3rd RoCEv2 packet's payload (inside the ICRC's coverage).
  const roceAt = [...readCapture(bytes)].flatMap((rec) => {
    const f = parseFrame(rec.linkType, rec.data);
    return f.ok && f.frame.udp.dstPort === 4791 ? [rec.data.byteOffset + f.frame.payloadOffset + (f.frame.payloadLength >> 1)] : [];
  });
  const bad = bytes.slice();
  bad[roceAt[2]!]! ^= 0x01;
  writeFileSync(join(dir, 'bad.pcap'), bad);
  const r = roce('decode', join(dir, 'bad.pcap'));
  t.equal(r.code, 1);
  t.match(r.out, /icrc=bad/);
  t.equal(r.out.trim().split('\n').filter((l) => l.endsWith('icrc=bad')).length, 1, 'exactly the one packet');
  t.equal(roce('decode', join(dir, 'bad.pcap'), '--icrc', 'off').code, 0, 'with --icrc off nothing is judged');
});

t.test('a malformed transport packet: MALFORMED line, exit 1', async (t) => {
  const bytes = new Uint8Array(readFileSync(join(FIX, 'imm_ud.pcap')));
  // Set TVer of every RoCEv2 packet to 1: BTH byte 1 is 42 bytes into each Ethernet/IPv4/UDP frame.
  const marker = [0x11, 0x12, 0xb7]; // dst port 4791 (0x12b7) preceded by protocol-agnostic search
  let n = 0;
  for (let i = 0; i + 4 < bytes.length; i++) {
    if (bytes[i] === 0x12 && bytes[i + 1] === 0xb7 && bytes[i - 2] !== undefined && i >= 36) {
      bytes[i + 6 + 1]! |= 0x01; // UDP dst port at 36..37 of the frame; BTH byte 1 is 7 bytes later
      n++;
    }
  }
  t.ok(n >= 3 && marker.length === 3);
  writeFileSync(join(dir, 'tver.pcap'), bytes);
  const r = roce('decode', join(dir, 'tver.pcap'));
  t.equal(r.code, 1);
  t.match(r.out, /MALFORMED BAD_TVER/);
});

t.test('unreadable input: one line, exit 2, no stack trace', async (t) => {
  writeFileSync(join(dir, 'junk.pcap'), 'this is not a capture at all');
  const cases: [string[], RegExp][] = [
    [['decode', join(dir, 'missing.pcap')], /^roce decode: cannot read .*missing\.pcap: ENOENT\n$/],
    [['decode', join(dir, 'junk.pcap')], /^roce decode: .*junk\.pcap: not a readable capture: .+\n$/],
    [['decode', dir], /^roce decode: cannot read .*: EISDIR\n$/],
    [['decode', join(FIX, 'rc_pingpong.pcap'), '--icrc', 'maybe'], /^roce decode: --icrc must be strict, recover or off, not 'maybe'\n$/],
    [['decode', join(FIX, 'rc_pingpong.pcap'), '--port', '99999'], /^roce decode: --port must be a UDP port number/],
    [['decode', join(FIX, 'rc_pingpong.pcap'), '--bogus'], /^roce decode: Unknown option '--bogus'/],
    [['decode'], /^roce decode: usage: roce decode FILE/],
    [['frobnicate'], /^roce: unknown command 'frobnicate'/],
  ];
  for (const [args, re] of cases) {
    const r = roce(...args);
    t.equal(r.code, 2, args.join(' '));
    t.match(r.err, re, args.join(' '));
    t.notMatch(r.err, /\n\s+at /, 'no stack trace');
    t.equal(r.out, '', 'nothing on stdout');
  }
  // A capture cut in the middle of a record is a truncated capture, not a crash.
  const whole = readFileSync(join(FIX, 'rc_pingpong.pcap'));
  writeFileSync(join(dir, 'cut.pcap'), whole.subarray(0, 5000));
  const r = roce('decode', join(dir, 'cut.pcap'));
  t.equal(r.code, 2);
  t.match(r.err, /not a readable capture/);
});

t.test('--port selects RoCEv2 by destination port only', async (t) => {
  const r = roce('decode', join(FIX, 'rc_pingpong.pcap'), '--port', '18515');
  // The TCP exchange on 18515 is not UDP: nothing is RoCEv2 on that port.
  t.equal(r.code, 0);
  t.equal(r.out, '');
});

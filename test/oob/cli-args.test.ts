// Argument parsing of `roce pingpong` and `roce perf`, and the tools' result lines.
import t from 'tap';
import { CliError } from '../../src/cli/errors.js';
import { formatPingpongSummary, parsePingpongArgs } from '../../src/cli/pingpong-args.js';
import {
  PERF_RESULT_FMT, PERF_RESULT_LINE, computePerfReport, formatPerfAddress, formatPerfReportHeader, formatPerfReportLine,
  formatPerfTitle, parsePerfArgs,
} from '../../src/cli/perf-args.js';

const v4gid = (last: number): Uint8Array => new Uint8Array([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, last]);

t.test('pingpong: defaults and flags', async (t) => {
  t.same(parsePingpongArgs([]), { transport: 'rc', port: 18515, ibPort: 1, gidIndex: -1, size: 4096, iters: 1000, mtu: 1024, rxDepth: 500, sl: 0, events: false });
  t.same(parsePingpongArgs(['10.77.0.2', '-d', 'rxe0', '-g', '1', '-n', '20', '-s', '0x1000', '-m', '4096', '-p', '18600', '-i', '1', '-r', '100', '-l', '3', '-e', '--transport', 'uc']), {
    transport: 'uc', port: 18600, ibPort: 1, gidIndex: 1, size: 4096, iters: 20, mtu: 4096, rxDepth: 100, sl: 3, events: true, host: '10.77.0.2', ibDev: 'rxe0',
  });
  t.equal(parsePingpongArgs(['--transport', 'ud']).size, 2048, 'ud_pingpong defaults to 2048 bytes (ud_pingpong.c)');
  t.equal(parsePingpongArgs(['--transport', 'ud', '-s', '0']).size, 0, 'ud_pingpong runs -s 0');
  t.equal(parsePingpongArgs(['--transport', 'ud', '-s0']).size, 0, '-s0');
  t.equal(parsePingpongArgs(['--transport=ud', '--size=0x0']).size, 0, '--size=0x0');
  t.throws(() => parsePingpongArgs(['-s', '0']), { code: 'ERR_CLI', message: /ibv_rc_pingpong cannot run 0-byte messages/ }, 'rc -s 0: refused as the tool fails');
  t.throws(() => parsePingpongArgs(['--transport', 'uc', '-s', '0']), { code: 'ERR_CLI', message: /ibv_uc_pingpong/ }, 'uc -s 0: refused');
  t.throws(() => parsePingpongArgs(['--transport', 'ud', '--size=-1']), { code: 'ERR_CLI' }, 'a negative size');
  t.equal(parsePingpongArgs(['--gid-idx=2', '--iters=5']).gidIndex, 2);
  const bad = [['-m', '1000'], ['--transport', 'rd'], ['--transport', 'ud', '-m', '1024'], ['-n', 'many'], ['-p', '70000'], ['a', 'b'], ['--transport', 'ud', '-s', '8192'], ['-x', '1']];
  for (const argv of bad) t.throws(() => parsePingpongArgs(argv), argv.join(' '));
  t.throws(() => parsePingpongArgs(['-m', '1000']), { code: 'ERR_CLI' });
  t.ok(new CliError('x') instanceof Error);
});

t.test('pingpong summary lines (rc_pingpong.c printf formats)', async (t) => {
  // 20 × 4096-byte pingpongs in 90 ms (the lab's hostpeer run printed "20 iters in 0.09 seconds").
  t.same(formatPingpongSummary({ size: 4096, iters: 20, usec: 90000 }), [
    '163840 bytes in 0.09 seconds = 14.56 Mbit/sec',
    '20 iters in 0.09 seconds = 4500.00 usec/iter',
  ]);
  t.same(formatPingpongSummary({ size: 4096, iters: 1000, usec: 1234567 }), [
    '8192000 bytes in 1.23 seconds = 53.08 Mbit/sec',
    '1000 iters in 1.23 seconds = 1234.57 usec/iter',
  ]);
});

t.test('perf: defaults, flags and perftest\'s refusals', async (t) => {
  t.same(parsePerfArgs(['write']), {
    verb: 'write', port: 18515, ibPort: 1, gidIndex: -1, size: 65536, iters: 5000, connection: 'RC', atomicType: 'FETCH_AND_ADD',
    txDepth: 128, outReads: 0, qps: 1, sl: 0, qpTimeout: 14, reportGbits: false,
  });
  const a = parsePerfArgs(['atomic', '10.77.0.2', '-d', 'rxe0', '-x', '1', '-n', '5', '-A', 'CMP_AND_SWAP', '-o', '16', '-F']);
  t.equal(a.size, 8);
  t.equal(a.iters, 5);
  t.equal(a.txDepth, 5, 'tx depth is cut to the iterations, as perftest does');
  t.equal(a.atomicType, 'CMP_AND_SWAP');
  t.equal(a.host, '10.77.0.2');
  t.equal(a.outReads, 16);
  t.equal(parsePerfArgs(['send', '-c', 'UD', '-s', '1024', '-m', '1024']).connection, 'UD');
  t.equal(parsePerfArgs(['read']).iters, 1000);
  t.equal(parsePerfArgs(['write', '-m', '256']).mtu, 256);
  t.equal(parsePerfArgs(['write', '--report_gbits']).reportGbits, true);
  const bad: [string[], RegExp][] = [
    [[], /write, read, send or atomic/],
    [['rping'], /not 'rping'/],
    [['read', '-c', 'UC'], /UC connection not possible in READ\/ATOMIC verbs/],
    [['write', '-c', 'UD'], /UD connection only possible in SEND verb/],
    [['atomic', '-s', '16'], /Message size cannot be changed for Atomic tests/],
    [['write', '-A', 'CMP_AND_SWAP'], /atomic only/],
    [['atomic', '-A', 'SWAP'], /CMP_AND_SWAP or FETCH_AND_ADD/],
    [['write', '-n', '4'], /between 5 and/],
    [['send', '-c', 'UD', '-s', '2048', '-m', '1024'], /UD cannot be greater than MTU/],
    [['write', '-o', '4'], /read and atomic only/],
    [['write', 'h1', 'h2'], /at most one HOST/],
    [['write', '-m', '9000'], /256, 512/],
  ];
  for (const [argv, re] of bad) t.throws(() => parsePerfArgs(argv), re, argv.join(' '));
});

t.test('perf output lines, as the tools printed them in the lab', async (t) => {
  // ib_write_bw -d rxe0 -x 1 -n 5 -s 64 (both sides printed these):
  t.equal(formatPerfTitle('write'), '                    RDMA_Write BW Test');
  t.equal(formatPerfTitle('atomic'), '                    Atomic FETCH_AND_ADD BW Test');
  t.equal(formatPerfTitle('send'), '                    Send BW Test');
  t.same(formatPerfReportHeader(), [PERF_RESULT_LINE, PERF_RESULT_FMT]);
  t.equal(PERF_RESULT_LINE, '---------------------------------------------------------------------------------------');
  t.equal(PERF_RESULT_FMT, ' #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]');
  const rep = { size: 64n, iters: 5n, bwPeak: 0.036718, bwAvg: 0.019357, msgRateAvg: 0.000317159 };
  t.equal(formatPerfReportLine(rep), ' 64         5                0.04               0.02   \t\t   0.000317');
  // ib_atomic_bw: " 8          5                0.01               0.01   \t\t   0.000902"
  t.equal(formatPerfReportLine({ size: 8n, iters: 5n, bwPeak: 0.0069, bwAvg: 0.0069, msgRateAvg: 0.000902 }), ' 8          5                0.01               0.01   \t\t   0.000902');
  t.equal(formatPerfReportLine({ size: 65536n, iters: 1000n, bwPeak: 1234.567, bwAvg: 999.999, msgRateAvg: 0.016 }), ' 65536      1000             1234.57            1000.00\t\t   0.016000');
  t.equal(formatPerfReportLine({ size: 64n, iters: 5n, bwPeak: 0.0004, bwAvg: 0.0002, msgRateAvg: 0.0003 }, true),
    ' 64         5           0.000400            0.000200            0.000300');
  const c = computePerfReport(65536, 20, 0.1);
  t.equal(c.bwAvg, (65536 * 20) / (0.1 * 1048576));
  t.equal(c.msgRateAvg, 20 / (0.1 * 1e6));
  // " local address: LID 0000 QPN 0x0015 PSN 0x4b839e RKey 0x00067b VAddr 0x005566dbb70000"
  const k = { lid: 0, outReads: 1, qpn: 0x15, psn: 0x4b839e, rkey: 0x67b, vaddr: 0x5566dbb70000n, gid: v4gid(2), srqn: 0 };
  t.same(formatPerfAddress('local', 'write', k), [
    ' local address: LID 0000 QPN 0x0015 PSN 0x4b839e RKey 0x00067b VAddr 0x005566dbb70000',
    ' GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:77:00:02',
  ]);
  // ib_read_bw's client: " remote address: LID 0000 QPN 0x0026 PSN 0x70806e OUT 0x01 RKey 0x001690 VAddr 0x00562bead53000"
  t.equal(formatPerfAddress('remote', 'read', { ...k, qpn: 0x26, psn: 0x70806e, rkey: 0x1690, vaddr: 0x562bead53000n })[0],
    ' remote address: LID 0000 QPN 0x0026 PSN 0x70806e OUT 0x01 RKey 0x001690 VAddr 0x00562bead53000');
  // ib_send_bw / ib_atomic_bw: " local address: LID 0000 QPN 0x001a PSN 0x6d1858"
  t.equal(formatPerfAddress('local', 'send', { ...k, qpn: 0x1a, psn: 0x6d1858 })[0], ' local address: LID 0000 QPN 0x001a PSN 0x6d1858');
  t.equal(formatPerfAddress('local', 'atomic', { ...k, qpn: 0x1c, psn: 0x42658d })[0], ' local address: LID 0000 QPN 0x001c PSN 0x42658d');
});

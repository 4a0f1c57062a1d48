/**
 * Our capture writers against Wireshark: RoCEv2 payloads from the rxe captures are rewrapped by
 * `writeRoce` into pcap and pcapng files, and tshark must open them, dissect every frame as
 * InfiniBand exactly as it dissects the original capture, find no malformed frames, and report
 * the IPv4 header checksum (and the IPv6 UDP checksum) good. Needs tshark; fails without it.
 */
import t from 'tap';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { readCapture } from '../../src/pcap/reader.js';
import { PcapngWriter, PcapWriter, type RoceFrameOptions } from '../../src/pcap/writer.js';
import { formatIpAddress, parseFrame } from '../../src/wire/frame.js';
import { readFixture, rxeFixtureDir } from '../pcap/fixtures.js';
import { tsharkJson } from './tshark.js';

const dir = mkdtempSync(join(tmpdir(), 'roce-tshark-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));

const CHECK = ['-o', 'ip.check_checksum:TRUE', '-o', 'udp.check_checksum:TRUE'];
/** Wireshark's checksum status values. */
const GOOD = '1';
const BAD = '0';
/** Wireshark's expert severity for warnings; errors and malformed frames are above it. */
const PI_WARN = 0x00600000;

interface Sample {
  /** The frame number in its fixture, to dissect the original for comparison. */
  readonly file: string;
  readonly frame: number;
  readonly timestampNs: bigint;
  readonly addr: RoceFrameOptions;
  readonly payload: Uint8Array;
}

/** The first `n` RoCEv2 frames of a fixture, with what it takes to rebuild them. */
function samples(file: string, n: number): Sample[] {
  const out: Sample[] = [];
  for (const rec of readCapture(readFixture(file))) {
    const p = parseFrame(rec.linkType, rec.data);
    if (!p.ok || p.frame.udp.dstPort !== 4791) continue;
    const f = p.frame;
    // Same IP ID, TTL, TOS, flow label and ports as rxe sent, so even the ICRC still holds.
    const addr: RoceFrameOptions =
      f.ip.family === 4
        ? { src: f.ip.src, dst: f.ip.dst, srcPort: f.udp.srcPort, ipId: f.ip.id, ttl: f.ip.ttl, tos: f.ip.tos }
        : { src: f.ip.src, dst: f.ip.dst, srcPort: f.udp.srcPort, ttl: f.ip.hopLimit, tos: f.ip.trafficClass, flowLabel: f.ip.flowLabel };
    out.push({ file, frame: rec.frame, timestampNs: rec.timestampNs, addr, payload: rec.data.subarray(f.payloadOffset, f.payloadOffset + f.payloadLength) });
    if (out.length === n) break;
  }
  return out;
}

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

/** Problems tshark reports in one frame: malformed, or any expert item at warning level or above. */
function problems(pkt: unknown): string[] {
  const out: string[] = [];
  if (valuesOf(pkt, '_ws.malformed').length > 0) out.push('malformed');
  for (const s of valuesOf(pkt, '_ws.expert.severity')) if (Number(s) >= PI_WARN) out.push(`expert severity ${String(s)}: ${JSON.stringify(valuesOf(pkt, '_ws.expert.message'))}`);
  return out;
}

function epoch(ns: bigint): string {
  return `${ns / 1_000_000_000n}.${(ns % 1_000_000_000n).toString().padStart(9, '0')}`;
}

type Pkt = any;
const layers = (p: Pkt): Record<string, Pkt> => p._source.layers;

/** tshark's InfiniBand dissection of the original frames, by "file#frame". */
async function originals(list: readonly Sample[]): Promise<Map<string, string>> {
  const out = new Map<string, string>();
  for (const file of new Set(list.map((s) => s.file))) {
    const frames = list.filter((s) => s.file === file).map((s) => s.frame);
    const pkts = await tsharkJson(join(rxeFixtureDir(), file), ['-Y', frames.map((n) => `frame.number == ${n}`).join(' || ')]);
    for (const p of pkts) out.set(`${file}#${String(layers(p)['frame']['frame.number'])}`, JSON.stringify(layers(p)['infiniband']));
  }
  return out;
}

const V4 = samples('rc_pingpong.pcap', 4);
const V6 = samples('v6_rc_pingpong.pcap', 2);
const READS = samples('read_bw.pcap', 2);
const ALL = [...V4, ...READS, ...V6];

t.test('pcap (µs): tshark decodes every rewrapped RoCEv2 frame, checksums good', async (t) => {
  t.equal(ALL.length, 8, 'samples found');
  const chunks: Uint8Array[] = [];
  const w = new PcapWriter((c) => chunks.push(c));
  for (const s of ALL) w.writeRoce(s.timestampNs, s.addr, [s.payload.subarray(0, 5), s.payload.subarray(5)]);
  // One more with an 802.1Q tag, which Wireshark must see through.
  const tagged = V4[0];
  if (tagged !== undefined) w.writeRoce(tagged.timestampNs, { ...tagged.addr, vlanTci: 0x2005 }, tagged.payload);
  const file = join(dir, 'roce.pcap');
  const bytes = Buffer.concat(chunks);
  writeFileSync(file, bytes);

  const pkts = await tsharkJson(file, CHECK);
  t.equal(pkts.length, ALL.length + 1, 'tshark sees every frame');
  const orig = await originals(ALL);
  pkts.forEach((p: Pkt, i: number) => {
    const s = ALL[i] ?? tagged;
    if (s === undefined) return;
    const l = layers(p);
    const name = `frame ${i + 1} (${s.file} #${s.frame})`;
    t.same(problems(p), [], `${name}: no malformed or expert problems`);
    t.match(l['frame']['frame.protocols'], /:udp:infiniband/, `${name}: dissected as RoCEv2`);
    t.equal(l['udp']['udp.dstport'], '4791');
    t.equal(l['frame']['frame.time_epoch'], epoch((s.timestampNs / 1000n) * 1000n), `${name}: timestamp`);
    t.equal(JSON.stringify(l['infiniband']), orig.get(`${s.file}#${s.frame}`), `${name}: same InfiniBand dissection as the rxe original`);
    if (s.addr.src.length === 4) {
      t.equal(l['ip']['ip.checksum.status'], GOOD, `${name}: IPv4 header checksum good`);
      t.equal(l['ip']['ip.src'], formatIpAddress(s.addr.src));
      t.equal(l['ip']['ip.dst'], formatIpAddress(s.addr.dst));
    } else {
      t.equal(l['udp']['udp.checksum_tree']?.['udp.checksum.status'] ?? l['udp']['udp.checksum.status'], GOOD, `${name}: IPv6 UDP checksum good`);
      t.equal(l['ipv6']['ipv6.src'], formatIpAddress(s.addr.src));
    }
  });
  t.ok(valuesOf(pkts[ALL.length], 'vlan.id').includes('5'), 'VLAN id 5 decoded');

  // Control: the same file with one IPv4 checksum byte broken must be reported bad, so the checks
  // above are not vacuous.
  const broken = Uint8Array.from(bytes);
  const firstIpChecksum = 24 + 16 + 14 + 10;
  broken[firstIpChecksum] = (broken[firstIpChecksum] ?? 0) ^ 0x01;
  const bad = join(dir, 'broken.pcap');
  writeFileSync(bad, broken);
  const badPkts = await tsharkJson(bad, CHECK);
  t.equal(layers(badPkts[0])['ip']['ip.checksum.status'], BAD, 'a broken checksum is reported bad');
  t.not(problems(badPkts[0]).length, 0, 'and flagged as an expert error');
});

t.test('pcapng (ns): two interfaces (Ethernet, raw IP), direction flags, comments', async (t) => {
  const chunks: Uint8Array[] = [];
  const w = new PcapngWriter((c) => chunks.push(c), { name: 'roce0' });
  const raw = w.addInterface({ linkType: 101, name: 'raw0', precision: 'us' });
  const base = 1_700_000_000_123_456_789n;
  ALL.forEach((s, i) =>
    w.writeRoce(base + BigInt(i), s.addr, s.payload, { interfaceId: i % 2 === 0 ? 0 : raw, direction: i % 2 === 0 ? 'out' : 'in', comment: `sample ${i}` }),
  );
  const file = join(dir, 'roce.pcapng');
  writeFileSync(file, Buffer.concat(chunks));
  const pkts = await tsharkJson(file, CHECK);
  t.equal(pkts.length, ALL.length);
  pkts.forEach((p: Pkt, i: number) => {
    const l = layers(p);
    const s = ALL[i];
    if (s === undefined) return;
    const onEth = i % 2 === 0;
    const name = `frame ${i + 1}`;
    t.same(problems(p), [], `${name}: no problems`);
    t.equal(l['frame']['frame.interface_id'], onEth ? '0' : '1', `${name}: interface`);
    t.equal(l['frame']['frame.encap_type'], onEth ? '1' : '7', `${name}: Ethernet or raw IP`);
    t.match(l['frame']['frame.protocols'], /:udp:infiniband/, `${name}: dissected as RoCEv2`);
    t.equal(l['frame']['frame.time_epoch'], epoch(onEth ? base + BigInt(i) : ((base + BigInt(i)) / 1000n) * 1000n), `${name}: timestamp at the interface's resolution`);
    t.equal(l['frame']['frame.packet_flags_tree']?.['frame.packet_flags_direction'], onEth ? '0x00000002' : '0x00000001', `${name}: direction`);
    t.equal(l['pkt_comment']?.['frame.comment'], `sample ${i}`, `${name}: comment`);
    if (s.addr.src.length === 4) t.equal(l['ip']['ip.checksum.status'], GOOD, `${name}: IPv4 checksum good`);
  });
});

t.test('classic pcap with ns timestamps opens with exact times', async (t) => {
  const chunks: Uint8Array[] = [];
  const w = new PcapWriter((c) => chunks.push(c), { precision: 'ns' });
  const s = V4[0];
  if (s === undefined) throw new Error('no sample');
  w.writeRoce(1_600_000_000_000_000_001n, s.addr, s.payload);
  const file = join(dir, 'ns.pcap');
  writeFileSync(file, Buffer.concat(chunks));
  const [p] = await tsharkJson(file, CHECK);
  t.equal(layers(p)['frame']['frame.time_epoch'], '1600000000.000000001');
  t.same(problems(p), []);
});

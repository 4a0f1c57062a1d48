/**
 * Runs tshark for the interop tests. There is no skip: a missing tshark is an error that says how
 * to install it, so `npm run test:interop` fails on a machine without it.
 */
import { execFile } from 'node:child_process';

/** tshark's output can be large (JSON of a whole capture). */
const MAX_OUTPUT = 512 * 1024 * 1024;

export class TsharkMissingError extends Error {
  override readonly name = 'TsharkMissingError';
  constructor() {
    super('tshark is not installed (or not on PATH): install the Debian package `tshark` (apt-get install -y tshark)');
  }
}

/** Runs `tshark ...args` and returns its stdout; rejects on a missing binary or a non-zero exit. */
export function tshark(args: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile('tshark', args, { maxBuffer: MAX_OUTPUT, encoding: 'utf8', env: { ...process.env, LC_ALL: 'C' } }, (err, stdout, stderr) => {
      if (err !== null) {
        if ((err as NodeJS.ErrnoException).code === 'ENOENT') reject(new TsharkMissingError());
        else reject(new Error(`tshark ${args.join(' ')} failed (${String(err.code ?? err.signal)}): ${stderr.trim()}`));
        return;
      }
      resolve(stdout);
    });
  });
}

/**
 * `tshark -r FILE -T json [...extraArgs]`, parsed: one element per frame, each
 * `{ _source: { layers: { frame: {...}, eth: {...}, ... } } }`.
 */
export async function tsharkJson(file: string, extraArgs: string[] = []): Promise<any[]> {
  const out = await tshark(['-r', file, '-T', 'json', ...extraArgs]);
  const parsed: unknown = JSON.parse(out.trim() === '' ? '[]' : out);
  if (!Array.isArray(parsed)) throw new Error(`tshark -T json on ${file} did not give an array`);
  return parsed;
}

/** Flattens a tshark JSON layer tree into field → value (first occurrence wins). */
export function flatten(o: unknown, into: Map<string, string> = new Map()): Map<string, string> {
  if (o && typeof o === 'object') {
    for (const [k, v] of Object.entries(o as Record<string, unknown>)) {
      if (typeof v === 'string') {
        if (!into.has(k)) into.set(k, v);
      } else flatten(v, into);
    }
  }
  return into;
}

/**
 * Wireshark guesses what an InfiniBand payload carries (heuristics, and EoIB for UD), and a test
 * payload of 0x7b bytes or none sets some off: a 1-byte SEND becomes a truncated RPC-over-RDMA
 * header, an empty UD SEND a truncated EoIB frame, rxe's frames and ours alike. The payload is
 * opaque data, so the protocols that would claim it are switched off.
 */
export const NO_HEURISTICS = ['rpcordma', 'infiniband.eoib', 'smb_direct', 'smc', 'nvme-rdma', 'lnet', 'iser', 'infiniband_sdp', 'fcoib']
  .flatMap((p) => ['--disable-protocol', p]);

/** A frame tshark finds wrong in a RoCEv2 capture, with what tells which cell it belongs to. */
export interface RoceProblem {
  /** Capture time, nanoseconds since the epoch. */
  timeNs: bigint;
  family: 4 | 6;
  /** `frame N: protocols expert messages`. */
  text: string;
}

/**
 * Problems tshark sees in a RoCEv2 capture: malformed frames, RoCEv2 frames it does not dissect as
 * InfiniBand, and expert warnings, except rxe's IPv6 UDP checksum 0 (it always sends 0; Wireshark
 * flags that).
 */
export async function roceProblems(pcap: string): Promise<RoceProblem[]> {
  const frames = await tsharkJson(pcap, [
    '-Y', '_ws.malformed || (udp.dstport == 4791 && !infiniband) || ' +
      '(udp.dstport == 4791 && _ws.expert.severity >= warning && !(ipv6 && udp.checksum == 0))',
    '-e', 'frame.number', '-e', 'frame.time_epoch', '-e', 'frame.protocols', '-e', '_ws.expert.message',
    ...NO_HEURISTICS,
  ]);
  return frames.map((p) => {
    const l = p._source.layers as Record<string, string[] | undefined>;
    const protocols = l['frame.protocols']?.[0] ?? '';
    return {
      timeNs: BigInt(Math.round(Number(l['frame.time_epoch']?.[0] ?? '0') * 1e6)) * 1000n,
      family: protocols.includes(':ipv6:') ? 6 : 4,
      text: `frame ${l['frame.number']?.[0]}: ${protocols} ${(l['_ws.expert.message'] ?? []).join('; ')}`,
    };
  });
}

/**
 * The RoCEv2 frames tshark counts in a capture, or -1 if its statistics cannot be read. Not the
 * ICMP errors that quote a RoCEv2 datagram (tshark dissects the quoted UDP header): a side that
 * gave up makes the host answer the other's late packets with port-unreachables.
 */
export async function roceFrameCount(pcap: string): Promise<number> {
  const out = await tshark(['-r', pcap, '-q', '-z', 'io,stat,0,udp.dstport==4791 && !icmp && !icmpv6']);
  // "|  0.0 <> 27.3 |  49152 | 16416768 |": the frames column of the one interval.
  const m = /<>\s*\S+\s*\|\s*(\d+)\s*\|/.exec(out);
  return m ? Number(m[1]) : -1;
}

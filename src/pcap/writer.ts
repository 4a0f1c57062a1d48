/**
 * Capture writers: classic pcap and pcapng over a sink, so a capture can go to a file stream, to
 * memory, or anywhere else. Pure; no `node:*` imports (see `file.ts` for files).
 *
 * Every call hands the sink exactly one freshly allocated chunk (a whole header or record) that
 * the writer never touches again, so a sink may queue it without copying. Frames are copied into
 * that chunk, so callers may reuse their buffers as soon as `writeFrame` returns.
 *
 * `writeRoce` wraps a RoCEv2 UDP payload (BTH … ICRC) in synthetic Ethernet/IP/UDP headers with
 * destination port 4791, which is what makes Wireshark's RoCEv2 dissector pick the frame up.
 */

import { ROCEV2_UDP_PORT } from '../wire/constants.js';
import { type EmitLinkType, LinkType, type UdpFrameOptions, emitUdpFrame, udpFrameLength } from '../wire/frame.js';
import {
  MAX_CAPTURE_BLOCK,
  PCAP_GLOBAL_HEADER_LEN,
  PCAP_RECORD_HEADER_LEN,
  PCAPNG_BLOCK_EPB,
  PCAPNG_BLOCK_IDB,
  PCAPNG_BLOCK_SHB,
  PCAPNG_BYTE_ORDER_MAGIC,
  PCAPNG_OPT_COMMENT,
  PCAPNG_OPT_ENDOFOPT,
  PCAPNG_OPT_EPB_FLAGS,
  PCAPNG_OPT_IF_NAME,
  PCAPNG_OPT_IF_TSRESOL,
  PCAPNG_OPT_SHB_USERAPPL,
  PCAPNG_VERSION_MAJOR,
  PCAPNG_VERSION_MINOR,
  emitPcapGlobalHeader,
  emitPcapRecordHeader,
  pad4,
} from './format.js';

/** Receives each encoded header or record; the chunk is the sink's to keep. */
export type CaptureSink = (chunk: Uint8Array) => void;

/** libpcap's MAXIMUM_SNAPLEN: what tcpdump and dumpcap write by default. */
export const DEFAULT_SNAP_LENGTH = 262144;

/** A RoCEv2 datagram's addressing; ports default to 49152 → 4791. */
export type RoceFrameOptions = Omit<UdpFrameOptions, 'linkType' | 'srcPort' | 'dstPort'> & {
  /** rdma_rxe derives it from a hash of the QPN, in 0xc000..0xffff. Default 0xc000. */
  readonly srcPort?: number;
  /** Default 4791. */
  readonly dstPort?: number;
};

export type FrameData = Uint8Array | readonly Uint8Array[];

function partsOf(data: FrameData): readonly Uint8Array[] {
  return data instanceof Uint8Array ? [data] : data;
}

function lengthOf(parts: readonly Uint8Array[]): number {
  let n = 0;
  for (const p of parts) n += p.length;
  return n;
}

/** Copies at most `limit` bytes of `parts` into `out` at `off`. */
function copyParts(parts: readonly Uint8Array[], out: Uint8Array, off: number, limit: number): void {
  let p = off;
  let left = limit;
  for (const part of parts) {
    if (left === 0) break;
    const take = Math.min(part.length, left);
    out.set(take === part.length ? part : part.subarray(0, take), p);
    p += take;
    left -= take;
  }
}

function checkSnapLength(n: number): number {
  if (!Number.isInteger(n) || n < 1 || n > MAX_CAPTURE_BLOCK) throw new RangeError(`snap length ${n} out of range 1..${MAX_CAPTURE_BLOCK}`);
  return n;
}

function checkLinkType(n: number): number {
  if (!Number.isInteger(n) || n < 0 || n > 0xffff) throw new RangeError(`link type ${n} out of range`);
  return n;
}

function roceUdpOptions(linkType: number, frame: RoceFrameOptions): UdpFrameOptions {
  if (linkType !== LinkType.ETHERNET && linkType !== LinkType.RAW && linkType !== LinkType.IPV4 && linkType !== LinkType.IPV6) {
    throw new RangeError(`writeRoce needs an Ethernet or raw-IP capture, not link type ${linkType}`);
  }
  return { ...frame, linkType: linkType as EmitLinkType, srcPort: frame.srcPort ?? 0xc000, dstPort: frame.dstPort ?? ROCEV2_UDP_PORT };
}

export interface PcapWriterOptions {
  /** Default Ethernet (1). */
  readonly linkType?: number;
  /** Timestamp resolution in the file. Default 'us', which every tool reads. */
  readonly precision?: 'us' | 'ns';
  /** Frames longer than this are cut (and keep their original length). Default 262144. */
  readonly snapLength?: number;
}

/** Classic pcap (little-endian, version 2.4). The global header is written by the constructor. */
export class PcapWriter {
  readonly linkType: number;
  readonly precision: 'us' | 'ns';
  readonly snapLength: number;
  private frames = 0;

  constructor(
    private readonly sink: CaptureSink,
    opts: PcapWriterOptions = {},
  ) {
    this.linkType = checkLinkType(opts.linkType ?? LinkType.ETHERNET);
    this.precision = opts.precision ?? 'us';
    this.snapLength = checkSnapLength(opts.snapLength ?? DEFAULT_SNAP_LENGTH);
    const header = new Uint8Array(PCAP_GLOBAL_HEADER_LEN);
    emitPcapGlobalHeader(header, 0, { nanosecond: this.precision === 'ns', snapLength: this.snapLength, linkType: this.linkType });
    this.sink(header);
  }

  get framesWritten(): number {
    return this.frames;
  }

  /** Writes one frame; `originalLength` defaults to the length of `data`. */
  writeFrame(timestampNs: bigint, data: FrameData, originalLength?: number): void {
    const parts = partsOf(data);
    const len = lengthOf(parts);
    const capLen = Math.min(len, this.snapLength);
    const rec = new Uint8Array(PCAP_RECORD_HEADER_LEN + capLen);
    emitPcapRecordHeader(rec, 0, timestampNs, this.precision === 'ns', capLen, originalLength ?? len);
    copyParts(parts, rec, PCAP_RECORD_HEADER_LEN, capLen);
    this.sink(rec);
    this.frames++;
  }

  /** Writes a RoCEv2 UDP payload as a whole frame of this capture's link type. */
  writeRoce(timestampNs: bigint, frame: RoceFrameOptions, udpPayload: FrameData): void {
    const opts = roceUdpOptions(this.linkType, frame);
    const parts = partsOf(udpPayload);
    const len = udpFrameLength(opts, lengthOf(parts));
    // Emit straight into the record, after its header: no intermediate frame buffer.
    const rec = new Uint8Array(PCAP_RECORD_HEADER_LEN + len);
    emitUdpFrame(opts, parts, rec, PCAP_RECORD_HEADER_LEN);
    const capLen = Math.min(len, this.snapLength);
    emitPcapRecordHeader(rec, 0, timestampNs, this.precision === 'ns', capLen, len);
    this.sink(rec.subarray(0, PCAP_RECORD_HEADER_LEN + capLen));
    this.frames++;
  }
}

export interface PcapngInterfaceOptions {
  /** Default Ethernet (1). */
  readonly linkType?: number;
  /** if_name, shown by Wireshark in the frame details. */
  readonly name?: string;
  /** Default 'ns' (if_tsresol 9). */
  readonly precision?: 'us' | 'ns';
  /** Default 262144. */
  readonly snapLength?: number;
}

export interface PcapngWriterOptions extends PcapngInterfaceOptions {
  /** shb_userappl. Default 'roce-ts'. */
  readonly application?: string;
}

export interface PcapngFrameOptions {
  /** Default 0, the interface the constructor describes. */
  readonly interfaceId?: number;
  /** Default: the length of the data. */
  readonly originalLength?: number;
  /** epb_flags direction: lets Wireshark (and `frame.packet_flags_direction`) tell rx from tx. */
  readonly direction?: 'in' | 'out';
  /** opt_comment, shown by Wireshark as a packet comment. */
  readonly comment?: string;
}

const utf8 = new TextEncoder();

/** Encoded options list (each padded to 32 bits) plus opt_endofopt, or nothing if there are none. */
function encodeOptions(opts: readonly (readonly [code: number, value: Uint8Array])[]): Uint8Array {
  if (opts.length === 0) return new Uint8Array(0);
  let len = 4;
  for (const [, value] of opts) {
    if (value.length > 0xffff) throw new RangeError(`pcapng option of ${value.length} bytes`);
    len += 4 + pad4(value.length);
  }
  const out = new Uint8Array(len);
  const v = new DataView(out.buffer);
  let p = 0;
  for (const [code, value] of opts) {
    v.setUint16(p, code, true);
    v.setUint16(p + 2, value.length, true);
    out.set(value, p + 4);
    p += 4 + pad4(value.length);
  }
  v.setUint16(p, PCAPNG_OPT_ENDOFOPT, true);
  return out;
}

/** A block: type, total length, body, options, total length again. */
function makeBlock(type: number, bodyLen: number, options: Uint8Array): { block: Uint8Array; view: DataView } {
  const total = 8 + pad4(bodyLen) + options.length + 4;
  if (total > MAX_CAPTURE_BLOCK) throw new RangeError(`pcapng block of ${total} bytes exceeds ${MAX_CAPTURE_BLOCK}`);
  const block = new Uint8Array(total);
  const view = new DataView(block.buffer);
  view.setUint32(0, type, true);
  view.setUint32(4, total, true);
  block.set(options, 8 + pad4(bodyLen));
  view.setUint32(total - 4, total, true);
  return { block, view };
}

interface WrittenInterface {
  readonly linkType: number;
  readonly snapLength: number;
  readonly nanosecond: boolean;
}

/** pcapng (one little-endian section). The SHB and interface 0's IDB are written by the constructor. */
export class PcapngWriter {
  private readonly interfaces: WrittenInterface[] = [];
  private frames = 0;

  constructor(
    private readonly sink: CaptureSink,
    opts: PcapngWriterOptions = {},
  ) {
    // SHB body: byte-order magic(4) major(2) minor(2) section length(8, -1 = not given).
    const { block, view } = makeBlock(PCAPNG_BLOCK_SHB, 16, encodeOptions([[PCAPNG_OPT_SHB_USERAPPL, utf8.encode(opts.application ?? 'roce-ts')]]));
    view.setUint32(8, PCAPNG_BYTE_ORDER_MAGIC, true);
    view.setUint16(12, PCAPNG_VERSION_MAJOR, true);
    view.setUint16(14, PCAPNG_VERSION_MINOR, true);
    view.setBigInt64(16, -1n, true);
    this.sink(block);
    this.addInterface(opts);
  }

  get framesWritten(): number {
    return this.frames;
  }

  /** Describes another interface (its own link type and resolution); returns its id. */
  addInterface(opts: PcapngInterfaceOptions = {}): number {
    const iface: WrittenInterface = {
      linkType: checkLinkType(opts.linkType ?? LinkType.ETHERNET),
      snapLength: checkSnapLength(opts.snapLength ?? DEFAULT_SNAP_LENGTH),
      nanosecond: (opts.precision ?? 'ns') === 'ns',
    };
    const options: [number, Uint8Array][] = [];
    if (opts.name !== undefined) options.push([PCAPNG_OPT_IF_NAME, utf8.encode(opts.name)]);
    options.push([PCAPNG_OPT_IF_TSRESOL, Uint8Array.of(iface.nanosecond ? 9 : 6)]);
    // IDB body: link type(2) reserved(2) snaplen(4).
    const { block, view } = makeBlock(PCAPNG_BLOCK_IDB, 8, encodeOptions(options));
    view.setUint16(8, iface.linkType, true);
    view.setUint16(10, 0, true);
    view.setUint32(12, iface.snapLength, true);
    this.sink(block);
    this.interfaces.push(iface);
    return this.interfaces.length - 1;
  }

  writeFrame(timestampNs: bigint, data: FrameData, opts: PcapngFrameOptions = {}): void {
    const parts = partsOf(data);
    const len = lengthOf(parts);
    const { block, dataOffset, capLen } = this.epb(timestampNs, len, opts.originalLength ?? len, opts);
    copyParts(parts, block, dataOffset, capLen);
    this.sink(block);
    this.frames++;
  }

  /** Writes a RoCEv2 UDP payload as a whole frame of the interface's link type. */
  writeRoce(timestampNs: bigint, frame: RoceFrameOptions, udpPayload: FrameData, opts: Omit<PcapngFrameOptions, 'originalLength'> = {}): void {
    const iface = this.interfaceOf(opts.interfaceId ?? 0);
    const udpOpts = roceUdpOptions(iface.linkType, frame);
    const parts = partsOf(udpPayload);
    const len = udpFrameLength(udpOpts, lengthOf(parts));
    if (len <= iface.snapLength) {
      // The common case: emit straight into the block.
      const { block, dataOffset } = this.epb(timestampNs, len, len, opts);
      emitUdpFrame(udpOpts, parts, block, dataOffset);
      this.sink(block);
    } else {
      const whole = emitUdpFrame(udpOpts, parts);
      const { block, dataOffset, capLen } = this.epb(timestampNs, len, len, opts);
      block.set(whole.subarray(0, capLen), dataOffset);
      this.sink(block);
    }
    this.frames++;
  }

  private interfaceOf(id: number): WrittenInterface {
    const iface = this.interfaces[id];
    if (iface === undefined) throw new RangeError(`no interface ${id} (have ${this.interfaces.length})`);
    return iface;
  }

  /*
   * EPB body: interface id(4) timestamp high(4) low(4) captured len(4) original len(4) data(padded).
   * Returns the block with everything but the packet data filled in.
   */
  private epb(timestampNs: bigint, len: number, originalLength: number, opts: PcapngFrameOptions): { block: Uint8Array; dataOffset: number; capLen: number } {
    const ifId = opts.interfaceId ?? 0;
    const iface = this.interfaceOf(ifId);
    if (timestampNs < 0n) throw new RangeError(`negative timestamp ${timestampNs}`);
    const ticks = iface.nanosecond ? timestampNs : timestampNs / 1000n;
    if (ticks > 0xffff_ffff_ffff_ffffn) throw new RangeError(`timestamp ${timestampNs} ns does not fit 64 bits`);
    const capLen = Math.min(len, iface.snapLength);
    const options: [number, Uint8Array][] = [];
    if (opts.comment !== undefined) options.push([PCAPNG_OPT_COMMENT, utf8.encode(opts.comment)]);
    if (opts.direction !== undefined) {
      // epb_flags bits 0-1: 01 inbound, 10 outbound.
      const flags = new Uint8Array(4);
      new DataView(flags.buffer).setUint32(0, opts.direction === 'in' ? 1 : 2, true);
      options.push([PCAPNG_OPT_EPB_FLAGS, flags]);
    }
    const { block, view } = makeBlock(PCAPNG_BLOCK_EPB, 20 + capLen, encodeOptions(options));
    view.setUint32(8, ifId, true);
    view.setUint32(12, Number(ticks >> 32n), true);
    view.setUint32(16, Number(ticks & 0xffff_ffffn), true);
    view.setUint32(20, capLen, true);
    view.setUint32(24, originalLength, true);
    return { block, dataOffset: 28, capLen };
  }
}

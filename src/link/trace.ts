/**
 * `TraceLink`: prints one line per datagram sent and received, as smoltcp's `phy::Tracer`.
 *
 *   tx 10.0.0.2:4791 sport=49441 RC_SEND_ONLY qp=0x000011 psn=0x000005 ack payload=64
 *   rx 10.0.0.2:49441 icrc=ok-recovered id=0x24b0 RC_ACKNOWLEDGE qp=0x000011 psn=0x000005 aeth(ACK credits=31 msn=1)
 *   rx 10.0.0.9:5000 icrc=ok 20B unparseable (BAD_TVER: TVer 3): 643f…
 *
 * The packet text is `formatPacket` (`src/wire/pretty.ts`), the same line the CLI and test names
 * use. Sent datagrams are printed as framed (ICRC included) by the inner link; received ones as the
 * inner link accepted them.
 */

import { parsePacket } from '../wire/packet.js';
import { formatPacket } from '../wire/pretty.js';
import type { PeerAddress, RxMeta, WireLink } from './link.js';
import { TapLink } from './middleware.js';

/** Bytes of an unparseable datagram shown in hex. */
const HEX_BYTES = 32;

export class TraceLink extends TapLink {
  constructor(
    inner: WireLink,
    private readonly print: (line: string) => void,
  ) {
    super(inner);
  }

  protected observeRx(payload: Uint8Array, meta: RxMeta): void {
    this.print(`rx ${peer(meta.src)} ${rxStatus(meta)} ${describe(payload)}`);
  }

  protected observeTx(dst: PeerAddress, srcPort: number, datagram: Uint8Array): void {
    this.print(`tx ${peer(dst)} sport=${srcPort} ${describe(datagram)}`);
  }
}

function peer(p: PeerAddress): string {
  return p.address.includes(':') ? `[${p.address}]:${p.port}` : `${p.address}:${p.port}`;
}

function rxStatus(m: RxMeta): string {
  let s = `icrc=${m.icrc}`;
  if (m.icrc === 'ok-recovered' && m.ipId !== undefined) s += ` id=0x${m.ipId.toString(16).padStart(4, '0')}`;
  if (m.ce) s += ' ce';
  return s;
}

/** `formatPacket` of the datagram, or a short hex line when it does not parse. Never throws. */
export function describe(datagram: Uint8Array): string {
  const r = parsePacket(datagram);
  if (r.ok) return formatPacket(r.packet);
  let hex = '';
  const n = Math.min(datagram.length, HEX_BYTES);
  for (let i = 0; i < n; i++) hex += datagram[i]!.toString(16).padStart(2, '0');
  return `${datagram.length}B unparseable (${r.error}: ${r.detail}): ${hex}${datagram.length > n ? '…' : ''}`;
}

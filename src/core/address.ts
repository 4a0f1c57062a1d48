/**
 * Addresses: GIDs, IP text and address handles. RoCEv2 GIDs are IP addresses (Annex A17.4):
 * IPv4 as IPv4-mapped IPv6 (`::ffff:a.b.c.d`), IPv6 as themselves.
 */

import { ROCEV2_UDP_PORT } from '../wire/constants.js';
import { formatIpAddress, gidFromIp, ipFromGid, parseIpAddress } from '../wire/frame.js';
import { InvalidAttrError } from './errors.js';
import type { AddressHandle, AhAttr } from './types.js';

/** Canonical text for an address (IPv4-mapped IPv6 becomes dotted quad), or undefined if not an address. */
export function normalizeAddress(text: string): string | undefined {
  const b = parseIpAddress(text);
  if (!b) return undefined;
  return formatIpAddress(b.length === 16 ? ipFromGid(b) : b);
}

/** The 16-byte GID for an IP address text. */
export function gidOf(address: string): Uint8Array {
  const b = parseIpAddress(address);
  if (!b) throw new InvalidAttrError(`not an IP address: ${address}`);
  return gidFromIp(b);
}

export function resolveAh(ah: AhAttr): AddressHandle {
  let bytes: Uint8Array | undefined;
  if (ah.dgid !== undefined) {
    bytes = typeof ah.dgid === 'string' ? parseIpAddress(ah.dgid) : ah.dgid.length === 16 ? ah.dgid : undefined;
    if (!bytes) throw new InvalidAttrError(`dgid is not a GID: ${String(ah.dgid)}`);
  } else if (ah.address !== undefined) {
    bytes = parseIpAddress(ah.address);
    if (!bytes) throw new InvalidAttrError(`not an IP address: ${ah.address}`);
  } else {
    throw new InvalidAttrError('an address handle needs dgid or address');
  }
  const dgid = gidFromIp(bytes);
  const port = ah.port ?? ROCEV2_UDP_PORT;
  if (!Number.isInteger(port) || port < 1 || port > 0xffff) throw new InvalidAttrError(`port ${port} is not a UDP port`);
  return Object.freeze({ address: formatIpAddress(ipFromGid(dgid)), port, dgid });
}

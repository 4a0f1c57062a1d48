/**
 * Addresses: GIDs, IP text and address handles. RoCEv2 GIDs are IP addresses (Annex A17.4):
 * IPv4 as IPv4-mapped IPv6 (`::ffff:a.b.c.d`), IPv6 as themselves.
 */

import { ROCEV2_UDP_PORT } from '../wire/constants.js';
import { formatIpAddress, gidFromIp, ipFromGid, parseIpAddress } from '../wire/frame.js';
import { InvalidAttrError } from './errors.js';
import type { AddressHandle, AhAttr, Endpoint } from './types.js';

// Canonical address strings and peer endpoints, one object per value. Every packet compares the
// sender with its QP's peer and every send looks its peer up by content: with thousands of QPs, a
// string and an endpoint of each QP's own were two more cold lines per packet, where one shared
// string compares by identity. Bounded: past the cap the tables start over, which costs only that.
const INTERN_MAX = 4096;
const internedAddresses = new Map<string, string>();
const internedEndpoints = new Map<string, Endpoint>();

function internAddress(text: string): string {
  const known = internedAddresses.get(text);
  if (known !== undefined) return known;
  if (internedAddresses.size >= INTERN_MAX) internedAddresses.clear();
  internedAddresses.set(text, text);
  return text;
}

/** The shared, frozen endpoint for `address` (canonical text) and `port`. */
export function peerEndpoint(address: string, port: number): Endpoint {
  const key = `${address}|${port}`;
  let e = internedEndpoints.get(key);
  if (e === undefined) {
    if (internedEndpoints.size >= INTERN_MAX) internedEndpoints.clear();
    e = Object.freeze({ address: internAddress(address), port });
    internedEndpoints.set(key, e);
  }
  return e;
}

/** Canonical text for an address (IPv4-mapped IPv6 becomes dotted quad), or undefined if not an address. */
export function normalizeAddress(text: string): string | undefined {
  const b = parseIpAddress(text);
  if (!b) return undefined;
  return internAddress(formatIpAddress(b.length === 16 ? ipFromGid(b) : b));
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
  return Object.freeze({ address: internAddress(formatIpAddress(ipFromGid(dgid))), port, dgid });
}

/**
 * UDP source ports, as rdma_rxe chooses them. RoCEv2 (Annex A17.2.3) leaves the source port
 * to the sender for ECMP entropy; rxe derives it from the QPNs so that one QP's packets stay
 * on one path (per-QP ordering) while different QPs spread out. Matching rxe keeps our
 * captures comparable to its: the values are checked against rxe-lab.md.
 */

/** RoCEv2 source ports come from the Dynamic Ports range's top quarter (0xC000..0xFFFF). */
export const ROCE_SPORT_BASE = 0xc000;

/**
 * Linux `rdma_calc_flow_label(lqpn, rqpn)`: a 20-bit flow label from the 64-bit product of the
 * two QPNs, folded. Symmetric, so both directions of a connection get the same label.
 */
export function calcFlowLabel(lqpn: number, rqpn: number): number {
  let fl = BigInt(lqpn >>> 0) * BigInt(rqpn >>> 0);
  fl ^= fl >> 20n;
  fl ^= fl >> 40n;
  return Number(fl & 0xfffffn);
}

/** Linux `rdma_flow_label_to_udp_sport`: fold 20 bits into 14 and put them in 0xC000..0xFFFF. */
export function flowLabelToSport(fl: number): number {
  const low = fl & 0x3fff;
  const high = fl & 0xfc000;
  return ((low ^ (high >>> 14)) | ROCE_SPORT_BASE) & 0xffff;
}

/** RC/UC: `0xC000 | fold(rdma_calc_flow_label(lqpn, rqpn))`. */
export function connectedSourcePort(lqpn: number, rqpn: number): number {
  return flowLabelToSport(calcFlowLabel(lqpn, rqpn));
}

/** Linux `hash_32(val, bits)`: multiplicative hashing with the 32-bit golden ratio. */
export function hash32(val: number, bits: number): number {
  return (Math.imul(val >>> 0, 0x61c88647) >>> 0) >>> (32 - bits);
}

/** UD (and QPs without a peer): `0xC000 + hash_32(qpn, 14)`. */
export function datagramSourcePort(qpn: number): number {
  return ROCE_SPORT_BASE + hash32(qpn, 14);
}

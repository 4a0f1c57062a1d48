/**
 * Numbers the specifications fix. Nothing here is a tunable: implementation choices live
 * with the code that makes them.
 *
 * IBTA Vol. 1 ch. 9 (transport headers) and Annex A17 (RoCEv2).
 */

/** IANA-assigned UDP destination port for RoCEv2 (Annex A17.2.2). */
export const ROCEV2_UDP_PORT = 4791;

/** Base Transport Header, bytes. */
export const BTH_LEN = 12;
/** RDMA Extended Transport Header: VA(8) R_Key(4) DMA length(4). */
export const RETH_LEN = 16;
/** ACK Extended Transport Header: syndrome(1) MSN(3). */
export const AETH_LEN = 4;
/** Atomic Extended Transport Header: VA(8) R_Key(4) swap/add(8) compare(8). */
export const ATOMIC_ETH_LEN = 28;
/** Atomic Acknowledge Extended Transport Header: original remote data(8). */
export const ATOMIC_ACK_ETH_LEN = 8;
/** Immediate Data Extended Transport Header. */
export const IMMDT_LEN = 4;
/** Invalidate Extended Transport Header: the R_Key to invalidate. */
export const IETH_LEN = 4;
/** Datagram Extended Transport Header: Q_Key(4) reserved(1) SrcQP(3). */
export const DETH_LEN = 8;
/** FLUSH Extended Transport Header (IBTA 1.5 memory placement extensions). */
export const FETH_LEN = 4;
/** A RoCEv2 CNP carries 16 reserved bytes after its BTH (Annex A17.9.2). */
export const CNP_RESERVED_LEN = 16;
/** Invariant CRC trailer. */
export const ICRC_LEN = 4;

/** Transport header version this stack speaks (BTH.TVer). */
export const BTH_TVER = 0;
/** The default (full-membership) partition key; rxe accepts nothing else. */
export const DEFAULT_PKEY = 0xffff;
/** Q_Key of the General Services Interface QP1 (IBTA 13.4.6.1). */
export const GSI_QKEY = 0x80010000;

/** The ICRC covers a stand-in for the LRH made of 8 bytes of ones (Annex A17.3.3). */
export const ICRC_LRH_MASK_LEN = 8;

/** Path MTUs a RoCEv2 QP may use (IBTA 9.6.3.1 enumerates 256..4096). */
export const PATH_MTUS = [256, 512, 1024, 2048, 4096] as const;
export type PathMtu = (typeof PATH_MTUS)[number];

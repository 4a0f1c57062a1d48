/**
 * Implementation limits and knobs. Spec-fixed numbers live in `wire/constants.ts`; what is
 * here is our choice, each with its reason. Most mirror rdma_rxe's `rxe_param.h` so that
 * the stack behaves like the peer it interoperates with.
 */

/** rxe RXE_MAX_UNACKED_PSNS: the requester stops when this many PSNs are unacknowledged. */
export const MAX_UNACKED_PSNS = 128;

/** rxe RXE_MAX_PKT_PER_ACK: AckReq at least once every this many packets, as well as at message end. */
export const MAX_PKT_PER_ACK = 64;

/**
 * How far the local ACK timer stretches, as a power of two of the QP's `timeout`: it runs for
 * at least that, twice the smoothed time a response takes, and doubles after each timeout without
 * progress since, never past 2^MAX_ACK_BACKOFF times `timeout`. A peer that is slow rather than
 * lossy (a busy software responder answers a window long after it arrived) otherwise gets the whole
 * window again at every timeout, queued behind the copies it has not read yet, which makes it slower
 * still: against rxe under TCG with four transfers at once, a window of 128 packets was ACKed
 * 100–250 ms after it left, the 67 ms timer (perftest's default) went back N two or three times per
 * window, every duplicate drew a duplicate ACK, and 1 MiB SENDs that take 3 s alone took 20–45 s.
 * Four times `timeout` at most, so a QP still gives up on a dead peer within a bounded multiple of
 * what its user asked for.
 */
export const MAX_ACK_BACKOFF = 2;

/**
 * Packets one QP emits per poll before yielding to the event loop. node's UDP receive path
 * reads at most 32 datagrams per socket per loop turn, so a longer burst between turns only
 * fills (and overflows) the peer's socket buffer when both ends share a process.
 */
export const MAX_PKTS_PER_POLL = 32;

/** Device limits reported by queryDevice and enforced by createQp/createCq/modifyQp. */
export const DEVICE_LIMITS = {
  maxQp: 0x10000,
  maxQpWr: 16384,
  maxSge: 32,
  maxCqe: 32767,
  /** rxe max_qp_rd_atom / max_qp_init_rd_atom (ibv_devinfo -v on rxe0). */
  maxQpRdAtom: 128,
  maxInlineData: 256,
  /** IBTA: a message is at most 2^31 bytes. */
  maxMsgSize: 0x80000000,
  maxMrSize: 0xffffffff,
} as const;

/** rxe numbers its first QP 0x11 (QP0/QP1 are special, 2..16 are reserved by rxe's pool). */
export const FIRST_QPN = 0x11;

/** Default active MTU of a port: 4096 (our links carry 4 KiB payloads; rxe on a 1500-byte netdev says 1024). */
export const DEFAULT_PORT_MTU = 4096;

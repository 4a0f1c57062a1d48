/**
 * roce-ts: a userspace RoCEv2 stack. Public surface: the verbs API and its vocabulary, the
 * links and clocks to run it on, and the wire codecs for tools.
 */

export {
  openDevice, closeDevice, allocPd, deallocPd, regMr, deregMr, createCq, destroyCq, createQp, destroyQp, modifyQp, queryQp,
  createAh, postSend, postRecv, pollCq, pollCqInto, Context, Pd, Cq, Qp,
  type OpenDeviceOptions, type QpInitAttr, type PortAttr,
} from './api/verbs.js';
export { nextCompletion, waitCompletion, completions, type WaitOptions } from './api/async.js';
export { DeviceEvents } from './api/events.js';
export {
  ACCESS, SEND_FLAGS, WC_FLAGS, WC_STATUS, QP_ATTR_MASK, QP_STATES,
  type QpType, type QpState, type WrOpcode, type WcOpcode, type WcStatus, type Sge, type SendWr, type RecvWr,
  type WorkCompletion, type AhAttr, type AddressHandle, type QpCap, type QpAttr, type MtuValue, type AsyncEvent,
  type AsyncEventType, type Qpn, type Psn, type Lkey, type Rkey, type Qkey, type WrId,
} from './core/types.js';
export {
  RoceError, InvalidAttrError, InvalidTransitionError, QpStateError, InvalidWrError, QueueFullError, MrError,
  isRoceError, type RoceErrorCode,
} from './core/errors.js';
export { COUNTER_NAMES, type CounterName, type Counters } from './core/counters.js';
export { MemoryRegion } from './core/mr.js';
export { newWorkCompletion } from './core/cq.js';
export { Device } from './runtime/device.js';
export { SystemClock, VirtualClock, type Clock, type Micros } from './runtime/clock.js';
export type { Link, PeerAddress, RxMeta, LinkCaps } from './link/link.js';
export { MemoryLink } from './link/memory.js';
export { FaultyLink, type FaultOptions } from './link/fault.js';
export { UdpLink, type UdpLinkOptions } from './link/udp.js';
export { parsePacket, emitPacket, type RocePacket } from './wire/packet.js';
export { formatPacket } from './wire/pretty.js';

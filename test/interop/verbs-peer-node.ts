/**
 * Our side of interop/lab/peer/verbs-peer.c, on the public verbs API (src/api/verbs.ts) over real
 * UDP: the same exchange, the same cells, the same checks, the same output lines (the protocol is
 * in the C file's header). It is always the TCP client; the C peer in the guest is the server.
 *
 *   node verbs-peer-node.js --bind ADDR HOST -p PORT -t rc|uc|ud -m MTU -r requester|responder
 *        -c OP:SIZE[:ITERS][,OP:SIZE[:ITERS]...] [-n ITERS] [--port-mtu N]
 *
 * `--bind` is our RoCEv2 address (its GID is ::ffff:a.b.c.d or the IPv6 address), HOST the C
 * peer's TCP address. `--port-mtu` is our device's active MTU (default 4096): a UD message must
 * fit it. Exit 0 only when every message of every cell was verified; a failure ends the run.
 */
import net from 'node:net';
import { parseArgs } from 'node:util';
import {
  allocPd, closeDevice, createAh, createCq, createQp, modifyQp, openDevice, postRecv, postSend, regMr,
  type Context, type Cq, type Qp,
} from '../../src/api/verbs.js';
import type { MemoryRegion } from '../../src/core/mr.js';
import { ACCESS, SEND_FLAGS, WC_FLAGS, type AddressHandle, type MtuValue, type WorkCompletion, type WrOpcode } from '../../src/core/types.js';
import { connectWithRetry } from '../../src/oob/common.js';

const GRH = 40;
const GUARD = 64;
const STEP_MS = 20_000;
const QKEY = 0x11111111;
const OPS = ['send', 'send_imm', 'write', 'write_imm', 'read'] as const;
type Op = (typeof OPS)[number];

const pattern = (k: number, i: number, j: number): number => (j * 7 + (j >>> 8) * 13 + k * 29 + i * 101 + 1) & 0xff;
const immOf = (k: number, i: number): number => (0x5a000000 | (k << 8) | i) >>> 0;
const hex = (v: number, w: number): string => v.toString(16).padStart(w, '0');

class Fail extends Error {}

/** Newline-terminated lines from the C peer, each awaited for at most STEP_MS. */
class Lines {
  private buf = '';
  private closed = false;
  private wake: (() => void) | undefined;

  constructor(readonly socket: net.Socket) {
    socket.setEncoding('latin1');
    socket.on('data', (d: string) => {
      this.buf += d;
      this.wake?.();
    });
    const end = (): void => {
      this.closed = true;
      this.wake?.();
    };
    socket.on('end', end);
    socket.on('close', end);
    socket.on('error', end);
  }

  async next(): Promise<string> {
    const deadline = Date.now() + STEP_MS;
    for (;;) {
      const nl = this.buf.indexOf('\n');
      if (nl >= 0) {
        const line = this.buf.slice(0, nl);
        this.buf = this.buf.slice(nl + 1);
        return line;
      }
      if (this.closed) return '';
      const left = deadline - Date.now();
      if (left <= 0) throw new Fail(`no line from the peer in ${STEP_MS} ms`);
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left);
        this.wake = () => {
          clearTimeout(timer);
          this.wake = undefined;
          resolve();
        };
      });
    }
  }

  send(line: string): void {
    this.socket.write(line + '\n');
  }
}

interface Peer {
  ctx: Context;
  cq: Cq;
  qp: Qp;
  mr: MemoryRegion;
  buf: Uint8Array;
  ud: boolean;
  remoteQpn: number;
  rkey: number;
  va: bigint;
  ah?: AddressHandle;
}

async function completion(cq: Cq): Promise<WorkCompletion> {
  try {
    return await cq.next({ timeoutMs: STEP_MS });
  } catch {
    throw new Fail(`no completion within ${STEP_MS / 1000} s`);
  }
}

/** Responder, before "ready". */
function prepare(p: Peer, op: Op, k: number, i: number, size: number): void {
  const at = p.ud ? GRH : 0;
  p.buf.fill(0);
  if (op === 'read') {
    for (let j = 0; j < size; j++) p.buf[j] = pattern(k, i, j);
    return;
  }
  if (op === 'write') return;
  postRecv(p.qp, { wrId: 100 + i, sgList: op === 'write_imm' ? [] : [p.mr.sge(0, size + at + GUARD)] });
}

const WR: Record<Op, WrOpcode> = {
  send: 'SEND', send_imm: 'SEND_WITH_IMM', write: 'RDMA_WRITE', write_imm: 'RDMA_WRITE_WITH_IMM', read: 'RDMA_READ',
};
const WC: Record<Op, string> = { send: 'SEND', send_imm: 'SEND', write: 'RDMA_WRITE', write_imm: 'RDMA_WRITE', read: 'RDMA_READ' };

/** Requester: post, complete, check (READ). */
async function request(p: Peer, op: Op, k: number, i: number, size: number): Promise<void> {
  p.buf.fill(0);
  if (op !== 'read') for (let j = 0; j < size; j++) p.buf[j] = pattern(k, i, j);
  postSend(p.qp, {
    wrId: 200 + i, opcode: WR[op], sgList: size > 0 ? [p.mr.sge(0, size)] : [], sendFlags: SEND_FLAGS.SIGNALED,
    ...(op.endsWith('_imm') ? { immData: immOf(k, i) } : {}),
    ...(p.ud ? { ud: { ah: p.ah!, remoteQpn: p.remoteQpn, remoteQkey: QKEY } } : { rdma: { remoteAddr: p.va, rkey: p.rkey } }),
  });
  const wc = await completion(p.cq);
  if (wc.status !== 'SUCCESS') throw new Fail(`send completion ${wc.status} (vendor_err ${wc.vendorErr})`);
  if (wc.opcode !== WC[op] || wc.wrId !== 200 + i) throw new Fail(`send completion opcode ${wc.opcode} wr_id ${wc.wrId}`);
  if (op === 'read') {
    for (let j = 0; j < size; j++) {
      if (p.buf[j] !== pattern(k, i, j)) throw new Fail(`READ data differs at byte ${j}: 0x${hex(p.buf[j]!, 2)}, expected 0x${hex(pattern(k, i, j), 2)}`);
    }
    for (let j = size; j < size + GUARD; j++) if (p.buf[j] !== 0) throw new Fail(`READ wrote past ${size} bytes (byte ${j})`);
  }
}

/** Responder, after "sent". */
async function check(p: Peer, op: Op, k: number, i: number, size: number): Promise<void> {
  const at = p.ud ? GRH : 0;
  if (op === 'read') return;
  if (op !== 'write') {
    const wc = await completion(p.cq);
    if (wc.status !== 'SUCCESS') throw new Fail(`receive completion ${wc.status}`);
    const want = op === 'write_imm' ? 'RECV_RDMA_WITH_IMM' : 'RECV';
    if (wc.opcode !== want || wc.wrId !== 100 + i) throw new Fail(`receive completion opcode ${wc.opcode} wr_id ${wc.wrId}, expected ${want}`);
    if (wc.byteLen !== size + at) throw new Fail(`receive byte_len ${wc.byteLen}, expected ${size + at}`);
    const hasImm = (wc.wcFlags & WC_FLAGS.WITH_IMM) !== 0;
    if (hasImm !== (op !== 'send')) throw new Fail(`wc_flags 0x${wc.wcFlags.toString(16)}: WITH_IMM ${hasImm ? 'set' : 'missing'}`);
    if (hasImm && wc.immData !== immOf(k, i)) throw new Fail(`imm_data 0x${hex(wc.immData ?? 0, 8)}, expected 0x${hex(immOf(k, i), 8)}`);
    if (p.ud && wc.srcQp !== p.remoteQpn) throw new Fail(`src_qp 0x${wc.srcQp.toString(16)}, expected 0x${p.remoteQpn.toString(16)}`);
  }
  // A UC WRITE has no receive completion and the requester's completion means "sent": give its
  // last packets time to land (an RC WRITE is complete when its ACK came).
  for (let tries = op === 'write' ? 5000 : 1; ; tries--) {
    let j = 0;
    while (j < size && p.buf[at + j] === pattern(k, i, j)) j++;
    if (j === size) break;
    if (tries === 1) throw new Fail(`data differs at byte ${j}: 0x${hex(p.buf[at + j]!, 2)}, expected 0x${hex(pattern(k, i, j), 2)}`);
    await new Promise((r) => setTimeout(r, 1));
  }
  for (let j = at + size; j < at + size + GUARD; j++) if (p.buf[j] !== 0) throw new Fail(`bytes written past the ${size}-byte message (offset ${j - at})`);
}

function gidHex(g: Uint8Array): string {
  return Buffer.from(g).toString('hex');
}

async function main(): Promise<number> {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      bind: { type: 'string' }, port: { type: 'string', short: 'p' }, transport: { type: 'string', short: 't' },
      mtu: { type: 'string', short: 'm' }, role: { type: 'string', short: 'r' }, cells: { type: 'string', short: 'c' }, iters: { type: 'string', short: 'n', default: '1' }, 'port-mtu': { type: 'string', default: '4096' },
    },
  });
  const host = positionals[0];
  const tr = values.transport;
  if (host === undefined || values.bind === undefined || (tr !== 'rc' && tr !== 'uc' && tr !== 'ud') || !values.cells || !values.mtu) {
    throw new Error('usage: verbs-peer-node --bind ADDR HOST -p PORT -t rc|uc|ud -m MTU -r requester|responder -c OP:SIZE[:ITERS],... [-n ITERS] [--port-mtu N]');
  }
  const cells = values.cells.split(',').map((c) => {
    const [op, size, n, ...rest] = c.split(':');
    if (!(OPS as readonly string[]).includes(op ?? '') || !/^\d+$/.test(size ?? '') || !/^\d*$/.test(n ?? '') || rest.length) throw new Error(`bad cell ${c}`);
    return { op: op as Op, size: Number(size), iters: n ? Number(n) : undefined };
  });
  const iters = Number(values.iters);
  const mtu = Number(values.mtu) as MtuValue;
  const requester = values.role === 'requester';
  const ud = tr === 'ud';
  const sizeMax = Math.max(...cells.map((c) => c.size));

  const ctx = await openDevice({ address: values.bind, mtu: Number(values['port-mtu']) });
  try {
    const portMtu = ctx.queryPort().activeMtu;
    console.log(`port active_mtu ${portMtu}`);
    if (ud && sizeMax > mtu) throw new Error(`a UD message of ${sizeMax} bytes does not fit -m ${mtu}`);
    const pd = allocPd(ctx);
    const buf = new Uint8Array(sizeMax + GRH + GUARD);
    const mr = regMr(pd, buf, ACCESS.LOCAL_WRITE | (ud ? 0 : ACCESS.REMOTE_WRITE | ACCESS.REMOTE_READ));
    const cq = createCq(ctx, { cqe: 16 });
    const type = ud ? 'UD' : tr === 'uc' ? 'UC' : 'RC';
    const qp = createQp(pd, { type, sendCq: cq, recvCq: cq, cap: { maxSendWr: 4, maxRecvWr: 4, maxSendSge: 1, maxRecvSge: 1, maxInlineData: 0 } });
    if (ud) modifyQp(qp, { qpState: 'INIT', pkeyIndex: 0, portNum: 1, qkey: QKEY });
    else modifyQp(qp, { qpState: 'INIT', pkeyIndex: 0, portNum: 1, qpAccessFlags: ACCESS.REMOTE_WRITE | (tr === 'rc' ? ACCESS.REMOTE_READ : 0) });
    const psn = Math.floor(Math.random() * 0x1000000);

    const socket = await connectWithRetry(host, Number(values.port), { timeoutMs: 30_000, what: 'verbs-peer', family: 4 });
    const lines = new Lines(socket);
    try {
      const mine = `${hex(0, 4)}:${hex(qp.qpNum, 6)}:${hex(psn, 6)}:${gidHex(ctx.gid)}:${hex(mr.rkey, 8)}:${mr.va().toString(16).padStart(16, '0')}`;
      lines.send(mine);
      const reply = await lines.next();
      const m = /^([0-9a-f]{4}):([0-9a-f]{6}):([0-9a-f]{6}):([0-9a-f]{32}):([0-9a-f]{8}):([0-9a-f]{16})$/.exec(reply);
      if (!m) throw new Error(`malformed address line '${reply}'`);
      const [rqpn, rpsn, rkey] = [parseInt(m[2]!, 16), parseInt(m[3]!, 16), parseInt(m[5]!, 16)];
      const dgid = Uint8Array.from(Buffer.from(m[4]!, 'hex'));
      console.log(`local  QPN 0x${hex(qp.qpNum, 6)} PSN 0x${hex(psn, 6)} GID ${gidHex(ctx.gid)} RKEY 0x${hex(mr.rkey, 8)} VA 0x${mr.va().toString(16).padStart(16, '0')}`);
      console.log(`remote QPN 0x${m[2]} PSN 0x${m[3]} GID ${m[4]} RKEY 0x${m[5]} VA 0x${m[6]}`);
      const ahAttr = { dgid, hopLimit: 64 };
      const p: Peer = { ctx, cq, qp, mr, buf, ud, remoteQpn: rqpn, rkey, va: BigInt(`0x${m[6]}`) };
      if (ud) {
        modifyQp(qp, { qpState: 'RTR' });
        modifyQp(qp, { qpState: 'RTS', sqPsn: psn });
        p.ah = createAh(pd, ahAttr);
      } else {
        const rtr = { qpState: 'RTR' as const, ahAttr, pathMtu: mtu, destQpNum: rqpn, rqPsn: rpsn };
        if (tr === 'rc') {
          modifyQp(qp, { ...rtr, maxDestRdAtomic: 1, minRnrTimer: 12 });
          modifyQp(qp, { qpState: 'RTS', timeout: 14, retryCnt: 7, rnrRetry: 7, sqPsn: psn, maxRdAtomic: 1 });
        } else {
          modifyQp(qp, rtr);
          modifyQp(qp, { qpState: 'RTS', sqPsn: psn });
        }
      }

      for (const [k, { op, size, iters: count }] of cells.entries()) {
        for (let i = 0; i < (count ?? iters); i++) {
          try {
            if (requester) {
              const l = await lines.next();
              if (l !== 'ready') throw new Fail(`expected ready, got '${l}'`);
              try {
                await request(p, op, k, i, size);
              } catch (e) {
                if (e instanceof Fail) lines.send(`fail ${e.message}`);
                throw e;
              }
              lines.send('sent');
              const r = await lines.next();
              if (r !== 'ok') throw new Fail(`the responder: ${r || '(closed)'}`);
            } else {
              prepare(p, op, k, i, size);
              lines.send('ready');
              const l = await lines.next();
              if (l !== 'sent') throw new Fail(`the requester: ${l || '(closed)'}`);
              try {
                await check(p, op, k, i, size);
              } catch (e) {
                if (e instanceof Fail) lines.send(`fail ${e.message}`);
                throw e;
              }
              lines.send('ok');
            }
          } catch (e) {
            console.log(`cell ${op} ${size} ${i} fail ${(e as Error).message}`);
            return 1;
          }
          console.log(`cell ${op} ${size} ${i} ok`);
        }
      }
      console.log(`result ok ${cells.length} cells`);
      // The ACK of the peer's last message leaves on the next turns of the event loop.
      await new Promise((r) => setTimeout(r, 50));
      return 0;
    } finally {
      socket.end();
      socket.destroySoon();
    }
  } finally {
    await closeDevice(ctx);
  }
}

main().then(
  (code) => {
    process.exitCode = code;
  },
  (e: unknown) => {
    console.error(`verbs-peer-node: ${(e as Error).message}`);
    process.exitCode = 2;
  },
);

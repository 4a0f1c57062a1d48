/**
 * The rxe lab: real Linux Soft-RoCE (rdma_rxe) peers for interop tests.
 *
 * `startLab()` creates a private network namespace with a bridge (10.77.0.1/24, fd77::1/64),
 * boots one or two QEMU guests running Debian's kernel with rdma_rxe on that bridge
 * (10.77.0.2, 10.77.0.3, …), and returns handles to run commands in the guests and host-side
 * processes (our stack) inside the namespace. Nothing leaves the namespace: the guests and the
 * host side only use 10.77.0.0/24 and fd77::/64 on the bridge.
 *
 * Guest images come from interop/lab/build.sh (run automatically, cached in interop/.cache).
 * The guest side of the command channel is interop/lab/guest/agent.sh (virtio-serial; see the
 * comment there for the protocol and why).
 *
 * Everything the lab starts is stopped by `stop()`, and also on process exit or SIGINT/SIGTERM/
 * SIGHUP: processes are killed by their own PIDs, the namespace is deleted. Every wait is bounded
 * and fails with a message that says what did not happen, with the guest's last console lines.
 * If the lab cannot run here (not root, no qemu, no kernel), `startLab()` throws and says why.
 */
import { spawn, type ChildProcess, type SpawnOptions } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, accessSync, constants as fsc } from 'node:fs';
import { execFileSync } from 'node:child_process';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export interface LabOptions {
  /** Number of rxe guests: 10.77.0.2 (and 10.77.0.3). Default 2. */
  guests?: 1 | 2;
  /** Netdev MTU of the bridge, taps and guest eth0 (1500 gives rxe path MTU 1024; 9000 gives 4096). Default 1500. */
  mtu?: number;
  /** Capture the bridge with dumpcap into this pcap file (from before the guests boot). */
  capture?: string;
  /** IPv6 on the bridge and in the guests (fd77::/64, guest GID index 2). Default true. */
  ipv6?: boolean;
  /** Bound on boot → rxe0 ACTIVE, per guest (they boot in parallel). Default 90 s. */
  bootTimeoutMs?: number;
  /** Guest memory in MiB. Default 1024. */
  memoryMb?: number;
  /** Run interop/lab/build.sh first (idempotent, cached, ~1 s when up to date). Default true. */
  build?: boolean;
}

export interface RunResult {
  /** Exit code of the command; 124 (or 137) when its time bound killed it. */
  code: number;
  /** stdout and stderr, interleaved as written. */
  stdout: string;
}

export interface RunOptions {
  /** Time bound for the command inside the guest (coreutils `timeout`). Default 30 s for run, 60 s for spawn. */
  timeoutMs?: number;
}

export interface BackgroundJob {
  readonly id: number;
  /** Wait for the job to end (it always does: it runs under its time bound) and collect it. */
  wait(): Promise<RunResult>;
  /** SIGTERM the job (exit code then 124 or the command's own); collect it with wait(). */
  kill(): Promise<void>;
}

export interface Guest {
  /** "g2", "g3": the last octet of the address. */
  name: string;
  ipv4: string;
  /** "" when the lab runs without IPv6. */
  ipv6: string;
  /** GID table index of ::ffff:ipv4 (RoCEv2): 1. */
  gidIndexV4: number;
  /** GID table index of the fd77:: address (RoCEv2): 2; -1 without IPv6. */
  gidIndexV6: number;
  mac: string;
  /** Run a shell command (busybox sh) in the guest and wait for it. */
  run(cmd: string, opts?: RunOptions): Promise<RunResult>;
  /** Start a shell command in the background in the guest. */
  spawn(cmd: string, opts?: RunOptions): Promise<BackgroundJob>;
  /** The last lines of the guest's serial console. */
  consoleTail(lines?: number): string;
  /**
   * Lines so far in which the guest's kernel said its NIC stopped transmitting (`NETDEV WATCHDOG`,
   * virtio_net's `TX timeout`): repeated every 5 s while the transmit queue stays stopped.
   */
  txStallLines(): number;
  /**
   * Boots the guest again: its qemu killed and started afresh (same addresses and MAC, rxe0 with the
   * same GID indices, or it throws; what ran in it is gone, jobs included). For a NIC whose transmit
   * queue stopped: resetting the device inside the guest frees the skbs stranded in its ring after
   * rxe's QPs are gone, and Debian 12's rdma_rxe has oopsed in their destructor (`rxe_skb_tx_dtor`).
   * A boot whose rxe0 has its GIDs at other indices is booted once more, at most twice
   * (`restartBoots`). Resolves with the time it all took, in ms.
   */
  restart(): Promise<number>;
  /** Boots the last `restart` took: 1, or more when a boot's GID indices differed from the first boot's. */
  restartBoots: number;
}

export interface HostRunResult {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

export interface Lab {
  hostIpv4: string;
  /** "" when the lab runs without IPv6. */
  hostIpv6: string;
  netns: string;
  bridge: string;
  mtu: number;
  guests: Guest[];
  /** The pcap being written, if `capture` was given. */
  capturePath: string | undefined;
  /** How the guests run: "tcg" or "kvm". */
  accel: 'tcg' | 'kvm';
  /** Start a host process inside the lab's namespace (`ip netns exec NS argv…`). It is killed by stop(). */
  execHost(argv: string[], opts?: SpawnOptions): ChildProcess;
  /** Run a host process inside the namespace to completion, killed after timeoutMs (default 30 s). */
  runHost(argv: string[], opts?: { timeoutMs?: number; input?: string }): Promise<HostRunResult>;
  /** Stop the capture so the pcap is complete; returns its path. The lab keeps running. */
  stopCapture(): Promise<string | undefined>;
  /** Stop everything the lab started and delete the namespace. Idempotent. */
  stop(): Promise<void>;
}

const HOST_V4 = '10.77.0.1';
const HOST_V6 = 'fd77::1';
const BRIDGE = 'rxebr0';
const NS_PREFIX = 'rocelab-';
/** Grace on top of a guest-side time bound before the host gives up on an answer (TCG is slow). */
const SLACK_MS = 20_000;

// ---------------------------------------------------------------------------------------------
// Small process helpers

interface Exec { code: number | null; signal: NodeJS.Signals | null; stdout: string; stderr: string }

function execCollect(cmd: string, args: string[], timeoutMs: number, input?: string): Promise<Exec> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { stdio: ['pipe', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => { stdout += d; });
    child.stderr.setEncoding('utf8').on('data', (d: string) => { stderr += d; });
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.on('error', (err) => { clearTimeout(timer); reject(err); });
    child.on('close', (code, signal) => { clearTimeout(timer); resolve({ code, signal, stdout, stderr }); });
    child.stdin.on('error', () => undefined);
    child.stdin.end(input ?? '');
  });
}

async function must(cmd: string, args: string[], timeoutMs = 15_000): Promise<string> {
  const r = await execCollect(cmd, args, timeoutMs);
  if (r.code !== 0) {
    throw new Error(`rxe lab: '${[cmd, ...args].join(' ')}' failed (${r.code ?? r.signal}): ${r.stderr.trim() || r.stdout.trim()}`);
  }
  return r.stdout;
}

function which(bin: string): string | undefined {
  for (const dir of (process.env['PATH'] ?? '/usr/sbin:/usr/bin:/sbin:/bin').split(':')) {
    const p = path.join(dir || '.', bin);
    try { accessSync(p, fsc.X_OK); if (statSync(p).isFile()) return p; } catch { /* next */ }
  }
  return undefined;
}

/** True while `pid` exists and is not a zombie. */
function running(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'latin1');
    return !/^\d+ \(.*\) [ZX]/s.test(stat);
  } catch {
    return false;
  }
}

function isAlive(pid: number): boolean {
  try { process.kill(pid, 0); return true; } catch { return false; }
}

function waitExit(child: ChildProcess, ms: number): Promise<boolean> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve(true);
  return new Promise((resolve) => {
    const timer = setTimeout(() => { child.off('exit', onExit); resolve(false); }, ms);
    const onExit = (): void => { clearTimeout(timer); resolve(true); };
    child.once('exit', onExit);
  });
}

async function terminate(child: ChildProcess, graceMs = 5_000): Promise<void> {
  if (child.pid === undefined || child.exitCode !== null || child.signalCode !== null) return;
  try { process.kill(child.pid, 'SIGTERM'); } catch { return; }
  if (await waitExit(child, graceMs)) return;
  try { process.kill(child.pid, 'SIGKILL'); } catch { return; }
  await waitExit(child, 2_000);
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** The repository root: the nearest ancestor of this module with interop/lab/build.sh. */
function repoRoot(): string {
  let dir = path.dirname(fileURLToPath(import.meta.url));
  for (;;) {
    if (existsSync(path.join(dir, 'interop', 'lab', 'build.sh'))) return dir;
    const up = path.dirname(dir);
    if (up === dir) throw new Error('rxe lab: cannot find interop/lab/build.sh above ' + fileURLToPath(import.meta.url));
    dir = up;
  }
}

/**
 * KVM only with real VMX/SVM. Some machines offer a /dev/kvm without them (e.g. PVM), on which a
 * stock kernel hangs right after "Probing EDD": never try KVM there. ROCE_LAB_ACCEL overrides.
 */
function chooseAccel(): 'tcg' | 'kvm' {
  const forced = process.env['ROCE_LAB_ACCEL'];
  if (forced === 'tcg' || forced === 'kvm') return forced;
  try {
    const flags = readFileSync('/proc/cpuinfo', 'utf8');
    if (!/^flags\s*:.*\b(vmx|svm)\b/m.test(flags)) return 'tcg';
    if (existsSync('/sys/module/kvm_pvm')) return 'tcg';
    accessSync('/dev/kvm', fsc.R_OK | fsc.W_OK);
    return 'kvm';
  } catch {
    return 'tcg';
  }
}

// ---------------------------------------------------------------------------------------------
// Cleanup on exit and signals, for labs whose stop() did not run.

const liveLabs = new Set<LabImpl>();
let hooksInstalled = false;

function onExitSync(): void {
  for (const lab of liveLabs) lab.killSync();
}
function onSignal(sig: NodeJS.Signals): void {
  onExitSync();
  removeHooks();
  // Re-raise with the default disposition, so the process ends the way the sender meant.
  process.kill(process.pid, sig);
}
const signals: NodeJS.Signals[] = ['SIGINT', 'SIGTERM', 'SIGHUP'];
function installHooks(): void {
  if (hooksInstalled) return;
  hooksInstalled = true;
  process.on('exit', onExitSync);
  for (const s of signals) process.on(s, onSignal);
}
function removeHooks(): void {
  if (!hooksInstalled) return;
  hooksInstalled = false;
  process.off('exit', onExitSync);
  for (const s of signals) process.off(s, onSignal);
}

/** Delete lab namespaces (and scratch dirs) left behind by processes that died without cleaning up (e.g. SIGKILL). */
async function reapStale(): Promise<void> {
  if (!process.env['ROCE_LAB_KEEP']) {
    for (const name of readdirSync(tmpdir())) {
      const m = /^rocelab-(\d+)-[0-9a-f]+-/.exec(name);
      if (m?.[1] && !isAlive(Number(m[1]))) rmSync(path.join(tmpdir(), name), { recursive: true, force: true });
    }
  }
  const r = await execCollect('ip', ['netns', 'list'], 10_000);
  for (const line of r.stdout.split('\n')) {
    const m = /^(rocelab-(\d+)-[0-9a-f]+)\b/.exec(line);
    if (m?.[1] && m[2] && !isAlive(Number(m[2]))) {
      await execCollect('ip', ['netns', 'del', m[1]], 10_000);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The agent channel: one unix socket per guest, requests serialized (the agent serves one at a time).

interface Reply { id: number; code: number; body: Buffer }

class AgentChannel {
  private sock: net.Socket | undefined;
  private buf: Buffer = Buffer.alloc(0);
  private nextId = 1;
  private chain: Promise<unknown> = Promise.resolve();
  private pending = new Map<number, { resolve: (r: Reply) => void; reject: (e: Error) => void }>();
  private failure: Error | undefined;

  constructor(private readonly describe: () => string) {}

  async connect(sockPath: string, deadline: number, alive: () => boolean): Promise<void> {
    for (;;) {
      try {
        this.sock = await new Promise<net.Socket>((resolve, reject) => {
          const s = net.connect(sockPath);
          s.once('connect', () => { s.off('error', reject); resolve(s); });
          s.once('error', reject);
        });
        break;
      } catch {
        if (!alive()) throw new Error(`qemu exited before its agent socket was ready${this.describe()}`);
        if (Date.now() > deadline) throw new Error(`qemu's agent socket ${sockPath} did not appear${this.describe()}`);
        await sleep(50);
      }
    }
    this.sock.on('data', (d: Buffer) => this.onData(d));
    this.sock.on('error', (e) => this.fail(new Error(`agent channel error: ${e.message}${this.describe()}`)));
    this.sock.on('close', () => this.fail(new Error(`agent channel closed (guest gone?)${this.describe()}`)));
  }

  fail(err: Error): void {
    this.failure ??= err;
    for (const p of this.pending.values()) p.reject(this.failure);
    this.pending.clear();
  }

  close(why = 'lab stopped'): void {
    this.fail(new Error(why));
    this.sock?.destroy();
  }

  private onData(d: Buffer): void {
    this.buf = this.buf.length ? Buffer.concat([this.buf, d]) : d;
    for (;;) {
      const nl = this.buf.indexOf(0x0a);
      if (nl < 0) return;
      const header = this.buf.subarray(0, nl).toString('latin1');
      const m = /^@@([A-Z]) (\d+) (-?\d+) (\d+)$/.exec(header);
      if (!m) { this.buf = this.buf.subarray(nl + 1); continue; } // not ours: skip the line
      const len = Number(m[4]);
      if (this.buf.length < nl + 1 + len) return;
      const body = Buffer.from(this.buf.subarray(nl + 1, nl + 1 + len));
      this.buf = this.buf.subarray(nl + 1 + len);
      const id = Number(m[2]);
      const p = this.pending.get(id);
      if (p) { this.pending.delete(id); p.resolve({ id, code: Number(m[3]), body }); }
    }
  }

  /** Send one request line; `boundMs` counts from when the agent gets it, not from queueing. */
  request(verb: string, args: string[], boundMs: number, what: string): Promise<Reply> {
    const run = (): Promise<Reply> => new Promise<Reply>((resolve, reject) => {
      if (this.failure) { reject(this.failure); return; }
      if (!this.sock) { reject(new Error('agent not connected')); return; }
      const id = this.nextId++;
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new Error(`no answer from the guest agent within ${Math.round(boundMs / 1000)} s for ${what}${this.describe()}`));
      }, boundMs);
      this.pending.set(id, {
        resolve: (r) => { clearTimeout(timer); resolve(r); },
        reject: (e) => { clearTimeout(timer); reject(e); },
      });
      this.sock.write(`${verb} ${id} ${args.join(' ')}\n`);
    });
    const p = this.chain.then(run, run);
    this.chain = p.catch(() => undefined);
    return p;
  }
}

// ---------------------------------------------------------------------------------------------

class GuestImpl implements Guest {
  readonly name: string;
  readonly ipv4: string;
  readonly ipv6: string;
  readonly mac: string;
  gidIndexV4 = -1;
  gidIndexV6 = -1;
  restartBoots = 0;
  readonly tap: string;
  /** This boot's serial console (each boot writes a file of its own). */
  consolePath = '';
  readonly sockPath: string;
  qemu: ChildProcess | undefined;
  qemuStderr = '';
  /** The agent of this boot. */
  agent: AgentChannel;
  /** Boots so far. */
  boots = 0;
  /** Watchdog lines on the consoles of earlier boots. */
  earlierStallLines = 0;
  /** Set by the lab: kills this guest's qemu and boots it again. */
  restarter: (() => Promise<number>) | undefined;

  constructor(readonly octet: number, ipv6: boolean, private readonly dir: string) {
    this.name = `g${octet}`;
    this.ipv4 = `10.77.0.${octet}`;
    this.ipv6 = ipv6 ? `fd77::${octet.toString(16)}` : '';
    this.mac = `52:54:00:77:00:${octet.toString(16).padStart(2, '0')}`;
    this.tap = `tap${octet}`;
    this.sockPath = path.join(dir, `${this.name}.agent.sock`);
    this.agent = new AgentChannel(() => this.context());
  }

  /** Before a boot: its console file, and after the first a fresh agent channel. */
  nextBoot(): void {
    if (this.boots > 0) {
      this.earlierStallLines = this.txStallLines();
      this.agent = new AgentChannel(() => this.context());
      this.qemuStderr = '';
    }
    this.boots++;
    this.consolePath = path.join(this.dir, this.boots === 1 ? `${this.name}.console.log` : `${this.name}.boot${this.boots}.console.log`);
  }

  /** The guest's serial console so far ('' before it has written any). */
  private consoleText(): string {
    try { return readFileSync(this.consolePath, 'latin1'); } catch { return ''; }
  }

  consoleTail(lines = 15): string {
    const all = this.consoleText().replace(/\r/g, '').split('\n').filter((l) => l.trim() !== '');
    return all.slice(-lines).join('\n') || '(no console output)';
  }

  txStallLines(): number {
    return this.earlierStallLines + (this.consoleText().match(/NETDEV WATCHDOG|TX timeout on queue/g)?.length ?? 0);
  }

  restart(): Promise<number> {
    if (!this.restarter) return Promise.reject(new Error(`guest ${this.ipv4}: not started by a lab`));
    return this.restarter();
  }

  private context(): string {
    const q = this.qemuStderr.trim();
    return `; guest ${this.ipv4}` + (q ? `; qemu: ${q.slice(-500)}` : '') +
      `; last console lines:\n${this.consoleTail()}`;
  }

  async run(cmd: string, opts: RunOptions = {}): Promise<RunResult> {
    const ms = opts.timeoutMs ?? 30_000;
    const r = await this.agent.request('R', [secs(ms), b64(cmd)], ms + 2_000 + SLACK_MS, `run(${JSON.stringify(short(cmd))})`);
    return { code: r.code, stdout: r.body.toString('utf8') };
  }

  async spawn(cmd: string, opts: RunOptions = {}): Promise<BackgroundJob> {
    const ms = opts.timeoutMs ?? 60_000;
    const what = `spawn(${JSON.stringify(short(cmd))})`;
    // The agent names the job after the request that started it.
    const jobId = (await this.agent.request('S', [secs(ms), b64(cmd)], SLACK_MS, what)).id;
    const endBy = Date.now() + ms + 2_000 + SLACK_MS;
    const agent = this.agent;
    let result: Promise<RunResult> | undefined;
    return {
      id: jobId,
      wait: () => {
        result ??= (async (): Promise<RunResult> => {
          for (;;) {
            const r = await agent.request('P', [String(jobId)], SLACK_MS, `poll of ${what}`);
            if (r.code === -2) throw new Error(`${what}: ${r.body.toString('utf8').trim()}`);
            if (r.code !== -1) return { code: r.code, stdout: r.body.toString('utf8') };
            if (Date.now() > endBy) throw new Error(`${what} did not end within its time bound${this.context()}`);
            await sleep(150);
          }
        })();
        return result;
      },
      kill: async () => { await agent.request('K', [String(jobId)], SLACK_MS, `kill of ${what}`); },
    };
  }
}

const b64 = (s: string): string => Buffer.from(s, 'utf8').toString('base64');
const secs = (ms: number): string => (Math.max(ms, 100) / 1000).toFixed(1);
const short = (s: string): string => (s.length > 80 ? s.slice(0, 77) + '...' : s);

// ---------------------------------------------------------------------------------------------

class LabImpl implements Lab {
  readonly hostIpv4 = HOST_V4;
  readonly hostIpv6: string;
  readonly bridge = BRIDGE;
  readonly guests: GuestImpl[] = [];
  capturePath: string | undefined;
  private dumpcap: ChildProcess | undefined;
  private dumpcapStderr = '';
  private readonly hostChildren = new Set<ChildProcess>();
  private nsCreated = false;
  private stopped = false;
  readonly dir: string;

  constructor(readonly netns: string, readonly mtu: number, readonly ipv6: boolean, readonly accel: 'tcg' | 'kvm') {
    this.hostIpv6 = ipv6 ? HOST_V6 : '';
    this.dir = mkdtempSync(path.join(tmpdir(), `${netns}-`));
  }

  // -- setup --

  async createNetwork(n: number): Promise<void> {
    await must('ip', ['netns', 'add', this.netns]);
    this.nsCreated = true;
    const ip = (...a: string[]): Promise<string> => must('ip', ['-n', this.netns, ...a]);
    const v6 = this.ipv6 ? '0' : '1';
    // A new namespace's IPv6 default comes from the host's sysctl; set it explicitly either way.
    await this.sysctl(`net/ipv6/conf/all/disable_ipv6=${v6} net/ipv6/conf/default/disable_ipv6=${v6}`);
    await ip('link', 'set', 'lo', 'up');
    // No STP and no forwarding delay: the ports forward at once. No multicast snooping: IPv6
    // neighbour discovery is simply flooded between the few ports.
    await ip('link', 'add', BRIDGE, 'type', 'bridge', 'forward_delay', '0', 'stp_state', '0', 'mcast_snooping', '0');
    for (let i = 0; i < n; i++) {
      const tap = `tap${i + 2}`;
      await ip('tuntap', 'add', 'dev', tap, 'mode', 'tap');
      await ip('link', 'set', tap, 'mtu', String(this.mtu), 'master', BRIDGE, 'up');
    }
    await ip('link', 'set', BRIDGE, 'mtu', String(this.mtu), 'up');
    await ip('addr', 'add', `${HOST_V4}/24`, 'dev', BRIDGE);
    if (this.ipv6) await ip('-6', 'addr', 'add', `${HOST_V6}/64`, 'dev', BRIDGE, 'nodad');
  }

  private async sysctl(assignments: string): Promise<void> {
    // Written from inside the namespace: /proc/sys/net is per network namespace.
    const script = assignments.split(' ').map((a) => {
      const [k, v] = a.split('=');
      return `echo ${v} > /proc/sys/${k}`;
    }).join(' && ');
    await must('ip', ['netns', 'exec', this.netns, 'sh', '-c', script]);
  }

  async startCapture(file: string): Promise<void> {
    const dumpcap = which('dumpcap');
    if (!dumpcap) throw new Error('rxe lab: capture requested but dumpcap is not installed (apt-get install tshark)');
    this.capturePath = path.resolve(file);
    rmSync(this.capturePath, { force: true });
    // -B 64: a 64 MiB kernel buffer (libpcap's default is 2 MiB). A test that moves hundreds of
    // MiB through the bridge in bursts (1 MiB messages at MTU 256 are 4096 back-to-back frames)
    // otherwise loses frames in the capture while the wire lost none.
    const child = spawn('ip', ['netns', 'exec', this.netns, ...pdeath(), dumpcap, '-q', '-B', '64', '-i', BRIDGE, '-P', '-w', this.capturePath],
      { stdio: ['ignore', 'ignore', 'pipe'] });
    this.dumpcap = child;
    child.stderr?.setEncoding('utf8').on('data', (d: string) => { this.dumpcapStderr += d; });
    child.on('error', () => undefined);
    // dumpcap writes the pcap header once the capture is running.
    const deadline = Date.now() + 15_000;
    while (!(existsSync(this.capturePath) && statSync(this.capturePath).size >= 24)) {
      if (child.exitCode !== null) throw new Error(`rxe lab: dumpcap exited (${child.exitCode}): ${this.dumpcapStderr.trim()}`);
      if (Date.now() > deadline) throw new Error(`rxe lab: dumpcap did not start capturing ${BRIDGE} within 15 s: ${this.dumpcapStderr.trim()}`);
      await sleep(50);
    }
  }

  startGuest(g: GuestImpl, kernel: string, initrd: string, memoryMb: number): void {
    g.nextBoot();
    const qemu = which('qemu-system-x86_64') ?? 'qemu-system-x86_64';
    const accel = this.accel === 'kvm' ? ['-accel', 'kvm', '-cpu', 'host'] : ['-accel', 'tcg', '-cpu', 'max'];
    const append = ['console=ttyS0', 'quiet', 'panic=-1', `lab.name=${g.name}`, `lab.ip=${g.ipv4}`,
      `lab.ip6=${g.ipv6 || 'none'}`, `lab.mtu=${this.mtu}`].join(' ');
    const args = [
      ...accel, '-m', String(memoryMb), '-smp', '1',
      '-nodefaults', '-no-user-config', '-display', 'none', '-monitor', 'none', '-no-reboot',
      '-serial', `file:${g.consolePath}`,
      '-kernel', kernel, '-initrd', initrd, '-append', append,
      '-netdev', `tap,id=n0,ifname=${g.tap},script=no,downscript=no`,
      '-device', `virtio-net-pci,netdev=n0,mac=${g.mac}`,
      '-chardev', `socket,id=agent,path=${g.sockPath},server=on,wait=off`,
      '-device', 'virtio-serial-pci', '-device', 'virtserialport,chardev=agent,name=lab.agent',
    ];
    // `ip netns exec` and setpriv both exec, so the child's PID is qemu's own.
    const child = spawn('ip', ['netns', 'exec', this.netns, ...pdeath(), qemu, ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
    g.qemu = child;
    child.stderr?.setEncoding('utf8').on('data', (d: string) => { g.qemuStderr += d; });
    child.on('error', (e) => { g.qemuStderr += `spawn error: ${e.message}`; });
    child.on('exit', (code, sig) => {
      // A qemu killed by `restartGuest` has been replaced: its agent went with it.
      if (!this.stopped && g.qemu === child) g.agent.fail(new Error(`qemu for guest ${g.ipv4} exited (${code ?? sig})${qemuContext(g)}`));
    });
  }

  /** What `startLab` booted the guests with, for `restartGuest`. */
  boot: { kernel: string; initrd: string; memoryMb: number; timeoutMs: number } | undefined;

  /**
   * Kills `g`'s qemu and boots it again as `startLab` did; fails unless rxe0 comes back with the GID
   * indices of the first boot. Resolves with the time it took, in ms.
   */
  async restartGuest(g: GuestImpl): Promise<number> {
    if (this.stopped || !this.boot) throw new Error('rxe lab: stopped');
    const start = Date.now();
    const was = [g.gidIndexV4, g.gidIndexV6];
    const seen: string[] = [];
    // Cells address a guest by the GID indices of its first boot. A boot that has them elsewhere
    // (index 1 taken before the IPv4 GID, seen once; interop/lab/guest/net) is booted once more.
    for (let boot = 1; ; boot++) {
      const old = g.qemu;
      g.agent.close(`guest ${g.ipv4} restarted`);
      if (old) await terminate(old, 3_000);
      rmSync(g.sockPath, { force: true });
      const { kernel, initrd, memoryMb, timeoutMs } = this.boot;
      this.startGuest(g, kernel, initrd, memoryMb);
      await this.waitReady(g, timeoutMs);
      g.restartBoots = boot;
      if (g.gidIndexV4 === was[0] && g.gidIndexV6 === was[1]) return Date.now() - start;
      seen.push(`${g.gidIndexV4}/${g.gidIndexV6}`);
      if (boot === 3) throw new Error(`guest ${g.ipv4}: booted again ${boot} times with GID indices ${seen.join(', ')}, not ${was[0]}/${was[1]}`);
    }
  }

  async waitReady(g: GuestImpl, timeoutMs: number): Promise<void> {
    const started = Date.now();
    const deadline = started + timeoutMs;
    const alive = (): boolean => g.qemu !== undefined && g.qemu.exitCode === null && g.qemu.signalCode === null;
    await g.agent.connect(g.sockPath, deadline, alive);
    // The hello is answered once the guest's init has rxe0 up (it reads the request only then).
    let hello: Reply;
    try {
      hello = await g.agent.request('H', [], Math.max(deadline - Date.now(), 1_000), 'hello');
    } catch (e) {
      const why = (e as Error).message;
      if (/no answer/.test(why)) {
        throw new Error(`guest ${g.ipv4} did not report rxe0 ACTIVE within ${Math.round(timeoutMs / 1000)} s` +
          `${qemuContext(g)}`);
      }
      throw e;
    }
    const text = hello.body.toString('utf8').trim();
    if (!text.startsWith('READY ')) throw new Error(`guest ${g.ipv4} could not bring up rxe0: ${text}${qemuContext(g)}`);
    const field = (k: string): number => Number(new RegExp(`\\b${k}=(-?\\d+)`).exec(text)?.[1] ?? NaN);
    g.gidIndexV4 = field('gid4');
    g.gidIndexV6 = field('gid6');
    if (!(g.gidIndexV4 >= 0) || (this.ipv6 && !(g.gidIndexV6 >= 0))) {
      throw new Error(`guest ${g.ipv4} reported unexpected GIDs: ${text}`);
    }
  }

  // -- the Lab API --

  execHost(argv: string[], opts: SpawnOptions = {}): ChildProcess {
    if (this.stopped) throw new Error('rxe lab: stopped');
    const child = spawn('ip', ['netns', 'exec', this.netns, ...pdeath(), ...argv], opts);
    this.hostChildren.add(child);
    child.on('exit', () => this.hostChildren.delete(child));
    child.on('error', () => this.hostChildren.delete(child));
    return child;
  }

  runHost(argv: string[], opts: { timeoutMs?: number; input?: string } = {}): Promise<HostRunResult> {
    return new Promise((resolve, reject) => {
      const child = this.execHost(argv, { stdio: ['pipe', 'pipe', 'pipe'] });
      let stdout = '';
      let stderr = '';
      child.stdout?.setEncoding('utf8').on('data', (d: string) => { stdout += d; });
      child.stderr?.setEncoding('utf8').on('data', (d: string) => { stderr += d; });
      const timer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs ?? 30_000);
      child.on('error', (e) => { clearTimeout(timer); reject(e); });
      child.on('close', (code, signal) => { clearTimeout(timer); resolve({ code, signal, stdout, stderr }); });
      child.stdin?.on('error', () => undefined);
      child.stdin?.end(opts.input ?? '');
    });
  }

  async stopCapture(): Promise<string | undefined> {
    if (this.dumpcap) {
      const d = this.dumpcap;
      this.dumpcap = undefined;
      // libpcap hands packets over in blocks that retire on a timeout, and dumpcap does not read
      // a partly filled block when told to stop: the last frames would be missing. Let the
      // file settle (no growth for 1 s, at most 5 s) before stopping it.
      if (this.capturePath && d.exitCode === null) {
        const size = (): number => { try { return statSync(this.capturePath!).size; } catch { return -1; } };
        let last = size();
        let stableSince = Date.now();
        const giveUp = Date.now() + 5_000;
        while (Date.now() - stableSince < 1_000 && Date.now() < giveUp) {
          await sleep(200);
          const now = size();
          if (now !== last) { last = now; stableSince = Date.now(); }
        }
      }
      await terminate(d); // SIGTERM: dumpcap writes what it has read and closes the file
    }
    return this.capturePath;
  }

  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    for (const g of this.guests) g.agent.close();
    await Promise.all([
      ...[...this.hostChildren].map((c) => terminate(c, 2_000)),
      ...this.guests.map((g) => (g.qemu ? terminate(g.qemu, 3_000) : Promise.resolve())),
    ]);
    await this.stopCapture();
    if (this.nsCreated) {
      const r = await execCollect('ip', ['netns', 'del', this.netns], 10_000);
      if (r.code === 0) this.nsCreated = false;
    }
    if (!process.env['ROCE_LAB_KEEP']) rmSync(this.dir, { recursive: true, force: true });
    liveLabs.delete(this);
    if (liveLabs.size === 0) removeHooks();
  }

  /** Last resort from the 'exit' handler or a signal: synchronous, kill everything by PID. */
  killSync(): void {
    this.stopped = true;
    const pids = [...this.hostChildren, ...this.guests.map((g) => g.qemu), this.dumpcap]
      .map((c) => c?.pid).filter((p): p is number => p !== undefined);
    for (const pid of pids) { try { process.kill(pid, 'SIGKILL'); } catch { /* gone */ } }
    // Tearing down a guest takes a moment; wait (bounded) until each is gone or a zombie,
    // so that nothing of ours is still running when this process ends.
    const until = Date.now() + 3_000;
    const pause = new Int32Array(new SharedArrayBuffer(4));
    while (pids.some(running) && Date.now() < until) Atomics.wait(pause, 0, 0, 20);
    if (this.nsCreated) {
      try { execFileSync('ip', ['netns', 'del', this.netns], { stdio: 'ignore', timeout: 10_000 }); } catch { /* best effort */ }
      this.nsCreated = false;
    }
    try { rmSync(this.dir, { recursive: true, force: true }); } catch { /* best effort */ }
    liveLabs.delete(this);
  }
}

function qemuContext(g: GuestImpl): string {
  const q = g.qemuStderr.trim();
  return (q ? `; qemu: ${q.slice(-500)}` : '') + `; last console lines:\n${g.consoleTail()}`;
}

/** Make a child die with us even if we are SIGKILLed (setpriv execs, keeping the PID). */
let setprivPath: string | null | undefined;
function pdeath(): string[] {
  if (setprivPath === undefined) setprivPath = which('setpriv') ?? null;
  return setprivPath ? [setprivPath, '--pdeathsig', 'KILL', '--'] : [];
}

// ---------------------------------------------------------------------------------------------

/**
 * What a test does about a guest NIC that stops transmitting in mid-run (`Guest.txStallLines`): every
 * cell that fails while the guest's console has new watchdog lines or its NIC answers no ping, or
 * while the guest is being restarted, runs again once after the guest was booted afresh (`Guest.restart`), one restart serving
 * all the cells then running; at most `maxRestarts` per run, each one told to `say`. Without a new
 * watchdog line, a failed cell has the guest ping the host: a NIC that stopped says nothing on the
 * console until its ring is full. `ROCE_LAB_PLANT_NIC_STALL=regex` stops the NIC silently (eth0 down)
 * before the first cell whose name matches, so that a test can be seen to recover.
 */
export class NicGuard {
  private restarts = 0;
  private stallLines = 0;
  private restarting: Promise<boolean> | undefined;
  private lastRestartEnd = 0;
  private planted = false;
  private readonly plant: RegExp | undefined;

  constructor(private readonly guest: Guest, private readonly maxRestarts = 2) {
    const p = process.env['ROCE_LAB_PLANT_NIC_STALL'];
    this.plant = p ? new RegExp(p) : undefined;
  }

  /** Before cell `name` starts: waits out a restart under way, and plants a stall where asked. */
  async before(name: string, say: (line: string) => void): Promise<void> {
    if (this.restarting) await this.restarting;
    if (!this.plant || this.planted || !this.plant.test(name)) return;
    this.planted = true;
    // No watchdog line: a real stall is silent for as long as the ring has room.
    const r = await this.guest.run('/usr/sbin/ip link set eth0 down');
    say(`planted before ${name}: guest ${this.guest.ipv4}'s eth0 down (${r.code})`);
  }

  /**
   * After cell `name`, started at `startMs` (Date.now()), failed with `problem`: whether it ran while the
   * NIC had stopped, the guest now booted again, so that it should run again. When not, and the NIC did
   * stop, `note` gets why (stopped once too often, or the guest did not come back); a restart made here
   * is told to `say`. Cells failing together share one look at the NIC and the restart it leads to.
   */
  again(name: string, startMs: number, problem: string, say: (line: string) => void, note: (why: string) => void): Promise<boolean> {
    if (this.restarting) return this.restarting;
    if (startMs < this.lastRestartEnd) return Promise.resolve(true);
    const p = this.look(name, problem, say, note).finally(() => {
      this.restarting = undefined;
    });
    this.restarting = p;
    return p;
  }

  private async look(name: string, problem: string, say: (line: string) => void, note: (why: string) => void): Promise<boolean> {
    const lines = this.guest.txStallLines();
    let why: string;
    if (lines > this.stallLines) {
      why = `${lines - this.stallLines} watchdog line${lines - this.stallLines === 1 ? '' : 's'} on its console`;
    } else {
      // The watchdog speaks only once the stopped ring is full, which the little a failing cell sends
      // may take minutes to fill: ask the NIC itself.
      const ping = await this.guest.run(`ping -c 3 -w 5 ${HOST_V4}`, { timeoutMs: 10_000 }).catch((e: Error) => ({ code: -1, stdout: e.message }));
      if (ping.code === 0) return false;
      why = `no answer to ping ${HOST_V4}: ${ping.stdout.trim().split('\n').pop() ?? ''}`;
    }
    if (this.restarts >= this.maxRestarts) {
      note(`guest ${this.guest.ipv4}'s NIC stopped transmitting again (${why}) after ${this.restarts} restarts`);
      return false;
    }
    this.restarts++;
    try {
      const ms = await this.guest.restart();
      // Lines the old console gained until its guest was killed are not a new stall.
      this.stallLines = this.guest.txStallLines();
      say(`guest ${this.guest.ipv4}'s NIC stopped transmitting (${why}; ${name} failed: ${problem.split('\n')[0]}); guest booted again in ${(ms / 1000).toFixed(1)} s${this.guest.restartBoots > 1 ? ` (${this.guest.restartBoots} boots: GID indices differed)` : ''}, rxe0 ACTIVE with GID indices ${this.guest.gidIndexV4}/${this.guest.gidIndexV6}`);
      return true;
    } catch (e) {
      note(`guest ${this.guest.ipv4}'s NIC stopped transmitting (${why}) and booting it again failed: ${(e as Error).message}`);
      return false;
    } finally {
      this.lastRestartEnd = Date.now();
    }
  }
}

/**
 * Start the lab. Throws (never resolves half-built) with the reason when it cannot run here.
 */
export async function startLab(opts: LabOptions = {}): Promise<Lab> {
  const n = opts.guests ?? 2;
  const mtu = opts.mtu ?? 1500;
  const ipv6 = opts.ipv6 ?? true;
  const bootTimeoutMs = opts.bootTimeoutMs ?? 90_000;
  if (process.platform !== 'linux') throw new Error('rxe lab: needs Linux (network namespaces, tap devices)');
  if (typeof process.getuid === 'function' && process.getuid() !== 0) {
    throw new Error('rxe lab: needs root (network namespaces, tap devices, dumpcap): run as root, e.g. `sudo npm run test:interop`');
  }
  if (!Number.isInteger(mtu) || mtu < 1280 || mtu > 9000) throw new Error(`rxe lab: unsupported MTU ${mtu} (1280..9000)`);
  for (const bin of ['ip', 'qemu-system-x86_64']) {
    if (!which(bin)) throw new Error(`rxe lab: '${bin}' not found in PATH (run interop/lab/install-deps.sh)`);
  }

  const root = repoRoot();
  const cache = process.env['ROCE_LAB_CACHE'] ?? path.join(root, 'interop', '.cache');
  if (opts.build ?? true) {
    const r = await execCollect('bash', [path.join(root, 'interop', 'lab', 'build.sh')], 15 * 60_000);
    if (r.code !== 0) {
      throw new Error(`rxe lab: interop/lab/build.sh failed (${r.code ?? r.signal}):\n${(r.stderr + r.stdout).trim().split('\n').slice(-15).join('\n')}`);
    }
  }
  const kernel = path.join(cache, 'out', 'vmlinuz');
  const initrd = path.join(cache, 'out', 'initramfs.gz');
  for (const f of [kernel, initrd]) {
    if (!existsSync(f)) throw new Error(`rxe lab: ${f} is missing: run interop/lab/build.sh`);
  }

  await reapStale();
  const netns = `${NS_PREFIX}${process.pid}-${randomBytes(3).toString('hex')}`;
  const lab = new LabImpl(netns, mtu, ipv6, chooseAccel());
  liveLabs.add(lab);
  installHooks();
  try {
    await lab.createNetwork(n);
    if (opts.capture) await lab.startCapture(opts.capture);
    lab.boot = { kernel, initrd, memoryMb: opts.memoryMb ?? 1024, timeoutMs: bootTimeoutMs };
    for (let i = 0; i < n; i++) {
      const g = new GuestImpl(i + 2, ipv6, lab.dir);
      g.restarter = () => lab.restartGuest(g);
      lab.guests.push(g);
    }
    for (const g of lab.guests) lab.startGuest(g, kernel, initrd, lab.boot.memoryMb);
    await Promise.all(lab.guests.map((g) => lab.waitReady(g, bootTimeoutMs)));
    return lab;
  } catch (e) {
    await lab.stop().catch(() => undefined);
    throw e;
  }
}

/*
 * verbs-peer: a small libibverbs program for the rxe lab, for what the Debian tools cannot do
 * (ibv_*_pingpong only SENDs, perftest 4.5 has no immediates, neither runs 0-byte RC/UC messages,
 * and ibv_ud_pingpong has no notion of a path MTU): SEND, SEND_WITH_IMM, RDMA_WRITE,
 * RDMA_WRITE_WITH_IMM and RDMA_READ over RC, UC and UD, any message size including 0, one
 * connection running a whole list of cells (operation, message size), every message checked on
 * the side that can see it.
 *
 *   verbs-peer -d DEV -g GIDX -t rc|uc|ud -m MTU -r requester|responder -p PORT
 *              -c OP:SIZE[:ITERS][,OP:SIZE[:ITERS]...] [-n ITERS] [-T SECONDS]
 *
 * OP is send, send_imm, write, write_imm or read; a cell runs ITERS messages (default -n, 1). The peer is always the TCP server (one client,
 * on :: and so on IPv4 too); -r says which side of the RDMA traffic it is. -m is the RC/UC path
 * MTU; for UD it is the largest message allowed and must not exceed the port's active MTU.
 * -T bounds the whole run (alarm): rxe with retry_cnt 7 retransmits forever when nobody answers.
 * Exit 0 only when every message of every cell was verified.
 *
 * The exchange (text over TCP, one '\n'-terminated line each):
 *  1. client -> server  "LID:QPN:PSN:GID:RKEY:VA"  ("%04x:%06x:%06x:%32s:%08x:%016llx", the
 *     pingpong format extended with the R_Key and the address of the peer's buffer)
 *  2. server -> client  the same, once the server's QP is in RTS
 *  then for each cell k = 0, 1, ... of -c, each of its messages i = 0, 1, ...:
 *  3. responder -> requester  "ready"  (receive posted / buffer cleared for a WRITE / pattern
 *     written for a READ)
 *  4. requester -> responder  "sent"   once the send completion is good (READ: data checked),
 *     or "fail WHY" (and both end)
 *  5. responder -> requester  "ok" once its checks pass, or "fail WHY" (and both end)
 *  Each side prints "cell OP SIZE ITER ok" or "cell OP SIZE ITER fail WHY" for what it checked.
 *
 * Message i of cell k carries byte j = pattern(k, i, j) and immediate 0x5a000000 | k << 8 | i
 * (host order; on the wire in network order, as ImmDt). A responder checks the receive
 * completion (status, opcode, byte_len, IBV_WC_WITH_IMM and imm_data), the bytes, and that the
 * 64 bytes after the message stayed untouched.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

enum { GRH = 40, GUARD = 64, MAX_CELLS = 64, STEP_MS = 20000 };
enum op { SEND, SEND_IMM, WRITE, WRITE_IMM, READ };
static const char *op_names[] = { "send", "send_imm", "write", "write_imm", "read" };

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_mr *mr;
static struct ibv_cq *cq;
static struct ibv_qp *qp;
static struct ibv_ah *ah;
static uint8_t *buf;
static size_t buf_len;
static int qp_type, gidx, mtu, requester, iters = 1, sock = -1;
static uint32_t remote_qpn, remote_rkey;
static uint64_t remote_va;

static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "verbs-peer: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	exit(1);
}

static uint8_t pattern(int k, int i, size_t j)
{
	/* j >> 8 makes a misplaced 256-byte block visible; k and i tell messages apart */
	return (uint8_t)(j * 7 + (j >> 8) * 13 + k * 29 + i * 101 + 1);
}

static uint32_t imm_of(int k, int i) { return 0x5a000000u | (uint32_t)k << 8 | (uint32_t)i; }

/* ---- the TCP exchange ------------------------------------------------------------------- */

static void send_line(const char *fmt, ...)
{
	char line[256];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(line, sizeof line - 1, fmt, ap);
	va_end(ap);
	line[n++] = '\n';
	for (int off = 0; off < n;) {
		ssize_t w = write(sock, line + off, n - off);
		if (w <= 0)
			die("TCP write: %s", strerror(errno));
		off += w;
	}
}

/* One line (without '\n'), waiting at most STEP_MS; "" on EOF. */
static char *recv_line(void)
{
	static char line[256];
	size_t n = 0;
	for (;;) {
		struct pollfd p = { .fd = sock, .events = POLLIN };
		if (poll(&p, 1, STEP_MS) <= 0)
			die("TCP read: no line from the peer in %d ms", STEP_MS);
		ssize_t r = read(sock, line + n, 1); /* byte by byte: lines are short and rare */
		if (r <= 0) {
			line[0] = 0;
			return line;
		}
		if (line[n] == '\n' || n == sizeof line - 2) {
			line[n] = 0;
			return line;
		}
		n++;
	}
}

static void listen_accept(int port)
{
	int one = 1, zero = 0;
	int l = socket(AF_INET6, SOCK_STREAM, 0);
	struct sockaddr_in6 a = { .sin6_family = AF_INET6, .sin6_port = htons(port), .sin6_addr = in6addr_any };
	if (l < 0)
		die("socket: %s", strerror(errno));
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	setsockopt(l, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
	if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 1))
		die("listen on port %d: %s", port, strerror(errno));
	printf("listening on %d\n", port);
	fflush(stdout);
	struct pollfd p = { .fd = l, .events = POLLIN };
	if (poll(&p, 1, 60000) <= 0)
		die("no client within 60 s");
	sock = accept(l, NULL, NULL);
	if (sock < 0)
		die("accept: %s", strerror(errno));
	close(l);
}

/* ---- verbs -------------------------------------------------------------------------------- */

static void open_device(const char *name, int size_max)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	for (int i = 0; list && i < n; i++)
		if (!strcmp(ibv_get_device_name(list[i]), name))
			ctx = ibv_open_device(list[i]);
	if (!ctx)
		die("no device %s", name);
	struct ibv_port_attr port;
	if (ibv_query_port(ctx, 1, &port))
		die("ibv_query_port");
	int active = 128 << port.active_mtu;
	printf("port active_mtu %d\n", active);
	if (mtu > active)
		die("-m %d is larger than the port's active MTU %d", mtu, active);
	if (qp_type == IBV_QPT_UD && size_max > mtu)
		die("a UD message of %d bytes does not fit -m %d", size_max, mtu);
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	buf_len = (size_t)size_max + GRH + GUARD;
	if (!pd || !cq || posix_memalign((void **)&buf, 4096, buf_len))
		die("PD/CQ/buffer");
	int access = IBV_ACCESS_LOCAL_WRITE;
	if (qp_type != IBV_QPT_UD)
		access |= IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	mr = ibv_reg_mr(pd, buf, buf_len, access);
	if (!mr)
		die("ibv_reg_mr(%zu): %s", buf_len, strerror(errno));
	struct ibv_qp_init_attr init = {
		.send_cq = cq, .recv_cq = cq, .qp_type = qp_type,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	qp = ibv_create_qp(pd, &init);
	if (!qp)
		die("ibv_create_qp: %s", strerror(errno));
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1 };
	int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
	if (qp_type == IBV_QPT_UD) {
		a.qkey = 0x11111111;
		mask |= IBV_QP_QKEY;
	} else {
		a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | (qp_type == IBV_QPT_RC ? IBV_ACCESS_REMOTE_READ : 0);
		mask |= IBV_QP_ACCESS_FLAGS;
	}
	if (ibv_modify_qp(qp, &a, mask))
		die("modify QP to INIT: %s", strerror(errno));
}

static enum ibv_mtu mtu_enum(int bytes)
{
	switch (bytes) {
	case 256: return IBV_MTU_256;
	case 512: return IBV_MTU_512;
	case 1024: return IBV_MTU_1024;
	case 2048: return IBV_MTU_2048;
	case 4096: return IBV_MTU_4096;
	}
	die("-m %d: not an IB MTU", bytes);
	return 0;
}

static void connect_qp(const union ibv_gid *dgid, uint32_t dqpn, uint32_t dpsn, uint32_t my_psn)
{
	struct ibv_ah_attr aha = {
		.is_global = 1, .port_num = 1,
		.grh = { .dgid = *dgid, .sgid_index = gidx, .hop_limit = 64 },
	};
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTR };
	int mask = IBV_QP_STATE;
	if (qp_type != IBV_QPT_UD) {
		a.path_mtu = mtu_enum(mtu);
		a.dest_qp_num = dqpn;
		a.rq_psn = dpsn;
		a.ah_attr = aha;
		mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
		if (qp_type == IBV_QPT_RC) {
			a.max_dest_rd_atomic = 1;
			a.min_rnr_timer = 12;
			mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
		}
	}
	if (ibv_modify_qp(qp, &a, mask))
		die("modify QP to RTR: %s", strerror(errno));
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = my_psn;
	mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
	if (qp_type == IBV_QPT_RC) {
		/* timeout 14 (67 ms): TCG guests are slow; retry 7 = forever in rxe, hence -T */
		a.timeout = 14;
		a.retry_cnt = 7;
		a.rnr_retry = 7;
		a.max_rd_atomic = 1;
		mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
	}
	if (ibv_modify_qp(qp, &a, mask))
		die("modify QP to RTS: %s", strerror(errno));
	if (qp_type == IBV_QPT_UD) {
		ah = ibv_create_ah(pd, &aha);
		if (!ah)
			die("ibv_create_ah: %s", strerror(errno));
	}
	remote_qpn = dqpn;
}

/* One completion within STEP_MS, or NULL with *why set. */
static int poll_one(struct ibv_wc *wc, const char **why)
{
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n < 0) {
			*why = "ibv_poll_cq failed";
			return 0;
		}
		if (n == 1)
			return 1;
		clock_gettime(CLOCK_MONOTONIC, &t);
		if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 > STEP_MS) {
			*why = "no completion within 20 s";
			return 0;
		}
		usleep(50);
	}
}

/* ---- one message ------------------------------------------------------------------------- */

static char why_buf[200];
#define FAIL(...) do { snprintf(why_buf, sizeof why_buf, __VA_ARGS__); return why_buf; } while (0)

/* Responder, before "ready". */
static const char *prepare(enum op op, int k, int i, int size)
{
	size_t at = qp_type == IBV_QPT_UD ? GRH : 0;
	memset(buf, 0, buf_len);
	if (op == READ) {
		for (int j = 0; j < size; j++)
			buf[j] = pattern(k, i, j);
		return NULL;
	}
	if (op == WRITE)
		return NULL;
	/* SEND, SEND_IMM, WRITE_IMM consume a receive; WRITE_IMM's data goes to the R_Key's address */
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = (uint32_t)(size + at + GUARD), .lkey = mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 100 + i, .sg_list = &sge, .num_sge = op == WRITE_IMM ? 0 : 1 }, *bad;
	(void)k;
	if (ibv_post_recv(qp, &wr, &bad))
		FAIL("ibv_post_recv: %s", strerror(errno));
	return NULL;
}

/* Requester: post, complete, check (READ). */
static const char *request(enum op op, int k, int i, int size)
{
	static const enum ibv_wr_opcode wr_op[] = { IBV_WR_SEND, IBV_WR_SEND_WITH_IMM, IBV_WR_RDMA_WRITE,
						    IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_RDMA_READ };
	static const enum ibv_wc_opcode wc_op[] = { IBV_WC_SEND, IBV_WC_SEND, IBV_WC_RDMA_WRITE, IBV_WC_RDMA_WRITE,
						    IBV_WC_RDMA_READ };
	memset(buf, 0, buf_len);
	if (op != READ)
		for (int j = 0; j < size; j++)
			buf[j] = pattern(k, i, j);
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = (uint32_t)size, .lkey = mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = 200 + i, .sg_list = &sge, .num_sge = size > 0, .opcode = wr_op[op],
		.send_flags = IBV_SEND_SIGNALED, .imm_data = htonl(imm_of(k, i)),
	}, *bad;
	if (qp_type == IBV_QPT_UD) {
		wr.wr.ud.ah = ah;
		wr.wr.ud.remote_qpn = remote_qpn;
		wr.wr.ud.remote_qkey = 0x11111111;
	} else {
		wr.wr.rdma.remote_addr = remote_va;
		wr.wr.rdma.rkey = remote_rkey;
	}
	if (ibv_post_send(qp, &wr, &bad))
		FAIL("ibv_post_send: %s", strerror(errno));
	struct ibv_wc wc;
	const char *why;
	if (!poll_one(&wc, &why))
		return why;
	if (wc.status != IBV_WC_SUCCESS)
		FAIL("send completion %s (vendor_err %u)", ibv_wc_status_str(wc.status), wc.vendor_err);
	if (wc.opcode != wc_op[op] || wc.wr_id != 200u + i)
		FAIL("send completion opcode %d wr_id %llu", wc.opcode, (unsigned long long)wc.wr_id);
	if (op == READ) {
		for (int j = 0; j < size; j++)
			if (buf[j] != pattern(k, i, j))
				FAIL("READ data differs at byte %d: 0x%02x, expected 0x%02x", j, buf[j], pattern(k, i, j));
		for (int j = size; j < size + GUARD; j++)
			if (buf[j])
				FAIL("READ wrote past %d bytes (byte %d)", size, j);
	}
	return NULL;
}

/* Responder, after "sent": the receive completion and the bytes. */
static const char *check(enum op op, int k, int i, int size)
{
	size_t at = qp_type == IBV_QPT_UD ? GRH : 0;
	if (op == READ)
		return NULL;
	if (op != WRITE) {
		struct ibv_wc wc;
		const char *why;
		if (!poll_one(&wc, &why))
			return why;
		if (wc.status != IBV_WC_SUCCESS)
			FAIL("receive completion %s", ibv_wc_status_str(wc.status));
		enum ibv_wc_opcode want = op == WRITE_IMM ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
		if (wc.opcode != want || wc.wr_id != 100u + i)
			FAIL("receive completion opcode %d wr_id %llu, expected %d", wc.opcode, (unsigned long long)wc.wr_id, want);
		if (wc.byte_len != size + at)
			FAIL("receive byte_len %u, expected %zu", wc.byte_len, size + at);
		int has_imm = !!(wc.wc_flags & IBV_WC_WITH_IMM);
		if (has_imm != (op != SEND))
			FAIL("wc_flags 0x%x: IBV_WC_WITH_IMM %s", wc.wc_flags, has_imm ? "set" : "missing");
		if (has_imm && ntohl(wc.imm_data) != imm_of(k, i))
			FAIL("imm_data 0x%08x, expected 0x%08x", ntohl(wc.imm_data), imm_of(k, i));
		if (qp_type == IBV_QPT_UD && wc.src_qp != remote_qpn)
			FAIL("src_qp 0x%x, expected 0x%x", wc.src_qp, remote_qpn);
	}
	/* A UC WRITE has no receive completion, and the requester's completion means "sent", not
	 * "placed": give its last packets time to land. */
	for (int tries = op == WRITE ? 5000 : 1; tries > 0; tries--) {
		int j = 0;
		while (j < size && buf[at + j] == pattern(k, i, j))
			j++;
		if (j == size)
			break;
		if (tries == 1)
			FAIL("data differs at byte %d: 0x%02x, expected 0x%02x", j, buf[at + j], pattern(k, i, j));
		usleep(1000);
	}
	for (size_t j = at + size; j < at + size + GUARD; j++)
		if (buf[j])
			FAIL("bytes written past the %d-byte message (offset %zu)", size, j - at);
	return NULL;
}

/* ---- main --------------------------------------------------------------------------------- */

/* "op:size[:iters],..." */
static int parse_cells(char *s, int *ops, int *sizes, int *counts)
{
	int n = 0;
	for (char *t = strtok(s, ","); t; t = strtok(NULL, ",")) {
		char *colon = strchr(t, ':'), *end;
		if (!colon || n == MAX_CELLS)
			die("bad cell '%s' (OP:SIZE, at most %d)", t, MAX_CELLS);
		*colon = 0;
		ops[n] = -1;
		for (int i = 0; i < 5; i++)
			if (!strcmp(t, op_names[i]))
				ops[n] = i;
		long v = strtol(colon + 1, &end, 0);
		counts[n] = 0; /* -n */
		if (*end == ':')
			counts[n] = (int)strtol(end + 1, &end, 0);
		if (ops[n] < 0 || *end || v < 0 || v > (64 << 20) || counts[n] < 0)
			die("bad cell '%s:%s'", t, colon + 1);
		sizes[n++] = (int)v;
	}
	return n;
}

int main(int argc, char **argv)
{
	const char *dev = "rxe0", *tr = "rc";
	int port = 18600, ops[MAX_CELLS], sizes[MAX_CELLS], counts[MAX_CELLS], ncells = 0, limit = 120, c;
	while ((c = getopt(argc, argv, "d:g:t:m:r:p:c:n:T:")) != -1) {
		switch (c) {
		case 'd': dev = optarg; break;
		case 'g': gidx = atoi(optarg); break;
		case 't': tr = optarg; break;
		case 'm': mtu = atoi(optarg); break;
		case 'r': requester = !strcmp(optarg, "requester"); break;
		case 'p': port = atoi(optarg); break;
		case 'c': ncells = parse_cells(optarg, ops, sizes, counts); break;
		case 'n': iters = atoi(optarg); break;
		case 'T': limit = atoi(optarg); break;
		default: die("usage: see the header of verbs-peer.c");
		}
	}
	qp_type = !strcmp(tr, "rc") ? IBV_QPT_RC : !strcmp(tr, "uc") ? IBV_QPT_UC : !strcmp(tr, "ud") ? IBV_QPT_UD : -1;
	if (qp_type < 0 || !ncells || iters < 1 || !mtu)
		die("need -t rc|uc|ud, -m MTU and -c CELLS");
	for (int k = 0; k < ncells; k++)
		if (qp_type == IBV_QPT_UD ? ops[k] > SEND_IMM : qp_type == IBV_QPT_UC && ops[k] == READ)
			die("%s is not an operation of %s", op_names[ops[k]], tr);
	alarm(limit);
	setvbuf(stdout, NULL, _IOLBF, 0);

	int size_max = 0;
	for (int k = 0; k < ncells; k++)
		size_max = sizes[k] > size_max ? sizes[k] : size_max;
	open_device(dev, size_max);
	union ibv_gid gid;
	if (ibv_query_gid(ctx, 1, gidx, &gid))
		die("no GID %d", gidx);
	srand48(getpid() * time(NULL));
	uint32_t psn = lrand48() & 0xffffff;

	listen_accept(port);
	/* 1. the client's address */
	unsigned lid, rqpn, rpsn, rkey;
	unsigned long long va;
	char gtext[33];
	union ibv_gid rgid;
	char *l = recv_line();
	if (sscanf(l, "%x:%x:%x:%32[0-9a-f]:%x:%llx", &lid, &rqpn, &rpsn, gtext, &rkey, &va) != 6 || strlen(gtext) != 32)
		die("malformed address line '%s'", l);
	for (int b = 0; b < 16; b++) {
		unsigned x;
		sscanf(gtext + 2 * b, "%2x", &x);
		rgid.raw[b] = (uint8_t)x;
	}
	remote_rkey = rkey;
	remote_va = va;
	connect_qp(&rgid, rqpn, rpsn, psn);
	/* 2. ours */
	char mine[33];
	for (int b = 0; b < 16; b++)
		sprintf(mine + 2 * b, "%02x", gid.raw[b]);
	send_line("%04x:%06x:%06x:%s:%08x:%016llx", 0, qp->qp_num, psn, mine, mr->rkey, (unsigned long long)(uintptr_t)buf);
	printf("local  QPN 0x%06x PSN 0x%06x GID %s RKEY 0x%08x VA 0x%016llx\n", qp->qp_num, psn, mine, mr->rkey,
	       (unsigned long long)(uintptr_t)buf);
	printf("remote QPN 0x%06x PSN 0x%06x GID %s RKEY 0x%08x VA 0x%016llx\n", rqpn, rpsn, gtext, rkey, va);

	for (int k = 0; k < ncells; k++) {
		int size = sizes[k];
		const char *op = op_names[ops[k]];
		for (int i = 0; i < (counts[k] ? counts[k] : iters); i++) {
			const char *why;
			if (requester) {
				l = recv_line();
				if (strcmp(l, "ready"))
					die("cell %s %d %d: expected ready, got '%s'", op, size, i, l);
				why = request(ops[k], k, i, size);
				if (why) {
					send_line("fail %s", why);
					printf("cell %s %d %d fail %s\n", op, size, i, why);
					return 1;
				}
				send_line("sent");
				l = recv_line();
				if (strcmp(l, "ok")) {
					printf("cell %s %d %d fail the responder: %s\n", op, size, i, *l ? l : "(closed)");
					return 1;
				}
			} else {
				why = prepare(ops[k], k, i, size);
				if (!why) {
					send_line("ready");
					l = recv_line();
					if (strcmp(l, "sent"))
						snprintf(why_buf, sizeof why_buf, "the requester: %s", *l ? l : "(closed)"), why = why_buf;
					else
						why = check(ops[k], k, i, size);
				}
				if (why) {
					send_line("fail %s", why);
					printf("cell %s %d %d fail %s\n", op, size, i, why);
					return 1;
				}
				send_line("ok");
			}
			printf("cell %s %d %d ok\n", op, size, i);
		}
	}
	printf("result ok %d cells\n", ncells);
	close(sock);
	return 0;
}

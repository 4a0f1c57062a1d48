/*
 * mmsg: the batched link's two system calls, sendmmsg and recvmmsg, called from JavaScript without
 * an FFI in between.
 *
 * Why: through koffi each call also converted its typed-array argument to a pointer and read errno
 * back, about 0.27 µs a call on top of the system call (recvmmsg finding nothing: 1.69–1.81 µs
 * through koffi, 1.43–1.54 µs from here, on the 2-vCPU VM of bench/README.md). A ping-pong side
 * makes one sendmmsg and one recvmmsg per message, and those two are a third of its busy time
 * (bench/HISTORY.md, "Since the full run at 20:17"). The message vector and everything it points to
 * stay where `mmsg.ts` lays them out: memory the kernel is handed by address, allocated once per ring.
 *
 * Each function returns what the system call returned, or -errno when it failed (never -1 with
 * errno left to read afterwards: nothing in between can change it then).
 */
#define _GNU_SOURCE
#define NAPI_VERSION 8
#include <node_api.h>

#include "mmsg.h"

#ifdef __linux__
#include <errno.h>
#include <stdint.h>
#include <sys/socket.h>

/* mmsg.ts lays the vector out for Linux LP64: a 56-byte msghdr and its 4-byte length, padded to 64. */
_Static_assert(sizeof(struct mmsghdr) == 64, "struct mmsghdr is 64 bytes (Linux LP64)");

/* The arguments (fd, vec, vlen, flags), vec a Uint8Array of at least vlen headers; 0 with a TypeError or RangeError pending. */
static int args_of(napi_env env, napi_callback_info info, int *fd, struct mmsghdr **vec, unsigned *vlen, int *flags) {
  size_t argc = 4;
  napi_value argv[4];
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok) return 0;
  napi_typedarray_type type;
  size_t length = 0;
  void *data = NULL;
  int32_t f = -1, n = -1, fl = 0;
  if (argc < 4 || napi_get_typedarray_info(env, argv[1], &type, &length, &data, NULL, NULL) != napi_ok || type != napi_uint8_array ||
      napi_get_value_int32(env, argv[0], &f) != napi_ok || napi_get_value_int32(env, argv[2], &n) != napi_ok ||
      napi_get_value_int32(env, argv[3], &fl) != napi_ok) {
    napi_throw_type_error(env, NULL, "(fd, vec, vlen, flags): a descriptor, a Uint8Array and two integers");
    return 0;
  }
  /* The headers' own bytes at least: what they point to is the caller's to have laid out. */
  if (f < 0 || n < 0 || (size_t)n * sizeof(struct mmsghdr) > length || ((uintptr_t)data & 7) != 0) {
    napi_throw_range_error(env, NULL, "a negative descriptor or count, or a vector shorter than its count or not 8-aligned");
    return 0;
  }
  *fd = f;
  *vec = data;
  *vlen = (unsigned)n;
  *flags = fl;
  return 1;
}

static napi_value result(napi_env env, int r) {
  napi_value out;
  napi_create_int32(env, r < 0 ? -errno : r, &out);
  return out;
}

/* sendmmsg(fd, vec, vlen, flags): messages sent, or -errno. */
static napi_value js_sendmmsg(napi_env env, napi_callback_info info) {
  int fd, flags;
  struct mmsghdr *vec;
  unsigned vlen;
  if (!args_of(env, info, &fd, &vec, &vlen, &flags)) return NULL;
  return result(env, sendmmsg(fd, vec, vlen, flags));
}

/* recvmmsg(fd, vec, vlen, flags): messages read (no timeout), or -errno. */
static napi_value js_recvmmsg(napi_env env, napi_callback_info info) {
  int fd, flags;
  struct mmsghdr *vec;
  unsigned vlen;
  if (!args_of(env, info, &fd, &vec, &vlen, &flags)) return NULL;
  return result(env, recvmmsg(fd, vec, vlen, flags, NULL));
}

void roce_mmsg_init(napi_env env, napi_value exports) {
  napi_value f;
  napi_create_function(env, "sendmmsg", NAPI_AUTO_LENGTH, js_sendmmsg, NULL, &f);
  napi_set_named_property(env, exports, "sendmmsg", f);
  napi_create_function(env, "recvmmsg", NAPI_AUTO_LENGTH, js_recvmmsg, NULL, &f);
  napi_set_named_property(env, exports, "recvmmsg", f);
}
#else
/* Linux's calls: elsewhere the link has no batched path, and the addon exports neither. */
void roce_mmsg_init(napi_env env, napi_value exports) {
  (void)env;
  (void)exports;
}
#endif

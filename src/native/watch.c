/*
 * watch: a socket's readiness, handed to JavaScript the way node hands its own sockets' data.
 *
 * Why native at all: the batched link (`src/link/mmsg.ts`) reads its socket with recvmmsg whenever
 * libuv reports it readable. koffi's poll calls JavaScript outside any node callback scope, builds an
 * event object with an interned property name per call, and runs no microtasks after it: promise
 * reactions to what was read would wait for the next unrelated callback. So the read had to be moved
 * to an immediate of the same loop turn, and the answer to a second one. Each wake-up paid for those
 * two hops before a byte was read (about 1.5 µs here, on each side of a ping-pong).
 *
 * Here the poll callback calls `read` and then `answer` through napi_make_callback, as node's own
 * handles call their listeners: each call runs in a callback scope whose end runs process.nextTick
 * callbacks and microtasks. What the application does in reaction to the read (a reply posted from a
 * completion it awaited) therefore happens before `answer`, and what `answer` sends is flushed by its
 * own scope's microtasks, all in the poll phase of the turn that reported the descriptor readable.
 *
 * The watch keeps the event loop alive while it runs, as a socket does; `close` stops it (and frees it
 * once libuv has closed the handle). An exception thrown by `read` or `answer` is raised as an uncaught
 * exception, as one thrown by any event listener is, and `answer` is then not called for that wake-up.
 */
/* uv.h needs the POSIX types that -std=c11 leaves out. */
#define _POSIX_C_SOURCE 200809L
#define NAPI_VERSION 8
#include <node_api.h>
#include <stdbool.h>
#include <stdlib.h>
#include <uv.h>

#include "watch.h"

typedef struct watch {
  uv_poll_t handle;
  napi_env env;
  napi_ref read;
  napi_ref answer;
  napi_ref resource;
  napi_async_context async;
  int closed;
} watch;

static void on_closed(uv_handle_t *h) {
  free(h->data);
}

/* Calls `ref`'s function in a callback scope; false when it threw (the exception is then raised). */
static int call(watch *w, napi_ref ref, napi_value resource) {
  napi_env env = w->env;
  napi_value fn, result;
  if (napi_get_reference_value(env, ref, &fn) != napi_ok || fn == NULL) return 0;
  napi_status st = napi_make_callback(env, w->async, resource, fn, 0, NULL, &result);
  if (st == napi_ok) return 1;
  bool pending = false;
  napi_is_exception_pending(env, &pending);
  if (pending) {
    napi_value err;
    napi_get_and_clear_last_exception(env, &err);
    napi_fatal_exception(env, err);
  }
  return 0;
}

static void on_poll(uv_poll_t *h, int status, int events) {
  (void)status;
  (void)events;
  watch *w = h->data;
  if (w->closed) return;
  napi_handle_scope scope;
  if (napi_open_handle_scope(w->env, &scope) != napi_ok) return;
  napi_value resource;
  if (napi_get_reference_value(w->env, w->resource, &resource) == napi_ok && resource != NULL) {
    /* An error status (the descriptor failed) is left to `read`: its recvmmsg reports it. */
    if (call(w, w->read, resource) && !w->closed) call(w, w->answer, resource);
  }
  napi_close_handle_scope(w->env, scope);
}

static void release(watch *w) {
  napi_env env = w->env;
  w->closed = 1;
  uv_poll_stop(&w->handle);
  napi_delete_reference(env, w->read);
  napi_delete_reference(env, w->answer);
  napi_delete_reference(env, w->resource);
  napi_async_destroy(env, w->async);
  uv_close((uv_handle_t *)&w->handle, on_closed);
}

/* The environment is torn down (a worker thread ends) with the watch still open. */
static void cleanup(void *arg) {
  watch *w = arg;
  if (!w->closed) release(w);
}

/* close(): stops the watch; a second call does nothing. `this` is the handle object watch() returned. */
static napi_value js_close(napi_env env, napi_callback_info info) {
  napi_value self;
  void *data = NULL;
  if (napi_get_cb_info(env, info, NULL, NULL, &self, NULL) != napi_ok) return NULL;
  if (napi_unwrap(env, self, &data) != napi_ok || data == NULL) return NULL;
  /* Unwrapped first: the memory is freed once libuv has closed the handle, and a second close()
     must not find it. */
  napi_remove_wrap(env, self, &data);
  watch *w = data;
  napi_remove_env_cleanup_hook(env, cleanup, w);
  release(w);
  return NULL;
}

/* watch(fd, read, answer) → { close() } */
static napi_value js_watch(napi_env env, napi_callback_info info) {
  size_t argc = 3;
  napi_value argv[3];
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok) return NULL;
  int32_t fd = -1;
  napi_valuetype t1 = napi_undefined, t2 = napi_undefined;
  if (argc == 3) {
    napi_get_value_int32(env, argv[0], &fd);
    napi_typeof(env, argv[1], &t1);
    napi_typeof(env, argv[2], &t2);
  }
  if (fd < 0 || t1 != napi_function || t2 != napi_function) {
    napi_throw_type_error(env, NULL, "watch(fd, read, answer): a descriptor and two functions");
    return NULL;
  }
  uv_loop_t *loop;
  if (napi_get_uv_event_loop(env, &loop) != napi_ok) {
    napi_throw_error(env, NULL, "watch: no event loop");
    return NULL;
  }
  watch *w = calloc(1, sizeof *w);
  if (w == NULL) {
    napi_throw_error(env, NULL, "watch: out of memory");
    return NULL;
  }
  w->env = env;
  w->handle.data = w;
  int r = uv_poll_init(loop, &w->handle, fd);
  if (r != 0) {
    free(w);
    napi_throw_error(env, uv_err_name(r), uv_strerror(r));
    return NULL;
  }
  napi_value self, close_fn, name;
  napi_create_object(env, &self);
  napi_create_function(env, "close", NAPI_AUTO_LENGTH, js_close, NULL, &close_fn);
  napi_set_named_property(env, self, "close", close_fn);
  napi_create_string_utf8(env, "RoceSocketWatch", NAPI_AUTO_LENGTH, &name);
  if (napi_wrap(env, self, w, NULL, NULL, NULL) != napi_ok || napi_async_init(env, self, name, &w->async) != napi_ok) {
    uv_close((uv_handle_t *)&w->handle, on_closed);
    napi_throw_error(env, NULL, "watch: could not set up the callback context");
    return NULL;
  }
  napi_create_reference(env, argv[1], 1, &w->read);
  napi_create_reference(env, argv[2], 1, &w->answer);
  napi_create_reference(env, self, 1, &w->resource);
  r = uv_poll_start(&w->handle, UV_READABLE, on_poll);
  if (r != 0) {
    release(w);
    napi_throw_error(env, uv_err_name(r), uv_strerror(r));
    return NULL;
  }
  napi_add_env_cleanup_hook(env, cleanup, w);
  return self;
}

void roce_watch_init(napi_env env, napi_value exports) {
  napi_value f;
  napi_create_function(env, "watch", NAPI_AUTO_LENGTH, js_watch, NULL, &f);
  napi_set_named_property(env, exports, "watch", f);
}

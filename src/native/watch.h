/* The socket readiness watch of `watch.c`, exported beside the ICRC functions of `icrc.c`. */
#ifndef ROCE_WATCH_H
#define ROCE_WATCH_H
#include <node_api.h>

/* Adds `watch(fd, read, answer)` to `exports`. */
void roce_watch_init(napi_env env, napi_value exports);

#endif

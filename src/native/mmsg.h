/* The batched link's system calls of `mmsg.c`, exported beside the ICRC functions of `icrc.c`. */
#ifndef ROCE_MMSG_H
#define ROCE_MMSG_H
#include <node_api.h>

/* Adds `sendmmsg(fd, vec, vlen, flags)` and `recvmmsg(fd, vec, vlen, flags)` to `exports`. */
void roce_mmsg_init(napi_env env, napi_value exports);

#endif

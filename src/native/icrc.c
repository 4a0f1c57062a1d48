/*
 * roce_icrc: CRC-32 and the RoCEv2 ICRC, each in one native call.
 *
 * Why native at all: a call from JavaScript into `@node-rs/crc32` costs about 100 ns before it reads a
 * byte, and the ICRC's own work around that call (the flow's cached pseudo-header CRC, the BTH mask,
 * the field at the tail, the IPv4 ID recovery) took another 25–35 ns of JavaScript. At path MTU 1024
 * that put the ICRC at 1.1–1.3 times a plain CRC of the same bytes. Here a call costs about 40 ns
 * (one typed array, no object reads), and the ICRC's own work is a few nanoseconds of C.
 *
 * The arithmetic is the one `src/wire/icrc.ts` documents and implements in JavaScript; that file is
 * the reference this one is tested against (test/wire/icrc-addon.test.ts), and the fallback where this
 * addon is not built. Everything is done on the CRC register r = ~crc: the register is linear in the
 * data once the start value is fixed, which is what the prefix cache, the ID terms and the recovery
 * tables use.
 *
 * The flow's key (family, ports, IPv4 ID and flags, addresses) does not travel as arguments: reading
 * one JavaScript number through N-API costs about as much as comparing the whole key. The wrapper
 * writes it into an Int32Array it shares with this file (`bind`), and each call reads it from there.
 * All mutable state is per N-API environment (worker threads each have their own); the tables are
 * computed once per process.
 */
#define NAPI_VERSION 8
#include <node_api.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mmsg.h"
#include "watch.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ROCE_X86 1
#include <cpuid.h>
#include <immintrin.h>
#endif

/* ---------------------------------------------------------------------------------------------- */
/* CRC-32 (IEEE 802.3, reflected polynomial 0xedb88320).                                          */

#define CRC32_POLY 0xedb88320u

/* Slicing-by-8: slice[k][b] is the register contribution of byte b followed by k zero bytes. */
static uint32_t slice[8][256];

/* The register moved over n bytes, eight at a time. For the short pieces: headers, tails, < 64 B. */
static uint32_t reg_table(uint32_t r, const uint8_t *p, size_t n) {
  while (n >= 8) {
    uint32_t a = r ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
    r = slice[7][a & 0xff] ^ slice[6][(a >> 8) & 0xff] ^ slice[5][(a >> 16) & 0xff] ^ slice[4][a >> 24] ^
        slice[3][p[4]] ^ slice[2][p[5]] ^ slice[1][p[6]] ^ slice[0][p[7]];
    p += 8;
    n -= 8;
  }
  /* Four independent lookups rather than four dependent byte steps: a BTH or an IPv4 header ends so. */
  if (n >= 4) {
    uint32_t a = r ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
    r = slice[3][a & 0xff] ^ slice[2][(a >> 8) & 0xff] ^ slice[1][(a >> 16) & 0xff] ^ slice[0][a >> 24];
    p += 4;
    n -= 4;
  }
  while (n-- > 0) r = slice[0][(r ^ *p++) & 0xff] ^ (r >> 8);
  return r;
}

#ifdef ROCE_X86
static int have_clmul;

/*
 * Carry-less multiplication folding (Gopal et al., "Fast CRC Computation for Generic Polynomials Using
 * PCLMULQDQ Instruction", Intel, 2009), with the paper's bit-reflected constants for this polynomial:
 * k1/k2 move each of four 128-bit lanes forward by 64 bytes, k3/k4 one lane by 16 bytes, k5 takes
 * the last 96 bits to 64, and μ/P' are the Barrett reduction's. test/wire/icrc-addon.test.ts holds the
 * result to the bitwise CRC at every length to 300 and at random lengths, offsets and seeds.
 */
#define ROCE_CLMUL __attribute__((target("pclmul,sse4.1")))

ROCE_CLMUL static inline __m128i fold(__m128i x, __m128i k, __m128i next) {
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), next);
}

ROCE_CLMUL static inline __m128i load(const uint8_t *p) {
  return _mm_loadu_si128((const __m128i *)p);
}

/*
 * The register moved over n bytes, n >= 64 and a multiple of 16, as if the first 8 bytes were XORed
 * with `flip` (little-endian; the ICRC masks a byte of the BTH with it, without a copy).
 */
ROCE_CLMUL static uint32_t reg_fold(uint32_t r, uint64_t flip, const uint8_t *p, size_t n) {
  const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596, 0x0154442bd4);
  const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009e, 0x01751997d0);
  const __m128i k5 = _mm_set_epi64x(0, 0x0163cd6124);
  const __m128i barrett = _mm_set_epi64x(0x01f7011641, 0x01db710641); /* μ, P' */
  const __m128i low32 = _mm_setr_epi32(-1, 0, -1, 0);

  __m128i a = _mm_xor_si128(load(p), _mm_set_epi64x(0, (long long)(flip ^ r)));
  __m128i b = load(p + 16);
  __m128i c = load(p + 32);
  __m128i d = load(p + 48);
  p += 64;
  n -= 64;
  /* Four independent lanes, so that the multiplier's latency overlaps. */
  for (; n >= 64; p += 64, n -= 64) {
    a = fold(a, k1k2, load(p));
    b = fold(b, k1k2, load(p + 16));
    c = fold(c, k1k2, load(p + 32));
    d = fold(d, k1k2, load(p + 48));
  }
  a = fold(a, k3k4, b);
  a = fold(a, k3k4, c);
  a = fold(a, k3k4, d);
  for (; n >= 16; p += 16, n -= 16) a = fold(a, k3k4, load(p));

  /* 128 bits to 64, then to 32 by Barrett reduction. */
  a = _mm_xor_si128(_mm_srli_si128(a, 8), _mm_clmulepi64_si128(a, k3k4, 0x10));
  a = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(a, low32), k5, 0x00), _mm_srli_si128(a, 4));
  __m128i t = _mm_clmulepi64_si128(_mm_and_si128(a, low32), barrett, 0x10);
  t = _mm_clmulepi64_si128(_mm_and_si128(t, low32), barrett, 0x00);
  return (uint32_t)_mm_extract_epi32(_mm_xor_si128(a, t), 1);
}
#endif

/* The register moved over n bytes, by folding where the CPU can and the table for the rest. */
/* Bytes before p's next 16-byte boundary: folding from there, no load straddles a cache line. */
static inline size_t lead_of(const uint8_t *p) {
  return (16 - ((uintptr_t)p & 15)) & 15;
}

static uint32_t reg_update(uint32_t r, const uint8_t *p, size_t n) {
#ifdef ROCE_X86
  size_t lead = lead_of(p);
  if (have_clmul && n >= 64 + lead) {
    r = reg_table(r, p, lead);
    p += lead;
    n -= lead;
    size_t m = n & ~(size_t)15;
    r = reg_fold(r, 0, p, m);
    p += m;
    n -= m;
  }
#endif
  return reg_table(r, p, n);
}

/* ---------------------------------------------------------------------------------------------- */
/* The ICRC (IBTA Annex A17.3.3; see src/wire/icrc.ts for the field-by-field account).            */

#define BTH_LEN 12
#define ICRC_LEN 4
#define MIN_PAYLOAD (BTH_LEN + ICRC_LEN)
#define IPV4_DF 0x4000u

/* The key block's words, as src/wire/native.ts writes them. Addresses are stored as their bytes. */
enum { K_FAMILY = 0, K_PORTS = 1, K_ID = 2, K_FLAGS = 3, K_SRC = 4, K_DST = 8, K_MODE = 12, K_OUT = 13, K_WORDS = 16 };
enum { MODE_STRICT = 0, MODE_RECOVER = 1 };
enum { V_BAD = 0, V_OK = 1, V_RECOVERED = 2 };

/* The register after the 8 × 0xff that stand in for the LRH: every ICRC starts from it. */
static uint32_t reg_lrh;
/* The IPv4 ID's linear terms (bytes 4 and 5 of the header, 22 more bytes of IPv4 + UDP after them). */
static uint32_t id_hi[256], id_lo[256];
static const uint8_t zeros[65536 + 64];

/* The masked IP + UDP headers' register for one flow at one length, for IPv4 ID 0. */
typedef struct {
  uint32_t family, ports, len, flags;
  uint32_t src[4], dst[4];
  uint32_t reg;
} prefix_entry;

/* M⁻¹ of the recovery (icrc.ts, "IPv4 IP-ID recovery") for one UDP payload length, by byte. */
typedef struct {
  uint32_t len;
  uint32_t t[4][256];
} recovery_table;

#define RECOVERY_SLOTS 16

typedef struct {
  int32_t *key;
  napi_ref key_ref;
  prefix_entry entry[2];
  int victim;
  recovery_table *recovery[RECOVERY_SLOTS];
  int recovery_next;
  recovery_table *recovery_last;
} env_state;

static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void init_tables(void) {
  for (uint32_t n = 0; n < 256; n++) {
    uint32_t c = n;
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (CRC32_POLY & (0u - (c & 1)));
    slice[0][n] = c;
  }
  for (int n = 0; n < 256; n++) {
    uint32_t c = slice[0][n];
    for (int k = 1; k < 8; k++) {
      c = slice[0][c & 0xff] ^ (c >> 8);
      slice[k][n] = c;
    }
  }
#ifdef ROCE_X86
  unsigned eax, ebx, ecx, edx;
  have_clmul = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_PCLMUL) && (ecx & bit_SSE4_1);
#endif
  const uint8_t lrh[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
  reg_lrh = reg_table(0xffffffffu, lrh, 8);
  /* From register 0 the register is linear in the bytes: the term of an ID byte is its register. */
  uint8_t e[24] = {0};
  for (int b = 0; b < 256; b++) {
    e[0] = (uint8_t)b;
    id_hi[b] = reg_table(0, e, sizeof e);
    e[0] = 0;
    e[1] = (uint8_t)b;
    id_lo[b] = reg_table(0, e, sizeof e);
    e[1] = 0;
  }
}

static inline void put16(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 8);
  p[1] = (uint8_t)v;
}

/* The register after the 8 × 0xff and the masked IP + UDP headers, for a UDP payload of len bytes. */
static uint32_t prefix_reg(env_state *s, uint32_t len) {
  const int32_t *k = s->key;
  uint32_t family = (uint32_t)k[K_FAMILY];
  uint32_t ports = (uint32_t)k[K_PORTS];
  uint32_t flags = family == 4 ? (uint32_t)k[K_FLAGS] & 0xffff : 0;
  size_t alen = family == 4 ? 4 : 16;
  len &= 0xffff; /* all the headers hold */
  /* The key's words XORed with an entry's and ORed: zero on a hit, one branch per entry. */
  const uint32_t *src = (const uint32_t *)(k + K_SRC), *dst = (const uint32_t *)(k + K_DST);
  prefix_entry *e = NULL;
  /* The entry hit last first: a run of packets of one flow and size compares one entry. */
  for (int j = 0; j < 2; j++) {
    int i = j ^ (1 - s->victim);
    prefix_entry *c = &s->entry[i];
    uint32_t diff = (c->family ^ family) | (c->ports ^ ports) | (c->len ^ len) | (c->flags ^ flags) | (c->src[0] ^ src[0]) | (c->dst[0] ^ dst[0]);
    if (family == 6) {
      for (int w = 1; w < 4; w++) diff |= (c->src[w] ^ src[w]) | (c->dst[w] ^ dst[w]);
    }
    if (diff == 0) {
      e = c;
      s->victim = 1 - i;
      break;
    }
  }
  if (e == NULL) {
    e = &s->entry[s->victim];
    s->victim = 1 - s->victim;
    uint8_t h[48];
    size_t n;
    if (family == 4) {
      h[0] = 0x45;
      h[1] = 0xff; /* TOS */
      put16(h + 2, 20 + 8 + len);
      put16(h + 4, 0); /* ID: its term is added per packet */
      put16(h + 6, flags);
      h[8] = 0xff; /* TTL */
      h[9] = 17;
      h[10] = 0xff; /* header checksum */
      h[11] = 0xff;
      memcpy(h + 12, k + K_SRC, 4);
      memcpy(h + 16, k + K_DST, 4);
      n = 20;
    } else {
      h[0] = 0x6f; /* version 6; traffic class and flow label masked */
      h[1] = 0xff;
      h[2] = 0xff;
      h[3] = 0xff;
      put16(h + 4, 8 + len);
      h[6] = 17;
      h[7] = 0xff; /* hop limit */
      memcpy(h + 8, k + K_SRC, 16);
      memcpy(h + 24, k + K_DST, 16);
      n = 40;
    }
    put16(h + n, ports >> 16);
    put16(h + n + 2, ports & 0xffff);
    put16(h + n + 4, 8 + len);
    h[n + 6] = 0xff; /* UDP checksum */
    h[n + 7] = 0xff;
    e->reg = reg_table(reg_lrh, h, n + 8);
    e->family = family;
    e->ports = ports;
    e->len = len;
    e->flags = flags;
    memset(e->src, 0, sizeof e->src);
    memset(e->dst, 0, sizeof e->dst);
    memcpy(e->src, k + K_SRC, alen);
    memcpy(e->dst, k + K_DST, alen);
  }
  uint32_t id = (uint32_t)k[K_ID] & 0xffff;
  return family == 4 ? e->reg ^ id_hi[id >> 8] ^ id_lo[id & 0xff] : e->reg;
}

/* The ICRC of a UDP payload of n >= MIN_PAYLOAD bytes (its last four, the field, not covered). */
static uint32_t icrc_of(env_state *s, const uint8_t *p, size_t n) {
  uint32_t r = prefix_reg(s, (uint32_t)n);
  size_t covered = n - ICRC_LEN;
  /* BTH byte 4 (FECN, BECN, reserved) is covered as 0xff. */
#ifdef ROCE_X86
  size_t lead = lead_of(p);
  if (have_clmul && covered >= 64 + lead) {
    uint64_t flip = 0;
    if (lead > 4) {
      uint8_t head[16];
      memcpy(head, p, lead);
      head[4] = 0xff;
      r = reg_table(r, head, lead);
    } else {
      r = reg_table(r, p, lead);
      flip = (uint64_t)(p[4] ^ 0xff) << (8 * (4 - lead));
    }
    size_t m = (covered - lead) & ~(size_t)15;
    r = reg_fold(r, flip, p + lead, m);
    return ~reg_table(r, p + lead + m, covered - lead - m);
  }
#endif
  uint8_t bth[8];
  memcpy(bth, p, 8);
  bth[4] = 0xff;
  r = reg_table(r, bth, 8);
  return ~reg_table(r, p + 8, covered - 8);
}

/* The ICRC of a UDP payload given as a ‖ b without its ICRC field (na + nb >= BTH_LEN). */
static uint32_t icrc_of2(env_state *s, const uint8_t *a, size_t na, const uint8_t *b, size_t nb) {
  uint32_t r = prefix_reg(s, (uint32_t)(na + nb + ICRC_LEN));
  /* The BTH's first 8 bytes, masked, wherever the split falls; then the rest of each part. */
  uint8_t bth[8];
  size_t fa = na < 8 ? na : 8;
  memcpy(bth, a, fa);
  memcpy(bth + fa, b, 8 - fa);
  bth[4] = 0xff;
  r = reg_table(r, bth, 8);
  r = reg_update(r, a + fa, na - fa);
  r = reg_update(r, b + (8 - fa), nb - (8 - fa));
  return ~r;
}

static recovery_table *build_recovery(uint32_t len) {
  recovery_table *t = malloc(sizeof *t);
  if (t == NULL) return NULL;
  /* Bytes covered after header bytes 4–7: the rest of the IPv4 header, UDP, the payload less the ICRC. */
  size_t trailing = 12 + 8 + len - ICRC_LEN;
  uint32_t vec[32], comb[32];
  for (int j = 0; j < 32; j++) {
    uint8_t four[4] = {0};
    four[3 - (j >> 3)] = (uint8_t)(1u << (j & 7)); /* bit j of the big-endian word */
    vec[j] = reg_update(reg_table(0, four, 4), zeros, trailing);
    comb[j] = 1u << j;
  }
  for (int r = 0; r < 32; r++) {
    int p = r;
    while (p < 32 && ((vec[p] >> r) & 1) == 0) p++;
    if (p == 32) { /* singular: impossible for CRC-32 (a burst of <= 32 bits), kept for safety */
      free(t);
      return NULL;
    }
    uint32_t v = vec[p], c = comb[p];
    vec[p] = vec[r];
    comb[p] = comb[r];
    vec[r] = v;
    comb[r] = c;
    for (int i = 0; i < 32; i++) {
      if (i != r && ((vec[i] >> r) & 1) != 0) {
        vec[i] ^= v;
        comb[i] ^= c;
      }
    }
  }
  t->len = len;
  for (int k = 0; k < 4; k++) {
    t->t[k][0] = 0;
    for (int b = 1; b < 256; b++) t->t[k][b] = t->t[k][b & (b - 1)] ^ comb[k * 8 + __builtin_ctz((unsigned)b)];
  }
  return t;
}

static recovery_table *recovery_for(env_state *s, uint32_t len) {
  if (s->recovery_last != NULL && s->recovery_last->len == len) return s->recovery_last;
  for (int i = 0; i < RECOVERY_SLOTS; i++) {
    if (s->recovery[i] != NULL && s->recovery[i]->len == len) return s->recovery_last = s->recovery[i];
  }
  recovery_table *t = build_recovery(len);
  if (t == NULL) return NULL;
  free(s->recovery[s->recovery_next]);
  s->recovery[s->recovery_next] = t;
  s->recovery_next = (s->recovery_next + 1) % RECOVERY_SLOTS;
  return s->recovery_last = t;
}

/* ---------------------------------------------------------------------------------------------- */
/* N-API.                                                                                          */

/* A Uint8Array (or Buffer) argument's bytes; false with a TypeError pending for anything else. */
static int bytes_of(napi_env env, napi_value v, const uint8_t **p, size_t *n) {
  napi_typedarray_type type;
  void *data;
  if (napi_get_typedarray_info(env, v, &type, n, &data, NULL, NULL) != napi_ok || type != napi_uint8_array) {
    napi_throw_type_error(env, NULL, "expected a Uint8Array");
    return 0;
  }
  *p = data;
  return 1;
}

static napi_value int32_value(napi_env env, uint32_t v) {
  napi_value out;
  /* As an int32: a uint32 above 2^31 would be a heap number; the wrapper takes `>>> 0` where it must. */
  napi_create_int32(env, (int32_t)v, &out);
  return out;
}

/* crc32(data, seed = 0): the CRC-32 of data, continuing from the final CRC seed (zlib's chaining). */
static napi_value js_crc32(napi_env env, napi_callback_info info) {
  size_t argc = 2;
  napi_value argv[2];
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  const uint8_t *p;
  size_t n;
  if (!bytes_of(env, argv[0], &p, &n)) return NULL;
  uint32_t seed = 0;
  if (argc >= 2) napi_get_value_uint32(env, argv[1], &seed);
  return int32_value(env, ~reg_update(~seed, p, n));
}

/*
 * The environment's state with its key block bound, and the call's first `argc` arguments (missing
 * ones read as undefined, which `bytes_of` refuses); NULL with an error pending if none is bound.
 */
static env_state *bound_state(napi_env env, napi_callback_info info, size_t argc, napi_value *argv) {
  void *data;
  napi_get_cb_info(env, info, &argc, argv, NULL, &data);
  env_state *s = data;
  if (s->key == NULL) {
    napi_throw_error(env, NULL, "roce_icrc: bind() a key block first");
    return NULL;
  }
  return s;
}

static int family_ok(env_state *s) {
  return s->key[K_FAMILY] == 4 || s->key[K_FAMILY] == 6;
}

/* The bound state and the one byte-array argument of `icrc` and `verify`; NULL with an exception pending. */
static env_state *bound_payload(napi_env env, napi_callback_info info, const uint8_t **p, size_t *n) {
  napi_value arg;
  env_state *s = bound_state(env, info, 1, &arg);
  return s != NULL && bytes_of(env, arg, p, n) ? s : NULL;
}

/* icrc(udpPayload): the ICRC of a RoCEv2 UDP payload for the flow in the key block. */
static napi_value js_icrc(napi_env env, napi_callback_info info) {
  const uint8_t *p;
  size_t n;
  env_state *s = bound_payload(env, info, &p, &n);
  if (s == NULL) return NULL;
  if (n < MIN_PAYLOAD || !family_ok(s)) {
    napi_throw_range_error(env, NULL, "a UDP payload shorter than BTH + ICRC, or a key block of no family");
    return NULL;
  }
  return int32_value(env, icrc_of(s, p, n));
}

/* icrc2(head, tail): the ICRC of the UDP payload head ‖ tail ‖ ICRC field, for the key block's flow. */
static napi_value js_icrc2(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  env_state *s = bound_state(env, info, 2, argv);
  const uint8_t *a, *b;
  size_t na, nb;
  if (s == NULL || !bytes_of(env, argv[0], &a, &na) || !bytes_of(env, argv[1], &b, &nb)) return NULL;
  if (na + nb < BTH_LEN || !family_ok(s)) {
    napi_throw_range_error(env, NULL, "parts shorter than a BTH, or a key block of no family");
    return NULL;
  }
  return int32_value(env, icrc_of2(s, a, na, b, nb));
}

/*
 * The verdict on one UDP payload for the key block's flow (IPv4: with its ID and flags): V_OK, V_RECOVERED
 * (it matches for another IPv4 ID and DF or not, and the mode is recover) or V_BAD; *out receives
 * ID << 1 | DF of the match.
 */
static int verify_one(env_state *s, const uint8_t *p, size_t n, int32_t *out) {
  const int32_t *k = s->key;
  if (n < MIN_PAYLOAD || !family_ok(s)) return V_BAD;
  const uint8_t *f = p + n - ICRC_LEN;
  uint32_t wire = (uint32_t)f[0] | (uint32_t)f[1] << 8 | (uint32_t)f[2] << 16 | (uint32_t)f[3] << 24;
  uint32_t mine = icrc_of(s, p, n);
  uint32_t id0 = (uint32_t)k[K_ID] & 0xffff, flags0 = (uint32_t)k[K_FLAGS] & 0xffff;
  if (wire == mine) {
    *out = (int32_t)(id0 << 1 | (flags0 & IPV4_DF) >> 14);
    return V_OK;
  }
  if (k[K_FAMILY] == 4 && k[K_MODE] == MODE_RECOVER && n <= 0xffff) {
    /* The ICRC is affine in the 32-bit word ID ‖ flags: solve for the word that gives the wire's. */
    recovery_table *t = recovery_for(s, (uint32_t)n);
    if (t != NULL) {
      uint32_t d = wire ^ mine;
      uint32_t w = (id0 << 16 | flags0) ^ t->t[0][d & 0xff] ^ t->t[1][(d >> 8) & 0xff] ^ t->t[2][(d >> 16) & 0xff] ^ t->t[3][d >> 24];
      if ((w & 0xffff & ~IPV4_DF) == 0) {
        *out = (int32_t)((w >> 16) << 1 | (w & IPV4_DF) >> 14);
        return V_RECOVERED;
      }
    }
  }
  return V_BAD;
}

/*
 * verify(udpPayload): 1 if the ICRC matches for the key block's flow (IPv4: with its ID and flags), 2
 * if it matches for another IPv4 ID and DF or not and the mode is recover, 0 otherwise. The key
 * block's K_OUT receives ID << 1 | DF of the match.
 */
static napi_value js_verify(napi_env env, napi_callback_info info) {
  const uint8_t *p;
  size_t n;
  env_state *s = bound_payload(env, info, &p, &n);
  if (s == NULL) return NULL;
  int verdict = verify_one(s, p, n, &s->key[K_OUT]);
  napi_value out;
  napi_create_int32(env, verdict, &out);
  return out;
}

/*
 * received(mem, desc, messages, out): the verdicts on every datagram a recvmmsg read, in one call rather
 * than one per datagram (the call, about 40 ns, was a third of a check at path MTU 1024). desc holds 4
 * words per message: the offset of its bytes in mem, its length, the length it is cut at (a GRO train's
 * segment size, else its length), and the offset of its source's sockaddr in mem (sockaddr_in or
 * sockaddr_in6 as the key block's family: port at 2, address at 4 or 8). The key block holds the family,
 * the local address (K_DST), the local port (the low half of K_PORTS), the flags assumed and the mode;
 * segment k of a train is tried with IPv4 ID k first (src/link/mmsg.ts). out[j], for the j-th datagram in
 * order: its verdict | (ID << 1 | DF) << 2. Returns the number of datagrams judged: all of them, or as
 * many as out holds; a RangeError for a message or sockaddr outside mem, before anything is judged.
 */
static napi_value js_received(napi_env env, napi_callback_info info) {
  napi_value argv[4];
  env_state *s = bound_state(env, info, 4, argv);
  if (s == NULL) return NULL;
  napi_typedarray_type mt, dt, ot;
  size_t mn, dn, on;
  void *mp, *dp, *op;
  int32_t messages;
  if (napi_get_typedarray_info(env, argv[0], &mt, &mn, &mp, NULL, NULL) != napi_ok || mt != napi_uint8_array ||
      napi_get_typedarray_info(env, argv[1], &dt, &dn, &dp, NULL, NULL) != napi_ok || dt != napi_int32_array ||
      napi_get_value_int32(env, argv[2], &messages) != napi_ok ||
      napi_get_typedarray_info(env, argv[3], &ot, &on, &op, NULL, NULL) != napi_ok || ot != napi_int32_array) {
    napi_throw_type_error(env, NULL, "expected (Uint8Array, Int32Array, messages, Int32Array)");
    return NULL;
  }
  const uint8_t *mem = mp;
  const int32_t *d = dp;
  int32_t *out = op;
  int32_t *k = s->key;
  int six = k[K_FAMILY] == 6;
  int64_t name_len = six ? 24 : 8;
  int bad = !family_ok(s) || messages < 0 || (size_t)messages > dn / 4;
  for (int32_t i = 0; i < messages && !bad; i++) {
    int64_t at = d[4 * i], len = d[4 * i + 1], step = d[4 * i + 2], name = d[4 * i + 3];
    bad = at < 0 || len < 0 || step < 0 || at + len > (int64_t)mn || name < 0 || name + name_len > (int64_t)mn;
  }
  if (bad) {
    napi_throw_range_error(env, NULL, "a message or sockaddr outside the memory, or a key block of no family");
    return NULL;
  }
  int32_t ports = k[K_PORTS], id0 = k[K_ID];
  size_t j = 0;
  for (int32_t i = 0; i < messages && j < on; i++) {
    size_t at = (size_t)d[4 * i], len = (size_t)d[4 * i + 1], step = d[4 * i + 2] > 0 ? (size_t)d[4 * i + 2] : len;
    const uint8_t *name = mem + d[4 * i + 3];
    k[K_PORTS] = (int32_t)((uint32_t)name[2] << 24 | (uint32_t)name[3] << 16 | ((uint32_t)ports & 0xffff));
    memcpy(k + K_SRC, name + (six ? 8 : 4), six ? 16 : 4);
    /* As RxRing cuts it: at least one datagram, even of length 0 (step 0: the whole message). */
    int32_t id = 0;
    size_t o = 0;
    do {
      size_t n = len - o < step ? len - o : step;
      int32_t w = 0;
      k[K_ID] = six ? 0 : id;
      int v = verify_one(s, mem + at + o, n, &w);
      out[j++] = v | w << 2;
      o += n;
      id++;
    } while (o < len && j < on);
  }
  k[K_PORTS] = ports;
  k[K_ID] = id0;
  return int32_value(env, (uint32_t)j);
}

/*
 * trains(ring, desc, from, to): the ICRC of every datagram of a send queue's messages from … to - 1,
 * written into each datagram's last four bytes, for the key block's flow. A batch of datagrams costs
 * one call rather than one each: the call (about 40 ns) was a third of an ICRC at path MTU 1024. desc
 * holds three runs of B words (B = its length / 3): each message's offset in ring, its length, and its
 * segment length. A message is a GSO train of segments of that length, the last one shorter or not,
 * and segment k leaves with IPv4 ID k (src/link/mmsg.ts); a message of one datagram is segment 0.
 * Every message is checked before any byte is written. Returns the number of datagrams.
 */
static napi_value js_trains(napi_env env, napi_callback_info info) {
  napi_value argv[4];
  env_state *s = bound_state(env, info, 4, argv);
  if (s == NULL) return NULL;
  napi_typedarray_type rt, dt;
  size_t rn, dn;
  void *rp, *dp;
  int32_t from, to;
  if (napi_get_typedarray_info(env, argv[0], &rt, &rn, &rp, NULL, NULL) != napi_ok || rt != napi_uint8_array ||
      napi_get_typedarray_info(env, argv[1], &dt, &dn, &dp, NULL, NULL) != napi_ok || dt != napi_int32_array ||
      napi_get_value_int32(env, argv[2], &from) != napi_ok || napi_get_value_int32(env, argv[3], &to) != napi_ok) {
    napi_throw_type_error(env, NULL, "expected (Uint8Array, Int32Array, from, to)");
    return NULL;
  }
  uint8_t *ring = rp;
  const int32_t *d = dp;
  size_t b = dn / 3;
  int bad = !family_ok(s) || from < 0 || to < from || (size_t)to > b;
  for (int32_t i = from; i < to && !bad; i++) {
    int64_t at = d[i], bytes = d[b + i], seg = d[2 * b + i];
    /* In the ring, segments of at least BTH + ICRC, the last one too, and at most 2^16 IDs. */
    bad = at < 0 || bytes < MIN_PAYLOAD || seg < MIN_PAYLOAD || at + bytes > (int64_t)rn ||
          (bytes - 1) / seg >= 65536 || bytes - (bytes - 1) / seg * seg < MIN_PAYLOAD;
  }
  if (bad) {
    napi_throw_range_error(env, NULL, "a message outside the ring, a segment shorter than BTH + ICRC, or a key block of no family");
    return NULL;
  }
  int32_t *k = s->key;
  int32_t id0 = k[K_ID];
  uint32_t count = 0;
  for (int32_t i = from; i < to; i++) {
    size_t at = (size_t)d[i], bytes = (size_t)d[b + i], seg = (size_t)d[2 * b + i];
    int32_t id = 0;
    for (size_t o = 0; o < bytes; o += seg, id++) {
      size_t n = bytes - o < seg ? bytes - o : seg;
      uint8_t *p = ring + at + o;
      k[K_ID] = id;
      uint32_t c = icrc_of(s, p, n);
      p[n - 4] = (uint8_t)c;
      p[n - 3] = (uint8_t)(c >> 8);
      p[n - 2] = (uint8_t)(c >> 16);
      p[n - 1] = (uint8_t)(c >> 24);
      count++;
    }
  }
  k[K_ID] = id0;
  return int32_value(env, count);
}

/* bind(block): the Int32Array of K_WORDS words the key is written into before each icrc/verify. */
static napi_value js_bind(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value arg;
  void *data;
  napi_get_cb_info(env, info, &argc, &arg, NULL, &data);
  env_state *s = data;
  napi_typedarray_type type;
  size_t len;
  void *words;
  if (argc < 1 || napi_get_typedarray_info(env, arg, &type, &len, &words, NULL, NULL) != napi_ok || type != napi_int32_array || len < K_WORDS) {
    napi_throw_type_error(env, NULL, "expected an Int32Array of 16 words");
    return NULL;
  }
  /* Held, so that its memory lives as long as this environment uses it. */
  if (s->key_ref != NULL) napi_delete_reference(env, s->key_ref);
  napi_create_reference(env, arg, 1, &s->key_ref);
  s->key = words;
  memset(s->entry, 0, sizeof s->entry);
  return NULL;
}

static void free_state(napi_env env, void *data, void *hint) {
  (void)env;
  (void)hint;
  env_state *s = data;
  for (int i = 0; i < RECOVERY_SLOTS; i++) free(s->recovery[i]);
  free(s);
}

NAPI_MODULE_INIT() {
  pthread_once(&tables_once, init_tables);
  env_state *s = calloc(1, sizeof *s);
  if (s == NULL || napi_set_instance_data(env, s, free_state, NULL) != napi_ok) {
    free(s);
    napi_throw_error(env, NULL, "roce_icrc: out of memory");
    return NULL;
  }
  const struct {
    const char *name;
    napi_callback fn;
  } fns[] = {{"crc32", js_crc32}, {"icrc", js_icrc}, {"icrc2", js_icrc2}, {"verify", js_verify}, {"trains", js_trains}, {"received", js_received}, {"bind", js_bind}};
  for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {
    napi_value f;
    napi_create_function(env, fns[i].name, NAPI_AUTO_LENGTH, fns[i].fn, s, &f);
    napi_set_named_property(env, exports, fns[i].name, f);
  }
  napi_value accel;
#ifdef ROCE_X86
  napi_get_boolean(env, have_clmul != 0, &accel);
#else
  napi_get_boolean(env, 0, &accel);
#endif
  napi_set_named_property(env, exports, "clmul", accel);
  roce_watch_init(env, exports);
  roce_mmsg_init(env, exports);
  return exports;
}

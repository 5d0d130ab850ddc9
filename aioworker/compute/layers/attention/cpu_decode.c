/* Paged decode attention on the CPU: one query token per sequence, keys and values read where
 * they lie in the head-outer cache [num_kv_heads, num_blocks, block_size, head_dim], nothing
 * gathered or copied first. Built at run time by cpu_decode.py with the machine's own flags
 * (-O3 -march=native -fopenmp). Scores, softmax and the weighted sum are in float32 whatever
 * the cache's type (bf16 or float32).
 *
 * Work is split over (sequence, kv head) pairs: all the query heads of a kv head are scored
 * against its keys together, so every key and value is read once. Vectors are GCC's vector
 * extensions of 16 floats (one AVX-512 register; the compiler splits them on narrower machines):
 * a key row's product with a query is kept as 16 partial sums, and the partial sums of 16
 * positions are folded together in one shuffle tree, so no position pays a horizontal sum.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LANES 16
#define MAX_HEAD_DIM 256
#define MAX_GROUP 32
#define MAX_CHUNKS (MAX_HEAD_DIM / LANES)

typedef float vfloat __attribute__((vector_size(LANES * sizeof(float))));
typedef uint16_t vhalf __attribute__((vector_size(LANES * sizeof(uint16_t))));
typedef uint32_t vuint __attribute__((vector_size(LANES * sizeof(uint32_t))));
typedef int32_t vint __attribute__((vector_size(LANES * sizeof(int32_t))));

typedef struct {
    int64_t batch, num_heads, num_kv_heads, head_dim, num_blocks, block_size, max_blocks;
    int64_t window; /* 0: every earlier position is visible */
    float scale;
} Shape;

/* -- loading and storing 16 values ----------------------------------------------------------- */

static inline vfloat load_bf16(const uint16_t *src) {
    vhalf half;
    memcpy(&half, src, sizeof(half));
    vuint wide = __builtin_convertvector(half, vuint) << 16;
    vfloat out;
    memcpy(&out, &wide, sizeof(out));
    return out;
}

static inline vfloat load_f32(const float *src) {
    vfloat out;
    memcpy(&out, src, sizeof(out));
    return out;
}

static inline uint16_t f32_to_bf16(float f) {
    union { float f; uint32_t u; } v;
    v.f = f;
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40u); /* NaN */
    v.u += 0x7fffu + ((v.u >> 16) & 1u); /* round to nearest, ties to even */
    return (uint16_t)(v.u >> 16);
}

static inline void store_bf16(uint16_t *dst, vfloat x) {
    for (int i = 0; i < LANES; i++) dst[i] = f32_to_bf16(x[i]);
}

static inline void store_f32(float *dst, vfloat x) { memcpy(dst, &x, sizeof(x)); }

/* -- folding 16 vectors of partial sums into one vector of 16 sums --------------------------- */

/* out[i] = sum of in[i]'s lanes. Each level adds pairs of vectors after interleaving their
 * halves, so the 16 sums cost 15 additions of whole vectors instead of 16 horizontal sums. */
static inline vfloat fold16(vfloat in[LANES]) {
    vfloat a[8], b[4], c[2];
    for (int i = 0; i < 8; i++)
        a[i] = __builtin_shufflevector(in[2 * i], in[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17,
                                       18, 19, 20, 21, 22, 23)
             + __builtin_shufflevector(in[2 * i], in[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24,
                                       25, 26, 27, 28, 29, 30, 31);
    for (int i = 0; i < 4; i++)
        b[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9,
                                       10, 11, 24, 25, 26, 27)
             + __builtin_shufflevector(a[2 * i], a[2 * i + 1], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13,
                                       14, 15, 28, 29, 30, 31);
    for (int i = 0; i < 2; i++)
        c[i] = __builtin_shufflevector(b[2 * i], b[2 * i + 1], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9,
                                       24, 25, 12, 13, 28, 29)
             + __builtin_shufflevector(b[2 * i], b[2 * i + 1], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11,
                                       26, 27, 14, 15, 30, 31);
    vfloat sums = __builtin_shufflevector(c[0], c[1], 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26,
                                          12, 28, 14, 30)
                + __builtin_shufflevector(c[0], c[1], 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27,
                                          13, 29, 15, 31);
    /* sums holds the 16 sums in the order the tree leaves them; put in[i]'s at lane i. */
    return __builtin_shufflevector(sums, sums, 0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7,
                                   15);
}

/* Lanes of a where mask is set (all ones), of b elsewhere (GCC's C has no vector ?:). */
static inline vfloat pick(vint mask, vfloat a, vfloat b) {
    return (vfloat)(((vint)a & mask) | ((vint)b & ~mask));
}

/* -- exp, vectorisable: 2^(x log2 e) as 2^integer * a polynomial in the fraction ------------ */

static inline vfloat vexp(vfloat x) {
    const vfloat zero = {0}, lo = zero - 87.0f, hi = zero + 88.0f;
    const vint underflow = x < lo; /* exp is below the smallest normal float: 0 */
    x = pick(underflow, lo, x);
    x = pick(x > hi, hi, x);
    vfloat t = x * 1.44269504088896341f;
    vint whole = __builtin_convertvector(t, vint);
    whole += __builtin_convertvector(whole, vfloat) > t; /* floor: a true lane is -1 */
    vfloat f = t - __builtin_convertvector(whole, vfloat);     /* in [0, 1) */
    /* 2^f on [0, 1): minimax polynomial, relative error below 2e-7 */
    vfloat p = f * 1.8775767e-3f + 8.9893397e-3f;
    p = p * f + 5.5826318e-2f;
    p = p * f + 2.4015361e-1f;
    p = p * f + 6.9315308e-1f;
    p = p * f + 9.9999994e-1f;
    vint bits = (whole + 127) << 23;
    vfloat scale;
    memcpy(&scale, &bits, sizeof(scale));
    return pick(underflow, zero, p * scale);
}

/* Softmax of scores[0..n) in place (n padded to whole vectors with -inf by the caller). */
static void softmax(float *scores, int64_t n) {
    const int64_t whole = (n + LANES - 1) / LANES;
    vfloat max = load_f32(scores);
    for (int64_t v = 1; v < whole; v++) {
        vfloat x = load_f32(scores + v * LANES);
        max = pick(x > max, x, max);
    }
    float m = max[0];
    for (int i = 1; i < LANES; i++) m = max[i] > m ? max[i] : m;
    vfloat sum = {0};
    for (int64_t v = 0; v < whole; v++) {
        vfloat e = vexp(load_f32(scores + v * LANES) - m);
        store_f32(scores + v * LANES, e);
        sum += e;
    }
    float total = 0.0f;
    for (int i = 0; i < LANES; i++) total += sum[i];
    const float inverse = 1.0f / total;
    for (int64_t v = 0; v < whole; v++) store_f32(scores + v * LANES, load_f32(scores + v * LANES) * inverse);
}

/* -- one (sequence, kv head) ------------------------------------------------------------------ */

/* Walks a sequence's positions through its block table: the cache row of each in turn, with no
 * division per position (a 64-bit division costs tens of cycles, more than the row's products). */
typedef struct {
    const int64_t *blocks;
    int64_t head_rows, block_size, block, offset;
} Walk;

static inline Walk start_walk(const Shape *s, const int64_t *blocks, int64_t head_rows,
                              int64_t position) {
    Walk walk = {blocks, head_rows, s->block_size, position / s->block_size,
                 position % s->block_size};
    return walk;
}

static inline int64_t next_row(Walk *walk) {
    int64_t row = walk->head_rows + walk->blocks[walk->block] * walk->block_size + walk->offset;
    if (++walk->offset == walk->block_size) {
        walk->offset = 0;
        walk->block++;
    }
    return row;
}

/* One (sequence, kv head) with CHUNKS vectors per row: a constant for the common head sizes
 * (64, 128), so rows and sums stay in registers, or the shape's own count. Scores are computed
 * 16 positions at a time, every query head of the kv head against each key row read; the
 * weighted sum runs one query head at a time, so its sums never leave registers. */
#define ATTEND(NAME, T, LOAD, STORE, CHUNKS)                                                   \
    static void NAME(const Shape *s, const T *q, const T *k_cache, const T *v_cache,           \
                     const int64_t *block_table, const int64_t *context_lens, T *out,          \
                     int64_t seq, int64_t kv_head, float *scores) {                            \
        const int64_t chunks = (CHUNKS), group = s->num_heads / s->num_kv_heads;               \
        const int64_t length = context_lens[seq];                                              \
        const int64_t first = s->window > 0 && length > s->window ? length - s->window : 0;    \
        const int64_t n = length - first, padded = (n + LANES - 1) / LANES * LANES;            \
        const int64_t *blocks = block_table + seq * s->max_blocks;                             \
        const int64_t head_rows = kv_head * s->num_blocks * s->block_size;                     \
        const T *queries = q + (seq * s->num_heads + kv_head * group) * s->head_dim;           \
        vfloat query[MAX_GROUP][MAX_CHUNKS];                                                   \
        for (int64_t g = 0; g < group; g++)                                                    \
            for (int64_t c = 0; c < chunks; c++)                                               \
                query[g][c] = LOAD(queries + g * s->head_dim + c * LANES) * s->scale;          \
        Walk walk = start_walk(s, blocks, head_rows, first);                                   \
        for (int64_t start = 0; start < padded; start += LANES) {                              \
            vfloat partial[MAX_GROUP][LANES];                                                  \
            const int64_t count = n - start < LANES ? n - start : LANES;                       \
            for (int64_t i = 0; i < count; i++) {                                              \
                const T *key = k_cache + next_row(&walk) * s->head_dim;                        \
                vfloat rows[MAX_CHUNKS];                                                       \
                for (int64_t c = 0; c < chunks; c++) rows[c] = LOAD(key + c * LANES);          \
                for (int64_t g = 0; g < group; g++) {                                          \
                    vfloat sum = query[g][0] * rows[0];                                        \
                    for (int64_t c = 1; c < chunks; c++) sum += query[g][c] * rows[c];         \
                    partial[g][i] = sum;                                                       \
                }                                                                              \
            }                                                                                  \
            for (int64_t g = 0; g < group; g++) {                                              \
                for (int64_t i = count; i < LANES; i++) partial[g][i] = (vfloat){0};           \
                vfloat folded = fold16(partial[g]);                                            \
                for (int64_t i = count; i < LANES; i++) folded[i] = -INFINITY;                 \
                store_f32(scores + g * padded + start, folded);                                \
            }                                                                                  \
        }                                                                                      \
        for (int64_t g = 0; g < group; g++) {                                                  \
            float *weights = scores + g * padded;                                              \
            softmax(weights, n);                                                               \
            vfloat acc[MAX_CHUNKS];                                                            \
            for (int64_t c = 0; c < chunks; c++) acc[c] = (vfloat){0};                         \
            walk = start_walk(s, blocks, head_rows, first);                                    \
            for (int64_t i = 0; i < n; i++) {                                                  \
                const T *value = v_cache + next_row(&walk) * s->head_dim;                      \
                for (int64_t c = 0; c < chunks; c++) acc[c] += weights[i] * LOAD(value + c * LANES); \
            }                                                                                  \
            T *dst = out + (seq * s->num_heads + kv_head * group + g) * s->head_dim;           \
            for (int64_t c = 0; c < chunks; c++) STORE(dst + c * LANES, acc[c]);               \
        }                                                                                      \
    }

ATTEND(attend_bf16_64, uint16_t, load_bf16, store_bf16, 4)
ATTEND(attend_bf16_128, uint16_t, load_bf16, store_bf16, 8)
ATTEND(attend_bf16_any, uint16_t, load_bf16, store_bf16, s->head_dim / LANES)
ATTEND(attend_f32_64, float, load_f32, store_f32, 4)
ATTEND(attend_f32_128, float, load_f32, store_f32, 8)
ATTEND(attend_f32_any, float, load_f32, store_f32, s->head_dim / LANES)

typedef void (*AttendBf16)(const Shape *, const uint16_t *, const uint16_t *, const uint16_t *,
                           const int64_t *, const int64_t *, uint16_t *, int64_t, int64_t,
                           float *);
typedef void (*AttendF32)(const Shape *, const float *, const float *, const float *,
                          const int64_t *, const int64_t *, float *, int64_t, int64_t, float *);

static AttendBf16 attend_bf16(int64_t head_dim) {
    return head_dim == 64 ? attend_bf16_64 : head_dim == 128 ? attend_bf16_128 : attend_bf16_any;
}

static AttendF32 attend_f32(int64_t head_dim) {
    return head_dim == 64 ? attend_f32_64 : head_dim == 128 ? attend_f32_128 : attend_f32_any;
}

/* -- entry points: 0, or -1 when the scratch memory could not be had (nothing written then) -- */

#define ENTRY(NAME, T, CHOOSE)                                                                \
    int NAME(const Shape *s, const T *q, const T *k_cache, const T *v_cache,                  \
             const int64_t *block_table, const int64_t *context_lens, T *out,                 \
             int64_t max_context) {                                                           \
        const int64_t group = s->num_heads / s->num_kv_heads;                                 \
        const __typeof__(CHOOSE(0)) attend_one = CHOOSE(s->head_dim);                          \
        const int64_t padded = (max_context + LANES - 1) / LANES * LANES;                     \
        int failed = 0;                                                                       \
        _Pragma("omp parallel")                                                               \
        {                                                                                     \
            float *scores = malloc((size_t)(group * padded) * sizeof(float));                 \
            if (scores == NULL) {                                                             \
                _Pragma("omp atomic write") failed = 1;                                       \
            }                                                                                 \
            _Pragma("omp barrier")                                                            \
            if (!failed) {                                                                    \
                _Pragma("omp for collapse(2) schedule(static)")                               \
                for (int64_t seq = 0; seq < s->batch; seq++)                                  \
                    for (int64_t kv_head = 0; kv_head < s->num_kv_heads; kv_head++)           \
                        attend_one(s, q, k_cache, v_cache, block_table, context_lens, out,    \
                                   seq, kv_head, scores);                                     \
            }                                                                                 \
            free(scores);                                                                     \
        }                                                                                     \
        return failed ? -1 : 0;                                                               \
    }

ENTRY(paged_decode_bf16, uint16_t, attend_bf16)
ENTRY(paged_decode_f32, float, attend_f32)

/* What ops.c and decoder_stack.c share: float math written so loops calling it vectorize, and the row-level pieces
 * of each op (defined in ops.c), which the single ops run over their rows and the decoder stack runs inside its
 * layers. Tensors are float32 and row-major; index arrays are int64. */
#ifndef GLIMMER_CPU_COMMON_H
#define GLIMMER_CPU_COMMON_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define INTERNAL __attribute__((visibility("hidden")))

/* e^x for float32 within about 2 ulp, written so the compiler vectorizes loops that call it (libm's expf is a
 * call per element): x = n ln2 + r with |r| <= ln2 / 2, e^r by its degree-6 Taylor polynomial, 2^n through the
 * exponent bits. Inputs are clamped to [-87.3, 88]: e^x there is 2^-126 instead of a denormal or 0, and e^88
 * instead of a larger number or infinity (their uses, softmax weights below 1 and 1 / (1 + e^-x), differ from
 * the reference's by less than 1e-37 for such x). */
static inline float fast_exp(float x) {
    x = x < -87.33654f ? -87.33654f : x;
    x = x > 88.0f ? 88.0f : x;
    /* n = round(x / ln2) by adding and taking away 1.5 * 2^23 (the sum rounds to an integer): no branch, so the
     * compiler vectorizes it */
    float finite = x == x ? x : 0.0f; /* NaN takes n = 0 (converting NaN to an integer is undefined); r stays NaN */
    float n = (finite * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    int32_t k = (int32_t)n;
    float r = x - n * 0.693359375f; /* ln2 in two parts: the high one exact in float */
    r = r + n * 2.12194440e-4f;
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    uint32_t bits = (uint32_t)(k + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

static inline float sigmoid(float x) { return 1.0f / (1.0f + fast_exp(-x)); }

/* residual_norm_torch on one row: with h, r = (h * inverse_rms(h)) * post_scale + residual, written to
 * out_residual; out_normed = (r * inverse_rms(r)) * following_scale. Without h (NULL), r is `residual`, which
 * is not written. */
INTERNAL void residual_norm_row(const float *h, const float *residual, const float *post_scale, float post_eps,
                                const float *following_scale, float following_eps, int64_t width,
                                float *out_residual, float *out_normed);

/* One q or k head of qk_norm_rope_store_torch: the weightless RMSNorm of src, times `scale` unless it is 1,
 * rotated by cos/sin (rotate-half pairs (j, j + d/2)) unless cos is NULL, written to dst. */
INTERNAL void norm_rope_head(const float *src, int64_t head_dim, float eps, float scale, const float *cos,
                             const float *sin, float *dst);

/* The keys sequence b's decode query sees: positions [*lo, seq_len) with lo = max(kv_start, seq_len - window
 * when window > 0). Returns 0 when the block table (table_width blocks of block_size from kv_start) holds them
 * all in blocks inside [0, num_blocks), else 1 (an empty range counts as not held). */
INTERNAL int visible_keys(int64_t seq_len, int64_t kv_start, int64_t window, const int64_t *table,
                          int64_t table_width, int64_t block_size, int64_t num_blocks, int64_t *lo);

/* decode attention of the `group` query heads that share key head kv_head, over the keys [lo, hi) listed by
 * `table` from position kv_start: out (group x d) is the softmax-weighted sum of values, times sigmoid(gate)
 * when gate (group x d) is not NULL. scores holds group * (hi - lo) floats, acc group * d. */
INTERNAL void attend(const float *query, int64_t group, int64_t head_dim, const float *key_cache,
                     const float *value_cache, int64_t kv_heads, int64_t kv_head, const int64_t *table,
                     int64_t block_size, int64_t kv_start, int64_t lo, int64_t hi, float scale, const float *gate,
                     float *out, float *scores, float *acc);

#endif

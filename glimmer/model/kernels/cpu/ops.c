/* The CPU decode step's small operations as C loops, one call each instead of tens of torch ops.
 *
 * Compiled at first use by glimmer/model/kernels/cpu/__init__.py (the system C compiler, -O3, with OpenMP where
 * the compiler has it) and called through ctypes. Every function mirrors the plain-torch reference beside its
 * dispatcher in glimmer/model/kernels/ and rounds to float32 after each operation where the reference does;
 * sums (the mean of squares in double, dot products in float) run in another order than torch's, so results
 * agree to float32 rounding, not bit for bit. Tensors are float32 and row-major; index arrays are int64.
 * Functions that index memory through the caller's indices check them first and return a nonzero code (the
 * Python side raises) instead of reading or writing out of bounds.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* below this many floats of work a loop runs on the calling thread: a parallel region costs microseconds, and
 * far more when other processes hold the cores (its barrier waits for a descheduled thread) */
#define PARALLEL_MIN 262144

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

/* 1 / sqrt(mean(x^2) + eps): the reference's rsqrt (and pow(., -0.5)) of the float mean */
static float inverse_rms(const float *x, int64_t n, float eps) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)x[i] * (double)x[i];
    return 1.0f / sqrtf((float)(sum / (double)n) + eps);
}

static float sum(const float *a, int64_t n) {
    float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) part[j] += a[i + j];
    float total = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
    for (; i < n; i++) total += a[i];
    return total;
}

static float dot(const float *a, const float *b, int64_t n) {
    float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) part[j] += a[i + j] * b[i + j];
    float sum = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

/* residual_norm_torch: with h, r = (h * inverse_rms(h)) * post_scale + residual, written to out_residual;
 * out_normed = (r * inverse_rms(r)) * following_scale. Without h (NULL), r is `residual` itself (the caller
 * passes it as out_residual). */
void glimmer_residual_norm(const float *h, const float *residual, const float *post_scale, float post_eps,
                           const float *following_scale, float following_eps, int64_t rows, int64_t width,
                           float *out_residual, float *out_normed, int threads) {
#pragma omp parallel for num_threads(threads) if (rows * width >= PARALLEL_MIN && rows > 1)
    for (int64_t row = 0; row < rows; row++) {
        float *r = out_residual + row * width;
        if (h != NULL) {
            const float *x = h + row * width;
            const float *res = residual + row * width;
            float inv = inverse_rms(x, width, post_eps);
            for (int64_t i = 0; i < width; i++) r[i] = (x[i] * inv) * post_scale[i] + res[i];
        }
        float inv = inverse_rms(r, width, following_eps);
        float *o = out_normed + row * width;
        for (int64_t i = 0; i < width; i++) o[i] = (r[i] * inv) * following_scale[i];
    }
}

/* qk_norm_rope_store_torch: row t of qkvg (row_stride floats apart) holds [q heads | k heads | v heads | gate].
 * Each q and k head is normed (weightless RMSNorm), q heads multiplied by q_scale, both rotated (rotate-half
 * pairs (j, j + d/2)) by row t of cos/sin unless cos is NULL (a NoPE layer); q goes to q_out (n, heads, d), k
 * and v to slot slot_mapping[t] of the caches (num_slots, kv_heads, d). Returns 1 + the first token whose slot
 * is outside [0, num_slots), writing nothing, or 0. */
int glimmer_qk_norm_rope_store(const float *qkvg, int64_t row_stride, int64_t n, int64_t heads, int64_t kv_heads,
                               int64_t head_dim, float eps, float q_scale, const float *cos, const float *sin,
                               float *key_cache, float *value_cache, int64_t num_slots, const int64_t *slot_mapping,
                               float *q_out, int threads) {
    for (int64_t t = 0; t < n; t++)
        if (slot_mapping[t] < 0 || slot_mapping[t] >= num_slots) return (int)(t + 1);
    const int64_t half = head_dim / 2, kv_row = kv_heads * head_dim;
#pragma omp parallel for num_threads(threads) if (n * (heads + kv_heads) * head_dim >= PARALLEL_MIN && n > 1)
    for (int64_t t = 0; t < n; t++) {
        const float *row = qkvg + t * row_stride;
        const int64_t slot = slot_mapping[t];
        float x[head_dim];
        for (int64_t head = 0; head < heads + kv_heads; head++) {
            const float *src = row + head * head_dim;
            float inv = inverse_rms(src, head_dim, eps);
            for (int64_t j = 0; j < head_dim; j++) x[j] = src[j] * inv;
            if (head < heads && q_scale != 1.0f)
                for (int64_t j = 0; j < head_dim; j++) x[j] = x[j] * q_scale;
            float *dst = head < heads ? q_out + (t * heads + head) * head_dim
                                      : key_cache + slot * kv_row + (head - heads) * head_dim;
            if (cos != NULL) {
                const float *c = cos + t * head_dim, *s = sin + t * head_dim;
                for (int64_t j = 0; j < half; j++) dst[j] = x[j] * c[j] + (-x[j + half]) * s[j];
                for (int64_t j = half; j < head_dim; j++) dst[j] = x[j] * c[j] + x[j - half] * s[j];
            } else {
                memcpy(dst, x, (size_t)head_dim * sizeof(float));
            }
        }
        memcpy(value_cache + slot * kv_row, row + (heads + kv_heads) * head_dim, (size_t)kv_row * sizeof(float));
    }
    return 0;
}

/* decode_attention over the paged cache in place: sequence b's one query (q row b: heads x d) at position
 * seq_lens[b] - 1 attends to the keys at positions max(kv_start_pos[b], seq_len - window if window > 0) up to
 * seq_len - 1; list index i = position - kv_start_pos[b] lives in block block_tables[b][i / block_size], row
 * i % block_size. Query head h reads key head h / (heads / kv_heads). out (batch, heads * d) is the softmax-weighted
 * sum of values, times sigmoid(gate) when gate is not NULL (gate row b starts gate_stride floats after row b-1).
 * Returns 1 + the first sequence whose keys the table does not hold (an empty range, a list index past the
 * table, a block id outside [0, num_blocks)), computing nothing; -1 if memory for the scores ran out; else 0. */
int glimmer_decode_attention(const float *q, int64_t batch, int64_t heads, int64_t kv_heads, int64_t head_dim,
                             const float *key_cache, const float *value_cache, int64_t num_blocks, int64_t block_size,
                             const int64_t *block_tables, int64_t table_width, const int64_t *kv_start_pos,
                             const int64_t *seq_lens, int64_t window, float scale, const float *gate,
                             int64_t gate_stride, float *out, int threads) {
    int64_t work = 0;
    for (int64_t b = 0; b < batch; b++) {
        int64_t hi = seq_lens[b], lo = window > 0 && hi - window > 0 ? hi - window : 0;
        if (lo < kv_start_pos[b]) lo = kv_start_pos[b];
        if (hi <= lo || (hi - 1 - kv_start_pos[b]) / block_size >= table_width) return (int)(b + 1);
        for (int64_t i = (lo - kv_start_pos[b]) / block_size; i <= (hi - 1 - kv_start_pos[b]) / block_size; i++) {
            int64_t block = block_tables[b * table_width + i];
            if (block < 0 || block >= num_blocks) return (int)(b + 1);
        }
        work += (hi - lo) * heads * head_dim;
    }
    const int64_t group = heads / kv_heads, kv_row = kv_heads * head_dim;
    int out_of_memory = 0;
#pragma omp parallel for collapse(2) schedule(dynamic) num_threads(threads) if (work >= PARALLEL_MIN)
    for (int64_t b = 0; b < batch; b++) {
        for (int64_t kv_head = 0; kv_head < kv_heads; kv_head++) {
            const int64_t start = kv_start_pos[b], hi = seq_lens[b];
            int64_t lo = window > 0 && hi - window > 0 ? hi - window : 0;
            if (lo < start) lo = start;
            const int64_t keys = hi - lo;
            float *scores = malloc((size_t)(group * keys) * sizeof(float));
            float *acc = calloc((size_t)(group * head_dim), sizeof(float));
            if (scores == NULL || acc == NULL) {
                free(scores);
                free(acc);
#pragma omp atomic write
                out_of_memory = 1;
                continue;
            }
            const float *query = q + (b * heads + kv_head * group) * head_dim;
            for (int64_t i = 0; i < keys; i++) {
                int64_t index = lo + i - start;
                int64_t slot = block_tables[b * table_width + index / block_size] * block_size + index % block_size;
                const float *key = key_cache + slot * kv_row + kv_head * head_dim;
                for (int64_t g = 0; g < group; g++) scores[g * keys + i] = dot(query + g * head_dim, key, head_dim) * scale;
            }
            for (int64_t g = 0; g < group; g++) {
                float *s = scores + g * keys, top = s[0], total;
                for (int64_t i = 1; i < keys; i++) top = s[i] > top ? s[i] : top;
                for (int64_t i = 0; i < keys; i++) s[i] = fast_exp(s[i] - top);
                total = sum(s, keys);
                for (int64_t i = 0; i < keys; i++) s[i] = s[i] / total;
            }
            for (int64_t i = 0; i < keys; i++) {
                int64_t index = lo + i - start;
                int64_t slot = block_tables[b * table_width + index / block_size] * block_size + index % block_size;
                const float *value = value_cache + slot * kv_row + kv_head * head_dim;
                for (int64_t g = 0; g < group; g++) {
                    float p = scores[g * keys + i], *a = acc + g * head_dim;
                    for (int64_t j = 0; j < head_dim; j++) a[j] += p * value[j];
                }
            }
            for (int64_t g = 0; g < group; g++) {
                const int64_t head = kv_head * group + g;
                float *o = out + (b * heads + head) * head_dim;
                const float *a = acc + g * head_dim;
                if (gate != NULL) {
                    const float *gt = gate + b * gate_stride + head * head_dim;
                    for (int64_t j = 0; j < head_dim; j++) o[j] = a[j] * sigmoid(gt[j]);
                } else {
                    memcpy(o, a, (size_t)head_dim * sizeof(float));
                }
            }
            free(scores);
            free(acc);
        }
    }
    return out_of_memory ? -1 : 0;
}

/* silu_mul_torch: gate_up rows [gate | up] of 2 * inter floats; out (rows, inter) = gate / (1 + e^-gate) * up */
void glimmer_silu_mul(const float *gate_up, int64_t rows, int64_t inter, float *out, int threads) {
#pragma omp parallel for num_threads(threads) if (rows * inter >= PARALLEL_MIN && rows > 1)
    for (int64_t row = 0; row < rows; row++) {
        const float *g = gate_up + row * 2 * inter, *u = g + inter;
        float *o = out + row * inter;
        for (int64_t i = 0; i < inter; i++) o[i] = (g[i] / (1.0f + fast_exp(-g[i]))) * u[i];
    }
}

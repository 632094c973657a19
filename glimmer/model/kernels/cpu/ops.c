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
#include <stdlib.h>

#include "common.h"

/* below this many floats of work a loop runs on the calling thread: a parallel region costs microseconds, and
 * far more when other processes hold the cores (its barrier waits for a descheduled thread) */
#define PARALLEL_MIN 262144

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

void residual_norm_row(const float *h, const float *residual, const float *post_scale, float post_eps,
                       const float *following_scale, float following_eps, int64_t width, float *out_residual,
                       float *out_normed) {
    const float *r = residual;
    if (h != NULL) {
        float inv = inverse_rms(h, width, post_eps);
        for (int64_t i = 0; i < width; i++) out_residual[i] = (h[i] * inv) * post_scale[i] + residual[i];
        r = out_residual;
    }
    float inv = inverse_rms(r, width, following_eps);
    for (int64_t i = 0; i < width; i++) out_normed[i] = (r[i] * inv) * following_scale[i];
}

/* residual_norm_torch over rows of `width`: residual_norm_row on each (without h, the caller passes `residual`
 * as out_residual) */
void glimmer_residual_norm(const float *h, const float *residual, const float *post_scale, float post_eps,
                           const float *following_scale, float following_eps, int64_t rows, int64_t width,
                           float *out_residual, float *out_normed, int threads) {
#pragma omp parallel for num_threads(threads) if (rows * width >= PARALLEL_MIN && rows > 1)
    for (int64_t row = 0; row < rows; row++)
        residual_norm_row(h == NULL ? NULL : h + row * width, residual + row * width, post_scale, post_eps,
                          following_scale, following_eps, width, out_residual + row * width, out_normed + row * width);
}

void norm_rope_head(const float *src, int64_t head_dim, float eps, float scale, const float *cos, const float *sin,
                    float *dst) {
    const int64_t half = head_dim / 2;
    float x[head_dim];
    float inv = inverse_rms(src, head_dim, eps);
    for (int64_t j = 0; j < head_dim; j++) x[j] = src[j] * inv;
    if (scale != 1.0f)
        for (int64_t j = 0; j < head_dim; j++) x[j] = x[j] * scale;
    if (cos != NULL) {
        for (int64_t j = 0; j < half; j++) dst[j] = x[j] * cos[j] + (-x[j + half]) * sin[j];
        for (int64_t j = half; j < head_dim; j++) dst[j] = x[j] * cos[j] + x[j - half] * sin[j];
    } else {
        memcpy(dst, x, (size_t)head_dim * sizeof(float));
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
    const int64_t kv_row = kv_heads * head_dim;
#pragma omp parallel for num_threads(threads) if (n * (heads + kv_heads) * head_dim >= PARALLEL_MIN && n > 1)
    for (int64_t t = 0; t < n; t++) {
        const float *row = qkvg + t * row_stride;
        const int64_t slot = slot_mapping[t];
        for (int64_t head = 0; head < heads + kv_heads; head++) {
            float *dst = head < heads ? q_out + (t * heads + head) * head_dim
                                      : key_cache + slot * kv_row + (head - heads) * head_dim;
            norm_rope_head(row + head * head_dim, head_dim, eps, head < heads ? q_scale : 1.0f,
                           cos == NULL ? NULL : cos + t * head_dim, sin == NULL ? NULL : sin + t * head_dim, dst);
        }
        memcpy(value_cache + slot * kv_row, row + (heads + kv_heads) * head_dim, (size_t)kv_row * sizeof(float));
    }
    return 0;
}

int visible_keys(int64_t seq_len, int64_t kv_start, int64_t window, const int64_t *table, int64_t table_width,
                 int64_t block_size, int64_t num_blocks, int64_t *lo) {
    int64_t first = window > 0 && seq_len - window > 0 ? seq_len - window : 0;
    if (first < kv_start) first = kv_start;
    *lo = first;
    if (seq_len <= first || (seq_len - 1 - kv_start) / block_size >= table_width) return 1;
    for (int64_t i = (first - kv_start) / block_size; i <= (seq_len - 1 - kv_start) / block_size; i++)
        if (table[i] < 0 || table[i] >= num_blocks) return 1;
    return 0;
}

/* list index `index`'s row of kv head `kv_head` in a paged cache */
static inline const float *cache_row(const float *cache, const int64_t *table, int64_t block_size, int64_t kv_row,
                                     int64_t kv_head, int64_t head_dim, int64_t index) {
    return cache + (table[index / block_size] * block_size + index % block_size) * kv_row + kv_head * head_dim;
}

/* how many keys ahead their rows are requested from memory: the rows of one head are kv_heads * head_dim floats
 * apart, a stride the hardware prefetcher follows late, and the cache is cold after a decode step's weights have
 * streamed through (8 sequences of about 100 keys, 8 layers, on a 2-vCPU Xeon: the decoder stack's time beyond its
 * products 1.0-1.6 ms a step with these requests, 1.6-2.3 ms without) */
#define KEYS_AHEAD 8

static inline void request_row(const float *row, int64_t head_dim) {
    for (int64_t j = 0; j < head_dim; j += 16) __builtin_prefetch(row + j);
}

void attend(const float *query, int64_t group, int64_t head_dim, const float *key_cache, const float *value_cache,
            int64_t kv_heads, int64_t kv_head, const int64_t *table, int64_t block_size, int64_t kv_start, int64_t lo,
            int64_t hi, float scale, const float *gate, float *out, float *scores, float *acc) {
    const int64_t keys = hi - lo, kv_row = kv_heads * head_dim, first = lo - kv_start;
    for (int64_t i = 0; i < keys; i++) {
        if (i + KEYS_AHEAD < keys)
            request_row(cache_row(key_cache, table, block_size, kv_row, kv_head, head_dim, first + i + KEYS_AHEAD),
                        head_dim);
        const float *key = cache_row(key_cache, table, block_size, kv_row, kv_head, head_dim, first + i);
        for (int64_t g = 0; g < group; g++) scores[g * keys + i] = dot(query + g * head_dim, key, head_dim) * scale;
    }
    for (int64_t i = 0; i < keys && i < KEYS_AHEAD; i++)  /* the values' first rows, while the softmax runs */
        request_row(cache_row(value_cache, table, block_size, kv_row, kv_head, head_dim, first + i), head_dim);
    for (int64_t g = 0; g < group; g++) {
        float *s = scores + g * keys, top = s[0], total;
        for (int64_t i = 1; i < keys; i++) top = s[i] > top ? s[i] : top;
        for (int64_t i = 0; i < keys; i++) s[i] = fast_exp(s[i] - top);
        total = sum(s, keys);
        for (int64_t i = 0; i < keys; i++) s[i] = s[i] / total;
    }
    memset(acc, 0, (size_t)(group * head_dim) * sizeof(float));
    for (int64_t i = 0; i < keys; i++) {
        if (i + KEYS_AHEAD < keys)
            request_row(cache_row(value_cache, table, block_size, kv_row, kv_head, head_dim, first + i + KEYS_AHEAD),
                        head_dim);
        const float *value = cache_row(value_cache, table, block_size, kv_row, kv_head, head_dim, first + i);
        for (int64_t g = 0; g < group; g++) {
            float p = scores[g * keys + i], *a = acc + g * head_dim;
            for (int64_t j = 0; j < head_dim; j++) a[j] += p * value[j];
        }
    }
    for (int64_t g = 0; g < group; g++) {
        float *o = out + g * head_dim;
        const float *a = acc + g * head_dim;
        if (gate != NULL) {
            const float *gt = gate + g * head_dim;
            for (int64_t j = 0; j < head_dim; j++) o[j] = a[j] * sigmoid(gt[j]);
        } else {
            memcpy(o, a, (size_t)head_dim * sizeof(float));
        }
    }
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
        int64_t lo;
        if (visible_keys(seq_lens[b], kv_start_pos[b], window, block_tables + b * table_width, table_width,
                         block_size, num_blocks, &lo))
            return (int)(b + 1);
        work += (seq_lens[b] - lo) * heads * head_dim;
    }
    const int64_t group = heads / kv_heads;
    int out_of_memory = 0;
#pragma omp parallel for collapse(2) schedule(dynamic) num_threads(threads) if (work >= PARALLEL_MIN)
    for (int64_t b = 0; b < batch; b++) {
        for (int64_t kv_head = 0; kv_head < kv_heads; kv_head++) {
            int64_t lo;
            const int64_t *table = block_tables + b * table_width;
            visible_keys(seq_lens[b], kv_start_pos[b], window, table, table_width, block_size, num_blocks, &lo);
            float *scores = malloc((size_t)(group * (seq_lens[b] - lo)) * sizeof(float));
            float *acc = malloc((size_t)(group * head_dim) * sizeof(float));
            if (scores == NULL || acc == NULL) {
                free(scores);
                free(acc);
#pragma omp atomic write
                out_of_memory = 1;
                continue;
            }
            const int64_t head = kv_head * group;
            attend(q + (b * heads + head) * head_dim, group, head_dim, key_cache, value_cache, kv_heads, kv_head, table,
                   block_size, kv_start_pos[b], lo, seq_lens[b], scale,
                   gate == NULL ? NULL : gate + b * gate_stride + head * head_dim, out + (b * heads + head) * head_dim,
                   scores, acc);
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

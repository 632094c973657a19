/* A CPU decode step's decoder layers in one call: every projection, norm, RoPE, cache store and attention of every
 * layer, for float32 models whose each sequence brings one token.
 *
 * Called by glimmer/model/kernels/decoder_stack.py, whose reference is TextModel's per-op forward (the same
 * formulas, op by op). Per layer, as architecture.md §2.4 orders them:
 *
 *     qkvg = h · [q | k | v | gate]ᵀ (+ bias)          one pass over the fused weight
 *     q, k = RoPE(q_scale · norm(q)), RoPE(norm(k))     k and v stored in the paged cache (norm_rope_head)
 *     a    = attention(q, cache) · sigmoid(gate)        (attend)
 *     o    = a · o_projᵀ (+ bias)
 *     residual, h = residual + post_attention(o), pre_feedforward(...)      (residual_norm_row)
 *     m    = (silu(h · gateᵀ) · (h · upᵀ)) · downᵀ      silu and the product in the gate|up pass's epilogue
 *     residual, h = residual + post_feedforward(m), the next layer's input norm (the final norm after the last)
 *
 * The step runs in one OpenMP parallel region: each phase splits its work (weight rows, heads, sequences) over the
 * threads, with a barrier between phases, instead of tens of torch ops a layer with their dispatch each. The
 * products stream each weight row once for up to eight sequences at once, with the summation order of their own
 * (sums agree with torch's to float32 rounding, not bit for bit). Indices are checked before anything is written.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "common.h"

#if defined(__clang__)
#pragma clang fp contract(fast) /* fused multiply-adds in the products: sums differ from torch's order anyway */
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=fast")
#endif

/* A product's accumulators, ROWS x FEATURES vectors of LANES floats, stay in registers: 16 of AVX-512's 32, 8 of
 * AVX2's 16 */
#if defined(__AVX512F__)
#define LANES 16
#define ROWS 8 /* input rows a pass over the weights multiplies at once */
#else
#define LANES 8
#define ROWS 4
#endif
#define FEATURES 2          /* weight rows a thread reads side by side */
/* How far ahead of the reads in a weight row the next ones are requested, and into which cache (a
 * __builtin_prefetch locality): 32 KB ahead into L2 (prefetcht1 on x86) lets the products overlap their arithmetic
 * with the memory reads (on a 2-vCPU Xeon, decode at 8 rows 11-15% faster than 4 KB ahead into L1, at one row
 * 0-17% depending on the machine's memory phase; A/B in one process; on a 2-vCPU Zen 4 EPYC the products 1.5 times as
 * fast at 1 to 8 rows). AMD documents hinted prefetches into L2 alone from Zen 4 on; its earlier cores fill L1 with
 * every hint, where lines requested 32 KB ahead would leave it before their use, so they keep 4 KB into L1 (not
 * measured on them). GCC before 13 names a Zen 4 `znver3` under -march=native, with AVX-512 on, which no earlier
 * AMD core has: AVX-512 tells them apart. */
#if (defined(__znver1__) || defined(__znver2__) || defined(__znver3__) || defined(__bdver1__) || \
     defined(__bdver2__) || defined(__bdver3__) || defined(__bdver4__) || defined(__btver1__) || \
     defined(__btver2__) || defined(__amdfam10__) || defined(__k8__)) && !defined(__AVX512F__)
#define PREFETCH_FLOATS 1024
#define PREFETCH_LOCALITY 3
#define X_WHOLE INT64_MAX /* a pass per weight-row pair (below) */
#else
#define PREFETCH_FLOATS 8192
#define PREFETCH_LOCALITY 2
#endif
typedef float lanes __attribute__((vector_size(LANES * sizeof(float)), aligned(sizeof(float))));

/* One decoder layer (mirrored field for field by `LayerArgs` in decoder_stack.py: every field 8 bytes). */
typedef struct {
    const float *qkvg_weight, *qkvg_bias; /* (2 q + 2 kv, hidden) rows q | k | v | gate; bias NULL or its rows */
    const float *o_weight, *o_bias;       /* (hidden, q); bias NULL or (hidden,) */
    const float *gate_up_weight;          /* (2 inter, hidden): gate rows, then up rows */
    const float *down_weight;             /* (hidden, inter) */
    const float *post_attention_scale, *pre_feedforward_scale, *post_feedforward_scale, *following_scale;
    double post_attention_eps, pre_feedforward_eps, post_feedforward_eps, following_eps;
    float *key_cache, *value_cache; /* (num_blocks, block_size, kv_heads, head_dim) */
    int64_t num_blocks;
    int64_t group;  /* which of the step's two block-table sets the layer's cache is read through */
    int64_t window; /* sliding window, 0 for a full-attention layer */
    int64_t rope;   /* 0: a NoPE layer */
    float *capture; /* NULL, or (rows, hidden) receiving the residual stream after the layer */
} glimmer_layer;

/* The step (mirrored by `StepArgs`): rows = sequences, one token each. */
typedef struct {
    int64_t rows, hidden, heads, kv_heads, head_dim, inter;
    double qk_eps, q_scale, attention_scale;
    const float *cos, *sin;   /* (rows, head_dim): the tokens' RoPE angles; NULL when no layer rotates */
    const int64_t *seq_lens;  /* (rows,): positions each sequence holds after this step */
    int64_t block_size[2];    /* per block-table set (a KV group): positions a block holds */
    const int64_t *tables[2]; /* (rows, table_width[g]) block ids */
    int64_t table_width[2];
    const int64_t *kv_start[2]; /* (rows,): the position of each row's first listed block */
    const int64_t *slots[2];    /* (rows,): the cache slot each token's key and value go to */
    const float *input_scale;   /* the first layer's input norm (1 + w) */
    double input_eps;
    int64_t barrier_spin_ns; /* how long a thread spins at a barrier between phases before it sleeps (team_wait) */
    int64_t *barrier_sleeps; /* receives how many of the step's barrier waits slept */
} glimmer_step;

/* A vector of LANES floats read from any float address: the same type with may_alias, dereferenced (a memcpy into a
 * `lanes` compiled, for AVX2 targets, to two 16-byte stores to the stack and a 32-byte load back, which cannot be
 * forwarded: the AVX2 products ran 10-30 times slower than with this load) */
typedef float unaligned_lanes __attribute__((vector_size(LANES * sizeof(float)), aligned(sizeof(float)), may_alias));
static inline lanes load(const float *p) { return *(const unaligned_lanes *)p; }

typedef float eight_lanes __attribute__((vector_size(8 * sizeof(float)), aligned(sizeof(float))));
typedef float four_lanes __attribute__((vector_size(4 * sizeof(float)), aligned(sizeof(float))));

/* the lanes' sum by halving (vector adds, not a scalar add per lane: a pass's sums are a fifth of its work at
 * hidden size 512) */
static inline float lane_sum(lanes v) {
    eight_lanes eight;
#if LANES == 16
    eight_lanes high;
    memcpy(&eight, &v, sizeof eight);
    memcpy(&high, (const char *)&v + sizeof eight, sizeof high);
    eight += high;
#else
    eight = v;
#endif
    four_lanes four, upper;
    memcpy(&four, &eight, sizeof four);
    memcpy(&upper, (const char *)&eight + sizeof four, sizeof upper);
    four += upper;
    return (four[0] + four[2]) + (four[1] + four[3]);
}

/* The lane sums of 16 vectors at once (ROWS x FEATURES accumulators of AVX-512): lane n of the result is
 * lane_sum(v[n]), bit for bit, since each level adds the same lanes in the same order as lane_sum does (lane i with
 * i + 8, then i + 4, then i + 2, then the two halves), but each shuffle serves two vectors at once (30 for the 16
 * sums). So a row's sums do not depend on how many rows a pass holds. */
#if LANES == 16 && ROWS * FEATURES == 16 && defined(__has_builtin)
#if __has_builtin(__builtin_shufflevector)
#define LANE_SUMS_16
#define HALVES(a, b, ...) (__builtin_shufflevector(a, b, __VA_ARGS__))
static inline lanes lane_sums_16(const lanes v[16]) {
    lanes by8[8], by4[4], by2[2];
    for (int k = 0; k < 8; k++) /* lanes 0-7: v[2k]'s i + (i + 8), lanes 8-15: v[2k + 1]'s */
        by8[k] = HALVES(v[2 * k], v[2 * k + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
                 HALVES(v[2 * k], v[2 * k + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    for (int k = 0; k < 4; k++) /* four lanes each of v[4k] .. v[4k + 3]: i + (i + 4) of the above */
        by4[k] = HALVES(by8[2 * k], by8[2 * k + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
                 HALVES(by8[2 * k], by8[2 * k + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    for (int k = 0; k < 2; k++) /* two lanes each of v[8k] .. v[8k + 7]: i + (i + 2) */
        by2[k] = HALVES(by4[2 * k], by4[2 * k + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
                 HALVES(by4[2 * k], by4[2 * k + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
    return HALVES(by2[0], by2[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
           HALVES(by2[0], by2[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}
#endif
#endif

/* Where x's rows are longer than X_WHOLE floats, a pass holds GROUP weight-row pairs and runs over x a chunk of
 * X_CHUNK floats at a time, each chunk through the GROUP pairs, the accumulators kept in memory between chunks: at eight
 * rows of 2,048 floats x is 64 KB, which does not stay in L1 beside the weights, and a pass per pair read all of it
 * from L2 again (the MLP's down product at eight rows read its weights at 9-10 GB/s a core, the gate|up product at
 * 14-17; chunked, 11-14, and at one row 20-26 instead of 17-21: 2-vCPU Zen 4, one process, alternating). Each lane adds the same
 * products in the same order either way, so the sums are the same bits. As a group's chunk is read, the same floats
 * of the next group are requested (GROUP * FEATURES rows on: 128 KB at 2,048 floats; 32 KB on would fall in the
 * group being read). Cores whose prefetch hints fill L1 (above) keep a pass per pair: requests a group ahead would
 * leave L1 before their use. */
#ifndef X_WHOLE
#define X_WHOLE 512
#endif
#define X_CHUNK 256 /* floats: 8 KB of eight AVX-512 rows, beside the 16 KB of the 16 weight rows' chunks */
#define GROUP 8

/* acc[r][f] += x row r's lanes times weight row f's over [from, to) (multiples of LANES), for nr rows (x rows stride
 * floats apart) and FEATURES weight rows starting at w (in floats each, consecutive); the weight `ahead` floats on
 * is requested as they are read. Inlined with constant nr, so the accumulators stay in registers. dot_block below
 * keeps its own copy of this loop: built from accumulate and finish, GCC compiled its two-row pass 20% slower. */
static inline __attribute__((always_inline)) void accumulate(const float *x, int64_t stride, int nr, const float *w,
                                                             int64_t in, int64_t from, int64_t to, int64_t ahead,
                                                             lanes acc[ROWS][FEATURES]) {
    lanes a[ROWS][FEATURES];
    for (int r = 0; r < nr; r++)
        for (int f = 0; f < FEATURES; f++) a[r][f] = acc[r][f];
    for (int64_t i = from; i < to; i += LANES) {
        lanes wv[FEATURES];
        for (int f = 0; f < FEATURES; f++) {
            wv[f] = load(w + f * in + i);
            __builtin_prefetch(w + f * in + i + ahead, 0, PREFETCH_LOCALITY);
        }
        for (int r = 0; r < nr; r++) {
            lanes xv = load(x + r * stride + i);
#if defined(__AVX__)
            /* x in a register, read once for the FEATURES products: left to itself the compiler folds the read into
             * each FMA, and the loads, not the FMAs, bound the pass (in cache at 8 rows 20-25% faster with AVX-512,
             * twice as fast with AVX2) */
            __asm__("" : "+v"(xv));
#endif
            for (int f = 0; f < FEATURES; f++) a[r][f] += xv * wv[f];
        }
    }
    for (int r = 0; r < nr; r++)
        for (int f = 0; f < FEATURES; f++) acc[r][f] = a[r][f];
}

/* dots[r][f] = the accumulators' lane sums plus the products of the last in % LANES floats */
static inline __attribute__((always_inline)) void finish(const lanes acc[ROWS][FEATURES], const float *x,
                                                         int64_t stride, int nr, const float *w, int64_t in,
                                                         float dots[ROWS][FEATURES]) {
    const int64_t whole = in - in % LANES;
    float sums[ROWS][FEATURES];
#ifdef LANE_SUMS_16
    if (nr > 3) { /* four rows and up: one reduction of all the accumulators (the rest zero) beats one each */
        lanes all[16];
        for (int r = 0; r < ROWS; r++)
            for (int f = 0; f < FEATURES; f++) all[r * FEATURES + f] = r < nr ? acc[r][f] : (lanes){0};
        const lanes reduced = lane_sums_16(all);
        for (int r = 0; r < nr; r++)
            for (int f = 0; f < FEATURES; f++) sums[r][f] = reduced[r * FEATURES + f];
    } else
#endif
        for (int r = 0; r < nr; r++)
            for (int f = 0; f < FEATURES; f++) sums[r][f] = lane_sum(acc[r][f]);
    for (int r = 0; r < nr; r++)
        for (int f = 0; f < FEATURES; f++) {
            float s = sums[r][f];
            for (int64_t i = whole; i < in; i++) s += x[r * stride + i] * w[f * in + i];
            dots[r][f] = s;
        }
}

/* dots[r][f] = x row r · weight row f, for nr rows (x rows stride floats apart) and FEATURES weight rows
 * starting at w (in floats each, consecutive). Inlined with constant nr, so the accumulators stay in registers. */
static inline __attribute__((always_inline)) void dot_block(const float *x, int64_t stride, int nr, const float *w,
                                                            int64_t in, float dots[ROWS][FEATURES]) {
    lanes acc[ROWS][FEATURES];
    for (int r = 0; r < nr; r++)
        for (int f = 0; f < FEATURES; f++) acc[r][f] = (lanes){0};
    const int64_t whole = in - in % LANES;
    for (int64_t i = 0; i < whole; i += LANES) {
        lanes wv[FEATURES];
        for (int f = 0; f < FEATURES; f++) {
            wv[f] = load(w + f * in + i);
            __builtin_prefetch(w + f * in + i + PREFETCH_FLOATS, 0, PREFETCH_LOCALITY);
        }
        for (int r = 0; r < nr; r++) {
            lanes xv = load(x + r * stride + i);
#if defined(__AVX__)
            /* x in a register, read once for the FEATURES products: left to itself the compiler folds the read into
             * each FMA, and the loads, not the FMAs, bound the pass (in cache at 8 rows 20-25% faster with AVX-512,
             * twice as fast with AVX2) */
            __asm__("" : "+v"(xv));
#endif
            for (int f = 0; f < FEATURES; f++) acc[r][f] += xv * wv[f];
        }
    }
    finish(acc, x, stride, nr, w, in, dots);
}

static void dots_of(const float *x, int64_t stride, int nr, const float *w, int64_t in, float dots[ROWS][FEATURES]) {
    switch (nr) {
    case 1: dot_block(x, stride, 1, w, in, dots); break;
    case 2: dot_block(x, stride, 2, w, in, dots); break;
    case 3: dot_block(x, stride, 3, w, in, dots); break;
#if ROWS > 4
    case 4: dot_block(x, stride, 4, w, in, dots); break;
    case 5: dot_block(x, stride, 5, w, in, dots); break;
    case 6: dot_block(x, stride, 6, w, in, dots); break;
    case 7: dot_block(x, stride, 7, w, in, dots); break;
#endif
    default: dot_block(x, stride, ROWS, w, in, dots); break;
    }
}

/* dots[g][r][f] = x row r · row f of the pair at w[g], for `count` (<= GROUP) pairs, a chunk of x at a time through
 * all of them (x rows longer than X_WHOLE); the weight `ahead` floats past each read is requested */
static inline __attribute__((always_inline)) void group_block(const float *x, int64_t stride, int nr,
                                                              const float *const w[GROUP], int count, int64_t in,
                                                              int64_t ahead, float dots[GROUP][ROWS][FEATURES]) {
    const int64_t whole = in - in % LANES;
    lanes acc[GROUP][ROWS][FEATURES];
    for (int g = 0; g < count; g++)
        for (int r = 0; r < nr; r++)
            for (int f = 0; f < FEATURES; f++) acc[g][r][f] = (lanes){0};
    for (int64_t from = 0; from < whole; from += X_CHUNK) {
        const int64_t to = whole - from > X_CHUNK ? from + X_CHUNK : whole;
        for (int g = 0; g < count; g++) accumulate(x, stride, nr, w[g], in, from, to, ahead, acc[g]);
    }
    for (int g = 0; g < count; g++) finish(acc[g], x, stride, nr, w[g], in, dots[g]);
}

static void group_dots_of(const float *x, int64_t stride, int nr, const float *const w[GROUP], int count, int64_t in,
                          int64_t ahead, float dots[GROUP][ROWS][FEATURES]) {
    switch (nr) {
    case 1: group_block(x, stride, 1, w, count, in, ahead, dots); break;
    case 2: group_block(x, stride, 2, w, count, in, ahead, dots); break;
    case 3: group_block(x, stride, 3, w, count, in, ahead, dots); break;
#if ROWS > 4
    case 4: group_block(x, stride, 4, w, count, in, ahead, dots); break;
    case 5: group_block(x, stride, 5, w, count, in, ahead, dots); break;
    case 6: group_block(x, stride, 6, w, count, in, ahead, dots); break;
    case 7: group_block(x, stride, 7, w, count, in, ahead, dots); break;
#endif
    default: group_block(x, stride, ROWS, w, count, in, ahead, dots); break;
    }
}

/* The barrier between a step's phases, for the threads of its parallel region: a thread that arrives spins at most
 * spin_ns, then sleeps until the last one arrives. libgomp's own barrier (torch's libgomp: the kernels link the one
 * loaded) spins 300,000 `pause`s before it sleeps unless the user set OMP_WAIT_POLICY or GOMP_SPINCOUNT (3.3 ms on a
 * 2-vCPU Xeon, more on cores whose pause is slower). While other processes hold the cores, the first thread at one of
 * a step's 58 barriers spun away the time slice its descheduled partner needed to get there: batch-1 decode fell from
 * 270 tok/s to 6-28 (bench/MEASUREMENTS.md, CPU decode). spin_ns < 0 takes the OpenMP runtime's barrier instead, which
 * honours what the user set. Either gives the same bits: a barrier orders the phases, it computes nothing.
 * `counted` 0 leaves a wait's sleep out of `sleeps`: at the end of a phase whose work may be uneven (attention, a
 * sequence's key head an item, contexts of any length, fewer items than threads at batch 1), a waiting thread is idle,
 * not held up by a descheduled partner, and one thread would be slower. */
typedef struct {
    atomic_int arrived;
    atomic_uint generation; /* one more each time the team passes */
    atomic_int sleeps;      /* counted waits that outlasted spin_ns: the thread they waited for was held up */
    pthread_mutex_t lock;   /* guards sleeping on `passed` against the last arrival's broadcast */
    pthread_cond_t passed;
} team_barrier;

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void team_wait(team_barrier *b, int64_t spin_ns, int counted) {
#ifdef _OPENMP
    const int team = omp_get_num_threads();
    if (team < 2) return;
    if (spin_ns < 0) {
#pragma omp barrier
        return;
    }
    const unsigned generation = atomic_load_explicit(&b->generation, memory_order_acquire);
    if (atomic_fetch_add_explicit(&b->arrived, 1, memory_order_acq_rel) == team - 1) { /* the last to arrive */
        atomic_store_explicit(&b->arrived, 0, memory_order_relaxed);
        pthread_mutex_lock(&b->lock);
        atomic_store_explicit(&b->generation, generation + 1, memory_order_release);
        pthread_cond_broadcast(&b->passed);
        pthread_mutex_unlock(&b->lock);
        return;
    }
    const int64_t until = now_ns() + spin_ns;
    for (unsigned spins = 1; atomic_load_explicit(&b->generation, memory_order_acquire) == generation; spins++) {
        relax();
        if (spins % 16 == 0 && now_ns() > until) {
            if (counted) atomic_fetch_add_explicit(&b->sleeps, 1, memory_order_relaxed);
            pthread_mutex_lock(&b->lock);
            while (atomic_load_explicit(&b->generation, memory_order_acquire) == generation)
                pthread_cond_wait(&b->passed, &b->lock);
            pthread_mutex_unlock(&b->lock);
            return;
        }
    }
#else
    (void)b;
    (void)spin_ns;
    (void)counted;
#endif
}

static void team_barrier_init(team_barrier *b) {
    atomic_init(&b->arrived, 0);
    atomic_init(&b->generation, 0u);
    atomic_init(&b->sleeps, 0);
    pthread_mutex_init(&b->lock, NULL);
    pthread_cond_init(&b->passed, NULL);
}

static void team_barrier_destroy(team_barrier *b) {
    pthread_mutex_destroy(&b->lock);
    pthread_cond_destroy(&b->passed);
}

/* y (rows, out) = x (rows, in) · wᵀ + bias (out >= FEATURES), the weight rows shared among the threads of the
 * enclosing region: a pair of them at a time, or GROUP pairs where x's rows are longer than X_WHOLE. A last odd weight
 * row is read with the row before it, whose sums that pass drops. No barrier after: y is whole once the caller's is
 * passed. */
static void project(const float *x, int64_t rows, const float *w, const float *bias, int64_t out, int64_t in, float *y) {
    const int64_t pairs = (out + FEATURES - 1) / FEATURES;
    if (in <= X_WHOLE) {
#pragma omp for schedule(static) nowait
        for (int64_t p = 0; p < pairs; p++) {
            const int64_t first = p * FEATURES < out - FEATURES ? p * FEATURES : out - FEATURES;
            float dots[ROWS][FEATURES];
            for (int64_t r0 = 0; r0 < rows; r0 += ROWS) {
                const int nr = rows - r0 < ROWS ? (int)(rows - r0) : ROWS;
                dots_of(x + r0 * in, in, nr, w + first * in, in, dots);
                for (int r = 0; r < nr; r++)
                    for (int64_t f = p * FEATURES - first; f < FEATURES; f++)
                        y[(r0 + r) * out + first + f] = dots[r][f] + (bias != NULL ? bias[first + f] : 0.0f);
            }
        }
        return;
    }
    const int64_t groups = (pairs + GROUP - 1) / GROUP;
#pragma omp for schedule(static) nowait
    for (int64_t q = 0; q < groups; q++) {
        const int count = pairs - q * GROUP < GROUP ? (int)(pairs - q * GROUP) : GROUP;
        int64_t first[GROUP];
        const float *rows_of[GROUP];
        for (int g = 0; g < count; g++) {
            const int64_t p = q * GROUP + g;
            first[g] = p * FEATURES < out - FEATURES ? p * FEATURES : out - FEATURES;
            rows_of[g] = w + first[g] * in;
        }
        float dots[GROUP][ROWS][FEATURES];
        for (int64_t r0 = 0; r0 < rows; r0 += ROWS) {
            const int nr = rows - r0 < ROWS ? (int)(rows - r0) : ROWS;
            group_dots_of(x + r0 * in, in, nr, rows_of, count, in, GROUP * FEATURES * in, dots);
            for (int g = 0; g < count; g++)
                for (int r = 0; r < nr; r++)
                    for (int64_t f = (q * GROUP + g) * FEATURES - first[g]; f < FEATURES; f++)
                        y[(r0 + r) * out + first[g] + f] = dots[g][r][f] + (bias != NULL ? bias[first[g] + f] : 0.0f);
        }
    }
}

/* act (rows, inter) = silu(x · gateᵀ) · (x · upᵀ) with the gate rows then the up rows of `w` (inter >= FEATURES):
 * the MLP's fused product and silu_mul_torch in one pass (where x's rows are longer than X_WHOLE, a pair of gate rows
 * and its pair of up rows as one group); no barrier after, as project() */
static void project_silu_mul(const float *x, int64_t rows, const float *w, int64_t inter, int64_t in, float *act) {
    const int64_t pairs = (inter + FEATURES - 1) / FEATURES;
#pragma omp for schedule(static) nowait
    for (int64_t p = 0; p < pairs; p++) {
        const int64_t first = p * FEATURES < inter - FEATURES ? p * FEATURES : inter - FEATURES;
        const float *gate_and_up[GROUP] = {w + first * in, w + (inter + first) * in};
        float dots[GROUP][ROWS][FEATURES]; /* [0]: the gate rows', [1]: the up rows' */
        for (int64_t r0 = 0; r0 < rows; r0 += ROWS) {
            const int nr = rows - r0 < ROWS ? (int)(rows - r0) : ROWS;
            if (in > X_WHOLE) {
                group_dots_of(x + r0 * in, in, nr, gate_and_up, 2, in, FEATURES * in, dots);
            } else {
                dots_of(x + r0 * in, in, nr, gate_and_up[0], in, dots[0]);
                dots_of(x + r0 * in, in, nr, gate_and_up[1], in, dots[1]);
            }
            for (int r = 0; r < nr; r++)
                for (int64_t f = p * FEATURES - first; f < FEATURES; f++) {
                    float g = dots[0][r][f];
                    act[(r0 + r) * inter + first + f] = (g / (1.0f + fast_exp(-g))) * dots[1][r][f];
                }
        }
    }
}

/* project() on the calling thread where `out` is below a pass's weight rows (it reads them in pairs) */
static void project_few(const float *x, int64_t rows, const float *w, const float *bias, int64_t out, int64_t in,
                        float *y) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t o = 0; o < out; o++) {
            float s = 0.0f;
            for (int64_t i = 0; i < in; i++) s += x[r * in + i] * w[o * in + i];
            y[r * out + o] = s + (bias != NULL ? bias[o] : 0.0f);
        }
}

/* y (rows, out) = x (rows, in) · wᵀ + bias: the stack's product alone, in a parallel region of its own (the CPU
 * bench times it beside torch's products; tests check it against F.linear) */
void glimmer_linear(const float *x, int64_t rows, const float *w, const float *bias, int64_t out, int64_t in, float *y,
                    int threads) {
    if (out < FEATURES) {
        project_few(x, rows, w, bias, out, in, y);
        return;
    }
#pragma omp parallel num_threads(threads)
    project(x, rows, w, bias, out, in, y);
}

/* softcapped_logits_torch: logits (rows, vocab) = cap * tanh(((h · wᵀ) * multiplier) / cap), each operation rounded
 * to float32 in the reference's order (architecture.md §2.7); tanhf is libm's */
void glimmer_logits(const float *h, int64_t rows, const float *w, int64_t vocab, int64_t hidden, float multiplier,
                    float cap, float *out, int threads, int64_t barrier_spin_ns) {
    if (vocab < FEATURES) project_few(h, rows, w, NULL, vocab, hidden, out);
    team_barrier barrier;
    team_barrier_init(&barrier);
#pragma omp parallel num_threads(threads)
    {
        if (vocab >= FEATURES) project(h, rows, w, NULL, vocab, hidden, out);
        team_wait(&barrier, barrier_spin_ns, 1);
#pragma omp for schedule(static)
        for (int64_t i = 0; i < rows * vocab; i++) {
            float z = out[i] * multiplier;
            z = z / cap;
            out[i] = tanhf(z) * cap;
        }
    }
    team_barrier_destroy(&barrier);
}

/* Check every index the layers will follow; 1 + the first offending row, or 0. */
static int check_indices(const glimmer_step *s, const glimmer_layer *layers, int64_t num_layers, int64_t *max_keys) {
    *max_keys = 1;
    for (int64_t l = 0; l < num_layers; l++) {
        const glimmer_layer *layer = &layers[l];
        const int64_t g = layer->group, num_slots = layer->num_blocks * s->block_size[g];
        for (int64_t b = 0; b < s->rows; b++) {
            int64_t lo;
            if (s->slots[g][b] < 0 || s->slots[g][b] >= num_slots) return (int)(b + 1);
            if (visible_keys(s->seq_lens[b], s->kv_start[g][b], layer->window, s->tables[g] + b * s->table_width[g],
                             s->table_width[g], s->block_size[g], layer->num_blocks, &lo))
                return (int)(b + 1);
            if (s->seq_lens[b] - lo > *max_keys) *max_keys = s->seq_lens[b] - lo;
        }
    }
    return 0;
}

/* The decoder layers of a decode step: x (rows, hidden) is the embedded tokens (before the input norm); out
 * (rows, hidden) receives the final-normed hidden states. Returns 0; 1 + a row whose slot or block table is out
 * of range (nothing is written then); -1 when memory for the work buffers ran out. */
int glimmer_decode_layers(const glimmer_step *s, const glimmer_layer *layers, int64_t num_layers, const float *x,
                          float *out, int threads) {
    int64_t max_keys;
    int bad = check_indices(s, layers, num_layers, &max_keys);
    if (bad) return bad;
    const int64_t rows = s->rows, hidden = s->hidden, heads = s->heads, kv_heads = s->kv_heads, d = s->head_dim;
    const int64_t q_size = heads * d, kv_size = kv_heads * d, qkvg_width = 2 * q_size + 2 * kv_size;
    const int64_t group = heads / kv_heads, inter = s->inter;
    float *work = malloc((size_t)(rows * (qkvg_width + 2 * q_size + 3 * hidden + inter)) * sizeof(float));
    if (work == NULL) return -1;
    float *qkvg = work, *q = qkvg + rows * qkvg_width, *attended = q + rows * q_size;
    float *residual = attended + rows * q_size, *h = residual + rows * hidden, *projected = h + rows * hidden;
    float *act = projected + rows * hidden;
    int out_of_memory = 0;
    const int64_t spin_ns = s->barrier_spin_ns;
    team_barrier barrier;
    team_barrier_init(&barrier);
#pragma omp parallel num_threads(threads)
    {
        float *scores = malloc((size_t)(group * max_keys) * sizeof(float));
        float *acc = malloc((size_t)(group * d) * sizeof(float));
        if (scores == NULL || acc == NULL) {
#pragma omp atomic write
            out_of_memory = 1;
        }
        team_wait(&barrier, spin_ns, 1);
        if (!out_of_memory) {
#pragma omp for schedule(static) nowait
            for (int64_t r = 0; r < rows; r++) {
                memcpy(residual + r * hidden, x + r * hidden, (size_t)hidden * sizeof(float));
                residual_norm_row(NULL, residual + r * hidden, NULL, 0.0f, s->input_scale, (float)s->input_eps,
                                  hidden, residual + r * hidden, h + r * hidden);
            }
            team_wait(&barrier, spin_ns, 1);
            for (int64_t l = 0; l < num_layers; l++) {
                const glimmer_layer *layer = &layers[l];
                const int64_t g = layer->group;
                float *normed = l == num_layers - 1 ? out : h;
                project(h, rows, layer->qkvg_weight, layer->qkvg_bias, qkvg_width, hidden, qkvg);
                team_wait(&barrier, spin_ns, 1);
/* one sequence's key head at a time: its query heads normed and rotated, its key and value stored, then the
 * query heads attend. No barrier between storing and attending: an item reads only its own sequence's keys of its
 * own key head, and the new keys of a sequence go to a block that sequence alone holds (shared prefix blocks are
 * full, never written). */
#pragma omp for collapse(2) schedule(dynamic) nowait
                for (int64_t r = 0; r < rows; r++)
                    for (int64_t kv_head = 0; kv_head < kv_heads; kv_head++) {
                        const float *row = qkvg + r * qkvg_width;
                        const int64_t slot = s->slots[g][r], head = kv_head * group;
                        const float *cos = layer->rope ? s->cos + r * d : NULL, *sin = layer->rope ? s->sin + r * d : NULL;
                        for (int64_t h = head; h < head + group; h++)
                            norm_rope_head(row + h * d, d, (float)s->qk_eps, (float)s->q_scale, cos, sin,
                                           q + (r * heads + h) * d);
                        norm_rope_head(row + (heads + kv_head) * d, d, (float)s->qk_eps, 1.0f, cos, sin,
                                       layer->key_cache + slot * kv_size + kv_head * d);
                        memcpy(layer->value_cache + slot * kv_size + kv_head * d, row + (heads + kv_heads + kv_head) * d,
                               (size_t)d * sizeof(float));
                        int64_t lo;
                        const int64_t *table = s->tables[g] + r * s->table_width[g];
                        visible_keys(s->seq_lens[r], s->kv_start[g][r], layer->window, table, s->table_width[g],
                                     s->block_size[g], layer->num_blocks, &lo);
                        attend(q + (r * heads + head) * d, group, d, layer->key_cache, layer->value_cache, kv_heads,
                               kv_head, table, s->block_size[g], s->kv_start[g][r], lo, s->seq_lens[r],
                               (float)s->attention_scale, qkvg + r * qkvg_width + q_size + 2 * kv_size + head * d,
                               attended + r * q_size + head * d, scores, acc);
                    }
                team_wait(&barrier, spin_ns, 0); /* uneven work: not counted */
                project(attended, rows, layer->o_weight, layer->o_bias, hidden, q_size, projected);
                team_wait(&barrier, spin_ns, 1);
#pragma omp for schedule(static) nowait
                for (int64_t r = 0; r < rows; r++)
                    residual_norm_row(projected + r * hidden, residual + r * hidden, layer->post_attention_scale,
                                      (float)layer->post_attention_eps, layer->pre_feedforward_scale,
                                      (float)layer->pre_feedforward_eps, hidden, residual + r * hidden, h + r * hidden);
                team_wait(&barrier, spin_ns, 1);
                project_silu_mul(h, rows, layer->gate_up_weight, inter, hidden, act);
                team_wait(&barrier, spin_ns, 1);
                project(act, rows, layer->down_weight, NULL, hidden, inter, projected);
                team_wait(&barrier, spin_ns, 1);
#pragma omp for schedule(static) nowait
                for (int64_t r = 0; r < rows; r++) {
                    residual_norm_row(projected + r * hidden, residual + r * hidden, layer->post_feedforward_scale,
                                      (float)layer->post_feedforward_eps, layer->following_scale,
                                      (float)layer->following_eps, hidden, residual + r * hidden, normed + r * hidden);
                    if (layer->capture != NULL)
                        memcpy(layer->capture + r * hidden, residual + r * hidden, (size_t)hidden * sizeof(float));
                }
                team_wait(&barrier, spin_ns, 1);
            }
        }
        free(scores);
        free(acc);
    }
    *s->barrier_sleeps = atomic_load(&barrier.sleeps);
    team_barrier_destroy(&barrier);
    free(work);
    return out_of_memory ? -1 : 0;
}

/* Hand-written CPU kernel of the observations (plain C99 + optional OpenMP; no torch headers).
 *
 * Semantics: gpusim.kernels.observations (module docstring); the oracle is the torch reference
 * naive.observations_reference. This file repeats its arithmetic operation by operation (same
 * float32 operations in the same order, no FMA contraction: built with -ffp-contract=off), the
 * same integer sort keys (tables.sort_key: float bits of the squared distance with the low bits
 * replaced by the candidate index) and the same cached road tables (tables.road_table), so the
 * partner and road order is identical and the values are bit for bit those of the reference
 * (cos/sin of the headings come from torch, computed by the caller), except the goal distance,
 * whose sqrtf is correctly rounded where torch's vectorised sqrt may be off by one ulp.
 *
 * Cost (2-core dev machine, 1 thread, 8 slots per world): ~2 us per slot row with the output in
 * cache; about half of it is sorting the ~100 road candidates (sort_keys). The row of 1,632
 * floats (6.5 KB) is written once.
 *
 * One output row per listed slot; rows are independent, an OpenMP `parallel for` splits them.
 * Built and called through ctypes by cpu.py (gpusim_obs_abi / gpusim_observations below, and
 * gpusim_observations_state: the env's stage in one call, rows and ego extras from the state's fields).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Bumped whenever the argument list of gpusim_observations changes (cpu.py checks it). */
#define GPUSIM_OBS_ABI 3

#define EGO_DIM 11   /* 6 computed + NEXTRA copied (obs_layout) */
#define NEXTRA 5
#define PDIM 11      /* PARTNER_FEATURES */
#define RDIM 10      /* ROAD_FEATURES */
#define GEO_COLS 8   /* tables.GEO_COLS: x0 y0 x1 y1 ux uy len 0 */
#define FEAT_COLS 10 /* tables.ROAD_COLS: mx my ux uy half onehot4 1 */
#define MAX_KEYS 65536

int gpusim_obs_abi(void) { return GPUSIM_OBS_ABI; }

int gpusim_obs_has_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

typedef struct {
    const float *pos, *cos_h, *sin_h, *speed, *length, *width;
    const int8_t *agent_type;
    const uint8_t *present;
    const float *goal, *extra;
    const uint8_t *active;
    const int64_t *scenario;
    const float *geo, *feat;
    const void *grid;
    int grid_is16;
    const int64_t *grid_start;
    const float *grid_origin;
    const int32_t *grid_dims;
    int64_t A, C, K, R, P;
    float cell_size, pr2, inv_pr, rr2, inv_rr, two_inv_rr, speed_mul, size_mul, goal_div;
    int abits, rbits;
    /* gpusim_observations_state only (extra == NULL): goal is the state's [W, A, 2] (goal_cols = A;
     * C for gpusim_observations), the ego extras are read from the state's fields */
    int64_t goal_cols;
    const uint8_t *collided, *offroad; /* [W, A] */
    const float *last_reward;          /* [W, C] */
    const float *t_index, *t_time;     /* [W], or NULL: 0 (no trial mode) */
} ObsArgs;

static inline uint32_t f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

/* gpusim.kernels.grid.cell_index_reference for one position (same float32 operations). */
static int64_t cell_of(const ObsArgs *a, int64_t s, float x, float y) {
    float ox = a->grid_origin[2 * s], oy = a->grid_origin[2 * s + 1];
    int64_t nx = a->grid_dims[2 * s], ny = a->grid_dims[2 * s + 1];
    float fx = (x - ox) / a->cell_size, fy = (y - oy) / a->cell_size;
    if (isnan(fx)) fx = 0.0f;
    if (isnan(fy)) fy = 0.0f;
    fx = fx < -1e9f ? -1e9f : (fx > 1e9f ? 1e9f : fx);
    fy = fy < -1e9f ? -1e9f : (fy > 1e9f ? 1e9f : fy);
    int64_t ix = (int64_t)floorf(fx), iy = (int64_t)floorf(fy);
    ix = ix < 0 ? 0 : ix;
    iy = iy < 0 ? 0 : iy;
    ix = ix < nx - 1 ? ix : nx - 1;
    iy = iy < ny - 1 ? iy : ny - 1;
    return iy * nx + ix;
}

#define NBUCKETS 128

static inline float bits_f32(int32_t k) {
    float x;
    memcpy(&x, &k, sizeof x);
    return x;
}

/* Bucket of a key: monotone in the key, so bucket order never contradicts key order. */
static inline int bucket(int32_t key, float scale) {
    float b = bits_f32(key) * scale;
    return b < (float)(NBUCKETS - 1) ? (int)b : NBUCKETS - 1;
}

/* Sort keys[0..n) ascending (unique non-negative keys whose float value lies in [0, maxval], up
 * to the index bits): a counting pass into NBUCKETS buckets linear in the squared distance, which
 * squared distances of candidates spread over a disc fill about evenly, then an insertion pass
 * that only moves keys within their bucket. tmp holds n keys. Both a plain insertion sort (the
 * grid's cell-centre order is far from the ego's order: one mispredicted exit per key) and a rank
 * count (n^2 compares) measured 3-5x slower for the ~100 road candidates of a slot. */
static void sort_keys(int32_t *keys, int64_t n, float maxval, int32_t *tmp) {
    if (n < 2) return;
    int32_t start[NBUCKETS + 1];
    const float scale = (float)NBUCKETS / maxval;
    memset(start, 0, sizeof start);
    for (int64_t i = 0; i < n; i++) start[bucket(keys[i], scale) + 1]++;
    for (int b = 0; b < NBUCKETS; b++) start[b + 1] += start[b];
    for (int64_t i = 0; i < n; i++) tmp[start[bucket(keys[i], scale)]++] = keys[i];
    for (int64_t i = 0; i < n; i++) {
        int32_t key = tmp[i];
        int64_t j = i;
        while (j > 0 && keys[j - 1] > key) {
            keys[j] = keys[j - 1];
            j--;
        }
        keys[j] = key;
    }
}

/* Partner block of slot c of world w: the kp nearest other present agents within the radius. */
static void partners_row(const ObsArgs *a, int64_t w, int64_t c, float ex, float ey, float ec, float es,
                         float *dst, int32_t *keys) {
    const int64_t A = a->A, kp = a->P < A ? a->P : A;
    const uint32_t low = ((uint32_t)1 << a->abits) - 1u;
    const float *pw = a->pos + 2 * w * A;
    const uint8_t *pres = a->present + w * A;
    int64_t n = 0;
    for (int64_t j = 0; j < A; j++) { /* compaction of the candidates within the radius */
        float rx = pw[2 * j] - ex, ry = pw[2 * j + 1] - ey;
        float d2 = rx * rx + ry * ry;
        keys[n] = (int32_t)((f32_bits(d2) & ~low) | (uint32_t)j);
        n += (pres[j] != 0) & (j != c) & (d2 <= a->pr2);
    }
    sort_keys(keys, n, a->pr2, keys + A);
    if (n > kp) n = kp;
    for (int64_t q = 0; q < n; q++) {
        int64_t j = (int64_t)((uint32_t)keys[q] & low), g = w * A + j;
        float px = pw[2 * j] - ex, py = pw[2 * j + 1] - ey;
        float pc = a->cos_h[g], ps = a->sin_h[g];
        int t = a->agent_type[g];
        float *o = dst + q * PDIM;
        o[0] = (px * ec + py * es) * a->inv_pr;
        o[1] = (py * ec - px * es) * a->inv_pr;
        o[2] = pc * ec + ps * es;
        o[3] = ps * ec - pc * es;
        o[4] = a->speed[g] * a->speed_mul;
        o[5] = a->length[g] * a->size_mul;
        o[6] = a->width[g] * a->size_mul;
        o[7] = t == 0 ? 1.0f : 0.0f;
        o[8] = t == 1 ? 1.0f : 0.0f;
        o[9] = t == 2 ? 1.0f : 0.0f;
        o[10] = 1.0f;
    }
    memset(dst + n * PDIM, 0, (size_t)(a->P - n) * PDIM * sizeof(float));
}

/* Candidate k of grid row `row` (int16 or int32 table). */
static inline int32_t grid_at(const ObsArgs *a, int64_t row, int64_t k) {
    if (a->grid_is16) return ((const int16_t *)a->grid)[row * a->K + k];
    return ((const int32_t *)a->grid)[row * a->K + k];
}

/* Road block: the grid cell's candidates within the radius, nearest first (tables.segment_d2). */
static void roads_row(const ObsArgs *a, int64_t w, float ex, float ey, float ec, float es, float *dst,
                      int32_t *keys) {
    const int64_t K = a->K;
    const uint32_t low = ((uint32_t)1 << a->rbits) - 1u;
    const int64_t s = a->scenario[w];
    const int64_t row = a->grid_start[s] + cell_of(a, s, ex, ey);
    const int64_t base = s * a->R;
    int64_t n = 0;
    for (int64_t k = 0; k < K; k++) {
        int32_t cand = grid_at(a, row, k);
        if (cand < 0) continue;
        const float *g = a->geo + (base + cand) * GEO_COLS;
        float q0x = ex - g[0], q0y = ey - g[1];
        float along = q0x * g[4] + q0y * g[5];
        float perp = q0x * g[5] - q0y * g[4];
        int before = along <= 0.0f;
        float cx = before ? q0x : ex - g[2];
        float cy = before ? q0y : ey - g[3];
        float d2 = (before || along >= g[6]) ? cx * cx + cy * cy : perp * perp;
        keys[n] = (int32_t)((f32_bits(d2) & ~low) | (uint32_t)k);
        n += d2 <= a->rr2;
    }
    sort_keys(keys, n, a->rr2, keys + K);
    for (int64_t q = 0; q < n; q++) {
        int64_t k = (int64_t)((uint32_t)keys[q] & low);
        const float *f = a->feat + (base + grid_at(a, row, k)) * FEAT_COLS;
        float mx = f[0] - ex, my = f[1] - ey, ux = f[2], uy = f[3];
        float *o = dst + q * RDIM;
        o[0] = (mx * ec + my * es) * a->inv_rr;
        o[1] = (my * ec - mx * es) * a->inv_rr;
        o[2] = f[4] * a->two_inv_rr;
        o[3] = ux * ec + uy * es;
        o[4] = uy * ec - ux * es;
        o[5] = f[5];
        o[6] = f[6];
        o[7] = f[7];
        o[8] = f[8];
        o[9] = 1.0f;
    }
    memset(dst + n * RDIM, 0, (size_t)(K - n) * RDIM * sizeof(float));
}

/* One observation row (flat slot i = w * C + c) into dst [D]. */
static void obs_row(const ObsArgs *a, int64_t i, int active, float *dst, int64_t D, int32_t *keys) {
    if (!active) {
        memset(dst, 0, (size_t)D * sizeof(float));
        return;
    }
    const int64_t w = i / a->C, c = i - w * a->C, e = w * a->A + c;
    const float ex = a->pos[2 * e], ey = a->pos[2 * e + 1];
    const float ec = a->cos_h[e], es = a->sin_h[e];
    const int64_t gi = w * a->goal_cols + c;
    float gx = a->goal[2 * gi] - ex, gy = a->goal[2 * gi + 1] - ey;
    dst[0] = a->speed[e] * a->speed_mul;
    dst[1] = a->length[e] * a->size_mul;
    dst[2] = a->width[e] * a->size_mul;
    dst[3] = (gx * ec + gy * es) / a->goal_div;
    dst[4] = (gy * ec - gx * es) / a->goal_div;
    dst[5] = sqrtf(gx * gx + gy * gy) / a->goal_div;
    if (a->extra) {
        memcpy(dst + 6, a->extra + NEXTRA * i, NEXTRA * sizeof(float));
    } else { /* sim.observe.ego_extra: collided, offroad, trial index, time in trial, last reward */
        dst[6] = a->collided[e] ? 1.0f : 0.0f;
        dst[7] = a->offroad[e] ? 1.0f : 0.0f;
        dst[8] = a->t_index ? a->t_index[w] + 0.0f : 0.0f;
        dst[9] = a->t_time ? a->t_time[w] + 0.0f : 0.0f;
        dst[10] = a->last_reward[i];
    }
    partners_row(a, w, c, ex, ey, ec, es, dst + EGO_DIM, keys);
    roads_row(a, w, ex, ey, ec, es, dst + EGO_DIM + a->P * PDIM, keys);
}

/* The rows of one call: either n listed/all slots (rows, active: gpusim_observations) or, with
 * controlled != NULL, every slot i = w * C + c of the W*C in play now (controlled and present [W, A] at
 * column c) or
 * was written before (written[i]); written_out[i] receives the in-play flag (gpusim_observations_state). */
typedef struct {
    const int64_t *rows;
    int64_t n;
    const uint8_t *controlled, *written;
    uint8_t *written_out;
} RowSel;

static int run_rows(const ObsArgs *a, const RowSel *sel, float *out, int64_t out_stride, int64_t zero_tail,
                    int num_threads) {
    const int64_t A = a->A, K = a->K, P = a->P;
    if (A > MAX_KEYS || K > MAX_KEYS) return -1;
    const int64_t D = EGO_DIM + P * PDIM + K * RDIM;
    const int64_t nkeys = 2 * (A > K ? A : K); /* keys + the sort's scratch */
    const int64_t n = sel->n;
    int failed = 0;
#ifdef _OPENMP
    if (num_threads < 1) num_threads = 1;
#pragma omp parallel num_threads(num_threads) if (num_threads > 1 && n > 1) reduction(| : failed)
#endif
    {
        int32_t stack_keys[1024];
        int32_t *heap = nkeys > 1024 ? (int32_t *)malloc((size_t)nkeys * sizeof(int32_t)) : NULL;
        int32_t *keys = nkeys > 1024 ? heap : stack_keys;
        if (!keys) failed = 1;
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (int64_t i = 0; i < n; i++) {
            if (!keys) continue;
            int64_t slot;
            int act;
            if (sel->controlled) {
                const int64_t w = i / a->C;
                slot = i;
                const int64_t e = w * A + (i - w * a->C);
                act = sel->controlled[e] && a->present[e];
                sel->written_out[i] = (uint8_t)act;
                if (!act && !sel->written[i]) continue;
            } else {
                slot = sel->rows ? sel->rows[i] : i;
                act = a->active[slot];
            }
            obs_row(a, slot, act, out + slot * out_stride, D, keys);
            if (zero_tail) memset(out + slot * out_stride + D, 0, (size_t)zero_tail * sizeof(float));
        }
        free(heap);
    }
    if (failed) return -2;
    return 0;
}

/* Observations of n slot rows (rows[i], or i itself when rows is NULL) into out + slot * out_stride;
 * the zero_tail floats after the D written ones of each row are set to 0.
 * Returns 0; -1 when A or K exceeds 65536 (the caller checks first); -2 when a key buffer could not
 * be allocated (rows are then left unwritten). */
int gpusim_observations(
    const float *pos, const float *cos_h, const float *sin_h, const float *speed, const float *length,
    const float *width, const int8_t *agent_type, const uint8_t *present, const float *goal, const float *extra,
    const uint8_t *active, const int64_t *scenario, const float *geo, const float *feat, const void *grid,
    int grid_is16, const int64_t *grid_start, const float *grid_origin, const int32_t *grid_dims,
    const int64_t *rows, int64_t n, float *out, int64_t out_stride, int64_t zero_tail,
    int64_t A, int64_t C, int64_t K, int64_t R, int64_t P, int abits, int rbits,
    float cell_size, float pr2, float inv_pr, float rr2, float inv_rr, float two_inv_rr,
    float speed_mul, float size_mul, float goal_div, int num_threads) {
    ObsArgs a = {pos, cos_h, sin_h, speed, length, width, agent_type, present, goal, extra, active, scenario,
                 geo, feat, grid, grid_is16, grid_start, grid_origin, grid_dims, A, C, K, R, P,
                 cell_size, pr2, inv_pr, rr2, inv_rr, two_inv_rr, speed_mul, size_mul, goal_div, abits, rbits,
                 C, NULL, NULL, NULL, NULL, NULL};
    RowSel sel = {rows, n, NULL, NULL, NULL};
    return run_rows(&a, &sel, out, out_stride, zero_tail, num_threads);
}

/* The env's observation stage in one call (sim.observe): the W*C slots' rows from the state's own
 * fields. Slot c of world w is in play when controlled and present [W, A] are set at column c; its
 * row is written when it is in play or written [W*C] says it may be non-zero (then zeroed);
 * written_out [W*C] receives the in-play flags. goal is [W, A, 2]; the ego extras come from
 * collided / offroad [W, A], t_index / t_time [W] (NULL: 0) and last_reward [W, C].
 * Returns as gpusim_observations. */
int gpusim_observations_state(
    const float *pos, const float *cos_h, const float *sin_h, const float *speed, const float *length,
    const float *width, const int8_t *agent_type, const uint8_t *present, const float *goal,
    const uint8_t *collided, const uint8_t *offroad, const float *t_index, const float *t_time,
    const float *last_reward, const uint8_t *controlled, const uint8_t *written, uint8_t *written_out,
    const int64_t *scenario, const float *geo, const float *feat, const void *grid,
    int grid_is16, const int64_t *grid_start, const float *grid_origin, const int32_t *grid_dims,
    int64_t W, float *out, int64_t out_stride, int64_t zero_tail,
    int64_t A, int64_t C, int64_t K, int64_t R, int64_t P, int abits, int rbits,
    float cell_size, float pr2, float inv_pr, float rr2, float inv_rr, float two_inv_rr,
    float speed_mul, float size_mul, float goal_div, int num_threads) {
    ObsArgs a = {pos, cos_h, sin_h, speed, length, width, agent_type, present, goal, NULL, NULL, scenario,
                 geo, feat, grid, grid_is16, grid_start, grid_origin, grid_dims, A, C, K, R, P,
                 cell_size, pr2, inv_pr, rr2, inv_rr, two_inv_rr, speed_mul, size_mul, goal_div, abits, rbits,
                 A, collided, offroad, last_reward, t_index, t_time};
    RowSel sel = {NULL, W * C, controlled, written, written_out};
    return run_rows(&a, &sel, out, out_stride, zero_tail, num_threads);
}

/* CPU kernels of gpusim/kernels/collision.py: agent-agent collisions (collisions_reference) and who
 * was hit (hit_by_reference, collision REMOVE). Called through ctypes by collision.py. */
#include "cpu_common.h"
#include "gpusim_generated.h" /* the argument structs (cbuild.CStruct tables in the .py) */

GPUSIM_EXPORT_ABI(gpusim_collision, 2)

/* Separating-axis test of boxes i and j (collision.py / events.hit_by: same expressions, same
 * order): d = c_j - c_i; half extents a (along the heading), b (across). 1 when they overlap. */
static inline int boxes_overlap(float dx, float dy, float ci, float si, float ai, float bi,
                                float cj, float sj, float aj, float bj) {
    float c = fabsf(ci * cj + si * sj);
    float s = fabsf(ci * sj - si * cj);
    if (fabsf(dx * ci + dy * si) > ai + aj * c + bj * s) return 0;
    if (fabsf(dy * ci - dx * si) > bi + aj * s + bj * c) return 0;
    if (fabsf(dx * cj + dy * sj) > aj + ai * c + bi * s) return 0;
    if (fabsf(dy * cj - dx * sj) > bj + ai * s + bi * c) return 0;
    return 1;
}

/* collision.collisions_reference with a query mask: for each present query agent i of world w and
 * each other present agent j, flag both when the boxes overlap. half_scale = float32(0.5 *
 * box_scale); half_margin = float32(0.5 * CIRCLE_MARGIN): the bounding-circle pre-check
 * |d|^2 <= (r_i + r_j)^2 with r = sqrt(a^2 + b^2) + half_margin. out [W, A] fully written. */
void gpusim_collisions(const CollisionsArgs *args) {
    GPUSIM_UNPACK_CollisionsArgs(args)
    int64_t w;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1)
    for (w = 0; w < W; w++) {
        const int64_t base = w * A;
        uint8_t *o = out + base;
        memset(o, 0, (size_t)A);
        for (int64_t i = 0; i < A; i++) {
            const int64_t gi = base + i;
            if (!query[gi] || !present[gi]) continue;
            float ai = half_scale * length[gi], bi = half_scale * width[gi];
            float ri = sqrtf(ai * ai + bi * bi) + half_margin;
            float px = pos[2 * gi], py = pos[2 * gi + 1], ci = cos_h[gi], si = sin_h[gi];
            for (int64_t j = 0; j < A; j++) {
                const int64_t gj = base + j;
                if (j == i || !present[gj]) continue;
                float aj = half_scale * length[gj], bj = half_scale * width[gj];
                float rs = sqrtf(aj * aj + bj * bj) + half_margin + ri;
                float dx = pos[2 * gj] - px, dy = pos[2 * gj + 1] - py;
                if (!(dx * dx + dy * dy <= rs * rs)) continue;
                if (boxes_overlap(dx, dy, ci, si, ai, bi, cos_h[gj], sin_h[gj], aj, bj)) {
                    o[i] = 1;
                    o[j] = 1;
                }
            }
        }
    }
}

/* events.hit_by_reference: target j (any slot) is hit when a source slot i < S (source[w, i] and
 * present) other than j overlaps it; targets must be present. No pre-check (the reference has
 * none). out [W, A] fully written. */
void gpusim_hit_by(const HitByArgs *args) {
    GPUSIM_UNPACK_HitByArgs(args)
    int64_t w;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1)
    for (w = 0; w < W; w++) {
        const int64_t base = w * A;
        uint8_t *o = out + base;
        memset(o, 0, (size_t)A);
        for (int64_t i = 0; i < S; i++) {
            const int64_t gi = base + i;
            if (!source[w * S + i] || !present[gi]) continue;
            float li = half_scale * length[gi], wi = half_scale * width[gi];
            float px = pos[2 * gi], py = pos[2 * gi + 1], ci = cos_h[gi], si = sin_h[gi];
            for (int64_t j = 0; j < A; j++) {
                const int64_t gj = base + j;
                if (j == i || !present[gj] || o[j]) continue;
                float lj = half_scale * length[gj], wj = half_scale * width[gj];
                float dx = pos[2 * gj] - px, dy = pos[2 * gj + 1] - py;
                if (boxes_overlap(dx, dy, ci, si, li, wi, cos_h[gj], sin_h[gj], lj, wj)) o[j] = 1;
            }
        }
    }
}

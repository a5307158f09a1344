/* CPU kernel of gpusim/kernels/offroad.py (offroad_reference). Called through ctypes by offroad.py. */
#include "cpu_common.h"
#include "gpusim_generated.h" /* the argument structs (cbuild.CStruct tables in the .py) */

GPUSIM_EXPORT_ABI(gpusim_offroad, 2)

/* grid.cell_index_reference for one position (same float32 operations; observations/cpu.c too). */
static int64_t cell_of(const float *origin, const int32_t *dims, float cell_size, int64_t s, float x, float y) {
    float ox = origin[2 * s], oy = origin[2 * s + 1];
    int64_t nx = dims[2 * s], ny = dims[2 * s + 1];
    float fx = (x - ox) / cell_size, fy = (y - oy) / cell_size;
    if (isnan(fx)) fx = 0.0f;
    if (isnan(fy)) fy = 0.0f;
    fx = fx < -1e9f ? -1e9f : (fx > 1e9f ? 1e9f : fx);
    fy = fy < -1e9f ? -1e9f : (fy > 1e9f ? 1e9f : fy);
    int64_t ix = (int64_t)floorf(fx), iy = (int64_t)floorf(fy);
    ix = ix < 0 ? 0 : (ix > nx - 1 ? nx - 1 : ix);
    iy = iy < 0 ? 0 : (iy > ny - 1 ? ny - 1 : iy);
    return iy * nx + ix;
}

/* Proper crossing of box edge p1->p2 with road segment q1->q2 (offroad.py, same expressions). */
static inline int crosses(float px1, float py1, float px2, float py2, float qx1, float qy1, float qx2,
                          float qy2) {
    float ex = px2 - px1, ey = py2 - py1, fx = qx2 - qx1, fy = qy2 - qy1;
    float o1 = ex * (qy1 - py1) - ey * (qx1 - px1);
    float o2 = ex * (qy2 - py1) - ey * (qx2 - px1);
    float o3 = fx * (py1 - qy1) - fy * (px1 - qx1);
    float o4 = fx * (py2 - qy1) - fy * (px2 - qx1);
    return (o1 * o2 < 0.0f) && (o3 * o4 < 0.0f);
}

/* offroad.offroad_reference for the first C slots of each world (inputs of row length A): the box
 * outline of a present slot crosses a road edge its grid cell lists. Pre-check: the segment's
 * bounding box overlaps the box's, grown by margin (PRECHECK_MARGIN); a NaN corner or segment
 * coordinate fails it, as torch.amin/maximum propagate NaN into false comparisons. out [W, A]:
 * all A columns written (columns >= C are 0). */
void gpusim_offroad(const OffroadArgs *args) {
    GPUSIM_UNPACK_OffroadArgs(args)
    int64_t w;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1)
    for (w = 0; w < W; w++) {
        const int64_t s = scenario[w];
        memset(out + w * A, 0, (size_t)A);
        for (int64_t a = 0; a < C; a++) {
            const int64_t g = w * A + a;
            if (!present[g]) continue;
            float x = pos[2 * g], y = pos[2 * g + 1];
            float ha = half_scale * length[g], hb = half_scale * width[g];
            float c = cos_h[g], sn = sin_h[g];
            float ux = ha * c, uy = ha * sn, vx = -hb * sn, vy = hb * c;
            float cx[4] = {x + ux + vx, x - ux + vx, x - ux - vx, x + ux - vx};
            float cy[4] = {y + uy + vy, y - uy + vy, y - uy - vy, y + uy - vy};
            int bad = 0;
            float bx0 = cx[0], bx1 = cx[0], by0 = cy[0], by1 = cy[0];
            for (int k = 0; k < 4; k++) {
                bad |= isnan(cx[k]) | isnan(cy[k]);
                bx0 = cx[k] < bx0 ? cx[k] : bx0;
                bx1 = cx[k] > bx1 ? cx[k] : bx1;
                by0 = cy[k] < by0 ? cy[k] : by0;
                by1 = cy[k] > by1 ? cy[k] : by1;
            }
            if (bad) continue;
            bx0 -= margin; bx1 += margin; by0 -= margin; by1 += margin;
            const int64_t row = (grid_start[s] + cell_of(grid_origin, grid_dims, cell_size, s, x, y)) * KE;
            int hit = 0;
            for (int64_t k = 0; k < KE && !hit; k++) {
                int64_t sid = grid_is16 ? (int64_t)((const int16_t *)grid)[row + k]
                                        : (int64_t)((const int32_t *)grid)[row + k];
                if (sid < 0) continue;
                const float *q = road_seg + (s * R + sid) * 4;
                float qx1 = q[0], qy1 = q[1], qx2 = q[2], qy2 = q[3];
                if (isnan(qx1) || isnan(qy1) || isnan(qx2) || isnan(qy2)) continue;
                if (!((qx1 > qx2 ? qx1 : qx2) >= bx0 && (qx1 < qx2 ? qx1 : qx2) <= bx1)) continue;
                if (!((qy1 > qy2 ? qy1 : qy2) >= by0 && (qy1 < qy2 ? qy1 : qy2) <= by1)) continue;
                for (int e = 0; e < 4 && !hit; e++) {
                    int f = (e + 1) & 3;
                    hit = crosses(cx[e], cy[e], cx[f], cy[f], qx1, qy1, qx2, qy2);
                }
            }
            out[g] = (uint8_t)hit;
        }
    }
}

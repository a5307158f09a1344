/* Hand-written CPU kernels of the step's contact and replay stages (plain C99 + optional OpenMP;
 * no torch headers): agent-agent collisions (gpusim.kernels.collision), who was hit
 * (gpusim.kernels.events.hit_by), offroad (gpusim.kernels.offroad), log replay
 * (gpusim.kernels.replay), the events of stage rewards (gpusim.kernels.events.events) and the
 * red-light test of stage signals (gpusim.kernels.signals.red_light_violation), and the in-play
 * flags of stage motion (gpusim.state.in_play).
 *
 * The oracles are the torch references of those modules. This file repeats their float32
 * arithmetic operation by operation, in the same order, built with -ffp-contract=off (no FMA
 * contraction), and their conservative pre-checks with the same margins (they never change an
 * answer, they only skip work), so every boolean is the reference's. cos/sin of the headings come
 * from torch (computed by the caller). Replay speed: the reference's torch.linalg.vector_norm of
 * the logged velocity, which torch's CPU reduction computes as sqrtf(fmaf(vy, vy, vx * vx)); the
 * kernel writes exactly that.
 *
 * One OpenMP `parallel for` over worlds (every output element belongs to one world). Built and
 * called through ctypes by step_cpu.py (gpusim_step_abi below).
 */
#include <stdint.h>
#include <string.h>
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Bumped whenever an argument list below changes (step_cpu.py checks it). */
#define GPUSIM_STEP_ABI 7

int gpusim_step_abi(void) { return GPUSIM_STEP_ABI; }

int gpusim_step_has_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

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
void gpusim_collisions(const float *pos, const float *cos_h, const float *sin_h, const float *length,
                       const float *width, const uint8_t *present, const uint8_t *query, uint8_t *out,
                       int64_t W, int64_t A, float half_scale, float half_margin, int num_threads) {
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
void gpusim_hit_by(const float *pos, const float *cos_h, const float *sin_h, const float *length,
                   const float *width, const uint8_t *present, const uint8_t *source, uint8_t *out,
                   int64_t W, int64_t A, int64_t S, float half_scale, int num_threads) {
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
void gpusim_offroad(const float *pos, const float *cos_h, const float *sin_h, const float *length,
                    const float *width, const uint8_t *present, const int64_t *scenario, const float *road_seg,
                    const void *grid, int grid_is16, const int64_t *grid_start, const float *grid_origin,
                    const int32_t *grid_dims, uint8_t *out, int64_t W, int64_t A, int64_t C, int64_t R,
                    int64_t KE, float cell_size, float half_scale, float margin, int num_threads) {
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

/* One world of replay.replay_reference at log index li: replayed slots take the log (or leave the
 * scene), the others are copied. replayed [W, A], or NULL: replayed = ~controlled & ~removed. */
static inline void replay_world(int64_t w, int64_t li, const float *pos, const float *heading,
                                const float *speed, const uint8_t *present, const uint8_t *replayed,
                                const uint8_t *controlled, const uint8_t *removed, const int64_t *scenario,
                                const float *traj_pos, const float *traj_heading, const float *traj_vel,
                                const uint8_t *traj_valid, float *out_pos, float *out_heading,
                                float *out_speed, uint8_t *out_present, int64_t A, int64_t T) {
    const int64_t s = scenario[w];
    const int in_range = li >= 0 && li < T;
    const int64_t i = li < 0 ? 0 : (li > T - 1 ? T - 1 : li);
    for (int64_t a = 0; a < A; a++) {
        const int64_t g = w * A + a, t = (s * A + a) * T + i;
        const int valid = in_range && traj_valid[t];
        const int rep = replayed ? replayed[g] != 0 : (!controlled[g] && !removed[g]);
        if (rep && valid) {
            float vx = traj_vel[2 * t], vy = traj_vel[2 * t + 1];
            out_pos[2 * g] = traj_pos[2 * t];
            out_pos[2 * g + 1] = traj_pos[2 * t + 1];
            out_heading[g] = traj_heading[t];
            out_speed[g] = sqrtf(fmaf(vy, vy, vx * vx));
        } else {
            out_pos[2 * g] = pos[2 * g];
            out_pos[2 * g + 1] = pos[2 * g + 1];
            out_heading[g] = heading[g];
            out_speed[g] = rep ? 0.0f : speed[g];
        }
        out_present[g] = (uint8_t)(rep ? valid : present[g] != 0);
    }
}

/* replay.replay_reference: replayed slots take the log at log_index[w] (or leave the scene), the
 * others are copied. Outputs fully written. */
void gpusim_replay(const float *pos, const float *heading, const float *speed, const uint8_t *present,
                   const uint8_t *replayed, const int64_t *scenario, const int64_t *log_index,
                   const float *traj_pos, const float *traj_heading, const float *traj_vel,
                   const uint8_t *traj_valid, float *out_pos, float *out_heading, float *out_speed,
                   uint8_t *out_present, int64_t W, int64_t A, int64_t T, int num_threads) {
    int64_t w;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1)
    for (w = 0; w < W; w++)
        replay_world(w, log_index[w], pos, heading, speed, present, replayed, NULL, NULL, scenario, traj_pos,
                     traj_heading, traj_vel, traj_valid, out_pos, out_heading, out_speed, out_present, A, T);
}

/* gpusim_replay with its two derived inputs computed in the pass (stage replay): replayed =
 * ~controlled & ~removed, log_index[w] = init_steps + (step[w] - trial_start[w]) (int32 clocks,
 * step the new one). */
void gpusim_replay_state(const float *pos, const float *heading, const float *speed, const uint8_t *present,
                         const uint8_t *controlled, const uint8_t *removed, const int64_t *scenario,
                         const int32_t *step, const int32_t *trial_start, int64_t init_steps,
                         const float *traj_pos, const float *traj_heading, const float *traj_vel,
                         const uint8_t *traj_valid, float *out_pos, float *out_heading, float *out_speed,
                         uint8_t *out_present, int64_t W, int64_t A, int64_t T, int num_threads) {
    int64_t w;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1)
    for (w = 0; w < W; w++)
        replay_world(w, init_steps + ((int64_t)step[w] - (int64_t)trial_start[w]), pos, heading, speed, present,
                     NULL, controlled, removed, scenario, traj_pos, traj_heading, traj_vel, traj_valid, out_pos,
                     out_heading, out_speed, out_present, A, T);
}

/* Agent g of a live world (world_done[w] == 0) is in play (gpusim.state.in_play). */
static inline uint8_t in_play_flag(int live, const uint8_t *controlled, const uint8_t *present,
                                   const uint8_t *stopped, const uint8_t *removed, int64_t g) {
    return (uint8_t)(live && controlled[g] && present[g] && !stopped[g] && !removed[g]);
}

/* A discrete action index clamped to [0, num_actions), as dynamics.decode_actions clamps it. */
static inline int64_t clamp_action(int64_t k, int64_t num_actions) {
    return k < 0 ? 0 : (k >= num_actions ? num_actions - 1 : k);
}

/* state.in_play: controlled & present & ~stopped & ~removed & ~world_done[w]; loss_mask = its first
 * C columns. in_play [W, A] and loss_mask [W, C] fully written. */
void gpusim_in_play(const uint8_t *controlled, const uint8_t *present, const uint8_t *stopped,
                    const uint8_t *removed, const uint8_t *world_done, uint8_t *in_play, uint8_t *loss_mask,
                    int64_t W, int64_t A, int64_t C, int num_threads) {
    int64_t w;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1)
    for (w = 0; w < W; w++) {
        const int live = world_done[w] == 0;
        for (int64_t a = 0; a < A; a++) {
            const int64_t g = w * A + a;
            const uint8_t p = in_play_flag(live, controlled, present, stopped, removed, g);
            in_play[g] = p;
            if (a < C) loss_mask[w * C + a] = p;
        }
    }
}

/* events.events_reference: goals, rewards, contact behaviours, early truncation, terminal flags.
 * Flags: rm_col / rm_off (collision / offroad REMOVE), stop_col / stop_off (STOP), stop_goal (goal
 * STOP). r2 = float32(goal_radius^2); reward_* and frac float32 (torch's float32 opmath of a
 * tensor-scalar op); the [W, A] outputs may alias nothing. reward, terminal, slot_done_out [W, C].
 * slot_active: [W, C] with row stride sa_stride (C, or A for the view controlled[:, :C]). */
void gpusim_events(const float *pos, const float *goal, const float *speed, const uint8_t *controlled,
                   const uint8_t *in_play, const uint8_t *present, const uint8_t *collided,
                   const uint8_t *offroad, const uint8_t *hit, const uint8_t *stopped,
                   const uint8_t *contact_stopped, const uint8_t *removed, const uint8_t *world_done,
                   const uint8_t *episode_end, const uint8_t *slot_active, const uint8_t *slot_done,
                   float *reward, uint8_t *goal_now, float *speed_out, uint8_t *present_out,
                   uint8_t *stopped_out, uint8_t *cstopped_out, uint8_t *removed_out,
                   uint8_t *world_done_out, uint8_t *trunc_out, uint8_t *terminal, uint8_t *slot_done_out,
                   int64_t W, int64_t A, int64_t C, float r2, float reward_goal, float reward_collision,
                   float reward_offroad, int rm_col, int rm_off, int stop_col, int stop_off, int stop_goal,
                   float frac, int64_t sa_stride, int num_threads) {
    int64_t w;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1)
    for (w = 0; w < W; w++) {
        int64_t n_ctrl = 0, n_cs = 0;
        for (int64_t a = 0; a < A; a++) {
            const int64_t g = w * A + a;
            float dx = pos[2 * g] - goal[2 * g], dy = pos[2 * g + 1] - goal[2 * g + 1];
            float d2 = dx * dx + dy * dy;
            int play = in_play[g] != 0;
            int gn = play && d2 <= r2;
            int col = play && collided[g];
            int off = play && offroad[g];
            if (a < C)
                reward[w * C + a] = (float)gn * reward_goal + (float)col * reward_collision + (float)off * reward_offroad;
            int rem = removed[g] || (rm_col && (col || (hit[g] && present[g]))) || (rm_off && off);
            int cs = ((stop_col && col) || (stop_off && off)) && !rem;
            int ns = cs || (stop_goal && gn && !rem);
            int cst = contact_stopped[g] || cs;
            goal_now[g] = (uint8_t)gn;
            removed_out[g] = (uint8_t)rem;
            present_out[g] = (uint8_t)(present[g] && !rem);
            stopped_out[g] = (uint8_t)(stopped[g] || ns);
            cstopped_out[g] = (uint8_t)cst;
            speed_out[g] = ns ? 0.0f : speed[g];
            n_ctrl += controlled[g] != 0;
            n_cs += cst && controlled[g];
        }
        int trunc = !world_done[w] && n_ctrl > 0 && (float)n_cs >= (float)n_ctrl * frac - 1e-6f;
        trunc_out[w] = (uint8_t)trunc;
        world_done_out[w] = (uint8_t)(world_done[w] || trunc);
        for (int64_t c = 0; c < C; c++) {
            const int64_t g = w * C + c;
            int term = (trunc || episode_end[w]) && slot_active[w * sa_stride + c] && !slot_done[g];
            terminal[g] = (uint8_t)term;
            slot_done_out[g] = (uint8_t)(slot_done[g] || term);
        }
    }
}

/* signals.red_light_violation_reference: slot c of world w crossed the stop line of a red signal
 * (signal l < num_signals[s] whose state at log_index[w] is one of red_codes) moving forward.
 * cos_h / sin_h [W, C] from torch; half_width, min_cos float32; out [W, C] fully written. */
void gpusim_red_light(const float *pos_before, const float *pos, const float *cos_h, const float *sin_h,
                      const uint8_t *moving, const int64_t *scenario, const int64_t *log_index,
                      const float *signal_pos, const float *signal_dir, const int8_t *signal_state,
                      const uint8_t *signal_valid, const int32_t *num_signals, uint8_t *out,
                      int64_t W, int64_t C, int64_t T, int64_t L, int red0, int red1, float half_width,
                      float min_cos, int num_threads) {
    int64_t w;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1)
    for (w = 0; w < W; w++) {
        const int64_t s = scenario[w], li = log_index[w];
        const int in_range = li >= 0 && li < T;
        const int64_t i = li < 0 ? 0 : (li > T - 1 ? T - 1 : li);
        const int64_t n = num_signals[s] < L ? num_signals[s] : L;
        const int64_t row = (s * T + i) * L;
        for (int64_t c = 0; c < C; c++) {
            const int64_t g = w * C + c;
            int any = 0;
            if (moving[g] && in_range) {
                float hx = cos_h[g], hy = sin_h[g];
                for (int64_t l = 0; l < n && !any; l++) {
                    if (!signal_valid[row + l]) continue;
                    int code = signal_state[row + l];
                    if (code != red0 && code != red1) continue;
                    const float *sp = signal_pos + 2 * (s * L + l), *sd = signal_dir + 2 * (s * L + l);
                    float dx = sd[0], dy = sd[1];
                    float ax = pos_before[2 * g] - sp[0], ay = pos_before[2 * g + 1] - sp[1];
                    float bx = pos[2 * g] - sp[0], by = pos[2 * g + 1] - sp[1];
                    float s0 = ax * dx + ay * dy, s1 = bx * dx + by * dy;
                    if (!(s0 < 0.0f && s1 >= 0.0f)) continue;
                    float f = -s0 / (s1 - s0);
                    float qx = ax + f * (bx - ax), qy = ay + f * (by - ay);
                    float lat = qy * dx - qx * dy;
                    if (fabsf(lat) <= half_width && hx * dx + hy * dy >= min_cos) any = 1;
                }
            }
            out[g] = (uint8_t)any;
        }
    }
}

/* dynamics.bicycle_step_reference on the first C slots, with the transcendental values from torch
 * (the caller's torch.tan / atan / cos / sin, so they are torch's): tan_d = tan(clamped steer),
 * cos_b = cos(beta), beta = atan(0.5 tan_d), cos_t / sin_t = cos / sin(heading + beta), all
 * [W, C]. Agents with moving[w, c] take the new pose; others, and every column >= C, keep theirs.
 * pos_out [W, A, 2], heading_out, speed_out [W, A] fully written. Constants float32 as torch's
 * tensor-scalar ops round them. */
/* The motion kernels' outputs start as copies of world w's rows (agents that do not move keep
 * their pose bit for bit). */
static inline void copy_world(const float *pos, const float *heading, const float *speed, float *pos_out,
                              float *heading_out, float *speed_out, int64_t base, int64_t A) {
    memcpy(pos_out + 2 * base, pos + 2 * base, (size_t)(2 * A) * sizeof(float));
    memcpy(heading_out + base, heading + base, (size_t)A * sizeof(float));
    memcpy(speed_out + base, speed + base, (size_t)A * sizeof(float));
}

/* One moving agent g of the bicycle step (reference order of operations); a, tan_d, cos_b, cos_t,
 * sin_t: its control and the transcendental values the caller took from torch. */
static inline void motion_agent(const float *pos, const float *heading, const float *speed,
                                const float *length, int64_t g, float a, float tan_d, float cos_b,
                                float cos_t, float sin_t, float *pos_out, float *heading_out,
                                float *speed_out, float dt, float max_accel, float min_speed,
                                float max_speed, float min_length, float pi, float two_pi) {
    if (a < -max_accel) a = -max_accel;
    if (a > max_accel) a = max_accel;
    float v = speed[g] + a * dt;
    if (v < min_speed) v = min_speed;
    if (v > max_speed) v = max_speed;
    float len = length[g];
    if (len < min_length) len = min_length;
    float omega = v * cos_b * tan_d / len;
    float step = v * dt;
    pos_out[2 * g] = pos[2 * g] + step * cos_t;
    pos_out[2 * g + 1] = pos[2 * g + 1] + step * sin_t;
    float h = heading[g] + omega * dt;
    heading_out[g] = h - two_pi * ceilf((h - pi) / two_pi);
    speed_out[g] = v;
}

void gpusim_motion(const float *pos, const float *heading, const float *speed, const float *length,
                   const float *accel, const float *tan_d, const float *cos_b, const float *cos_t,
                   const float *sin_t, const uint8_t *moving, float *pos_out, float *heading_out,
                   float *speed_out, int64_t W, int64_t A, int64_t C, float dt, float max_accel,
                   float min_speed, float max_speed, float min_length, float pi, float two_pi,
                   int num_threads) {
    int64_t w;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1)
    for (w = 0; w < W; w++) {
        const int64_t base = w * A;
        copy_world(pos, heading, speed, pos_out, heading_out, speed_out, base, A);
        for (int64_t c = 0; c < C; c++) {
            const int64_t g = base + c, k = w * C + c;
            if (!moving[k]) continue;
            motion_agent(pos, heading, speed, length, g, accel[k], tan_d[k], cos_b[k], cos_t[k], sin_t[k],
                         pos_out, heading_out, speed_out, dt, max_accel, min_speed, max_speed, min_length,
                         pi, two_pi);
        }
    }
}

/* Discrete actions, first pass of stage motion: the in-play flags (as gpusim_in_play) and
 * theta = heading + beta_of[k] of the first C slots, k the action clamped to [0, num_actions) as
 * dynamics.decode_actions clamps it (beta_of: the per-action table of atan(0.5 tan(steer))). */
void gpusim_motion_prepare(const uint8_t *controlled, const uint8_t *present, const uint8_t *stopped,
                           const uint8_t *removed, const uint8_t *world_done, const float *heading,
                           const int64_t *action, const float *beta_of, uint8_t *in_play,
                           uint8_t *loss_mask, float *theta, int64_t W, int64_t A, int64_t C,
                           int64_t num_actions, int num_threads) {
    int64_t w;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1)
    for (w = 0; w < W; w++) {
        const int live = world_done[w] == 0;
        for (int64_t a = 0; a < A; a++) {
            const int64_t g = w * A + a;
            const uint8_t p = in_play_flag(live, controlled, present, stopped, removed, g);
            in_play[g] = p;
            if (a < C) {
                const int64_t k = clamp_action(action[w * C + a], num_actions);
                loss_mask[w * C + a] = p;
                theta[w * C + a] = heading[g] + beta_of[k];
            }
        }
    }
}

/* Discrete actions, second pass of stage motion: gpusim_motion with the control, tan(steer) and
 * cos(beta) looked up per action (accel_of, tan_of, cos_b_of [num_actions]). */
void gpusim_motion_discrete(const float *pos, const float *heading, const float *speed, const float *length,
                            const int64_t *action, const float *accel_of, const float *tan_of,
                            const float *cos_b_of, const float *cos_t, const float *sin_t,
                            const uint8_t *moving, float *pos_out, float *heading_out, float *speed_out,
                            int64_t W, int64_t A, int64_t C, int64_t num_actions, float dt, float max_accel,
                            float min_speed, float max_speed, float min_length, float pi, float two_pi,
                            int num_threads) {
    int64_t w;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1)
    for (w = 0; w < W; w++) {
        const int64_t base = w * A;
        copy_world(pos, heading, speed, pos_out, heading_out, speed_out, base, A);
        for (int64_t c = 0; c < C; c++) {
            const int64_t g = base + c, j = w * C + c;
            if (!moving[j]) continue;
            const int64_t k = clamp_action(action[j], num_actions);
            motion_agent(pos, heading, speed, length, g, accel_of[k], tan_of[k], cos_b_of[k], cos_t[j],
                         sin_t[j], pos_out, heading_out, speed_out, dt, max_accel, min_speed, max_speed,
                         min_length, pi, two_pi);
        }
    }
}

/* Stage accounting (gpusim/sim/accounting.py): the per-slot episode accumulators and the contact
 * flags of agents in play, flat loops over [W, C] and [W, A] (each output a new array):
 * ep_return + reward, ep_length + loss_mask, goal_reached | goal_now, collided_ip = in_play &
 * collided, offroad_ip = in_play & offroad, ever_collided | collided_ip, ever_offroad | offroad_ip,
 * ever_red_light | red_light_now. The loops sit in functions with restrict parameters, called on
 * chunks of the range: inside an OpenMP region GCC drops restrict and does not vectorise them. */
static void accounting_slots(int64_t lo, int64_t hi, const float *restrict ep_return,
                             const float *restrict reward, const int32_t *restrict ep_length,
                             const uint8_t *restrict loss_mask, const uint8_t *restrict ever_red_light,
                             const uint8_t *restrict red_light_now, float *restrict ep_return_out,
                             int32_t *restrict ep_length_out, uint8_t *restrict ever_red_light_out) {
    for (int64_t i = lo; i < hi; i++) {
        ep_return_out[i] = ep_return[i] + reward[i];
        ep_length_out[i] = ep_length[i] + (int32_t)(loss_mask[i] != 0);
        ever_red_light_out[i] = (uint8_t)(ever_red_light[i] | red_light_now[i]);
    }
}

static void accounting_agents(int64_t lo, int64_t hi, const uint8_t *restrict goal_reached,
                              const uint8_t *restrict goal_now, const uint8_t *restrict in_play,
                              const uint8_t *restrict collided, const uint8_t *restrict offroad,
                              const uint8_t *restrict ever_collided, const uint8_t *restrict ever_offroad,
                              uint8_t *restrict goal_reached_out, uint8_t *restrict collided_ip,
                              uint8_t *restrict offroad_ip, uint8_t *restrict ever_collided_out,
                              uint8_t *restrict ever_offroad_out) {
    for (int64_t i = lo; i < hi; i++) {
        const uint8_t c = (uint8_t)(in_play[i] & collided[i]), o = (uint8_t)(in_play[i] & offroad[i]);
        collided_ip[i] = c;
        offroad_ip[i] = o;
        goal_reached_out[i] = (uint8_t)(goal_reached[i] | goal_now[i]);
        ever_collided_out[i] = (uint8_t)(ever_collided[i] | c);
        ever_offroad_out[i] = (uint8_t)(ever_offroad[i] | o);
    }
}

static int64_t count_set(int64_t lo, int64_t hi, const uint8_t *restrict flags) {
    int64_t n = 0;
    for (int64_t i = lo; i < hi; i++) n += flags[i] != 0;
    return n;
}

/* Returns the number of terminal slots (terminal [W, C]). */
int64_t gpusim_accounting(const float *ep_return, const float *reward, const int32_t *ep_length,
                          const uint8_t *loss_mask, const uint8_t *goal_reached, const uint8_t *goal_now,
                          const uint8_t *in_play, const uint8_t *collided, const uint8_t *offroad,
                          const uint8_t *ever_collided, const uint8_t *ever_offroad,
                          const uint8_t *ever_red_light, const uint8_t *red_light_now, const uint8_t *terminal,
                          float *ep_return_out, int32_t *ep_length_out, uint8_t *goal_reached_out,
                          uint8_t *collided_ip, uint8_t *offroad_ip, uint8_t *ever_collided_out,
                          uint8_t *ever_offroad_out, uint8_t *ever_red_light_out, int64_t W, int64_t A,
                          int64_t C, int num_threads) {
    const int64_t nc = W * C, na = W * A;
    const int64_t parts = num_threads > 1 ? num_threads : 1;
    int64_t k, terminals = 0;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1) reduction(+ : terminals)
    for (k = 0; k < parts; k++) {
        const int64_t c0 = nc * k / parts, c1 = nc * (k + 1) / parts;
        const int64_t a0 = na * k / parts, a1 = na * (k + 1) / parts;
        accounting_slots(c0, c1, ep_return, reward, ep_length, loss_mask, ever_red_light, red_light_now,
                         ep_return_out, ep_length_out, ever_red_light_out);
        accounting_agents(a0, a1, goal_reached, goal_now, in_play, collided, offroad, ever_collided,
                          ever_offroad, goal_reached_out, collided_ip, offroad_ip, ever_collided_out,
                          ever_offroad_out);
        terminals += count_set(c0, c1, terminal);
    }
    return terminals;
}

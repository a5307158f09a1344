/* CPU kernels of gpusim/kernels/motion.py (stage motion): the in-play flags (gpusim.state.in_play)
 * and the kinematic bicycle of gpusim/kernels/dynamics.py on the policy slots, for continuous
 * controls and for discrete actions (decoded through per-action tables). Called through ctypes by
 * motion.py. */
#include "cpu_common.h"
#include "gpusim_generated.h" /* the argument structs (cbuild.CStruct tables in the .py) */

GPUSIM_EXPORT_ABI(gpusim_motion, 2)

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
void gpusim_in_play(const InPlayArgs *args) {
    GPUSIM_UNPACK_InPlayArgs(args)
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

void gpusim_motion(const MotionArgs *args) {
    GPUSIM_UNPACK_MotionArgs(args)
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
void gpusim_motion_prepare(const MotionPrepareArgs *args) {
    GPUSIM_UNPACK_MotionPrepareArgs(args)
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
void gpusim_motion_discrete(const MotionDiscreteArgs *args) {
    GPUSIM_UNPACK_MotionDiscreteArgs(args)
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

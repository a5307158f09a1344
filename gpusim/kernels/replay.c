/* CPU kernels of gpusim/kernels/replay.py: log replay (replay_reference) and its state form
 * (replayed and the log index derived in the pass). Replay speed: the reference's
 * torch.linalg.vector_norm of the logged velocity, which torch's CPU reduction computes as
 * sqrtf(fmaf(vy, vy, vx * vx)); the kernel writes exactly that. Called through ctypes by replay.py. */
#include "cpu_common.h"
#include "gpusim_generated.h" /* the argument structs (cbuild.CStruct tables in the .py) */

GPUSIM_EXPORT_ABI(gpusim_replay, 2)

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
void gpusim_replay(const ReplayArgs *args) {
    GPUSIM_UNPACK_ReplayArgs(args)
    int64_t w;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1)
    for (w = 0; w < W; w++)
        replay_world(w, log_index[w], pos, heading, speed, present, replayed, NULL, NULL, scenario, traj_pos,
                     traj_heading, traj_vel, traj_valid, out_pos, out_heading, out_speed, out_present, A, T);
}

/* gpusim_replay with its two derived inputs computed in the pass (stage replay): replayed =
 * ~controlled & ~removed, log_index[w] = init_steps + (step[w] - trial_start[w]) (int32 clocks,
 * step the new one). */
void gpusim_replay_state(const ReplayStateArgs *args) {
    GPUSIM_UNPACK_ReplayStateArgs(args)
    int64_t w;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1)
    for (w = 0; w < W; w++)
        replay_world(w, init_steps + ((int64_t)step[w] - (int64_t)trial_start[w]), pos, heading, speed, present,
                     NULL, controlled, removed, scenario, traj_pos, traj_heading, traj_vel, traj_valid, out_pos,
                     out_heading, out_speed, out_present, A, T);
}

/* CPU kernel of gpusim/kernels/events.py (events_reference: stage rewards). Called through ctypes
 * by events.py. */
#include "cpu_common.h"
#include "gpusim_generated.h" /* the argument structs (cbuild.CStruct tables in the .py) */

GPUSIM_EXPORT_ABI(gpusim_events, 2)

/* events.events_reference: goals, rewards, contact behaviours, early truncation, terminal flags.
 * Flags: rm_col / rm_off (collision / offroad REMOVE), stop_col / stop_off (STOP), stop_goal (goal
 * STOP). r2 = float32(goal_radius^2); reward_* and frac float32 (torch's float32 opmath of a
 * tensor-scalar op); the [W, A] outputs may alias nothing. reward, terminal, slot_done_out [W, C].
 * slot_active: [W, C] with row stride sa_stride (C, or A for the view controlled[:, :C]). */
void gpusim_events(const EventsArgs *args) {
    GPUSIM_UNPACK_EventsArgs(args)
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

/* CPU kernel of gpusim/kernels/accounting.py (stage accounting). Called through ctypes by
 * accounting.py. */
#include "cpu_common.h"
#include "gpusim_generated.h" /* the argument structs (cbuild.CStruct tables in the .py) */

GPUSIM_EXPORT_ABI(gpusim_accounting, 2)

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
int64_t gpusim_accounting(const AccountingArgs *args) {
    GPUSIM_UNPACK_AccountingArgs(args)
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

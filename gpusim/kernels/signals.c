/* CPU kernel of the red-light test of gpusim/kernels/signals.py (red_light_violation_reference:
 * stage signals). Called through ctypes by signals.py. */
#include "cpu_common.h"
#include "gpusim_generated.h" /* the argument structs (cbuild.CStruct tables in the .py) */

GPUSIM_EXPORT_ABI(gpusim_signals, 2)

/* signals.red_light_violation_reference: slot c of world w crossed the stop line of a red signal
 * (signal l < num_signals[s] whose state at log_index[w] is one of red_codes) moving forward.
 * cos_h / sin_h [W, C] from torch; half_width, min_cos float32; out [W, C] fully written. */
void gpusim_red_light(const RedLightArgs *args) {
    GPUSIM_UNPACK_RedLightArgs(args)
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

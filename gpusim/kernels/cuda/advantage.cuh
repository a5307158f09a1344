// GAE / V-trace advantage of one row, shared by the CUDA kernel (advantage.cu) and the host
// library used in the tests (host_abi.cpp). Semantics: gpusim/kernels/advantage.py.
//
//   delta_t = rho_t * (r_t + [not s_t] * gamma * V_{t+1} - V_t)      (V_T = last_value)
//   A_t     = delta_t + [not s_t] * gamma * lambda * c_t * A_{t+1}   (A_T = 0)
//   ret_t   = A_t + V_t
// with rho_t = min(rho_clip, exp(log_rho_t)), c_t = min(c_clip, exp(log_rho_t)), or 1 and 1 when
// log_rho is null (plain GAE; Schulman et al. 2016). The clipped form follows IMPALA's V-trace
// (Espeholt et al. 2018) as generalised with lambda by PufferLib's puff_advantage.
#pragma once
#include "common.cuh"

GPUSIM_HD inline void gpusim_advantage_row(
    const float* rewards,        // [T] reward of the action at column t
    const float* values,         // [T] V_t
    const unsigned char* stop,   // [T] bootstrap_stop (0/1)
    float last_value,            // V_T
    const float* log_rho,        // [T] log importance ratio, or null for plain GAE
    float* adv,                  // [T] out: advantages
    float* ret,                  // [T] out: returns
    gpusim_i64 T, float gamma, float gae_lambda, float rho_clip, float c_clip)
{
    const float gl = gamma * gae_lambda;
    float next_v = last_value;
    float acc = 0.0f;
    for (gpusim_i64 t = T - 1; t >= 0; --t) {
        const bool s = stop[t] != 0;
        const float v = values[t];
        float delta = (rewards[t] + (s ? 0.0f : gamma * next_v)) - v;
        float trace = s ? 0.0f : gl;
        if (log_rho != 0) {
            const float ratio = expf(log_rho[t]);
            delta = fminf(ratio, rho_clip) * delta;
            trace = trace * fminf(ratio, c_clip);
        }
        acc = delta + trace * acc;
        adv[t] = acc;
        ret[t] = acc + v;
        next_v = v;
    }
}

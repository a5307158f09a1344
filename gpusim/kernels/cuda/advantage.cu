// CUDA kernel for gpusim.kernels.advantage: one thread per row (a rollout row of T steps), the
// backward scan over T runs inside the thread. Launched through cupy.RawModule
// (gpusim/kernels/cuda/__init__.py). The math is gpusim_advantage_row in advantage.cuh.
#include "advantage.cuh"

extern "C" __global__ void gpusim_advantage_kernel(
    const float* __restrict__ rewards,        // [B, T]
    const float* __restrict__ values,         // [B, T]
    const unsigned char* __restrict__ stop,   // [B, T] bool as bytes
    const float* __restrict__ last_value,     // [B]
    const float* __restrict__ log_rho,        // [B, T] (ignored unless has_rho)
    float* __restrict__ adv,                  // [B, T] out
    float* __restrict__ ret,                  // [B, T] out
    gpusim_i64 B, gpusim_i64 T,
    float gamma, float gae_lambda, float rho_clip, float c_clip, int has_rho)
{
    const gpusim_i64 row = (gpusim_i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= B) return;
    const gpusim_i64 off = row * T;
    gpusim_advantage_row(rewards + off, values + off, stop + off, last_value[row],
                         has_rho ? log_rho + off : 0, adv + off, ret + off,
                         T, gamma, gae_lambda, rho_clip, c_clip);
}

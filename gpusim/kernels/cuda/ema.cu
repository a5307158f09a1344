// CUDA kernels for gpusim.kernels.ema, launched through cupy.RawModule
// (gpusim/kernels/cuda/__init__.py). The math is in ema.cuh.
#include "ema.cuh"

// One thread per slot row: the row's M metrics and its has_data flag (no two threads share data).
extern "C" __global__ void gpusim_ema_update_kernel(
    float* __restrict__ slots,                 // [N, M] in/out
    unsigned char* __restrict__ has_data,      // [N] in/out
    const float* __restrict__ episode,         // [N, M]
    const unsigned char* __restrict__ done,    // [N]
    gpusim_i64 N, gpusim_i64 M, float alpha)
{
    const gpusim_i64 row = (gpusim_i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= N) return;
    gpusim_ema_update_row(slots + row * M, has_data + row, episode + row * M, done[row], alpha, M);
}

// One block of GPUSIM_EMA_REPORT_THREADS threads per metric column: strided partial sums, then a
// shared-memory tree reduction. Block 0 also writes the number of slots with data.
extern "C" __global__ void gpusim_ema_report_kernel(
    const float* __restrict__ slots,           // [N, M]
    const unsigned char* __restrict__ has_data,// [N]
    float* __restrict__ mean,                  // [M] out
    gpusim_i64* __restrict__ n_out,            // [1] out
    gpusim_i64 N, gpusim_i64 M)
{
    __shared__ float s_sum[GPUSIM_EMA_REPORT_THREADS];
    __shared__ gpusim_i64 s_cnt[GPUSIM_EMA_REPORT_THREADS];
    const gpusim_i64 col = blockIdx.x;
    const int tid = threadIdx.x;
    float s;
    gpusim_i64 c;
    gpusim_ema_partial(slots, has_data, N, M, col, tid, GPUSIM_EMA_REPORT_THREADS, &s, &c);
    s_sum[tid] = s;
    s_cnt[tid] = c;
    __syncthreads();
    for (int w = GPUSIM_EMA_REPORT_THREADS / 2; w > 0; w >>= 1) {
        if (tid < w) {
            s_sum[tid] += s_sum[tid + w];
            s_cnt[tid] += s_cnt[tid + w];
        }
        __syncthreads();
    }
    if (tid == 0) {
        mean[col] = gpusim_ema_mean(s_sum[0], s_cnt[0]);
        if (col == 0) *n_out = s_cnt[0];
    }
}

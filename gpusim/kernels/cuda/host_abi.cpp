// Host-side C ABI over the same math headers as the CUDA kernels, so the tests can check the CUDA
// C math against the torch reference on machines without a GPU (built with g++ into a shared
// library and called through ctypes; see tests/test_cuda_sources.py). Not used at run time.
#include "advantage.cuh"
#include "ema.cuh"

extern "C" {

// Same loop structure as gpusim_advantage_kernel, one "thread" (row) after the other.
void gpusim_advantage_host(const float* rewards, const float* values, const unsigned char* stop,
                           const float* last_value, const float* log_rho, float* adv, float* ret,
                           gpusim_i64 B, gpusim_i64 T, float gamma, float gae_lambda,
                           float rho_clip, float c_clip, int has_rho)
{
    for (gpusim_i64 row = 0; row < B; ++row) {
        const gpusim_i64 off = row * T;
        gpusim_advantage_row(rewards + off, values + off, stop + off, last_value[row],
                             has_rho ? log_rho + off : 0, adv + off, ret + off,
                             T, gamma, gae_lambda, rho_clip, c_clip);
    }
}

void gpusim_ema_update_host(float* slots, unsigned char* has_data, const float* episode,
                            const unsigned char* done, gpusim_i64 N, gpusim_i64 M, float alpha)
{
    for (gpusim_i64 row = 0; row < N; ++row) {
        gpusim_ema_update_row(slots + row * M, has_data + row, episode + row * M, done[row], alpha, M);
    }
}

// Emulates gpusim_ema_report_kernel: the same strided partials and the same tree reduction order.
void gpusim_ema_report_host(const float* slots, const unsigned char* has_data, float* mean,
                            gpusim_i64* n_out, gpusim_i64 N, gpusim_i64 M)
{
    float s_sum[GPUSIM_EMA_REPORT_THREADS];
    gpusim_i64 s_cnt[GPUSIM_EMA_REPORT_THREADS];
    if (M == 0) {
        gpusim_i64 c = 0;
        for (gpusim_i64 i = 0; i < N; ++i) c += has_data[i] != 0;
        *n_out = c;
        return;
    }
    for (gpusim_i64 col = 0; col < M; ++col) {
        for (int tid = 0; tid < GPUSIM_EMA_REPORT_THREADS; ++tid) {
            gpusim_ema_partial(slots, has_data, N, M, col, tid, GPUSIM_EMA_REPORT_THREADS,
                               &s_sum[tid], &s_cnt[tid]);
        }
        for (int w = GPUSIM_EMA_REPORT_THREADS / 2; w > 0; w >>= 1) {
            for (int tid = 0; tid < w; ++tid) {
                s_sum[tid] += s_sum[tid + w];
                s_cnt[tid] += s_cnt[tid + w];
            }
        }
        mean[col] = gpusim_ema_mean(s_sum[0], s_cnt[0]);
        if (col == 0) *n_out = s_cnt[0];
    }
}

}  // extern "C"

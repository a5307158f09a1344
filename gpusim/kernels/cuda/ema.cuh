// Per-agent EMA slots (docs/design.md section 13), shared by the CUDA kernels (ema.cu) and the host
// library used in the tests (host_abi.cpp). Semantics: gpusim/kernels/ema.py.
#pragma once
#include "common.cuh"

// Fold one finished episode into one slot row (in place). No-op when !done.
// First completion: slot = episode; later: slot = alpha * slot + (1 - alpha) * episode.
GPUSIM_HD inline void gpusim_ema_update_row(
    float* slot, unsigned char* has_data, const float* episode, unsigned char done,
    float alpha, gpusim_i64 M)
{
    if (!done) return;
    const bool had = *has_data != 0;
    for (gpusim_i64 m = 0; m < M; ++m) {
        slot[m] = had ? alpha * slot[m] + (1.0f - alpha) * episode[m] : episode[m];
    }
    *has_data = 1;
}

// Partial sum of column `col` over rows start, start + stride, ... that have data, and their
// count. One CUDA thread computes one partial (start = threadIdx.x, stride = blockDim.x); the
// host library runs the same partials in a loop and then the same tree reduction.
GPUSIM_HD inline void gpusim_ema_partial(
    const float* slots, const unsigned char* has_data, gpusim_i64 N, gpusim_i64 M,
    gpusim_i64 col, gpusim_i64 start, gpusim_i64 stride, float* sum, gpusim_i64* count)
{
    float s = 0.0f;
    gpusim_i64 c = 0;
    for (gpusim_i64 i = start; i < N; i += stride) {
        if (has_data[i]) {
            s += slots[i * M + col];
            c += 1;
        }
    }
    *sum = s;
    *count = c;
}

// Mean of the slots with data; 0 when none has data.
GPUSIM_HD inline float gpusim_ema_mean(float sum, gpusim_i64 n)
{
    return n > 0 ? sum / (float)n : 0.0f;
}

// Threads per block of the report kernel (a power of two: the tree reduction halves it).
#define GPUSIM_EMA_REPORT_THREADS 256

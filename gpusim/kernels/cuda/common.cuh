// Shared portability macros for the gpusim CUDA C sources.
//
// The math headers (*.cuh) are compiled three ways:
//   * by NVRTC through cupy.RawModule (device code; no standard headers available),
//   * by nvcc (device code, `nvcc -ptx` in the tests),
//   * by a plain host C++ compiler (g++) for the ctypes host library used by the tests.
// GPUSIM_HD marks a function callable from both host and device.
#pragma once

#if defined(__CUDACC__)
#define GPUSIM_HD __host__ __device__
#else
#define GPUSIM_HD
#endif

#if !defined(__CUDACC_RTC__)
#include <math.h>
#endif

typedef long long gpusim_i64;

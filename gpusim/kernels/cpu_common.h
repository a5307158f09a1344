/* What every hand-written CPU kernel shares (one .c file per op, next to the op's .py module, each
 * built into its own shared library by gpusim/kernels/cbuild.py with this directory on the include
 * path). Plain C99 + optional OpenMP, no torch headers.
 *
 * The oracles are the ops' torch references: a kernel repeats their float32 arithmetic operation by
 * operation, in the same order, built with -ffp-contract=off (no FMA contraction), so every output
 * is the reference's bit for bit. One OpenMP `parallel for` over worlds (every output element
 * belongs to one world); cos/sin and the other transcendental values come from torch (computed by
 * the caller).
 */
#ifndef GPUSIM_CPU_COMMON_H
#define GPUSIM_CPU_COMMON_H

#include <stdint.h>
#include <string.h>
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#define GPUSIM_HAS_OPENMP 1
#else
#define GPUSIM_HAS_OPENMP 0
#endif

/* The two symbols cbuild.CLibrary checks: <prefix>_abi() (bumped whenever an argument list of the
 * file changes, so a stale cached library is never called) and <prefix>_has_openmp(). */
#define GPUSIM_EXPORT_ABI(prefix, version)                    \
    int prefix##_abi(void) { return (version); }              \
    int prefix##_has_openmp(void) { return GPUSIM_HAS_OPENMP; }

#endif

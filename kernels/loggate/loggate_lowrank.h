// GLA's forget gate from its low-rank projection (docs/gla.md §1.1, §4.4), with the projection's second factor
// inside the gate (loggate.h has the gate's math):
//   forward:  z[n,j] = sum_r u[n,r] W[j,r]                (the sum in order r = 0..R-1)
//             g[n,j] = loggate(z[n,j] + b[j])
//   backward: dz[n,j] = loggate_bwd(z[n,j] + b[j], dg[n,j])   (overwrite)
//             db[j] += sum_n dz[n,j]
// z is recomputed where it is needed and never stored. What is left of the backward, dW = dz^T u
// and du = dz W, are GEMMs on dz (the caller's).
//
// Layout: u [N, R] (unit column stride, free row stride: a view into the mixer's projection
// buffer), W [D, R] contiguous, b and db [D], g, dg, dz [N, D] (free row strides).
// Dtypes: GPU: u, W, dz bf16 (the activation dtype); b, g, dg, db f32; math in f32. CPU: one
// dtype (f32 or f64). The GPU kernels need R in {8, 16, 32} and D a multiple of 4 up to 1024
// (loggate_lowrank_gpu_ok: bf16 only); a thread keeps four rows of W in registers and walks rows of u.
// db's column sums go through per-block partials in ctx.workspace, added in a fixed order, so
// reruns are bit-identical.
#pragma once

#include <cstdint>

#include "core/gpu.h"
#include "core/tensor.h"
#include "loggate/loggate.h"

namespace linac {

template <class T>
void loggate_lowrank_fwd_cpu(const T* u, int64_t ldu, const T* w, const T* b, T* g, int64_t ldg, int64_t n, int64_t d,
                             int64_t rank, const LogGateOpts& o);
template <class T>
void loggate_lowrank_bwd_cpu(const T* u, int64_t ldu, const T* w, const T* b, const T* dg, int64_t lddg, T* dz,
                             int64_t lddz, T* db, int64_t n, int64_t d, int64_t rank, const LogGateOpts& o);

void loggate_lowrank_fwd_cuda(const Ctx& ctx, const Tensor& u, const Tensor& w, const Tensor& b, const Tensor& g,
                              const LogGateOpts& o);
void loggate_lowrank_bwd_cuda(const Ctx& ctx, const Tensor& u, const Tensor& w, const Tensor& b, const Tensor& dg,
                              const Tensor& dz, const Tensor& db, const LogGateOpts& o);

// Whether this device takes these shapes with u, W and dz in `act` (always on the CPU);
// otherwise the caller composes a GEMM and loggate_fwd / loggate_bwd.
bool loggate_lowrank_gpu_ok(const Ctx& ctx, int64_t d, int64_t rank, DType act);

// Entry points: check shapes, dispatch on ctx.device.
void loggate_lowrank_fwd(const Ctx& ctx, const Tensor& u, const Tensor& w, const Tensor& b, const Tensor& g,
                         const LogGateOpts& o);
void loggate_lowrank_bwd(const Ctx& ctx, const Tensor& u, const Tensor& w, const Tensor& b, const Tensor& dg,
                         const Tensor& dz, const Tensor& db, const LogGateOpts& o);

}  // namespace linac

// Log-space forget gate (GLA, Yang et al. 2023, footnote 8; the clamp follows the v3 code):
//   g[n,j] = max(logsigmoid(z[n,j] + b[j]) / tau, clamp)          (clamp = -inf: no clamp)
// Backward (d/dz logsigmoid(z) = sigmoid(-z); no gradient where the clamp is active):
//   dz[n,j] = dg[n,j] * sigmoid(-(z + b)) / tau * [logsigmoid(z + b) / tau >= clamp]
// logsigmoid(x) = min(x, 0) - log1p(exp(-|x|)) and sigmoid(-x) from exp(-|x|): neither
// overflows nor loses the tail (never log(sigmoid(x)) or 1 - sigmoid(x)).
//
// Layout: z, g, dg, dz [N, D] (rows may be strided: row stride >= D, unit column stride); b [D].
// g and dz are written (overwrite); the bias gradient is the column sum of dz (left to the caller).
// Dtypes: GPU: z f32 or bf16, b/g/dg f32 (gates stay in f32), dz f32 or bf16; math in f32.
// CPU: one dtype (f32 or f64).
#pragma once

#include <cstdint>
#include <string>

#include "core/gpu.h"
#include "core/tensor.h"

namespace linac {

// Row stride (elements) of an [N, D] operand of the gate kernels; a single row counts as contiguous.
inline int64_t loggate_ld(const Tensor& x) { return x.size(0) > 1 ? x.strides[0] : x.size(1); }
// Throws unless x is [n, width] with unit column stride and a row stride >= width; `what` names
// the operand in the message (e.g. "loggate: g").
void loggate_check_rows(const Tensor& x, int64_t n, int64_t width, const std::string& what);

struct LogGateOpts {
  double tau = 16.0;
  double clamp = 0.0;  // lower bound of g; 0 (or any value >= 0) disables the clamp
  bool clamped() const { return clamp < 0.0; }
};

template <class T>
void loggate_fwd_cpu(const T* z, int64_t ldz, const T* b, T* g, int64_t ldg, int64_t n, int64_t d,
                     const LogGateOpts& o);
template <class T>
void loggate_bwd_cpu(const T* z, int64_t ldz, const T* b, const T* dg, int64_t lddg, T* dz, int64_t lddz, int64_t n,
                     int64_t d, const LogGateOpts& o);

void loggate_fwd_cuda(const Ctx& ctx, const Tensor& z, const Tensor& b, const Tensor& g, const LogGateOpts& o);
void loggate_bwd_cuda(const Ctx& ctx, const Tensor& z, const Tensor& b, const Tensor& dg, const Tensor& dz,
                      const LogGateOpts& o);

// Entry points: check shapes, dispatch on ctx.device and dtypes.
void loggate_fwd(const Ctx& ctx, const Tensor& z, const Tensor& b, const Tensor& g, const LogGateOpts& o);
void loggate_bwd(const Ctx& ctx, const Tensor& z, const Tensor& b, const Tensor& dg, const Tensor& dz,
                 const LogGateOpts& o);

}  // namespace linac

// Full reductions of a flat tensor to one number (global gradient norm, summed loss):
//   sum_squares: out[0] = sum_i x[i]^2
//   sum:         out[0] = sum_i x[i]
//   count_nonfinite: out[0] = #{i : x[i] is inf or NaN}   (the finiteness check of weights and
//                    optimizer state before a checkpoint; exact up to 2^24 in an f32 out)
//
// Layout: x contiguous, any shape (n = numel, up to ~2^31 and beyond: 64-bit indexing); out has
// one element and is overwritten. GPU: x f32 or bf16, out f32; accumulation is in double
// throughout (per thread, per block, and the final fixed-order sum over block partials, which
// live in ctx.workspace). CPU: x and out share one dtype (f32 or f64); accumulation in double.
// Both devices split x into a fixed number of contiguous pieces whose partial sums are added in
// order, so a result depends only on the data, never on the thread count.
#pragma once

#include <cstdint>

#include "core/gpu.h"
#include "core/tensor.h"

namespace linac {

template <class T>
void sum_squares_cpu(const T* x, T* out, int64_t n);
template <class T>
void sum_cpu(const T* x, T* out, int64_t n);
template <class T>
void count_nonfinite_cpu(const T* x, T* out, int64_t n);

// What the GPU reductions need of ctx.workspace at most: a double per block.
constexpr int kReduceMaxBlocks = 1024;
constexpr size_t kReduceWorkspaceBytes = kReduceMaxBlocks * sizeof(double);

void sum_squares_cuda(const Ctx& ctx, const Tensor& x, const Tensor& out);
void sum_cuda(const Ctx& ctx, const Tensor& x, const Tensor& out);
void count_nonfinite_cuda(const Ctx& ctx, const Tensor& x, const Tensor& out);

// Column sums of per-slab partials, the last stage of the parameter-gradient reductions that
// kernels keep in slabs (rmsnorm's dw, lrpe's dtheta):
//   out[j] += sum_s partial[s * dim + j],   s < slabs, j < dim   (f32, device pointers)
// The slabs are added in a fixed order (deterministic), on ctx's stream.
void add_slab_sums_cuda(const Ctx& ctx, const float* partial, int64_t slabs, int64_t dim, float* out);

// hash_words: a 64-bit hash of x's bytes, by which the data-parallel ranks check that they hold
// the same parameters (not cryptographic; train/content_hash.h, the checkpoints' hash, is one
// sequential chain and would need the bytes on the host). With w_i the i-th little-endian 8-byte
// word of x (the last one zero-padded) and n its byte count:
//   hash = mix(sum_i mix(w_i ^ (seed + (i + 1) K1)) + n K3 + seed K2)   (mod 2^64)
// mix (core/mix64.h) is a bijection, so a change in any one word always changes the hash; the sum
// is exact and order-free, so both devices and any thread or block count give the same bits.
// x contiguous; on the GPU 8-byte aligned (a buffer's start or a parameter's), its blocks' sums
// added atomically into ctx.workspace, read back to the host (a sync of ctx's stream).
uint64_t hash_words_cpu(const void* x, int64_t nbytes, uint64_t seed);
uint64_t hash_words_cuda(const Ctx& ctx, const Tensor& x, uint64_t seed);

// Entry points: check shapes, dispatch on ctx.device and dtypes.
void sum_squares(const Ctx& ctx, const Tensor& x, const Tensor& out);
void sum(const Ctx& ctx, const Tensor& x, const Tensor& out);
void count_nonfinite(const Ctx& ctx, const Tensor& x, const Tensor& out);
uint64_t hash_words(const Ctx& ctx, const Tensor& x, uint64_t seed = 0);

}  // namespace linac

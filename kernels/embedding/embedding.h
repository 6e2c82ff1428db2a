// Token embedding lookup and its gradient:
//   out[n, :] = table[tokens[n], :]
//   dtable[v, :] += sum over n with tokens[n] == v of dout[n, :]      (ACCUMULATED)
//
// Layout: tokens [N] i32; table, dtable [V, d] contiguous; out, dout [N, d] contiguous.
// GPU: table and out f32 or bf16 independently (table is the f32 master or its bf16 copy),
// dout f32 or bf16, dtable f32. CPU: one dtype (f32 or f64).
//
// Token ids outside [0, V): the CPU throws linac::Error. The GPU entry point cannot see device
// data, so its kernels skip such tokens: the forward leaves their out rows unwritten and the
// backward adds nothing for them; nothing is read out of bounds.
//
// The GPU backward is deterministic: (token, position) pairs are radix-sorted (stable, so equal
// tokens stay in position order), each run of equal tokens is summed in position order (one
// thread per column) and added to its dtable row once. Its scratch comes from ctx.workspace,
// which must hold embedding_bwd_workspace_bytes(N) bytes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/gpu.h"
#include "core/tensor.h"

namespace linac {

template <class T>
void embedding_fwd_cpu(const int32_t* tokens, const T* table, T* out, int64_t n, int64_t v, int64_t d);
template <class T>
void embedding_bwd_cpu(const int32_t* tokens, const T* dout, T* dtable, int64_t n, int64_t v, int64_t d);

void embedding_fwd_cuda(const Ctx& ctx, const Tensor& tokens, const Tensor& table, const Tensor& out);
void embedding_bwd_cuda(const Ctx& ctx, const Tensor& tokens, const Tensor& dout, const Tensor& dtable);
size_t embedding_bwd_workspace_bytes_cuda(int64_t n);

// Entry points: check shapes, dispatch on ctx.device and dtypes.
void embedding_fwd(const Ctx& ctx, const Tensor& tokens, const Tensor& table, const Tensor& out);
void embedding_bwd(const Ctx& ctx, const Tensor& tokens, const Tensor& dout, const Tensor& dtable);
// Workspace the GPU backward needs for N tokens (0 in a build without CUDA; with CUDA it asks
// CUB, which needs a device).
size_t embedding_bwd_workspace_bytes(int64_t n);

}  // namespace linac

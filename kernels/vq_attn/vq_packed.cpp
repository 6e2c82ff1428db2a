// Layout of the GPU VQ-attention workspace (vq_packed.h) and the size it asks for.
#include "vq_attn/vq_packed.h"

#include <algorithm>

namespace linac {
namespace vq_cuda {

size_t layout(const Geo& g, size_t act_bytes, bool backward, int64_t cap, char* base, Ws* ws) {
  size_t off = 0;
  auto take = [&](int64_t elems, size_t elem_bytes) -> char* {
    char* p = base ? base + off : nullptr;
    off += (static_cast<size_t>(elems) * elem_bytes + 255) / 256 * 256;
    return p;
  };
  auto act = [&](int64_t elems) -> void* { return take(elems, act_bytes); };
  auto f32 = [&](int64_t elems) -> float* { return reinterpret_cast<float*>(take(elems, sizeof(float))); };
  Ws w{};
  const int64_t rows = g.P * g.Tp, H = g.H, S = g.S, Dk = g.Dk, Dv = g.Dv;
  w.qp = act(rows * Dk);
  w.kp = act(rows * Dk);
  w.vp = act(rows * Dv);
  w.ubar = act(g.NB * S * Dv);
  const bool split = act_bytes == 2;  // bf16: the f32 tables as hi + lo parts
  w.ldt = split ? 2 * Dk : Dk;
  w.ctab = act(H * S * w.ldt);
  w.rtab = act(H * g.ldp * w.ldt);
  w.qq = split ? act(rows * 2 * Dk) : nullptr;
  w.counts = f32(g.NB * S);
  w.ub = f32(rows);
  w.ucb = f32(H * S);
  w.vrho = f32(H * g.ldp);
  w.cbias = f32(g.NB * g.lds);
#if LINAC_WITH_CUDA
  w.lists_bytes = code_lists_bytes(g.B, g.T, g.H, g.S, g.R);
#else
  w.lists_bytes = 0;  // CPU-only builds have no GPU kernels to lay out for
#endif
  w.lists = take(static_cast<int64_t>(w.lists_bytes), 1);
  if (backward) {
    w.qu = act(rows * Dk);
    w.qr = act(rows * Dk);
    w.dop = act(rows * Dv);
    w.delta = f32(rows);
    w.dqu = f32(rows * Dk);
    w.dqr = f32(rows * Dk);
    w.dk = f32(rows * Dk);
    w.dvp = act(rows * Dv);
    w.gcache = act(g.NB * S * Dv);
    w.ones = f32(g.B * g.Tp);
    w.drho = f32(H * g.ldp * Dk);
  }
  const int64_t cr = cap * g.Lb;
  w.swin = f32(cr * g.ldw);
  w.scache = f32(cr * g.lds);
  w.pos = f32(cr * g.ldp);
  w.pwin = act(backward ? (cap + 1) * key_slot_elems(g) : cr * g.ldw);
  w.pcache = act(cr * g.lds);
  if (backward) {
    w.dpwin = f32(cr * g.ldw);
    w.dpcache = f32(cr * g.lds);
    w.gswin = act(cr * g.ldw);
    w.gscache = act(cr * g.lds);
    w.gpos = act(cr * g.ldp);
  } else {
    w.ochunk = f32(cr * Dv);
  }
  w.cap = cap;
  char* blas = take(static_cast<int64_t>(kBlasBytes), 1);
  if (ws) {
    *ws = w;
    ws->blas.workspace = blas;
    ws->blas.workspace_bytes = kBlasBytes;
  }
  return off;
}

SavedCache saved_cache(const Geo& g, size_t act_bytes, void* base) {
  const size_t means = (static_cast<size_t>(g.NB * g.S * g.Dv) * act_bytes + 255) / 256 * 256;
  SavedCache c;
  c.ubar = base;
  c.counts = base ? reinterpret_cast<float*>(static_cast<char*>(base) + means) : nullptr;
  c.bytes = means + static_cast<size_t>(g.NB * g.S) * sizeof(float);
  return c;
}

SavedWeights saved_weights(const Geo& g, size_t act_bytes, void* base) {
  const size_t rows = static_cast<size_t>(g.P * g.Tp), win = (rows * g.ldw * act_bytes + 255) / 256 * 256;
  SavedWeights s;
  s.pwin = base;
  s.pcache = base ? static_cast<char*>(base) + win : nullptr;
  s.bytes = win + rows * g.lds * act_bytes;
  return s;
}

}  // namespace vq_cuda

size_t vq_attn_saved_weights_bytes(int64_t B, int64_t T, int64_t H, int64_t S, int64_t Lb, DType act, bool documents) {
  const int64_t R = documents ? vq_cuda::doc_blocks_bound(T, Lb) : 0;
  return vq_cuda::saved_weights(vq_cuda::geo_of(B, T, H, 1, 1, S, Lb, R), dtype_size(act), nullptr).bytes;
}

size_t vq_attn_saved_cache_bytes(int64_t B, int64_t T, int64_t H, int64_t Dv, int64_t S, int64_t Lb, DType act,
                                 bool documents) {
  const int64_t R = documents ? vq_cuda::doc_blocks_bound(T, Lb) : 0;
  return vq_cuda::saved_cache(vq_cuda::geo_of(B, T, H, 1, Dv, S, Lb, R), dtype_size(act), nullptr).bytes;
}

size_t vq_attn_workspace_bytes(int64_t B, int64_t T, int64_t H, int64_t Dk, int64_t Dv, int64_t S, int64_t Lb,
                               DType act, bool documents) {
  const int64_t R = documents ? vq_cuda::doc_blocks_bound(T, Lb) : 0;
  const vq_cuda::Geo g = vq_cuda::geo_of(B, T, H, Dk, Dv, S, Lb, R);
  const size_t es = dtype_size(act), fixed = vq_cuda::layout(g, es, true, 0, nullptr, nullptr);
  const size_t per_block = vq_cuda::layout(g, es, true, 1, nullptr, nullptr) - fixed;
  const int64_t cap = std::clamp<int64_t>(static_cast<int64_t>(vq_cuda::kChunkBytesGoal / per_block), 1, g.B * g.R);
  return vq_cuda::layout(g, es, true, cap, nullptr, nullptr) +
         (documents ? vq_cuda::doc_tables_bytes(B, T, Lb, g.R) : 0);
}

size_t vq_attn_state_prefill_workspace_bytes(int64_t B, int64_t T, int64_t H, int64_t S) {
#if LINAC_WITH_CUDA
  // Each token's segment (vq_state_prefill.cu), then the tokens' lists by (head, row, segment, code).
  return (static_cast<size_t>(B * T) * sizeof(int32_t) + 255) / 256 * 256 + vq_cuda::code_lists_bytes(B, T, H, S, 2);
#else
  (void)B, (void)T, (void)H, (void)S;
  return 0;
#endif
}

}  // namespace linac

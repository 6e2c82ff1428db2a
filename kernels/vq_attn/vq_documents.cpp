// Documents in the packed layout of the GPU VQ-attention (vq_packed.h): the placement planned on
// the host from the bounds and its tables, copied to the start of the workspace.
#include <algorithm>
#include <string>

#include "vq_attn/vq_packed.h"

namespace linac::vq_cuda {

size_t doc_tables_bytes(int64_t B, int64_t T, int64_t Lb, int64_t R) {
  const int64_t n = 2 * B * R * Lb + B * R + B * T;
  return (static_cast<size_t>(n) * sizeof(int32_t) + 255) / 256 * 256;
}

DocPlan plan_documents(const int32_t* end, int64_t B, int64_t T, int64_t Lb) {
  struct Placed {
    int64_t b, a, e, at;
    bool segment;  // starts a cache segment on a block boundary
  };
  std::vector<Placed> docs;
  DocPlan plan;
  plan.R = 1;
  for (int64_t b = 0; b < B; ++b) {
    int64_t at = 0;
    for (int64_t a = 0; a < T;) {
      const int64_t e = end[b * T + a];
      LINAC_CHECK(e > a && e <= T, "vq_attn: document bounds: the end of the document at token " + std::to_string(a) +
                                       " of row " + std::to_string(b) + " is " + std::to_string(e) +
                                       ", expected one in (" + std::to_string(a) + ", " + std::to_string(T) + "]");
      const int64_t o = at % Lb;
      const bool segment = o + (e - a) > 2 * Lb;  // would reach two blocks past its first one
      if (segment && o > 0) at += Lb - o;
      docs.push_back({b, a, e, at, segment});
      at += e - a;
      a = e;
    }
    plan.R = std::max(plan.R, (at + Lb - 1) / Lb);
  }
  const int64_t R = plan.R, Tp = R * Lb;
  plan.tables.assign(static_cast<size_t>(2 * B * Tp + B * R + B * T), 0);
  int32_t* src = plan.tables.data();
  int32_t* start = src + B * Tp;
  int32_t* cache_from = start + B * Tp;
  int32_t* packed = cache_from + B * R;
  std::fill(src, src + B * Tp, -1);
  for (int64_t i = 0; i < B * Tp; ++i) start[i] = static_cast<int32_t>(i % Tp);  // padding: itself
  std::vector<char> segment_starts(static_cast<size_t>(B * R), 0);
  for (const Placed& d : docs) {
    for (int64_t x = 0; x < d.e - d.a; ++x) {
      src[d.b * Tp + d.at + x] = static_cast<int32_t>(d.a + x);
      start[d.b * Tp + d.at + x] = static_cast<int32_t>(d.at);
      packed[d.b * T + d.a + x] = static_cast<int32_t>(d.at + x);
    }
    if (d.segment) segment_starts[static_cast<size_t>(d.b * R + d.at / Lb)] = 1;
  }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0, from = 0; n < R; ++n) {
      if (segment_starts[static_cast<size_t>(b * R + n)]) from = n;
      cache_from[b * R + n] = static_cast<int32_t>(from);
    }
  return plan;
}

Geo geo_of_call(const Ctx& ctx, const VqAttnLayout& L, Ctx* rest) {
  *rest = ctx;
  if (!L.docs.defined()) return geo_of(L);
  int64_t R = L.doc_blocks ? *L.doc_blocks : 0;
  const bool planned = R > 0;  // by an earlier call: its tables are at the workspace's start
  DocPlan plan;
  if (!planned) {
    std::vector<int32_t> end(static_cast<size_t>(L.B * L.T));
    gpu_memcpy(end.data(), Device::CPU, L.docs.end, Device::CUDA, end.size() * sizeof(int32_t));
    plan = plan_documents(end.data(), L.B, L.T, L.Lb);
    R = plan.R;
  }
  LINAC_CHECK(R <= doc_blocks_bound(L.T, L.Lb), "vq_attn: document placement past its bound");
  Geo g = geo_of(L.B, L.T, L.H, L.Dk, L.Dv, L.S, L.Lb, R);
  const size_t bytes = doc_tables_bytes(L.B, L.T, L.Lb, R);
  LINAC_CHECK(ctx.workspace_bytes >= bytes, "vq_attn: ctx.workspace has " + std::to_string(ctx.workspace_bytes) +
                                                " bytes, the documents' tables need " + std::to_string(bytes) +
                                                " (vq_attn_workspace_bytes with documents)");
  if (!planned) {
    // In ctx's stream order; a pageable source is staged before the call returns.
    gpu_memcpy_async(ctx, ctx.workspace, plan.tables.data(), plan.tables.size() * sizeof(int32_t));
    if (L.doc_blocks) *L.doc_blocks = R;
  }
  const int32_t* t = static_cast<const int32_t*>(ctx.workspace);
  const int64_t BTp = g.B * g.Tp;
  g.docs = {t, t + BTp, t + 2 * BTp, t + 2 * BTp + g.B * g.R};
  rest->workspace = static_cast<char*>(ctx.workspace) + bytes;
  rest->workspace_bytes = ctx.workspace_bytes - bytes;
  return g;
}

}  // namespace linac::vq_cuda

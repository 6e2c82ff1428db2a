// Greedy decoding's choice for each row of next-token logits, where the logits are:
//   id[b]      = argmax_v logits[b, v]            (the lowest id among equal maxima, as the host
//                                                  Sampler's temperature 0, generate/sampler.h)
//   logprob[b] = logits[b, id] - m - log(sum_v exp(logits[b, v] - m)),  m = logits[b, id]
// in double. Logits are finite (a NaN row has no defined choice).
//
// Layout: logits [B, V] contiguous; id [B] int32; logprob [B] f64, optional (undefined: skipped).
// Dtypes: GPU f32 logits; CPU f32 or f64. The GPU reduces each row in one CTA in a fixed tree
// order, so a row always gives the same bits; its sum agrees with the CPU's left-to-right one to
// about 1e-15 relative. On the GPU the pick runs inside a decoding step's CUDA graph
// (generate/decode_graph.h), writing the next step's input ids in place.
#pragma once

#include <cstdint>

#include "core/gpu.h"
#include "core/tensor.h"

namespace linac {

template <class F>
void greedy_pick_cpu(const F* logits, int64_t B, int64_t V, int32_t* id, double* logprob);
void greedy_pick_cuda(const Ctx& ctx, const Tensor& logits, const Tensor& id, const Tensor& logprob);

// Entry point: checks shapes, dispatches on ctx.device and dtype.
void greedy_pick(const Ctx& ctx, const Tensor& logits, const Tensor& id, const Tensor& logprob = Tensor());

}  // namespace linac

// Mixer: the interface of a block's sub-layers — token mixers (attention, GLA, ...) and
// channel mixers (SwiGLU). Blocks are pre-norm residual:
//   x += Mixer(Norm(x));  x += ChannelMixer(Norm(x))
//
// forward(x, out):   out += f(x). x is the normed input [B, T, d] (activation dtype) and stays
//                    valid (unchanged) until backward; out is the residual stream [B, T, d]
//                    (residual dtype): the output projection accumulates straight into it.
// backward(x, dy, dx): dy = dL/d(out) [B, T, d] (activation dtype); writes dx = dL/dx
//                    (overwrite) and accumulates parameter gradients.
// reserve(B, T):     allocates what forward saves for backward, once, for the largest shape.
#pragma once

#include <cstdint>
#include <string>

#include "core/tensor.h"
#include "model/env.h"

namespace linac {

class Mixer {
 public:
  virtual ~Mixer() = default;
  virtual std::string kind() const = 0;
  virtual void reserve(int64_t B, int64_t T) = 0;
  virtual void forward(const Tensor& x, const Tensor& out) = 0;
  virtual void backward(const Tensor& x, const Tensor& dy, const Tensor& dx) = 0;
  // Bytes saved between forward and backward for a [B, T] micro-batch.
  virtual size_t activation_bytes(int64_t B, int64_t T) const = 0;
  // Training FLOPs per token (forward + backward) at sequence length T, for MFU.
  virtual double flops_per_token(int64_t T) const = 0;
};

}  // namespace linac

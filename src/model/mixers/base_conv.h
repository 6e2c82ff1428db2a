// BaseConv: Based's gated short convolution layer (Arora et al. 2024;
// docs/based.md §4), with E = expand * d / 2 channels per branch and filter width W:
//   [a|g] = x Win^T + b_in            Win: [2E, d], b_in: [2E]  (a: conv branch, g: linear gate)
//   c_t   = sum_{j<W} h[:, j] * a_{t-W+1+j}                     h: [E, W], zero left padding, no bias
//   out  += (act(c) * g) Wout^T + b_out                         Wout: [d, E], b_out: [d]; act = SiLU
// expand = 4 is the paper's "expansion factor 4": the total in_proj width, each branch 2d (the
// reading that reproduces its parameter counts, docs/based.md §4 / §9).
// Init (docs/based.md §1.3): Win ~ N(0, init_std), Wout ~ N(0, init_std / sqrt(2 n_layers)), biases 0;
// h ~ N(0, 1/sqrt(3 W)): the variance of PyTorch's default depthwise Conv1d init,
// U(-1/sqrt(W), 1/sqrt(W)) (the parameter store draws normals).
// Saved for backward: [a|g] [B*T, 2E] and the gated output z = act(c) * g [B*T, E] (act), which
// Wout's gradient needs: keeping it costs E values per token and saves a convolution pass.
// Documents (mixer.h): no filter tap reads across a document start (the kernel reads the zero
// padding there, short_conv.h); start_document zeroes a row's decoding state, which is that padding.
// Decoding: the last W-1 conv inputs per channel (f32 on the GPU), whatever the length. prefill()
// runs the forward, then steps each row's last min(W-1, tokens of its last document) tokens into
// a zeroed state.
#pragma once

#include "config/config.h"
#include "model/mixer.h"

namespace linac {

struct BaseConvMixerOptions {
  double expand = 4;                // in_proj width / d_model (both branches together)
  int64_t kernel_size = 3;          // W
  std::string activation = "silu";  // of the conv branch: silu | none
  bool operator==(const BaseConvMixerOptions&) const = default;
  static BaseConvMixerOptions parse(const json& o, const std::string& path, const std::string& file);
};

class BaseConvMixer final : public Mixer {
 public:
  BaseConvMixer(ModelEnv& env, const ModelConfig& cfg, int layer, const BaseConvMixerOptions& opt,
                const std::string& path);
  std::string kind() const override { return "base_conv"; }
  bool supports_documents() const override { return true; }
  bool graph_safe_step() const override { return true; }  // no host-side position
  void start_document(MixerState& state, int64_t row) override;
  void reserve(int64_t B, int64_t T) override;
  void forward(const Tensor& x, const Tensor& out, const Tensor& add = Tensor()) override;
  void backward(const Tensor& x, const Tensor& dy, const Tensor& dx) override;
  size_t activation_bytes(int64_t B, int64_t T) const override;
  int64_t state_elems(int64_t T) const override;
  double flops_per_token(int64_t T) const override;
  std::unique_ptr<MixerState> init_state(int64_t B) override;
  void step(MixerState& state, const Tensor& x_t, const Tensor& out_t) override;
  void prefill(const Ctx& ctx, MixerState& state, const Tensor& x, const Tensor& out) override;

 private:
  // b_out in the activation dtype (the forward's matmul_bias epilogue adds it).
  Tensor out_bias();
  // out [N, d] += ones [N, 1] b_out [1, d] (a K = 1 GEMM: deterministic, no extra kernel), for
  // decoding's few rows, whose skinny GEMM has no bias epilogue.
  void add_out_bias(const Tensor& out, int64_t N);
  void fill_ones(int64_t N);

  ModelEnv& env_;
  BaseConvMixerOptions opt_;
  int64_t d_, E_, W_;
  int w_in_, b_in_, filter_, w_out_, b_out_;
  SavedBuf proj_buf_, z_buf_;
  Buffer ones_act_;
  int64_t capacity_ = 0, ones_n_ = 0;
};

}  // namespace linac

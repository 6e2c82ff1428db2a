// Whole models on the GPU, one parameterised suite over the architecture registry
// (model/registry.h): every check runs as ModelGpu.<check>/<arch>, so an architecture gets them
// all by being registered.
//   MatchesCpuFp32, MatchesCpuBf16  loss and every parameter gradient against the CPU reference
//                                   (double) for identical weights and batch (model_parity.h)
//   Bf16LogitsMatchF32Logits        train.logits_dtype bf16 against f32, both bf16 precision (model_parity.h)
//   DecodeStepsMatchFullSequence    GPU decoding token by token (fp32) against the GPU's full forward
// What each runs on: arch_entries() below. An architecture without an entry gets a 2-layer model
// of d_model 128 and 2 heads (head dim 64: the tensor-core paths), tied embeddings, T = 77 (ragged
// chunks, blocks and tiles); its entry, when it needs one, sets its own configs and probes.
// Decoding after a prefill, the attention caches and greedy generation: test_generate_gpu.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "model/registry.h"
#include "model_checks.h"
#include "model_parity.h"
#include "test_util.h"

namespace linac::test_model_gpu {
namespace {

struct ParityCase {
  std::string what;
  ModelConfig cfg;
};

struct GpuCases {
  std::vector<ParityCase> fp32, bf16;
  // Why there is no bf16 parity at the model level (bf16 empty): the test says so as it skips.
  std::string no_bf16;
  ModelConfig decode;
  std::vector<int64_t> probes;  // of 2 sequences of 70 tokens
};

// d_model 128, 2 heads, vocabulary 1000, SwiGLU 352 (or the architecture's channel mixer).
ModelConfig gpu_model(const std::string& arch, int64_t n_layers = 2) {
  return test::tiny_model(n_layers, 128, 2, 1000, 352, arch);
}

GpuCases default_cases(const ArchInfo& arch) {
  ModelConfig cfg = gpu_model(arch.name, std::max<int64_t>(2, static_cast<int64_t>(arch.pattern.size())));
  cfg.tie_embeddings = true;
  GpuCases c;
  c.fp32 = c.bf16 = {{"tied", cfg}};
  c.decode = cfg;
  c.probes = {0, 1, 33, 63, 64, 69};
  return c;
}

ModelConfig latte_config(bool macchiato) {
  ModelConfig cfg = gpu_model(macchiato ? "latte_macchiato" : "latte");  // Dh = 64
  cfg.tie_embeddings = true;
  if (macchiato)
    cfg.mixer = {{"latents", 32}, {"window", 33}};  // 16 latents + the local state per head, conv 3
  else
    cfg.mixer = {{"latents", 32}};
  return cfg;
}

// One entry per architecture that needs more than the defaults: it edits default_cases' result.
const std::map<std::string, std::function<void(GpuCases&)>>& arch_entries() {
  static const std::map<std::string, std::function<void(GpuCases&)>> table = {
      {"transformer",
       [](GpuCases& c) {
         const ModelConfig untied = gpu_model("transformer");  // head dim 64: the tensor-core attention path
         ModelConfig tied = untied;
         tied.tie_embeddings = true;
         // Multi-query attention (2 query heads, 1 key/value head) with Llama 3's RoPE scaling.
         ModelConfig gqa = untied;
         gqa.mixer = {{"kv_heads", 1},
                      {"rope_base", 500000},
                      {"rope_scaling", {{"factor", 8}, {"original_max_position_embeddings", 32}}}};
         c.fp32 = {{"untied", untied}, {"multi-query, llama3 RoPE", gqa}};
         c.bf16 = {{"untied", untied}, {"tied embeddings", tied}, {"multi-query, llama3 RoPE", gqa}};
         c.decode = untied;
       }},
      {"gla",
       [](GpuCases& c) {
         const ModelConfig cfg = gpu_model("gla");  // Dk = 32, Dv = 64; T = 77: two chunks, the second ragged
         c.fp32 = c.bf16 = {{"untied", cfg}};
         c.decode = cfg;
       }},
      {"based",
       [](GpuCases& c) {
         ModelConfig cfg = gpu_model("based", 3);  // head dim 64 for the window, Dv 64 for the linear attention
         cfg.ffn_hidden = 256;
         cfg.tie_embeddings = true;
         cfg.layers = {"base_conv", "taylor", "sliding_window"};
         cfg.mixers = {{"taylor", {{"feature_dim", 16}}}, {"sliding_window", {{"window", 16}}}};
         c.fp32 = c.bf16 = {{"ragged chunks and tiles", cfg}};
         c.decode = cfg;
         c.probes = {0, 1, 15, 16, 17, 40, 69};
       }},
      {"transnormer",
       [](GpuCases& c) {
         ModelConfig cfg = gpu_model("transnormer");  // dh = 64; layer 0 runs the attention with Dk = 128 (LRPE)
         cfg.norm_eps = 1e-6;
         cfg.tie_embeddings = true;
         c.fp32 = c.bf16 = {{"ragged blocks", cfg}};
         c.decode = cfg;
       }},
      {"latte",
       [](GpuCases& c) {
         c.fp32 = c.bf16 = {{"32 latents", latte_config(false)}};
         c.decode = latte_config(false);
       }},
      {"latte_macchiato",
       [](GpuCases& c) {
         c.fp32 = c.bf16 = {{"32 latents, window 33", latte_config(true)}};
         c.decode = latte_config(true);
       }},
      {"transformer_vq",
       [](GpuCases& c) {
         ModelConfig cfg = gpu_model("transformer_vq");
         cfg.n_heads = 1;
         cfg.ffn_hidden = 0;
         cfg.final_norm = false;
         cfg.head_bias = true;
         cfg.mixer = {{"dk", 64}, {"dv", 256}, {"codebook", 32}, {"block", 16}, {"beta", 0.01}};
         c.fp32 = {{"T = 77: 5 blocks of 16, the cache in use", cfg}};
         c.bf16 = {};
         c.no_bf16 =
             "no bf16 parity at the model level: bf16 keys round by ~1e-2 and may pick a different nearest code than the "
             "double reference does (a different but equally valid forward); the op-level GPU tests cover bf16";
         c.decode = cfg;
         c.probes = {0, 1, 15, 16, 33, 63, 64, 69};
       }},
  };
  return table;
}

GpuCases cases_of(const std::string& name) {
  GpuCases c = default_cases(find_architecture(name, "test"));
  const auto& entries = arch_entries();
  if (const auto it = entries.find(name); it != entries.end()) it->second(c);
  return c;
}

std::vector<std::string> arch_names() {
  std::vector<std::string> out;
  for (const ArchInfo& a : architectures()) out.push_back(a.name);
  return out;
}

class ModelGpu : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelGpu, MatchesCpuFp32) {
  LINAC_SKIP_WITHOUT_GPU();
  const GpuCases c = cases_of(GetParam());
  ASSERT_FALSE(c.fp32.empty());
  for (const ParityCase& p : c.fp32) {
    SCOPED_TRACE(p.what);
    test::check_model_gpu_parity(p.cfg, "fp32", 2, 77, 1e-5, 1e-4);
  }
}

TEST_P(ModelGpu, MatchesCpuBf16) {
  LINAC_SKIP_WITHOUT_GPU();
  const GpuCases c = cases_of(GetParam());
  if (c.bf16.empty()) {
    ASSERT_FALSE(c.no_bf16.empty()) << "an entry without bf16 parity must say why";
    GTEST_SKIP() << c.no_bf16;
  }
  for (const ParityCase& p : c.bf16) {
    SCOPED_TRACE(p.what);
    test::check_model_gpu_parity(p.cfg, "bf16", 2, 77, 1e-2, 5e-2);
  }
}

// Every fp32 case (Transformer-VQ has no bf16 parity case but has the head bias).
TEST_P(ModelGpu, Bf16LogitsMatchF32Logits) {
  LINAC_SKIP_WITHOUT_GPU();
  for (const ParityCase& p : cases_of(GetParam()).fp32) {
    SCOPED_TRACE(p.what);
    test::check_bf16_logits(p.cfg, 2, 77, 2e-3, 3e-2);
  }
}

TEST_P(ModelGpu, DecodeStepsMatchFullSequence) {
  LINAC_SKIP_WITHOUT_GPU();
  const GpuCases c = cases_of(GetParam());
  test::check_model_gpu_decode(c.decode, 2, 70, c.probes, 1e-4);
}

// Past 2048 tokens the Taylor op runs more than one scan segment and the Based layer keeps the
// forward's segment carries for its backward (TaylorAttnOpts::saved_carries): the step still
// matches the CPU model in bf16.
TEST(ModelGpuBased, TwoScanSegmentsKeepCarries) {
  LINAC_SKIP_WITHOUT_GPU();
  ModelConfig cfg = gpu_model("based", 3);
  cfg.ffn_hidden = 256;
  cfg.tie_embeddings = true;
  cfg.layers = {"base_conv", "taylor", "sliding_window"};
  cfg.mixers = {{"taylor", {{"feature_dim", 16}}}, {"sliding_window", {{"window", 16}}}};
  test::check_model_gpu_parity(cfg, "bf16", 1, 2100, 1e-2, 5e-2);
}

// The parameter's name is the architecture's (gtest takes letters, digits and '_').
INSTANTIATE_TEST_SUITE_P(, ModelGpu, ::testing::ValuesIn(arch_names()), [](const ::testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
});

}  // namespace
}  // namespace linac::test_model_gpu

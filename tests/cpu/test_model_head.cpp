// The model's optional block and head parts (Transformer-VQ uses them): blocks without a channel
// mixer (`channel_mixer: "none"`), no final norm, a bias on the logits and a logit scale, an
// embedding init of its own. Gradient check in double over every parameter (the head bias
// included), decoding token by token against the full forward, and the parameter bookkeeping.
#include <gtest/gtest.h>

#include "model/model.h"
#include "model_checks.h"
#include "test_util.h"

namespace linac::test_model_head {
namespace {

ModelConfig bare_gla() {
  ModelConfig c;
  c.arch = "gla";
  c.n_layers = 3;
  c.d_model = 16;
  c.n_heads = 2;
  c.vocab_size = 11;
  c.init_std = 0.3;
  c.mixer = {{"gate_rank", 4}, {"chunk", 16}};
  c.channel_mixer = "none";
  c.final_norm = false;
  c.head_bias = true;
  c.logit_scale = 0.5;
  c.embed_init_std = 0.5;
  return c;
}

TEST(ModelHead, ParametersOfTheOptionalParts) {
  ModelConfig c = bare_gla();
  const Model bare(c, Ctx{}, {.precision = "fp32", .allocate = false});
  c.channel_mixer = "";
  c.final_norm = true;
  c.head_bias = false;
  const Model full(c, Ctx{}, {.precision = "fp32", .allocate = false});
  // Per layer the MLP (3 d F, F = 256: the default rounding) and its norm (d); the final norm (d);
  // the bias (V).
  const int64_t d = 16, F = 256, V = 11;
  EXPECT_EQ(full.n_params() - bare.n_params(), 3 * (3 * d * F + d) + d - V);
  EXPECT_EQ(bare.n_embedding_params(), 2 * V * d + V);  // untied (the default) + bias
  std::string kinds;
  for (const auto& row : bare.layer_table()) kinds += row.name + ":" + row.kind + " ";
  EXPECT_EQ(kinds.find("mlp"), std::string::npos) << kinds;
  EXPECT_EQ(kinds.find("norm_f"), std::string::npos) << kinds;
  EXPECT_NE(kinds.find("head:linear + bias"), std::string::npos) << kinds;
}

TEST(ModelHead, GradCheckDouble) {
  test::check_model_gradients(bare_gla(), 2, 19, 16);
  ModelConfig c = bare_gla();
  c.tie_embeddings = true;
  c.final_norm = true;
  test::check_model_gradients(c, 1, 9, 16);
}

TEST(ModelHead, DecodeStepsMatchFullSequence) {
  test::check_decode_matches_forward(bare_gla(), 2, 19);
}

}  // namespace
}  // namespace linac::test_model_head

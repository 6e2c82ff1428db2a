// Decoding for every registered architecture (so one added later is covered at once): token-by-
// token decode and prefill + decode against the full-sequence forward, in double. Attention's KV
// cache: the full cache growing past its first allocation, and the sliding window's ring buffer
// filled by a prefill longer than the window and wrapping while decoding.
#include <gtest/gtest.h>

#include "model/registry.h"
#include "model_checks.h"

namespace linac::test_prefill_decode {
namespace {

TEST(PrefillDecodeCpu, EveryArchitectureDecodesAsItsForward) {
  ASSERT_FALSE(architectures().empty());
  for (const ArchInfo& arch : architectures()) {
    SCOPED_TRACE(arch.name);
    const ModelConfig cfg = test::tiny_config_of(arch);
    test::check_decode_matches_forward(cfg, 2, 21);
    test::check_decode_matches_forward(cfg, 2, 21, 1e-10, 13);  // prefill 13 tokens, decode 8
    test::check_decode_matches_forward(cfg, 1, 9, 1e-10, 8);    // prefill all but the last
  }
}

TEST(PrefillDecodeCpu, FullAttentionCacheGrowsPastItsFirstSlots) {
  ModelConfig cfg;
  cfg.n_layers = 1;
  cfg.d_model = 8;
  cfg.n_heads = 2;
  cfg.vocab_size = 7;
  cfg.ffn_hidden = 8;
  cfg.init_std = 0.3;
  // 256 first slots: decoding crosses them; prefill starts beyond them.
  test::check_decode_matches_forward(cfg, 1, 263, 1e-10, 250);
  test::check_decode_matches_forward(cfg, 1, 263, 1e-10, 260);
}

TEST(PrefillDecodeCpu, SlidingWindowRingBufferAcrossTheWindowBoundary) {
  ModelConfig cfg;
  cfg.n_layers = 2;
  cfg.d_model = 16;
  cfg.n_heads = 2;
  cfg.vocab_size = 11;
  cfg.ffn_hidden = 24;
  cfg.init_std = 0.3;
  cfg.layers = {"sliding_window", "sliding_window"};
  cfg.mixers = {{"sliding_window", {{"window", 5}}}};
  test::check_decode_matches_forward(cfg, 2, 23);             // wraps four times
  test::check_decode_matches_forward(cfg, 2, 23, 1e-10, 3);   // prompt shorter than the window
  test::check_decode_matches_forward(cfg, 2, 23, 1e-10, 5);   // exactly one window
  test::check_decode_matches_forward(cfg, 2, 23, 1e-10, 12);  // longer: only its last 5 are kept
}

}  // namespace
}  // namespace linac::test_prefill_decode

// Embedding CPU reference: gather, accumulation over repeated tokens, gradient check, bad ids.
#include <algorithm>
#include <vector>

#include "core/rng.h"
#include "embedding/embedding.h"
#include "test_util.h"

namespace linac::test_embedding {
namespace {

OwnedTensor make_tokens(const std::vector<int32_t>& ids) {
  OwnedTensor t(DType::I32, Device::CPU, {static_cast<int64_t>(ids.size())});
  std::copy(ids.begin(), ids.end(), t->data<int32_t>());
  return t;
}

// Most positions hit one of three ids (including the first and last row of the table).
std::vector<int32_t> repeated_ids(int64_t n, int64_t v, uint64_t seed) {
  Rng rng{seed, 1, 0};
  std::vector<int32_t> ids(static_cast<size_t>(n));
  const int32_t hot[3] = {0, static_cast<int32_t>(v / 2), static_cast<int32_t>(v - 1)};
  for (auto& id : ids) id = rng.uniform() < 0.7 ? hot[rng.below(3)] : static_cast<int32_t>(rng.below(v));
  return ids;
}

TEST(EmbeddingCpu, ForwardGathersRows) {
  const int64_t n = 7, v = 129, d = 37;
  for (DType dt : {DType::F32, DType::F64}) {
    OwnedTensor tokens = make_tokens(repeated_ids(n, v, 1));
    OwnedTensor table = test::random_tensor({v, d}, dt, 2);
    OwnedTensor out(dt, Device::CPU, {n, d});
    embedding_fwd(Ctx{}, tokens, table, out);
    const auto tab = to_doubles(table), o = to_doubles(out);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < d; ++j)
        ASSERT_EQ(o[i * d + j], tab[tokens->data<int32_t>()[i] * d + j]) << "row " << i << " col " << j;
  }
}

TEST(EmbeddingCpu, BackwardAccumulatesRepeatedTokens) {
  const int64_t n = 200, v = 129, d = 37;
  OwnedTensor tokens = make_tokens(repeated_ids(n, v, 3));
  OwnedTensor dout = test::random_tensor({n, d}, DType::F64, 4);
  OwnedTensor dtable = test::random_tensor({v, d}, DType::F64, 5);
  std::vector<double> expect = to_doubles(dtable);
  const double* g = dout->data<double>();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < d; ++j) expect[tokens->data<int32_t>()[i] * d + j] += g[i * d + j];
  embedding_bwd(Ctx{}, tokens, dout, dtable);
  EXPECT_LT(test::max_abs_diff(to_doubles(dtable), expect), 1e-12);
}

TEST(EmbeddingCpu, GradCheckDouble) {
  const int64_t n = 13, v = 11, d = 37;
  OwnedTensor tokens = make_tokens(repeated_ids(n, v, 6));
  OwnedTensor table = test::random_tensor({v, d}, DType::F64, 7);
  OwnedTensor u = test::random_tensor({n, d}, DType::F64, 8);
  auto loss = [&] {
    OwnedTensor out(DType::F64, Device::CPU, {n, d});
    embedding_fwd(Ctx{}, tokens, table, out);
    double l = 0;
    for (int64_t i = 0; i < n * d; ++i) l += out->data<double>()[i] * u->data<double>()[i];
    return l;
  };
  OwnedTensor dtable(DType::F64, Device::CPU, {v, d});
  zero_tensor(dtable);
  embedding_bwd(Ctx{}, tokens, u, dtable);
  EXPECT_LT(test::check_grad(loss, table->data<double>(), dtable->data<double>(), static_cast<size_t>(v * d), 200),
            1e-6);
}

TEST(EmbeddingCpu, OutOfRangeTokenThrowsBeforeWriting) {
  const int64_t v = 11, d = 5;
  OwnedTensor table = test::random_tensor({v, d}, DType::F64, 9);
  OwnedTensor out(DType::F64, Device::CPU, {3, d});
  OwnedTensor dout = test::random_tensor({3, d}, DType::F64, 10);
  for (int32_t bad : {-1, static_cast<int32_t>(v)}) {
    OwnedTensor tokens = make_tokens({1, bad, 2});
    EXPECT_THROW(embedding_fwd(Ctx{}, tokens, table, out), Error);
    OwnedTensor dtable = test::random_tensor({v, d}, DType::F64, 11);
    const std::vector<double> before = to_doubles(dtable);
    EXPECT_THROW(embedding_bwd(Ctx{}, tokens, dout, dtable), Error);
    EXPECT_EQ(to_doubles(dtable), before);
  }
}

}  // namespace
}  // namespace linac::test_embedding

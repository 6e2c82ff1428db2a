#include "document_checks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/rng.h"
#include "data/documents.h"
#include "model/model.h"
#include "model_checks.h"
#include "test_util.h"

namespace linac::test {

PackedWindow packed_window(const std::vector<std::vector<int64_t>>& lengths, int64_t V, uint64_t seed) {
  PackedWindow w;
  w.B = static_cast<int64_t>(lengths.size());
  w.lengths = lengths;
  for (const auto& row : lengths) {
    int64_t sum = 0;
    for (int64_t l : row) sum += l;
    if (w.T == 0) w.T = sum;
    LINAC_CHECK(sum == w.T && sum > 0, "packed_window: every row's documents must fill the same T");
  }
  w.tokens = OwnedTensor(DType::I32, Device::CPU, {w.B, w.T});
  w.targets = OwnedTensor(DType::I32, Device::CPU, {w.B, w.T});
  w.docs = OwnedTensor(DType::I32, Device::CPU, {2, w.B, w.T});
  Rng rng{seed, 17, 0};
  int32_t* tk = w.tokens->data<int32_t>();
  int32_t* tg = w.targets->data<int32_t>();
  for (int64_t b = 0; b < w.B; ++b) {
    int64_t t = 0;
    for (size_t d = 0; d < lengths[static_cast<size_t>(b)].size(); ++d) {
      const int64_t len = lengths[static_cast<size_t>(b)][d];
      const bool last = d + 1 == lengths[static_cast<size_t>(b)].size();
      for (int64_t i = 0; i < len; ++i, ++t)
        tk[b * w.T + t] = !last && i == len - 1 ? kTestEos : static_cast<int32_t>(4 + rng.below(static_cast<uint64_t>(V - 4)));
    }
    for (int64_t i = 0; i < w.T; ++i) tg[b * w.T + i] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(V)));
  }
  doc_bounds_from_tokens(tk, w.B, w.T, kTestEos, w.docs->data<int32_t>());
  return w;
}

namespace {

struct Pass {
  std::vector<double> losses;               // per token
  std::vector<std::vector<double>> grads;   // per parameter
};

}  // namespace

void check_documents_match_separate(const ModelConfig& cfg, const Ctx& ctx, const std::string& precision,
                                    const std::vector<std::vector<int64_t>>& lengths, double tol) {
  const PackedWindow w = packed_window(lengths, cfg.vocab_size, 5);
  Model model(cfg, ctx, {.precision = precision});
  model.init_params(12);
  perturb_special_init(model.params());
  model.params().refresh_compute(ctx);
  model.reserve(w.B, w.T);
  ParamStore& ps = model.params();
  auto grads = [&] {
    std::vector<std::vector<double>> g;
    for (int i = 0; i < ps.count(); ++i) g.push_back(to_doubles(ps.grad(i)));
    return g;
  };
  const OwnedTensor tok = to(w.tokens, ctx.device, DType::I32), tgt = to(w.targets, ctx.device, DType::I32);
  const OwnedTensor docs = to(w.docs, ctx.device, DType::I32);

  Pass packed;
  ps.zero_grad(ctx);
  model.forward_backward(tok, tgt, 1.f, nullptr, docs);
  packed.losses = model.token_losses();
  packed.grads = grads();

  Pass alone;
  alone.losses.assign(static_cast<size_t>(w.B * w.T), 0.0);
  ps.zero_grad(ctx);
  for (int64_t b = 0; b < w.B; ++b) {
    int64_t s = 0;
    for (int64_t len : w.lengths[static_cast<size_t>(b)]) {
      OwnedTensor dt(DType::I32, Device::CPU, {1, len}), dg(DType::I32, Device::CPU, {1, len});
      std::copy_n(w.tokens->data<int32_t>() + b * w.T + s, len, dt->data<int32_t>());
      std::copy_n(w.targets->data<int32_t>() + b * w.T + s, len, dg->data<int32_t>());
      model.forward_backward(to(dt, ctx.device, DType::I32), to(dg, ctx.device, DType::I32), 1.f);
      const std::vector<double> l = model.token_losses();
      std::copy(l.begin(), l.end(), alone.losses.begin() + b * w.T + s);
      s += len;
    }
  }
  alone.grads = grads();
  expect_close(packed.losses, alone.losses, tol, "per-token losses");
  for (int i = 0; i < ps.count(); ++i)
    expect_close(packed.grads[static_cast<size_t>(i)], alone.grads[static_cast<size_t>(i)], tol,
                 "gradient of " + ps.spec(i).name);

  // Without bounds, a document after the first sees its predecessors: some later loss changes,
  // by far more than packed and alone differ.
  model.forward_loss(tok, tgt);
  const std::vector<double> stream = model.token_losses();
  double changed = 0, noise = 0;
  for (size_t i = 0; i < stream.size(); ++i) {
    changed = std::max(changed, std::abs(stream[i] - packed.losses[i]));
    noise = std::max(noise, std::abs(alone.losses[i] - packed.losses[i]));
  }
  EXPECT_GT(changed, std::max(10 * noise, 1e-6)) << "document bounds made no difference";
}

namespace {

// The logits of decoding rows[b] (all of one length n) token by token from `st` ([B, n, V] f64);
// before token t of row b, start_document when restart[b] == t.
DType logits_dtype(const Model& m) { return m.env().act == DType::F64 ? DType::F64 : DType::F32; }

std::vector<double> decode_all(Model& m, Model::DecodeState& st, const std::vector<std::vector<int32_t>>& rows,
                               const std::vector<int64_t>& restart = {}) {
  const int64_t V = m.config().vocab_size, B = static_cast<int64_t>(rows.size());
  const auto n = static_cast<int64_t>(rows[0].size());
  const Device dev = m.env().device();
  OwnedTensor tok(DType::I32, Device::CPU, {B}), tok_d(DType::I32, dev, {B}), logits(logits_dtype(m), dev, {B, V});
  std::vector<double> out(static_cast<size_t>(B * n * V));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t b = 0; b < B; ++b) {
      if (!restart.empty() && restart[static_cast<size_t>(b)] == t) m.start_document(st, b);
      tok->data<int32_t>()[b] = rows[static_cast<size_t>(b)][static_cast<size_t>(t)];
    }
    copy_tensor(tok_d, tok);
    m.decode_step(st, tok_d, logits);
    const std::vector<double> l = to_doubles(logits);
    for (int64_t b = 0; b < B; ++b) std::copy_n(l.begin() + b * V, V, out.begin() + (b * n + t) * V);
  }
  return out;
}
std::vector<double> decode_all(Model& m, Model::DecodeState& st, const std::vector<int32_t>& tokens) {
  return decode_all(m, st, std::vector<std::vector<int32_t>>{tokens});
}

// The logits after prefilling `rows` (all of one length; with bounds from their EOS tokens when
// `documents`), [B, V] f64.
std::vector<double> prefill_logits(Model& m, Model::DecodeState& st, const std::vector<std::vector<int32_t>>& rows,
                                   bool documents) {
  const int64_t V = m.config().vocab_size, B = static_cast<int64_t>(rows.size());
  const auto n = static_cast<int64_t>(rows[0].size());
  const Device dev = m.env().device();
  OwnedTensor tok(DType::I32, Device::CPU, {B, n}), logits(logits_dtype(m), dev, {B, V});
  for (int64_t b = 0; b < B; ++b) std::copy_n(rows[static_cast<size_t>(b)].begin(), n, tok->data<int32_t>() + b * n);
  OwnedTensor docs;
  if (documents) {
    OwnedTensor host(DType::I32, Device::CPU, {2, B, n});
    doc_bounds_from_tokens(tok->data<int32_t>(), B, n, kTestEos, host->data<int32_t>());
    docs = to(host, dev, DType::I32);
  }
  m.prefill(st, to(tok, dev, DType::I32), logits, documents ? docs.t : Tensor());
  return to_doubles(logits);
}
std::vector<double> prefill_logits(Model& m, Model::DecodeState& st, const std::vector<int32_t>& tokens,
                                   bool documents) {
  return prefill_logits(m, st, std::vector<std::vector<int32_t>>{tokens}, documents);
}

}  // namespace

void check_document_decode(const ModelConfig& cfg, const Ctx& ctx, const std::string& precision, double tol) {
  Model model(cfg, ctx, {.precision = precision});
  model.init_params(13);
  perturb_special_init(model.params());
  model.params().refresh_compute(ctx);
  Rng rng{77, 1, 0};
  auto doc = [&](int64_t n) {
    std::vector<int32_t> d;
    for (int64_t i = 0; i < n; ++i) d.push_back(static_cast<int32_t>(4 + rng.below(static_cast<uint64_t>(cfg.vocab_size - 4))));
    return d;
  };
  std::vector<int32_t> doc1 = doc(9);
  doc1.push_back(kTestEos);
  const std::vector<int32_t> doc2a = doc(6), doc2b = doc(7);

  std::vector<int32_t> packed = doc1;
  packed.insert(packed.end(), doc2a.begin(), doc2a.end());
  Model::DecodeState st = model.init_decode(1);
  std::vector<double> got = prefill_logits(model, st, packed, true);
  std::vector<double> more = decode_all(model, st, doc2b);
  got.insert(got.end(), more.begin(), more.end());

  Model::DecodeState fresh = model.init_decode(1);
  std::vector<double> want = prefill_logits(model, fresh, doc2a, false);
  more = decode_all(model, fresh, doc2b);
  want.insert(want.end(), more.begin(), more.end());
  {
    SCOPED_TRACE("prefill across a document boundary");
    expect_close(got, want, tol, "logits");
  }

  // Two rows decoding together: row 0 runs doc1 then starts doc2, row 1 runs one document
  // throughout (so the rows sit at different positions after the restart).
  std::vector<int32_t> doc2 = doc2a;
  doc2.insert(doc2.end(), doc2b.begin(), doc2b.end());
  std::vector<int32_t> row0 = doc1;
  row0.insert(row0.end(), doc2.begin(), doc2.end());
  const std::vector<int32_t> row1 = doc(static_cast<int64_t>(row0.size()));
  const auto n = static_cast<int64_t>(row0.size()), n1 = static_cast<int64_t>(doc1.size());
  const int64_t V = cfg.vocab_size;
  Model::DecodeState stepped = model.init_decode(2);
  const std::vector<double> both = decode_all(model, stepped, {row0, row1}, {n1, -1});
  Model::DecodeState empty = model.init_decode(1);
  want = decode_all(model, empty, doc2);
  got.assign(both.begin() + n1 * V, both.begin() + n * V);
  {
    SCOPED_TRACE("decode_step across a document boundary (start_document)");
    expect_close(got, want, tol, "logits");
  }
  Model::DecodeState single = model.init_decode(1);
  want = decode_all(model, single, row1);
  got.assign(both.begin() + n * V, both.end());
  {
    SCOPED_TRACE("the other row decodes on undisturbed");
    expect_close(got, want, tol, "logits");
  }

  // One prefill of rows whose last documents are 1, 2 and 12 tokens long (12: past the tiny models'
  // windows, filters and chunks), then decoding on: each row as its last document prefilled alone.
  const std::vector<std::vector<int32_t>> lasts = {doc(1), doc(2), doc(12)};
  std::vector<std::vector<int32_t>> rows = {doc(10), doc(3), {}};
  rows[0].push_back(kTestEos);
  rows[1].push_back(kTestEos);
  const std::vector<int32_t> middle = doc(5);
  rows[1].insert(rows[1].end(), middle.begin(), middle.end());
  rows[1].push_back(kTestEos);
  for (size_t b = 0; b < rows.size(); ++b) rows[b].insert(rows[b].end(), lasts[b].begin(), lasts[b].end());
  const std::vector<std::vector<int32_t>> next = {doc(4), doc(4), doc(4)};
  Model::DecodeState batch = model.init_decode(3);
  const std::vector<double> first = prefill_logits(model, batch, rows, true), then = decode_all(model, batch, next);
  const int64_t steps = static_cast<int64_t>(next[0].size());
  for (int64_t b = 0; b < 3; ++b) {
    SCOPED_TRACE("a batched prefill, row " + std::to_string(b) + " ending in a document of " +
                 std::to_string(lasts[static_cast<size_t>(b)].size()) + " tokens");
    Model::DecodeState alone = model.init_decode(1);
    want = prefill_logits(model, alone, lasts[static_cast<size_t>(b)], false);
    more = decode_all(model, alone, next[static_cast<size_t>(b)]);
    want.insert(want.end(), more.begin(), more.end());
    got.assign(first.begin() + b * V, first.begin() + (b + 1) * V);
    got.insert(got.end(), then.begin() + b * steps * V, then.begin() + (b + 1) * steps * V);
    expect_close(got, want, tol, "logits");
  }
}

}  // namespace linac::test

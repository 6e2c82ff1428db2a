// Document packing on the CPU (data.packing "document", docs/data.md "Packing"): the bounds the
// loader derives from EOS tokens; RoPE positions restarting at documents; for every architecture
// that supports it, a packed window of several documents against each document run alone (losses
// per token and gradients, fp64 and fp32) and decoding across a document boundary; the clear
// refusal of the others; config checks; exact resume and `linac eval --packing` end to end.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "config/config.h"
#include "data/documents.h"
#include "document_checks.h"
#include "gla/gla.h"
#include "model/mixers/gla.h"
#include "model/model.h"
#include "model/registry.h"
#include "model_checks.h"
#include "mpi_run.h"
#include "rope/rope.h"
#include "test_util.h"
#include "train_fixture.h"

namespace linac::test_documents {
namespace {

std::vector<int32_t> row(const Tensor& t, int64_t part, int64_t b, int64_t T) {
  const int32_t* p = t.data<int32_t>() + (part * t.size(1) + b) * T;
  return {p, p + T};
}

TEST(DocBounds, FromEosTokens) {
  // Row 0: "a b EOS | c EOS | d e" (window ends mid-document); row 1: no EOS; row 2 ends with EOS.
  const std::vector<int32_t> tokens = {5, 6, 3, 7, 3, 8, 9,  //
                                       5, 5, 5, 5, 5, 5, 5,  //
                                       3, 4, 4, 4, 4, 4, 3};
  OwnedTensor out(DType::I32, Device::CPU, {2, 3, 7});
  doc_bounds_from_tokens(tokens.data(), 3, 7, 3, out->data<int32_t>());
  EXPECT_EQ(row(out, 0, 0, 7), (std::vector<int32_t>{0, 0, 0, 3, 3, 5, 5}));
  EXPECT_EQ(row(out, 1, 0, 7), (std::vector<int32_t>{3, 3, 3, 5, 5, 7, 7}));
  EXPECT_EQ(row(out, 0, 1, 7), (std::vector<int32_t>(7, 0)));
  EXPECT_EQ(row(out, 1, 1, 7), (std::vector<int32_t>(7, 7)));
  // A leading EOS is a one-token document; the final EOS belongs to the document it ends.
  EXPECT_EQ(row(out, 0, 2, 7), (std::vector<int32_t>{0, 1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(row(out, 1, 2, 7), (std::vector<int32_t>{1, 7, 7, 7, 7, 7, 7}));
  // Starts: row 0 at 0, 3, 5; row 1 at 0; row 2 at 0, 1 (its final EOS starts nothing in the row).
  EXPECT_DOUBLE_EQ(mean_doc_length(tokens.data(), 3, 7, 3), 21.0 / 6.0);
}

// Positions restart at every document: rotating a packed row equals rotating each document alone.
TEST(DocBounds, RopePositionsRestartAtDocuments) {
  const int64_t T = 13, H = 2, D = 8;
  const std::vector<int32_t> tokens = {5, 5, 3, 5, 5, 5, 5, 3, 5, 3, 5, 5, 5};
  OwnedTensor docs(DType::I32, Device::CPU, {2, 1, T});
  doc_bounds_from_tokens(tokens.data(), 1, T, 3, docs->data<int32_t>());
  OwnedTensor x = test::random_tensor({1, T, H, D}, DType::F64, 3), ref = test::random_tensor({1, T, H, D}, DType::F64, 3);
  const DocBounds bounds{docs->data<int32_t>(), docs->data<int32_t>() + T};
  rope_fwd(Ctx{}, x, 10000.0, 0, bounds);
  for (const auto [s, n] : {std::pair<int64_t, int64_t>{0, 3}, {3, 5}, {8, 2}, {10, 3}})
    rope_fwd(Ctx{}, ref->narrow(1, s, n), 10000.0, 0);
  EXPECT_EQ(test::max_abs_diff(to_doubles(x), to_doubles(ref)), 0.0);
  rope_bwd(Ctx{}, x, 10000.0, 0, bounds);
  const OwnedTensor orig = test::random_tensor({1, T, H, D}, DType::F64, 3);
  EXPECT_LT(test::max_abs_diff(to_doubles(x), to_doubles(orig)), 1e-14);
}

// The GLA core with the document-start gate (model/mixers/gla.h): a sequence whose gate is
// gla_doc_start_gate at each document start gives each document's outputs and gradients as if it
// ran alone (dg at the starts aside: the mixer zeroes it there). Documents of 1 to 8 tokens over
// chunks of 8 (sub-chunks of 4), one starting at a chunk boundary.
template <class F>
void check_gla_reset(DType dt, double tol) {
  const int64_t T = 21, H = 2, Dk = 4, Dv = 8;
  const std::vector<int64_t> starts = {0, 1, 8, 11, 12, 13, 21};
  const OwnedTensor q = test::random_tensor({1, T, H, Dk}, dt, 1), k = test::random_tensor({1, T, H, Dk}, dt, 2);
  const OwnedTensor v = test::random_tensor({1, T, H, Dv}, dt, 3), du = test::random_tensor({1, T, H, Dv}, dt, 4);
  const OwnedTensor g = test::random_tensor({1, T, H, Dk}, dt, 5, -0.5, 0.0);
  for (size_t d = 1; d + 1 < starts.size(); ++d)
    std::fill_n(g->template data<F>() + starts[d] * H * Dk, H * Dk, static_cast<F>(gla_doc_start_gate(dt)));
  GlaOpts go;
  go.chunk = 8;
  go.sub_chunk = 4;
  go.scale = 0.5;
  struct Out {
    OwnedTensor o, dq, dk, dv, dg;
  };
  auto fresh = [&] {
    return Out{OwnedTensor(dt, Device::CPU, {1, T, H, Dv}), OwnedTensor(dt, Device::CPU, {1, T, H, Dk}),
               OwnedTensor(dt, Device::CPU, {1, T, H, Dk}), OwnedTensor(dt, Device::CPU, {1, T, H, Dv}),
               OwnedTensor(dt, Device::CPU, {1, T, H, Dk})};
  };
  auto run = [&](Out& r, int64_t t0, int64_t n) {
    auto nt = [&](const Tensor& x) { return x.narrow(1, t0, n); };
    gla_fwd(Ctx{}, nt(q), nt(k), nt(v), nt(g), nt(r.o), Tensor(), Tensor(), go);
    gla_bwd(Ctx{}, nt(q), nt(k), nt(v), nt(g), nt(du), Tensor(), Tensor(), nt(r.dq), nt(r.dk), nt(r.dv), nt(r.dg),
            Tensor(), go);
  };
  Out packed = fresh(), alone = fresh();
  run(packed, 0, T);
  for (size_t d = 0; d + 1 < starts.size(); ++d) run(alone, starts[d], starts[d + 1] - starts[d]);
  // dg at a start: the packed run's is the start gate's (a constant to the mixer), not the document's.
  for (size_t d = 1; d + 1 < starts.size(); ++d) {
    std::fill_n(packed.dg->template data<F>() + starts[d] * H * Dk, H * Dk, F(0));
    std::fill_n(alone.dg->template data<F>() + starts[d] * H * Dk, H * Dk, F(0));
  }
  const char* names[] = {"o", "dq", "dk", "dv", "dg"};
  const OwnedTensor* got[] = {&packed.o, &packed.dq, &packed.dk, &packed.dv, &packed.dg};
  const OwnedTensor* want[] = {&alone.o, &alone.dq, &alone.dk, &alone.dv, &alone.dg};
  for (int i = 0; i < 5; ++i)
    EXPECT_LT(test::max_abs_diff(to_doubles(*got[i]), to_doubles(*want[i])), tol) << names[i];
}

TEST(Documents, GlaStartGateSeparatesDocuments) {
  check_gla_reset<double>(DType::F64, 1e-12);
  check_gla_reset<float>(DType::F32, 2e-5);
}

// Layouts over T = 21 (3 rows): documents of one token, shorter than a chunk (8 in the tiny GLA),
// starting exactly at a chunk boundary (8, 16), a row that is one document.
const std::vector<std::vector<int64_t>> kLayouts = {{1, 7, 5, 8}, {21}, {3, 1, 1, 3, 8, 5}};

struct DocCase {
  std::string name;
  ModelConfig cfg;
};

std::vector<DocCase> supported_cases() {
  ModelConfig tf = test::tiny_model(2, 16, 2, 11, 24);
  tf.init_std = 0.3;
  ModelConfig window = tf;  // a sliding window of 4 keys, then full attention
  window.layers = {"sliding_window", "attention"};
  window.mixers = {{"sliding_window", {{"window", 4}}}};
  ModelConfig norope = tf;
  norope.mixer = {{"rope", false}};
  ModelConfig gla = test::tiny_model(2, 16, 2, 11, 24, "gla");
  gla.init_std = 0.3;
  gla.mixer = {{"gate_rank", 4}, {"chunk", 8}};
  return {{"transformer", tf}, {"transformer_window", window}, {"transformer_no_rope", norope}, {"gla", gla}};
}

TEST(Documents, PackedWindowEqualsDocumentsAloneFp64) {
  for (const DocCase& c : supported_cases()) {
    SCOPED_TRACE(c.name);
    test::check_documents_match_separate(c.cfg, Ctx{}, "fp64", kLayouts, 1e-10);
  }
}

// GLA's cumulative gate sums carry the start gate (-60 per document start), which costs f32
// about 3e-5 relative in its gradients (fp64 agrees to 1e-10 above; stream packing's f32 to 1e-6).
TEST(Documents, PackedWindowEqualsDocumentsAloneFp32) {
  for (const DocCase& c : supported_cases()) {
    SCOPED_TRACE(c.name);
    test::check_documents_match_separate(c.cfg, Ctx{}, "fp32", kLayouts, c.name == "gla" ? 1e-4 : 2e-5);
  }
}

TEST(Documents, DecodingAfterABoundaryStartsFresh) {
  for (const DocCase& c : supported_cases()) {
    SCOPED_TRACE(c.name);
    test::check_document_decode(c.cfg, Ctx{}, "fp64", 1e-10);
  }
}

// Every registered architecture supports documents (each has its packed-against-alone tests here
// and in test_documents_<arch>.cpp); a mixer kind added without support would be refused in one
// line naming it (Model::check_documents).
TEST(Documents, EveryArchitectureSupportsThem) {
  for (const ArchInfo& a : architectures()) {
    SCOPED_TRACE(a.name);
    const Model m(test::tiny_config_of(a), Ctx{}, {.allocate = false});
    EXPECT_EQ(m.mixer_without_documents(), "");
    EXPECT_NO_THROW(m.check_documents());
  }
}

TEST(Documents, ConfigPacking) {
  json j = test::tiny_train_config("unused");
  EXPECT_EQ(Config::from_json(j, "c.json").data.packing, "stream");
  j["data"]["packing"] = "document";
  const Config c = Config::from_json(j, "c.json");
  EXPECT_EQ(c.data.packing, "document");
  EXPECT_EQ(Config::from_json(c.to_json(), "again").data.packing, "document");
  j["data"]["packing"] = "documents";
  try {
    Config::from_json(j, "c.json");
    ADD_FAILURE() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("data.packing"), std::string::npos) << e.what();
  }
}

// Training in document mode resumes bit for bit, as stream mode does.
TEST(Documents, ResumeIsBitIdentical) {
  json j = test::tiny_train_config("");
  j["data"]["packing"] = "document";
  test::check_resume_is_bit_identical(j);
}

// End to end: a document-mode run trains; `linac eval --packing` scores both ways and says which;
// `linac generate` decodes the checkpoint with document bounds.
TEST(Documents, TrainAndEvalFromTheCli) {
  if (!test::have_linac_binary()) GTEST_SKIP() << "LINAC_BIN not set";
  const std::string dir = test::fresh_dir("documents_cli");
  json j = test::tiny_train_config(dir + "/run");
  j["data"]["packing"] = "document";
  j["train"]["steps"] = 3;
  j["train"]["checkpoint_every"] = 3;
  const std::string cfg = test::write_config(dir, j);
  std::string out;
  ASSERT_EQ(test::run_linac("train " + cfg, out), 0) << out;
  const std::string ckpt = test::latest_checkpoint_path(dir + "/run");
  ASSERT_EQ(test::run_linac("eval --checkpoint " + ckpt + " --json", out), 0) << out;
  EXPECT_NE(out.find("\"packing\": \"document\""), std::string::npos) << out;
  const double doc_loss = json::parse(out.substr(out.find('{')))["loss"].get<double>();
  ASSERT_EQ(test::run_linac("eval --checkpoint " + ckpt + " --packing stream --json", out), 0) << out;
  const double stream_loss = json::parse(out.substr(out.find('{')))["loss"].get<double>();
  EXPECT_NE(doc_loss, stream_loss);
  EXPECT_EQ(test::run_linac("eval --checkpoint " + ckpt + " --packing docs", out), 2) << out;
  EXPECT_NE(out.find("--packing must be stream or document"), std::string::npos) << out;
  // generate decodes a document-trained checkpoint with bounds, restarting after sampled EOS tokens.
  ASSERT_EQ(test::run_linac("generate --checkpoint " + ckpt + " --prompt 'the cat' --max-new-tokens 40 --batch 2 --json",
                            out),
            0)
      << out;
}

}  // namespace
}  // namespace linac::test_documents

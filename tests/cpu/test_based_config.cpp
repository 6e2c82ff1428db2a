// The shipped Based configs: the paper's layer positions and sizes (docs/based.md §1.2) give the paper's
// parameter counts exactly (363m and 1.35b: docs/based.md §1.2 and §12).
#include <string>

#include "config/config.h"
#include "model/layer_plan.h"
#include "model/model.h"
#include "test_util.h"

namespace linac::test_based_config {
namespace {

Config shipped(const std::string& name) { return load_config(std::string(LINAC_TEST_SOURCE_DIR) + "/configs/" + name); }

std::vector<int64_t> positions(const Config& c, const std::string& kind) {
  std::vector<int64_t> at;
  const auto plan = resolve_layers(c.model, c.source);
  for (size_t l = 0; l < plan.size(); ++l)
    if (plan[l].kind == kind) at.push_back(static_cast<int64_t>(l));
  return at;
}

TEST(BasedConfigs, PaperSizesAndParameterCounts) {
  struct Expect {
    const char* file;
    int64_t params;
    std::vector<int64_t> taylor, window;
    int64_t conv_layers;
  };
  const Expect cases[] = {
      {"based_360m.json", 362620928, {1, 6, 11, 16, 21}, {2, 7, 12, 17, 22}, 17},
      {"based_1.3b.json", 1349453056, {1, 6, 11, 16, 21, 27, 33}, {2, 7, 12, 17, 22, 28, 34}, 22},
  };
  for (const Expect& e : cases) {
    const Config c = shipped(e.file);
    EXPECT_EQ(positions(c, "taylor"), e.taylor) << e.file;
    EXPECT_EQ(positions(c, "sliding_window"), e.window) << e.file;
    EXPECT_EQ(static_cast<int64_t>(positions(c, "base_conv").size()), e.conv_layers) << e.file;
    Model m(c.model, Ctx{}, {.precision = "fp32", .allocate = false});
    EXPECT_EQ(m.n_params(), e.params) << e.file;
  }
}

TEST(BasedConfigs, QuickstartUsesEveryLayerKind) {
  const Config c = shipped("based_quickstart.json");
  EXPECT_FALSE(positions(c, "taylor").empty());
  EXPECT_FALSE(positions(c, "sliding_window").empty());
  EXPECT_FALSE(positions(c, "base_conv").empty());
}

}  // namespace
}  // namespace linac::test_based_config

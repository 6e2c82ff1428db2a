// linac train CONFIG.json [--set key.path=value]... [--resume auto|PATH]
#include <cstdio>

#include "cli/args.h"
#include "cli/commands.h"
#include "config/config.h"
#include "core/error.h"
#include "train/trainer.h"

namespace linac::cli {

namespace {
const char* kUsage =
    "usage: linac train CONFIG.json [--set key.path=value]... [--resume auto|PATH]\n\n"
    "Trains the model of CONFIG.json (docs/config.md lists every key). The whole config is\n"
    "validated before any work starts. --set overrides one key (value parsed as JSON, else a\n"
    "string), e.g. --set train.lr=1e-3 --set train.out_dir=runs/x. Outputs go to train.out_dir:\n"
    "config.json, train.log, metrics.jsonl, ckpt/. --resume auto continues from the newest\n"
    "checkpoint there (or starts fresh when there is none); --resume PATH from that checkpoint.\n"
    "SIGINT/SIGTERM finish the current step, write a checkpoint and exit 0.\n";
}  // namespace

int cmd_train(int argc, char** argv) {
  Args args(argc, argv, kUsage);
  if (args.help()) {
    std::printf("%s", kUsage);
    return 0;
  }
  const auto sets = args.get_all("set");
  const std::string resume = args.get_or("resume", "");
  if (args.get("resume") && resume.empty()) throw UserError("--resume is empty; give auto or a checkpoint's path");
  const auto pos = args.positionals();
  args.finish();
  if (pos.size() != 1) throw UserError("expected one CONFIG.json argument (see --help)");
  const Config cfg = load_config(pos[0], sets);
  return blaming_sets(cfg, [&] { return run_training(cfg, resume); });
}

}  // namespace linac::cli

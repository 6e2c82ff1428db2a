// A tiny prepared dataset and config for training-level tests: synthetic sentences from a
// small grammar (learnable structure, never constant), a 300-piece tokenizer, a 2-layer model.
#pragma once

#include <string>
#include <vector>

#include "config/config.h"

namespace linac::test {

// Prepares (once per process) a token file under a temp dir and returns its path.
const std::string& tiny_dataset();
// Trains tiny_train_config(fresh_dir(name)) for `steps` steps; returns its last checkpoint.
std::string tiny_checkpoint(const std::string& name, int64_t steps);
// A token dataset of the text files in text_dir at out (a SentencePiece model of 300 pieces
// trained on them, a tenth of the documents for validation); returns out.
std::string prepare_small_dataset(const std::string& text_dir, const std::string& out);
// A fresh temp directory for one test; removed at the process's end when all its tests passed.
std::string fresh_dir(const std::string& name);
// A small transformer config on tiny_dataset() writing to out_dir.
json tiny_train_config(const std::string& out_dir);
// Runs the linac binary (LINAC_BIN) with args; returns the exit status (128 + signal when it was
// killed); stderr+stdout in `output`. `shell_prefix` runs first in the same /bin/sh, e.g.
// "ulimit -f 100;" to make large writes fail (linac ignores SIGXFSZ, so they fail with EFBIG).
int run_linac(const std::string& args, std::string& output, const std::string& shell_prefix = "");
bool have_linac_binary();
// tiny_train_config on the GPU for the 2-GPU data-parallel tests: d_model 128, bf16, micro-batches
// of 2, no clipping (a norm summed from shards agrees to rounding only), 0.25 MB buckets (several,
// one split between two shards).
json two_gpu_train_config(const std::string& out_dir);
// The checkpoint `--resume auto` would take in out_dir ("" when there is none).
std::string latest_checkpoint_path(const std::string& out_dir);
// The whole content of a checkpoint as CheckpointReader hands it out (config, state, tokenizer,
// parameters and moments), for bit-exact comparisons.
std::vector<std::string> checkpoint_contents(const std::string& path);
// Every fp32 value of a checkpoint group ("params", "optim/m", "optim/v" in parameter order, or
// "buffers" in buffer order), concatenated.
std::vector<float> read_all_f32(const std::string& path, const std::string& group);
// The checkpoint of `step` in out_dir: the sharded directory a multi-rank run writes, else the file.
std::string checkpoint_at(const std::string& out_dir, int64_t step);
// Trains `cfg` (6 steps, checkpoints every 3) twice; rolls the second run back to step 3 and
// resumes it; expects parameters and AdamW moments at step 6 to be identical bit for bit.
// `extra_groups` are compared too (e.g. "buffers").
void check_resume_is_bit_identical(json cfg, const std::vector<std::string>& extra_groups = {});

}  // namespace linac::test

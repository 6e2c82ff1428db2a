#include "cli/commands.h"

namespace linac::cli {

const std::vector<Command>& commands() {
  static const std::vector<Command> table = {
      {"prepare", "tokenise text into an HDF5 token dataset (trains a SentencePiece model)", cmd_prepare},
      {"train", "train a model from a JSON config (checkpointed, exactly resumable)", cmd_train},
      {"eval", "loss, perplexity and bits per byte of a checkpoint on a dataset split", cmd_eval},
      {"info", "parameters, layer table and memory plan of a config or checkpoint", cmd_info},
      {"bench", "time training steps (tokens/s, MFU, memory) or single ops", cmd_bench},
  };
  return table;
}

}  // namespace linac::cli

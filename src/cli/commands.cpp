#include "cli/commands.h"

namespace linac::cli {

const std::vector<Command>& commands() {
  static const std::vector<Command> table = {
      {"prepare", "tokenise text into an HDF5 token dataset (trains a SentencePiece model)", cmd_prepare},
      {"train", "train a model from a JSON config (checkpointed, exactly resumable)", cmd_train, true},
      {"eval", "loss, perplexity and bits per byte of a checkpoint on a dataset split", cmd_eval},
      {"info", "parameters, layer table and memory plan of a config or checkpoint", cmd_info},
      {"generate", "sample text from a checkpoint (prefill, then KV-cache / recurrent decoding)", cmd_generate},
      {"export", "write a checkpoint's weights as safetensors or a Hugging Face Llama folder", cmd_export},
      {"import", "read a Hugging Face Llama folder (safetensors) into a linac checkpoint", cmd_import},
      {"bench", "time training steps, generation (prefill/decode tokens/s) or single ops", cmd_bench, true},
  };
  return table;
}

}  // namespace linac::cli

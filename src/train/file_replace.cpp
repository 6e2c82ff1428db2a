#include "train/file_replace.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "train/checkpoint_file.h"

namespace linac {

void replace_file(const std::string& path, const std::string& text, bool durable) {
  namespace fs = std::filesystem;
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  const auto failed = [&](int err) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    return UserError("cannot write " + path + ": " + std::strerror(err));
  };
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text << std::flush;
    if (!out) throw failed(errno);
  }
  if (durable)
    if (const int err = sync_path(tmp, false)) throw failed(err);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw failed(errno);
  if (durable) sync_path(fs::path(path).parent_path().string(), true);
}

}  // namespace linac

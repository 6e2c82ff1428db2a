// Replacing a small file whole (the run's `latest` pointer, metrics.jsonl cut back on a resume, a
// GEMM algorithm table): the text goes to PATH.tmp-PID and a rename puts it in place, so a reader
// sees the old file or the new one, never part of one.
#pragma once

#include <string>

namespace linac {

// Writes `text` over `path` as above; with `durable`, the temp file is fsynced before the rename
// and the directory after it. A failed write or rename removes the temp file and throws
// UserError("cannot write PATH: why"), leaving `path` as it was. A temp file left by a process
// killed in between is what run_lock's stale-file sweep removes.
void replace_file(const std::string& path, const std::string& text, bool durable);

}  // namespace linac

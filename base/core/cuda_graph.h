// A CUDA graph of the work one function launches on a context's stream, replayed with a single
// launch: for a sequence of many short kernels whose arguments do not change between calls (a
// decoding step, generate/decode_graph.h), the replay saves each kernel's launch overhead.
//
// capture(ctx, fn) runs fn once with the stream in capture mode: fn's host code runs, its
// launches are recorded instead of executed, and fn must not synchronise or allocate device
// memory (a failed capture is an Error naming the CUDA error). launch(ctx)
// executes the recorded work on the stream. The graph keeps the addresses fn's launches used.
#pragma once

#include <functional>

#include "core/gpu.h"

namespace linac {

class CudaGraph {
 public:
  CudaGraph() = default;
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  void capture(const Ctx& ctx, const std::function<void()>& fn);  // replaces a previous capture
  void launch(const Ctx& ctx) const;
  bool captured() const { return exec_ != nullptr; }
  void reset();

 private:
  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
};

}  // namespace linac

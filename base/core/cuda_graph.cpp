#include "core/cuda_graph.h"

#include <string>

#include "core/error.h"

#if LINAC_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda_check.h"
#endif

namespace linac {

CudaGraph::~CudaGraph() { reset(); }

#if LINAC_WITH_CUDA

void CudaGraph::reset() {
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
  exec_ = graph_ = nullptr;
}

void CudaGraph::capture(const Ctx& ctx, const std::function<void()>& fn) {
  LINAC_CHECK(ctx.is_gpu(), "CudaGraph::capture: needs a GPU context");
  reset();
  auto stream = static_cast<cudaStream_t>(ctx.stream);
  // Thread-local: other threads (a checkpoint writer) may use CUDA meanwhile; this one may not
  // call anything that is unsafe during a capture.
  LINAC_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  cudaGraph_t graph = nullptr;
  try {
    fn();
  } catch (...) {
    cudaStreamEndCapture(stream, &graph);
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    throw;
  }
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  if (end != cudaSuccess) {
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    LINAC_FAIL(std::string("CudaGraph::capture: the stream capture failed: ") + cudaGetErrorString(end));
  }
  graph_ = graph;
  cudaGraphExec_t exec = nullptr;
  LINAC_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  exec_ = exec;
}

void CudaGraph::launch(const Ctx& ctx) const {
  LINAC_CHECK(exec_, "CudaGraph::launch: nothing captured");
  LINAC_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), static_cast<cudaStream_t>(ctx.stream)));
}

#else  // CPU-only build

void CudaGraph::reset() {}
void CudaGraph::capture(const Ctx&, const std::function<void()>&) {
  throw UserError("this linac was built without CUDA; rebuild with a CUDA toolkit");
}
void CudaGraph::launch(const Ctx&) const {
  throw UserError("this linac was built without CUDA; rebuild with a CUDA toolkit");
}

#endif

}  // namespace linac

#include "train/grad_squares.h"

#include <algorithm>

#include "reduce/reduce.h"

#if LINAC_WITH_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda_check.h"
#endif

namespace linac {

GradSquares::GradSquares(const ParamStore& params, const Ctx& ctx, const std::vector<std::vector<int>>& groups)
    : params_(params), ctx_(ctx), side_(ctx), group_of_(static_cast<size_t>(params.count()), -1) {
  LINAC_CHECK(!params.grads_sharded(), "GradSquares: the gradients are split over the ranks (ZeRO-2)");
  int64_t slots = 0;
  for (const auto& group : groups) {
    std::vector<Run> runs;
    for (const ParamStore::FlatRun& r : params.flat_runs(group)) {
      for (int id : r.ids) {
        LINAC_CHECK(group_of_[static_cast<size_t>(id)] < 0,
                    "GradSquares: " + params.spec(id).name + " is in two gradient groups");
        group_of_[static_cast<size_t>(id)] = static_cast<int>(runs_.size());
      }
      runs.push_back({r.lo, r.hi});  // the padding inside a run is zero
    }
    first_slot_.push_back(slots);
    slots += static_cast<int64_t>(runs.size());
    runs_.push_back(std::move(runs));
  }
  for (int id = 0; id < params.count(); ++id)
    LINAC_CHECK(group_of_[static_cast<size_t>(id)] >= 0,
                "GradSquares: " + params.spec(id).name + " is in no gradient group");
  slots_ = OwnedTensor(params.master_dtype(), ctx.device, {std::max<int64_t>(slots, 1)});
#if LINAC_WITH_CUDA
  if (ctx.is_gpu()) {
    cudaStream_t s;
    LINAC_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    side_.stream = s;
    side_workspace_ = Buffer(kReduceWorkspaceBytes, ctx.device);
    side_.workspace = side_workspace_.data();
    side_.workspace_bytes = side_workspace_.bytes();
    side_.profiler = nullptr;  // the profiler times the compute stream's phases only
    for (void** e : {&ev_ready_, &ev_done_}) {
      cudaEvent_t ev;
      LINAC_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
      *e = ev;
    }
  }
#endif
}

GradSquares::~GradSquares() {
#if LINAC_WITH_CUDA
  if (side_.stream != ctx_.stream) {
    cudaStreamSynchronize(as_stream(side_.stream));
    cudaStreamDestroy(as_stream(side_.stream));
    for (void* e : {ev_ready_, ev_done_}) cudaEventDestroy(as_event(e));
  }
#endif
}

void GradSquares::on_ready(const std::vector<int>& ids) {
  if (ids.empty()) return;
  const auto g = static_cast<size_t>(group_of_[static_cast<size_t>(ids.front())]);
#if LINAC_WITH_CUDA
  if (ctx_.is_gpu()) {
    LINAC_CUDA_CHECK(cudaEventRecord(as_event(ev_ready_), as_stream(ctx_.stream)));
    LINAC_CUDA_CHECK(cudaStreamWaitEvent(as_stream(side_.stream), as_event(ev_ready_), 0));
  }
#endif
  const Tensor grad = params_.flat_grad();
  for (size_t r = 0; r < runs_[g].size(); ++r) {
    const int64_t slot = first_slot_[g] + static_cast<int64_t>(r);
    sum_squares(side_, grad.slice0(runs_[g][r].lo, runs_[g][r].hi), slots_->slice0(slot, slot + 1));
  }
}

void GradSquares::join() {
#if LINAC_WITH_CUDA
  if (ctx_.is_gpu()) {
    LINAC_CUDA_CHECK(cudaEventRecord(as_event(ev_done_), as_stream(side_.stream)));
    LINAC_CUDA_CHECK(cudaStreamWaitEvent(as_stream(ctx_.stream), as_event(ev_done_), 0));
  }
#endif
}

double GradSquares::total() const {
  double sum = 0;
  for (double s : to_doubles(ctx_, slots_)) sum += s;
  return sum;
}

}  // namespace linac

// GradSquares: the gradient norm's sums of squares, taken while the backward pass of a step's
// last micro-batch is still running (one process, gradients not sharded).
//
// The clipping norm needs every gradient once it is final, and read after the backward that pass
// is a memory-bound sweep over the whole gradient buffer (5.4 GB and about 1.9 ms per step at
// 1.3B parameters on an H100) during which the tensor cores idle. The model reports each group of
// Model::grad_groups() once its gradients are final (the hooks of Model::set_grad_hooks, as the
// data-parallel reduction uses them); in the last micro-batch each such group's sum of squares is
// taken on a side stream after an event on the compute stream, so it runs beside the backward's
// GEMMs, which leave DRAM bandwidth over. join() makes the compute stream wait for the side
// stream; total() then adds the groups' sums in group order.
//
// A group's parameters that are neighbours in the flat buffer form one run (their padding, which
// stays zero, included), so a group costs a launch or two. Each run's sum goes to its own slot and
// the slots are added on the host in a fixed order: the norm depends on the data only, replays of
// a captured step (core/cuda_graph.h; the side stream joins the capture through the events) give
// the same bits as eager steps. The reduction kernels on the side stream get a workspace of their
// own, since the compute stream's is in use meanwhile. On the CPU the sums are taken at once.
#pragma once

#include <cstdint>
#include <vector>

#include "core/buffer.h"
#include "core/gpu.h"
#include "model/param_store.h"

namespace linac {

class GradSquares {
 public:
  // `groups`: Model::grad_groups(); every parameter must be in exactly one of them.
  GradSquares(const ParamStore& params, const Ctx& ctx, const std::vector<std::vector<int>>& groups);
  ~GradSquares();
  GradSquares(const GradSquares&) = delete;
  GradSquares& operator=(const GradSquares&) = delete;

  // The model's ready hook: the gradients of the group holding `ids` are final.
  void on_ready(const std::vector<int>& ids);
  // After the backward that called on_ready for every group: the compute stream waits for the
  // side stream's sums.
  void join();
  // The sum of squares of every gradient (after join; reads the slots, a sync of the compute stream).
  double total() const;

 private:
  struct Run {
    int64_t lo = 0, hi = 0;  // in the flat gradient buffer
  };
  const ParamStore& params_;
  Ctx ctx_, side_;                      // the compute stream's and the side stream's contexts
  std::vector<std::vector<Run>> runs_;  // by group
  std::vector<int64_t> first_slot_;     // by group: its first run's slot
  std::vector<int> group_of_;           // by parameter id
  OwnedTensor slots_;                   // a sum per run, in master dtype
  Buffer side_workspace_;
  void *ev_ready_ = nullptr, *ev_done_ = nullptr;
};

}  // namespace linac

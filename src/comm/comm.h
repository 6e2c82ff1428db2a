// Comm: the processes of a data-parallel job and their collectives.
//
// Launched by mpirun (OpenMPI/PMIx environment present), linac initialises MPI; otherwise it is
// a single process and never touches MPI. Backends:
//   single  world of one; every collective is the identity
//   mpi     CPU tensors, and GPU tensors when NCCL is unavailable (through host memory)
//   nccl    GPU tensors; rank 0 creates the ncclUniqueId, MPI broadcasts it
// Each rank uses GPU local_rank % device_count (local rank: its rank among the processes of its
// host, from MPI_Comm_split_type, whatever the launcher).
// Host-side collectives (scalars, loader states, stop flags) always go through MPI.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/gpu.h"
#include "core/tensor.h"

namespace linac {

class Comm {
 public:
  // `device` is where gradients live; selects NCCL for CUDA when built with it and world > 1.
  static std::unique_ptr<Comm> create(Device device);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }
  int local_rank() const { return local_rank_; }
  bool is_root() const { return rank_ == 0; }
  const char* backend() const;

  // In-place sum over ranks of a contiguous f32/f64/bf16 tensor. GPU tensors: enqueued on `stream`
  // (a cudaStream_t) for NCCL; the MPI fallback synchronises `stream` first and copies through
  // the host. bf16 sums round every addition to bf16, as NCCL does (over MPI in MPI's order of
  // the ranks: with 2 ranks both give the correctly rounded sum, with more they may differ).
  void allreduce_sum(const Tensor& t, void* stream);
  // ZeRO's collectives on contiguous tensors (f32/f64/bf16), enqueued like allreduce_sum:
  // reduce_sum: the sum over ranks of `send` lands in `root`'s `recv` (recv may be send, in
  // place; the others' recv is not written, and in place their send is left undefined).
  void reduce_sum(const Tensor& send, const Tensor& recv, int root, void* stream);
  // reduce_scatter_sum, in place: t splits into world equal chunks; rank r's chunk r receives the sum over
  // ranks of chunk r (the other chunks are left undefined).
  void reduce_scatter_sum(const Tensor& t, void* stream);
  // allgather: every rank's chunk r (of world equal chunks) is copied from rank r (f32/f64/bf16).
  void allgather(const Tensor& t, void* stream);
  // Host f32 pieces of equal length, concatenated in rank order into `out` on rank 0 (out is
  // ignored elsewhere).
  void gather_to_root(const std::vector<float>& piece, std::vector<float>& out) const;
  double sum(double v) const;
  int64_t max(int64_t v) const;
  // Every rank's vector (all of the same length), in rank order.
  std::vector<std::vector<int64_t>> allgather(const std::vector<int64_t>& v) const;
  void barrier() const;

 private:
  Comm() = default;
  int rank_ = 0, world_ = 1, local_rank_ = 0;
  bool mpi_ = false;
  void* nccl_ = nullptr;  // ncclComm_t
};

// True when this process was started by an MPI launcher.
bool launched_by_mpi();
// Ends every rank of an MPI job (MPI_Abort) when this process is part of one with more than
// one rank; returns otherwise. Used by the CLI after it printed an error.
void abort_job_if_distributed(int code);
// This process's rank per the launcher's environment (0 when not launched by MPI).
int launcher_rank();
// The job's number of processes per the launcher's environment (1 when not launched by MPI).
int launcher_world_size();
// Throws UserError when the launcher started more than one process: `what` (e.g. "linac eval")
// runs as one process, and N copies of it would each do the whole work (and race on its outputs).
void require_one_process(const std::string& what);

}  // namespace linac

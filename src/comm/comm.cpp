#include "comm/comm.h"

#include <mpi.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "core/buffer.h"
#include "core/error.h"

#if LINAC_WITH_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "core/cuda_check.h"
#define LINAC_NCCL_CHECK(call)                                                                  \
  do {                                                                                          \
    ncclResult_t r_ = (call);                                                                   \
    if (r_ != ncclSuccess) ::linac::fail_at(__FILE__, __LINE__, std::string(#call) + ": " + ncclGetErrorString(r_)); \
  } while (0)
#endif

#define LINAC_MPI_CHECK(call)                                                         \
  do {                                                                                \
    int rc_ = (call);                                                                 \
    if (rc_ != MPI_SUCCESS) {                                                         \
      char msg_[MPI_MAX_ERROR_STRING];                                                \
      int len_ = 0;                                                                   \
      MPI_Error_string(rc_, msg_, &len_);                                             \
      ::linac::fail_at(__FILE__, __LINE__, std::string(#call) + ": " + std::string(msg_, len_)); \
    }                                                                                 \
  } while (0)

namespace linac {

namespace {
int env_int(const char* name, int def) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : def;
}
}  // namespace

bool launched_by_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK") || std::getenv("PMI_SIZE");
}

int launcher_rank() { return env_int("OMPI_COMM_WORLD_RANK", env_int("PMIX_RANK", env_int("PMI_RANK", 0))); }

// srun --mpi=pmix sets no size variable of PMIx's own; Slurm's task count is the job's size.
int launcher_world_size() {
  if (!launched_by_mpi()) return 1;
  return env_int("OMPI_COMM_WORLD_SIZE", env_int("PMI_SIZE", env_int("SLURM_STEP_NUM_TASKS", 1)));
}

void require_one_process(const std::string& what) {
  const int n = launcher_world_size();
  if (n > 1)
    throw UserError(what + " runs as one process, but the launcher started " + std::to_string(n) +
                    ": run it without mpirun (train and bench's training steps are what use the ranks)");
}

void abort_job_if_distributed(int code) {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin) return;
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world > 1) MPI_Abort(MPI_COMM_WORLD, code);
}

std::unique_ptr<Comm> Comm::create(Device device) {
  std::unique_ptr<Comm> c(new Comm());
  if (!launched_by_mpi()) return c;
  int init = 0;
  MPI_Initialized(&init);
  if (!init) {
    int provided = 0;
    LINAC_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided));
  }
  c->mpi_ = true;
  LINAC_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &c->rank_));
  LINAC_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &c->world_));
  // The rank among this host's processes, from MPI itself rather than a launcher's environment
  // variable: the same under mpirun and srun --mpi=pmix (which sets no local-rank variable).
  MPI_Comm node = MPI_COMM_NULL;
  LINAC_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, c->rank_, MPI_INFO_NULL, &node));
  LINAC_MPI_CHECK(MPI_Comm_rank(node, &c->local_rank_));
  MPI_Comm_free(&node);
  if (device == Device::CUDA) {
    const int n = gpu_count();
    if (n == 0) throw UserError("rank " + std::to_string(c->rank_) + ": no CUDA device");
    gpu_set_device(c->local_rank_ % n);
  }
#if LINAC_WITH_NCCL
  if (device == Device::CUDA && c->world_ > 1) {
    ncclUniqueId id;
    if (c->rank_ == 0) LINAC_NCCL_CHECK(ncclGetUniqueId(&id));
    LINAC_MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD));
    ncclComm_t nc = nullptr;
    LINAC_NCCL_CHECK(ncclCommInitRank(&nc, c->world_, id, c->rank_));
    c->nccl_ = nc;
  }
#endif
  return c;
}

Comm::~Comm() {
  // Unwinding from an error: leave MPI up so the CLI can print the error and MPI_Abort the
  // whole job (finalizing here would leave the other ranks waiting in a collective).
  if (std::uncaught_exceptions() > 0) return;
#if LINAC_WITH_NCCL
  if (nccl_) ncclCommDestroy(static_cast<ncclComm_t>(nccl_));
#endif
  if (mpi_) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
  }
}

const char* Comm::backend() const {
  if (world_ == 1) return "single";
  return nccl_ ? "nccl" : "mpi";
}

namespace {

#if LINAC_WITH_NCCL
ncclDataType_t nccl_type(DType dt) {
  switch (dt) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::BF16: return ncclBfloat16;
    default: LINAC_FAIL(std::string("no NCCL type for ") + dtype_name(dt));
  }
}
#endif

// a[i] + b[i] into b for bf16 elements, rounded to bf16 once per addition as NCCL's bf16 sum
// rounds its result. The f32 sum of two bf16 values rounded to bf16 is the correctly rounded bf16
// sum: f32's 24 bits are at least 2 x 8 + 2, where rounding twice cannot differ from once.
void add_bf16(void* in, void* inout, int* len, MPI_Datatype*) {
  const bf16* a = static_cast<const bf16*>(in);
  bf16* b = static_cast<bf16*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = float_to_bf16(bf16_to_float(a[i]) + bf16_to_float(b[i]));
}

// The MPI type and sum of a tensor's dtype. MPI has no bf16: its elements travel as 16-bit
// integers, summed by add_bf16 (an operation created for the call, freed with it).
struct MpiSum {
  explicit MpiSum(DType dt) {
    LINAC_CHECK(dt == DType::F32 || dt == DType::F64 || dt == DType::BF16,
                "MPI reductions take f32/f64/bf16 tensors");
    if (dt == DType::F64) type = MPI_DOUBLE;
    if (dt != DType::BF16) return;
    type = MPI_UINT16_T;
    LINAC_MPI_CHECK(MPI_Op_create(&add_bf16, /*commute=*/1, &op));
  }
  ~MpiSum() {
    if (op != MPI_SUM) MPI_Op_free(&op);
  }
  MpiSum(const MpiSum&) = delete;
  MpiSum& operator=(const MpiSum&) = delete;
  MPI_Datatype type = MPI_FLOAT;
  MPI_Op op = MPI_SUM;
};

int mpi_count(int64_t n) {
  LINAC_CHECK(n <= INT32_MAX, "MPI collective of " + std::to_string(n) + " elements: more than an int counts");
  return static_cast<int>(n);
}

// Runs an MPI collective on a host copy of a GPU tensor (or on the tensor itself on the CPU).
template <class F>
void through_host(const Tensor& t, F&& f) {
  if (t.device == Device::CPU) {
    f(t);
    return;
  }
  OwnedTensor host(t.dtype, Device::CPU, t.dims());
  copy_tensor(host.t, t);  // device-wide synchronous: waits for the stream too
  f(host.t);
  copy_tensor(t, host.t);
}

}  // namespace

void Comm::allreduce_sum(const Tensor& t, void* stream) {
  if (world_ == 1 || t.numel() == 0) return;
  LINAC_CHECK(t.is_contiguous(), "allreduce_sum: contiguous tensors only");
#if LINAC_WITH_NCCL
  if (nccl_ && t.device == Device::CUDA) {
    LINAC_NCCL_CHECK(ncclAllReduce(t.ptr, t.ptr, static_cast<size_t>(t.numel()), nccl_type(t.dtype), ncclSum,
                                   static_cast<ncclComm_t>(nccl_), static_cast<cudaStream_t>(stream)));
    return;
  }
#endif
  (void)stream;
  through_host(t, [&](const Tensor& h) {
    const MpiSum sum(h.dtype);
    LINAC_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, h.ptr, mpi_count(h.numel()), sum.type, sum.op, MPI_COMM_WORLD));
  });
}

void Comm::reduce_sum(const Tensor& send, const Tensor& recv, int root, void* stream) {
  if (send.numel() == 0) return;
  LINAC_CHECK(send.is_contiguous() && (rank_ != root || (recv.is_contiguous() && recv.numel() == send.numel() &&
                                                         recv.dtype == send.dtype && recv.device == send.device)),
              "reduce_sum: contiguous tensors of one size, dtype and device");
  const bool in_place = send.ptr == recv.ptr;
  if (world_ == 1) {
    if (!in_place) copy_tensor(recv, send);
    return;
  }
#if LINAC_WITH_NCCL
  if (nccl_ && send.device == Device::CUDA) {
    LINAC_NCCL_CHECK(ncclReduce(send.ptr, rank_ == root ? recv.ptr : send.ptr, static_cast<size_t>(send.numel()),
                                nccl_type(send.dtype), ncclSum, root, static_cast<ncclComm_t>(nccl_),
                                static_cast<cudaStream_t>(stream)));
    return;
  }
#endif
  (void)stream;
  through_host(send, [&](const Tensor& h) {
    const MpiSum sum(h.dtype);
    const int n = mpi_count(h.numel());
    if (rank_ != root)
      LINAC_MPI_CHECK(MPI_Reduce(h.ptr, nullptr, n, sum.type, sum.op, root, MPI_COMM_WORLD));
    else if (in_place)
      LINAC_MPI_CHECK(MPI_Reduce(MPI_IN_PLACE, h.ptr, n, sum.type, sum.op, root, MPI_COMM_WORLD));
    else
      through_host(recv, [&](const Tensor& r) {
        LINAC_MPI_CHECK(MPI_Reduce(h.ptr, r.ptr, n, sum.type, sum.op, root, MPI_COMM_WORLD));
      });
  });
}

void Comm::reduce_scatter_sum(const Tensor& t, void* stream) {
  if (world_ == 1 || t.numel() == 0) return;
  LINAC_CHECK(t.is_contiguous() && t.numel() % world_ == 0, "reduce_scatter_sum: contiguous, world equal chunks");
  const int64_t chunk = t.numel() / world_;
#if LINAC_WITH_NCCL
  if (nccl_ && t.device == Device::CUDA) {
    // In place: NCCL's recvbuff = sendbuff + rank * recvcount.
    void* mine = static_cast<char*>(t.ptr) + static_cast<size_t>(rank_ * chunk) * dtype_size(t.dtype);
    LINAC_NCCL_CHECK(ncclReduceScatter(t.ptr, mine, static_cast<size_t>(chunk), nccl_type(t.dtype), ncclSum,
                                       static_cast<ncclComm_t>(nccl_), static_cast<cudaStream_t>(stream)));
    return;
  }
#endif
  (void)stream;
  through_host(t, [&](const Tensor& h) {
    OwnedTensor out(h.dtype, Device::CPU, {chunk});
    const MpiSum sum(h.dtype);
    LINAC_MPI_CHECK(MPI_Reduce_scatter_block(h.ptr, out->ptr, mpi_count(chunk), sum.type, sum.op, MPI_COMM_WORLD));
    copy_tensor(h.slice0(rank_ * chunk, (rank_ + 1) * chunk), out.t);
  });
}

void Comm::allgather(const Tensor& t, void* stream) {
  if (world_ == 1 || t.numel() == 0) return;
  LINAC_CHECK(t.is_contiguous() && t.numel() % world_ == 0, "allgather: contiguous, world equal chunks");
  const int64_t chunk = t.numel() / world_;
#if LINAC_WITH_NCCL
  if (nccl_ && t.device == Device::CUDA) {
    const void* mine = static_cast<const char*>(t.ptr) + static_cast<size_t>(rank_ * chunk) * dtype_size(t.dtype);
    LINAC_NCCL_CHECK(ncclAllGather(mine, t.ptr, static_cast<size_t>(chunk), nccl_type(t.dtype),
                                   static_cast<ncclComm_t>(nccl_), static_cast<cudaStream_t>(stream)));
    return;
  }
#endif
  (void)stream;
  through_host(t, [&](const Tensor& h) {
    const int bytes = mpi_count(chunk * static_cast<int64_t>(dtype_size(h.dtype)));
    LINAC_MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, h.ptr, bytes, MPI_BYTE, MPI_COMM_WORLD));
  });
}

void Comm::gather_to_root(const std::vector<float>& piece, std::vector<float>& out) const {
  if (world_ == 1) {
    out = piece;
    return;
  }
  if (rank_ == 0) out.resize(piece.size() * static_cast<size_t>(world_));
  const int n = mpi_count(static_cast<int64_t>(piece.size()));
  LINAC_MPI_CHECK(MPI_Gather(piece.data(), n, MPI_FLOAT, rank_ == 0 ? out.data() : nullptr, n, MPI_FLOAT, 0, MPI_COMM_WORLD));
}

double Comm::sum(double v) const {
  if (world_ == 1) return v;
  double out = 0;
  LINAC_MPI_CHECK(MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
  return out;
}

int64_t Comm::max(int64_t v) const {
  if (world_ == 1) return v;
  int64_t out = 0;
  LINAC_MPI_CHECK(MPI_Allreduce(&v, &out, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD));
  return out;
}

std::vector<std::vector<int64_t>> Comm::allgather(const std::vector<int64_t>& v) const {
  if (world_ == 1) return {v};
  std::vector<int64_t> flat(v.size() * static_cast<size_t>(world_));
  LINAC_MPI_CHECK(MPI_Allgather(v.data(), static_cast<int>(v.size()), MPI_INT64_T, flat.data(),
                                static_cast<int>(v.size()), MPI_INT64_T, MPI_COMM_WORLD));
  std::vector<std::vector<int64_t>> out;
  for (int r = 0; r < world_; ++r)
    out.emplace_back(flat.begin() + static_cast<int64_t>(r * v.size()), flat.begin() + static_cast<int64_t>((r + 1) * v.size()));
  return out;
}

void Comm::barrier() const {
  if (world_ > 1) LINAC_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
}

}  // namespace linac

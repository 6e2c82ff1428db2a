// CUDA doc_start_fill (doc_start_fill.h): one block per token row; rows that do not start a
// document return at once.
#include <algorithm>

#include "common/cuda_common.cuh"
#include "elementwise/doc_start_fill.h"

namespace linac {
namespace {

template <class T>
__global__ void doc_start_fill_kernel(T* __restrict__ x, const int32_t* __restrict__ doc_start, int T_len, int64_t C,
                                      float value) {
  const int64_t row = blockIdx.x;
  const int t = static_cast<int>(row % T_len);
  if (t == 0 || doc_start[row] != t) return;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) x[row * C + c] = cuda::from_float<T>(value);
}

}  // namespace

void doc_start_fill_cuda(const Ctx& ctx, const Tensor& x, const int32_t* doc_start, double value) {
  const int64_t rows = x.size(0) * x.size(1), C = x.numel() / std::max<int64_t>(rows, 1);
  if (rows == 0) return;
  LINAC_CHECK(x.size(1) < (int64_t{1} << 30), "doc_start_fill (GPU): T too large");
  const int threads = C >= 256 ? 256 : 64;
  const auto T_len = static_cast<int>(x.size(1));
  LINAC_GPU_DISPATCH(x.dtype, T,
                     doc_start_fill_kernel<<<static_cast<unsigned>(rows), threads, 0, cuda::stream_of(ctx)>>>(
                         x.data<T>(), doc_start, T_len, C, static_cast<float>(value)));
  LINAC_CUDA_LAUNCH_CHECK();
}

}  // namespace linac

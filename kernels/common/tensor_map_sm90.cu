// TMA descriptors through the driver's cuTensorMapEncodeTiled, reached via the
// runtime so that nothing links libcuda directly.
#include <cudaTypedefs.h>

#include "common/cuda_common.cuh"
#include "common/tensor_map.h"

namespace linac::sm90 {

namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    LINAC_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found));
    LINAC_CHECK(p && found == cudaDriverEntryPointSuccess, "TMA: the driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

}  // namespace

CUtensorMap head_rows_tensor_map(const void* base, int64_t B, int64_t T, int64_t H, int64_t D, int64_t stride_b,
                                 int64_t stride_t, int box_rows) {
  LINAC_CHECK(
      reinterpret_cast<uintptr_t>(base) % 16 == 0 && stride_t % 8 == 0 && (B == 1 || stride_b % 8 == 0) && D % 64 == 0,
      "TMA: rows must be 16-byte aligned and hold a multiple of 64 columns");
  // A batch of one never moves along its stride, which may then be anything
  // (also 0).
  const int64_t sb = B == 1 ? T * stride_t : stride_b;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(D), static_cast<cuuint64_t>(T), static_cast<cuuint64_t>(H),
                              static_cast<cuuint64_t>(B)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(stride_t) * 2, static_cast<cuuint64_t>(D) * 2,
                                 static_cast<cuuint64_t>(sb) * 2};
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(box_rows), 1, 1};
  const cuuint32_t unit[4] = {1, 1, 1, 1};
  CUtensorMap map{};
  const CUresult r = encode_tiled()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void*>(base), dims, strides,
                                    box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                    CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  LINAC_CHECK(r == CUDA_SUCCESS,
              "TMA: cuTensorMapEncodeTiled failed (error " + std::to_string(static_cast<int>(r)) + ")");
  return map;
}

}  // namespace linac::sm90

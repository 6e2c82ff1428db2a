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

CUtensorMap bf16_tensor_map(const void* base, const int64_t (&dims)[4], const int64_t (&strides)[3],
                            const int (&box)[4], int swizzle_bytes) {
  LINAC_CHECK(swizzle_bytes == 64 || swizzle_bytes == 128, "TMA: swizzle must be 64 or 128 bytes");
  LINAC_CHECK(box[0] * 2 == swizzle_bytes, "TMA: a box row must span the swizzle");
  LINAC_CHECK(
      reinterpret_cast<uintptr_t>(base) % 16 == 0 && strides[0] % 8 == 0 && strides[1] % 8 == 0 && strides[2] % 8 == 0,
      "TMA: rows must be 16-byte aligned");
  cuuint64_t d[4], st[3];
  cuuint32_t bx[4];
  for (int i = 0; i < 4; ++i) d[i] = static_cast<cuuint64_t>(dims[i]), bx[i] = static_cast<cuuint32_t>(box[i]);
  for (int i = 0; i < 3; ++i) st[i] = static_cast<cuuint64_t>(strides[i]) * 2;
  const cuuint32_t unit[4] = {1, 1, 1, 1};
  CUtensorMap map{};
  const CUresult r = encode_tiled()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void*>(base), d, st, bx, unit,
                                    CU_TENSOR_MAP_INTERLEAVE_NONE,
                                    swizzle_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
                                    CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  LINAC_CHECK(r == CUDA_SUCCESS,
              "TMA: cuTensorMapEncodeTiled failed (error " + std::to_string(static_cast<int>(r)) + ")");
  return map;
}

CUtensorMap head_rows_tensor_map(const void* base, int64_t B, int64_t T, int64_t H, int64_t D, int64_t stride_b,
                                 int64_t stride_t, int box_rows) {
  LINAC_CHECK(D % 8 == 0, "TMA: head rows must be 16-byte multiples");
  // Boxes are 64 columns wide: where D is not a multiple of 64 the last box reaches past the row,
  // and the copy engine fills those columns with zeros instead of reading the next head.
  // A batch of one never moves along its stride, which may then be anything
  // (also 0).
  const int64_t sb = B == 1 ? T * stride_t : stride_b;
  return bf16_tensor_map(base, {D, T, H, B}, {stride_t, D, sb}, {64, box_rows, 1, 1}, 128);
}

}  // namespace linac::sm90

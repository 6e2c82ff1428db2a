// TMA descriptors (CUtensorMap) for the bf16 tensors the Hopper kernels read
// tile by tile.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace linac::sm90 {

// A bf16 tensor of up to four dims, innermost first: dims[0] elements are contiguous, strides[i]
// (elements, multiples of 8) step dims[i + 1]; unused dims have size 1. A box is box[0] x box[1] x
// box[2] x box[3] elements, its rows of box[0] elements (swizzle_bytes / 2: 32 or 64) stored in
// shared memory with the 64- or 128-byte swizzle. Elements outside dims read as zero and are not
// written.
CUtensorMap bf16_tensor_map(const void* base, const int64_t (&dims)[4], const int64_t (&strides)[3],
                            const int (&box)[4], int swizzle_bytes);

// Rows of one head of a [B, T, H, D] bf16 tensor at `base` (head stride D, unit
// dim stride; batch and token strides in elements, multiples of 8): a box is
// `box_rows` consecutive tokens x 64 columns of one head, written to shared
// memory as 128-byte rows with the 128-byte swizzle. Coordinates (innermost
// first): (column, token, head, batch); tokens past T and columns past D
// (D a multiple of 8, not necessarily of 64) read as zero.
CUtensorMap head_rows_tensor_map(const void* base, int64_t B, int64_t T, int64_t H, int64_t D, int64_t stride_b,
                                 int64_t stride_t, int box_rows);

}  // namespace linac::sm90

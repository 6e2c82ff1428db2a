// LINAC_HD: a small function callable from host code and, under nvcc, from device code.
#pragma once

#if defined(__CUDACC__)
#define LINAC_HD __host__ __device__ __forceinline__
#else
#define LINAC_HD inline
#endif

// Buffer: owned memory on the host (64-byte aligned) or the GPU (cudaMalloc).
// OwnedTensor: a Buffer with a Tensor view over all of it, for tests and small state.
#pragma once

#include <cstddef>
#include <vector>

#include "core/gpu.h"
#include "core/tensor.h"

namespace linac {

class Buffer {
 public:
  Buffer() = default;
  Buffer(size_t bytes, Device device);
  ~Buffer();
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  Tensor tensor(DType dt, const std::vector<int64_t>& dims, size_t byte_offset = 0) const;

 private:
  void release();
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  Device device_ = Device::CPU;
};

// Bytes held by Buffers on a device now, and the most held at once since the last reset (what
// `linac bench` reports as peak memory; allocations outside Buffer, such as the GPU workspace or
// cuBLAS and NCCL internals, are not counted).
size_t buffer_bytes_live(Device device);
size_t buffer_bytes_peak(Device device);
void reset_buffer_peak(Device device);

struct OwnedTensor {
  Buffer mem;
  Tensor t;
  OwnedTensor() = default;
  OwnedTensor(DType dt, Device dev, const std::vector<int64_t>& dims)
      : mem(Tensor(nullptr, dt, dev, dims).nbytes(), dev), t(mem.tensor(dt, dims)) {}
  operator const Tensor&() const { return t; }
  Tensor* operator->() { return &t; }
  const Tensor* operator->() const { return &t; }
};

// Copies between any two devices; same dtype and element count. Synchronous.
void copy_tensor(const Tensor& dst, const Tensor& src);
// Host-side dtype conversion (f32/f64/bf16 among themselves); both tensors on the CPU.
void convert_host(const Tensor& dst, const Tensor& src);
// A new tensor on `dev` with dtype `dt` holding src's values (via the host when converting).
OwnedTensor to(const Tensor& src, Device dev, DType dt);
// Reads any float tensor (any device, f32/bf16/f64) into doubles on the host.
std::vector<double> to_doubles(const Tensor& src);
// Sets every element to zero (memset / cudaMemset).
void zero_tensor(const Tensor& t);
// Stream-ordered versions for use between kernels on ctx (plain memcpy/memset on the CPU).
void copy_tensor(const Ctx& ctx, const Tensor& dst, const Tensor& src);
void zero_tensor(const Ctx& ctx, const Tensor& t);
// to_doubles once ctx's stream reaches this point: waits for that stream only, so work on other
// streams (a gradient reduction on the comm stream) goes on while the host reads a loss.
std::vector<double> to_doubles(const Ctx& ctx, const Tensor& src);

}  // namespace linac

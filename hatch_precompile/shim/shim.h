// The shim's own tensors and what its files share: a tensor is a strided view
// of a reference-counted storage (a caller's blob, or memory allocated here);
// every C function runs its body through `guarded`, which turns an exception
// into AOTITorchError 1 and keeps its text for hatch_precompile_shim_last_error.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include <immintrin.h>
#include <omp.h>

using AOTITorchError = int32_t;

namespace shim {

// torch's ScalarType numbers, so a code means the same dtype on both providers.
enum Dtype : int32_t { U8 = 0, I8 = 1, I16 = 2, I32 = 3, I64 = 4, F16 = 5, F32 = 6, F64 = 7, BOOL = 11, BF16 = 15 };

inline int64_t itemsize(int32_t dtype) {
  switch (dtype) {
    case U8: case I8: case BOOL: return 1;
    case I16: case F16: case BF16: return 2;
    case I32: case F32: return 4;
    case I64: case F64: return 8;
  }
  throw std::invalid_argument("dtype code " + std::to_string(dtype) + " is not one this shim holds");
}

struct Storage {
  void* data;
  bool owned;  // allocated here (freed with the last tensor), or a caller's blob
  std::atomic<int64_t> references{1};
  ~Storage() { if (owned) std::free(data); }
};

struct Tensor {
  Storage* storage;
  int64_t offset;  // in elements, from the storage's start
  int32_t dtype;
  std::vector<int64_t> sizes, strides;

  Tensor(Storage* storage, int64_t offset, int32_t dtype, int64_t ndim, const int64_t* sizes, const int64_t* strides)
      : storage(storage), offset(offset), dtype(dtype), sizes(sizes, sizes + ndim), strides(strides, strides + ndim) {}
  Tensor(const Tensor& other) : Tensor(other.storage, other.offset, other.dtype, other.ndim(), other.sizes.data(), other.strides.data()) {
    storage->references++;
  }
  ~Tensor() { if (--storage->references == 0) delete storage; }

  int64_t ndim() const { return static_cast<int64_t>(sizes.size()); }
  int64_t numel() const { return std::accumulate(sizes.begin(), sizes.end(), int64_t{1}, std::multiplies<>()); }
  char* data() const { return static_cast<char*>(storage->data) + offset * itemsize(dtype); }
  float* floats() const {
    if (dtype != F32) throw std::invalid_argument("this shim's operators take float32 tensors, not dtype code " + std::to_string(dtype));
    return reinterpret_cast<float*>(data());
  }
};

inline Tensor* tensor(void* handle) { return static_cast<Tensor*>(handle); }

extern thread_local std::string last_error;  // for hatch_precompile_shim_last_error (tensors.cpp)

template <typename Body>
AOTITorchError guarded(Body body) {
  last_error.clear();  // what hatch_precompile_shim_last_error says is this call's, or nothing
  try {
    body();
    return 0;
  } catch (const std::exception& error) {
    last_error = error.what();
    return 1;
  }
}

// The elements a strided view spans, as torch's empty_strided allocates them.
inline int64_t span(int64_t ndim, const int64_t* sizes, const int64_t* strides) {
  int64_t extent = 1;
  for (int64_t d = 0; d < ndim; ++d) {
    if (sizes[d] == 0) return 0;
    extent += (sizes[d] - 1) * strides[d];
  }
  return extent;
}

inline Tensor* allocate(int64_t ndim, const int64_t* sizes, const int64_t* strides, int32_t dtype) {
  size_t bytes = static_cast<size_t>(std::max<int64_t>(span(ndim, sizes, strides), 1) * itemsize(dtype));
  void* data = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!data) throw std::bad_alloc();
  return new Tensor(new Storage{data, true}, 0, dtype, ndim, sizes, strides);
}

// Row-major strides of `sizes` (by default `like`'s own) laid out in the order of
// `like`'s strides, as torch's empty_like keeps a dense tensor's memory format.
inline std::vector<int64_t> strides_like(const Tensor& like, const std::vector<int64_t>* sizes = nullptr) {
  const std::vector<int64_t>& shape = sizes ? *sizes : like.sizes;
  std::vector<int64_t> order(like.ndim()), strides(like.ndim());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return like.strides[a] > like.strides[b]; });
  int64_t stride = 1;
  for (auto d = order.rbegin(); d != order.rend(); ++d) {
    strides[*d] = stride;
    stride *= std::max<int64_t>(shape[*d], 1);
  }
  return strides;
}

inline void require_dims(const Tensor& t, int64_t ndim, const char* op, const char* what) {
  if (t.ndim() != ndim)
    throw std::invalid_argument(std::string(op) + ": " + what + " has " + std::to_string(t.ndim()) + " dims, expected " + std::to_string(ndim));
}

// Calls visit(n, offset, other) for each element of a strided view, in row-major
// order: n counts the elements, offset is the element's in the view's strides,
// other its offset in the strides `then` (the same index in another layout; 0
// where none is given).
template <typename Visit>
void for_each_element(const Tensor& t, Visit visit, const std::vector<int64_t>* then = nullptr) {
  std::vector<int64_t> index(t.ndim(), 0);
  for (int64_t n = 0, count = t.numel(); n < count; ++n) {
    int64_t from = 0, to = 0;
    for (int64_t d = 0; d < t.ndim(); ++d) from += index[d] * t.strides[d], to += then ? index[d] * (*then)[d] : 0;
    visit(n, from, to);
    for (int64_t d = t.ndim() - 1; d >= 0 && ++index[d] == t.sizes[d]; --d) index[d] = 0;
  }
}

// out[M,N] = alpha * a[M,K] @ b[K,N] + beta * out, each operand by its pointer
// and strides, on the kernels' OpenMP threads (blas.cpp).
void gemm(int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t a0, int64_t a1, const float* b, int64_t b0, int64_t b1,
          float beta, float* out, int64_t o0, int64_t o1);

}  // namespace shim

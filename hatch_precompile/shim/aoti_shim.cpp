// The torch-free form's shim: AOTInductor's C shim (`aoti_torch_*`, as declared
// in torch/csrc/inductor/aoti_torch/c/shim.h and generated/c_shim_cpu.h) over
// tensors of its own, for a model container library compiled with
// `aot_inductor.link_libtorch = False`.
//
// It implements what such libraries reference and nothing else of torch:
// tensors (a strided view of a reference-counted storage: blob, owned or
// shared), their getters, the dtype and device codes, grad mode (a flag: the
// container only turns it off), and six operators: addmm, mm, bmm, baddbmm,
// convolution and CPU flash attention, on float32, through a cblas_sgemm that the loader hands in
// (NumPy's own OpenBLAS). Vector math (`Sleef_*`) is generated beside this
// file per wheel (`build.py`). The build checks that every shim symbol a
// library references is exported here, and names the ones that are not.
//
// Errors: each function returns 0 (AOTI_TORCH_SUCCESS) or 1 and keeps the
// reason for `hatch_precompile_shim_last_error`; `aoti_torch_check` throws, as
// torch's does, and the container turns that into its own error code.

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

namespace {

// torch's ScalarType numbers, so a code means the same dtype on both providers.
enum Dtype : int32_t { U8 = 0, I8 = 1, I16 = 2, I32 = 3, I64 = 4, F16 = 5, F32 = 6, F64 = 7, BOOL = 11, BF16 = 15 };

int64_t itemsize(int32_t dtype) {
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

Tensor* tensor(void* handle) { return static_cast<Tensor*>(handle); }

thread_local std::string last_error;
thread_local bool grad_enabled = false;

template <typename Body>
AOTITorchError guarded(Body body) {
  try {
    body();
    return 0;
  } catch (const std::exception& error) {
    last_error = error.what();
    return 1;
  }
}

// The elements a strided view spans, as torch's empty_strided allocates them.
int64_t span(int64_t ndim, const int64_t* sizes, const int64_t* strides) {
  int64_t extent = 1;
  for (int64_t d = 0; d < ndim; ++d) {
    if (sizes[d] == 0) return 0;
    extent += (sizes[d] - 1) * strides[d];
  }
  return extent;
}

Tensor* allocate(int64_t ndim, const int64_t* sizes, const int64_t* strides, int32_t dtype) {
  size_t bytes = static_cast<size_t>(std::max<int64_t>(span(ndim, sizes, strides), 1) * itemsize(dtype));
  void* data = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!data) throw std::bad_alloc();
  return new Tensor(new Storage{data, true}, 0, dtype, ndim, sizes, strides);
}

// Row-major strides of `sizes` (by default `like`'s own) laid out in the order of
// `like`'s strides, as torch's empty_like keeps a dense tensor's memory format.
std::vector<int64_t> strides_like(const Tensor& like, const std::vector<int64_t>* sizes = nullptr) {
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

// cblas_sgemm (row-major), as NumPy's OpenBLAS exports it: the loader hands it
// in, with the width of its integers (ILP64 builds take int64_t).
using Sgemm32 = void (*)(int, int, int, int32_t, int32_t, int32_t, float, const float*, int32_t, const float*, int32_t, float, float*, int32_t);
using Sgemm64 = void (*)(int, int, int, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t, float, float*, int64_t);
void* sgemm_function = nullptr;
bool sgemm_ilp64 = false;
// OpenBLAS's openblas_set_num_threads_local, where the loader found one: each
// sgemm here runs on one BLAS thread, the threads being the kernels' OpenMP
// ones, and the calling thread's setting is put back after it (the caller's
// NumPy keeps its own).
using ThreadsLocal = int (*)(int);
ThreadsLocal blas_threads_local = nullptr;
constexpr int ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112;

// A matrix operand of sgemm: a 2-D strided view that is row- or column-major
// (any other layout is copied into a dense one first).
struct Operand {
  const float* data;
  int transposed;
  int64_t leading;
  std::vector<float> copy;

  Operand(const float* base, int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride) {
    if ((cols == 1 || col_stride == 1) && (rows == 1 || row_stride >= cols)) {
      data = base, transposed = NO_TRANS, leading = rows == 1 ? cols : row_stride;
    } else if ((rows == 1 || row_stride == 1) && (cols == 1 || col_stride >= rows)) {
      data = base, transposed = TRANS, leading = cols == 1 ? rows : col_stride;
    } else {
      copy.resize(rows * cols);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) copy[r * cols + c] = base[r * row_stride + c * col_stride];
      data = copy.data(), transposed = NO_TRANS, leading = cols;
    }
  }
};

// One thread's sgemm: out[M,N] = alpha * a[M,K] @ b[K,N] + beta * out, each
// operand given by its pointer and strides.
void gemm_serial(int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t a0, int64_t a1, const float* b, int64_t b0, int64_t b1,
                 float beta, float* out, int64_t o0, int64_t o1) {
  if (M == 0 || N == 0) return;
  if (!sgemm_function) throw std::runtime_error("hatch-precompile's shim has no sgemm: the loader did not hand one in");
  bool dense_out = (o1 == 1 || N == 1) && (M == 1 || o0 >= N);
  std::vector<float> staged;
  float* target = out;
  int64_t ldc = M == 1 ? N : o0;
  if (!dense_out) {
    staged.resize(M * N);
    for (int64_t r = 0; r < M; ++r)
      for (int64_t c = 0; c < N; ++c) staged[r * N + c] = out[r * o0 + c * o1];
    target = staged.data(), ldc = N;
  }
  Operand left(a, M, K, a0, a1), right(b, K, N, b0, b1);
  int threads_before = blas_threads_local ? blas_threads_local(1) : 0;
  if (sgemm_ilp64)
    reinterpret_cast<Sgemm64>(sgemm_function)(ROW_MAJOR, left.transposed, right.transposed, M, N, K, alpha, left.data, left.leading, right.data, right.leading, beta, target, ldc);
  else
    reinterpret_cast<Sgemm32>(sgemm_function)(ROW_MAJOR, left.transposed, right.transposed, M, N, K, alpha, left.data, left.leading, right.data, right.leading, beta, target, ldc);
  if (blas_threads_local) blas_threads_local(threads_before);
  if (!dense_out)
    for (int64_t r = 0; r < M; ++r)
      for (int64_t c = 0; c < N; ++c) out[r * o0 + c * o1] = staged[r * N + c];
}

// The same product on the kernels' OpenMP threads, each taking a block of rows
// (or of columns, where there are few rows): one thread pool in the process, as
// torch has, with the BLAS itself single-threaded in each.
void gemm(int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t a0, int64_t a1, const float* b, int64_t b0, int64_t b1,
          float beta, float* out, int64_t o0, int64_t o1) {
  int threads = omp_in_parallel() || M * N * K < 32768 ? 1 : omp_get_max_threads();
  if (threads == 1) return gemm_serial(M, N, K, alpha, a, a0, a1, b, b0, b1, beta, out, o0, o1);
  bool by_rows = M >= N || M >= 8 * threads;
  int64_t extent = by_rows ? M : N, block = (extent + threads - 1) / threads;
  std::string failure;
#pragma omp parallel for num_threads(threads)
  for (int part = 0; part < threads; ++part) {
    int64_t start = part * block, count = std::min(block, extent - start);
    if (count <= 0) continue;
    try {
      if (by_rows)
        gemm_serial(count, N, K, alpha, a + start * a0, a0, a1, b, b0, b1, beta, out + start * o0, o0, o1);
      else
        gemm_serial(M, count, K, alpha, a, a0, a1, b + start * b1, b0, b1, beta, out + start * o1, o0, o1);
    } catch (const std::exception& error) {
#pragma omp critical
      failure = error.what();
    }
  }
  if (!failure.empty()) throw std::runtime_error(failure);
}

// exp of n floats in place, 16 or 8 at a time by glibc's vector math (libmvec,
// since glibc 2.22) where the CPU has AVX-512 or AVX2.
extern "C" __attribute__((target("avx512f"))) __m512 _ZGVeN16v_expf(__m512);
extern "C" __attribute__((target("avx2,fma"))) __m256 _ZGVdN8v_expf(__m256);

__attribute__((target("avx512f"))) int64_t exp_avx512(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _ZGVeN16v_expf(_mm512_loadu_ps(x + i)));
  return i;
}

__attribute__((target("avx2,fma"))) int64_t exp_avx2(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _ZGVdN8v_expf(_mm256_loadu_ps(x + i)));
  return i;
}

void exp_in_place(float* x, int64_t n) {
  static const bool avx512 = __builtin_cpu_supports("avx512f"), avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  int64_t done = avx512 ? exp_avx512(x, n) : avx2 ? exp_avx2(x, n) : 0;
  for (int64_t i = done; i < n; ++i) x[i] = std::exp(x[i]);
}

// A row of attention scores -> its softmax, in place; returns its logsumexp. A
// row masked whole gives zeros (and -inf).
float softmax(float* row, int64_t S) {
  float top = -INFINITY;
#pragma omp simd reduction(max : top)
  for (int64_t j = 0; j < S; ++j) top = row[j] > top ? row[j] : top;
  if (top == -INFINITY) {
    std::fill(row, row + S, 0.0f);
    return -INFINITY;
  }
  for (int64_t j = 0; j < S; ++j) row[j] -= top;
  exp_in_place(row, S);
  float total = 0;
#pragma omp simd reduction(+ : total)
  for (int64_t j = 0; j < S; ++j) total += row[j];
  float inverse = 1.0f / total;
  for (int64_t j = 0; j < S; ++j) row[j] *= inverse;
  return top + std::log(total);
}

void require_dims(const Tensor& t, int64_t ndim, const char* op, const char* what) {
  if (t.ndim() != ndim)
    throw std::invalid_argument(std::string(op) + ": " + what + " has " + std::to_string(t.ndim()) + " dims, expected " + std::to_string(ndim));
}

}  // namespace

extern "C" {

const char* hatch_precompile_shim_last_error() { return last_error.c_str(); }

void hatch_precompile_shim_use_blas(void* sgemm, int32_t ilp64, void* threads_local) {
  sgemm_function = sgemm, sgemm_ilp64 = ilp64 != 0, blas_threads_local = reinterpret_cast<ThreadsLocal>(threads_local);
}

void hatch_precompile_shim_set_num_threads(int32_t threads) { omp_set_num_threads(threads); }

int32_t aoti_torch_device_type_cpu() { return 0; }
int32_t aoti_torch_device_type_cuda() { return 1; }
int32_t aoti_torch_layout_strided() { return 0; }
int32_t aoti_torch_dtype_uint8() { return U8; }
int32_t aoti_torch_dtype_int8() { return I8; }
int32_t aoti_torch_dtype_int16() { return I16; }
int32_t aoti_torch_dtype_int32() { return I32; }
int32_t aoti_torch_dtype_int64() { return I64; }
int32_t aoti_torch_dtype_float16() { return F16; }
int32_t aoti_torch_dtype_float32() { return F32; }
int32_t aoti_torch_dtype_float64() { return F64; }
int32_t aoti_torch_dtype_bool() { return BOOL; }
int32_t aoti_torch_dtype_bfloat16() { return BF16; }

bool aoti_torch_grad_mode_is_enabled() { return grad_enabled; }
void aoti_torch_grad_mode_set_enabled(bool enabled) { grad_enabled = enabled; }

void aoti_torch_check(bool cond, const char* func, const char* file, uint32_t line, const char* msg) {
  if (!cond) throw std::runtime_error(std::string(msg) + " (" + func + ", " + file + ":" + std::to_string(line) + ")");
}

AOTITorchError aoti_torch_create_tensor_from_blob(void* data, int64_t ndim, const int64_t* sizes, const int64_t* strides, int64_t storage_offset,
                                                  int32_t dtype, int32_t device_type, int32_t, void** ret) {
  return guarded([&] {
    if (device_type != 0) throw std::invalid_argument("this shim holds CPU tensors only");
    itemsize(dtype);
    *ret = new Tensor(new Storage{data, false}, storage_offset, dtype, ndim, sizes, strides);
  });
}

AOTITorchError aoti_torch_create_tensor_from_blob_v2(void* data, int64_t ndim, const int64_t* sizes, const int64_t* strides, int64_t storage_offset,
                                                     int32_t dtype, int32_t device_type, int32_t device_index, void** ret, int32_t layout,
                                                     const uint8_t*, int64_t opaque_metadata_size) {
  if (layout != 0 || opaque_metadata_size != 0) return guarded([] { throw std::invalid_argument("this shim holds strided tensors only"); });
  return aoti_torch_create_tensor_from_blob(data, ndim, sizes, strides, storage_offset, dtype, device_type, device_index, ret);
}

AOTITorchError aoti_torch_empty_strided(int64_t ndim, const int64_t* sizes, const int64_t* strides, int32_t dtype, int32_t device_type, int32_t, void** ret) {
  return guarded([&] {
    if (device_type != 0) throw std::invalid_argument("this shim holds CPU tensors only");
    *ret = allocate(ndim, sizes, strides, dtype);
  });
}

AOTITorchError aoti_torch__reinterpret_tensor(void* self, int64_t ndim, const int64_t* sizes, const int64_t* strides, int64_t storage_offset, void** ret) {
  return guarded([&] {
    Tensor* view = new Tensor(*tensor(self));
    view->sizes.assign(sizes, sizes + ndim), view->strides.assign(strides, strides + ndim), view->offset = storage_offset;
    *ret = view;
  });
}

AOTITorchError aoti_torch_new_tensor_handle(void* orig, void** ret) {
  return guarded([&] { *ret = new Tensor(*tensor(orig)); });
}

AOTITorchError aoti_torch_delete_tensor_object(void* handle) {
  return guarded([&] { delete tensor(handle); });
}

// torch's clone keeps a dense tensor's layout and makes others row-major.
AOTITorchError aoti_torch_clone(void* self, void** ret) {
  return guarded([&] {
    const Tensor& source = *tensor(self);
    std::vector<int64_t> strides = strides_like(source);
    Tensor* copy = allocate(source.ndim(), source.sizes.data(), strides.data(), source.dtype);
    int64_t size = itemsize(source.dtype), count = source.numel();
    std::vector<int64_t> index(source.ndim(), 0);
    for (int64_t n = 0; n < count; ++n) {
      int64_t from = 0, to = 0;
      for (int64_t d = 0; d < source.ndim(); ++d) from += index[d] * source.strides[d], to += index[d] * strides[d];
      std::memcpy(copy->data() + to * size, source.data() + from * size, size);
      for (int64_t d = source.ndim() - 1; d >= 0 && ++index[d] == source.sizes[d]; --d) index[d] = 0;
    }
    *ret = copy;
  });
}

AOTITorchError aoti_torch_clone_preserve_strides(void* self, void** ret) {
  return guarded([&] {
    const Tensor& source = *tensor(self);
    int64_t extent = span(source.ndim(), source.sizes.data(), source.strides.data());
    Tensor* copy = allocate(source.ndim(), source.sizes.data(), source.strides.data(), source.dtype);
    std::memcpy(copy->data(), source.data(), extent * itemsize(source.dtype));
    *ret = copy;
  });
}

AOTITorchError aoti_torch_get_data_ptr(void* t, void** ret) { return guarded([&] { *ret = tensor(t)->data(); }); }
AOTITorchError aoti_torch_get_dim(void* t, int64_t* ret) { return guarded([&] { *ret = tensor(t)->ndim(); }); }
AOTITorchError aoti_torch_get_numel(void* t, int64_t* ret) { return guarded([&] { *ret = tensor(t)->numel(); }); }
AOTITorchError aoti_torch_get_sizes(void* t, int64_t** ret) { return guarded([&] { *ret = tensor(t)->sizes.data(); }); }
AOTITorchError aoti_torch_get_strides(void* t, int64_t** ret) { return guarded([&] { *ret = tensor(t)->strides.data(); }); }
AOTITorchError aoti_torch_get_storage_offset(void* t, int64_t* ret) { return guarded([&] { *ret = tensor(t)->offset; }); }
AOTITorchError aoti_torch_get_dtype(void* t, int32_t* ret) { return guarded([&] { *ret = tensor(t)->dtype; }); }
AOTITorchError aoti_torch_get_device_type(void*, int32_t* ret) { return guarded([&] { *ret = 0; }); }
AOTITorchError aoti_torch_get_device_index(void*, int32_t* ret) { return guarded([&] { *ret = 0; }); }
AOTITorchError aoti_torch_get_storage_size(void* t, int64_t* ret) {
  // What a tensor of this storage can reach: a blob's size is not known, so it is
  // this view's own span from the storage's start, which is what the container asks
  // (it checks a constant covers its view).
  return guarded([&] {
    const Tensor& v = *tensor(t);
    *ret = (v.offset + span(v.ndim(), v.sizes.data(), v.strides.data())) * itemsize(v.dtype);
  });
}

AOTITorchError aoti_torch_cpu_addmm_out(void* out, void* self, void* mat1, void* mat2, double beta, double alpha) {
  return guarded([&] {
    const Tensor &o = *tensor(out), &bias = *tensor(self), &a = *tensor(mat1), &b = *tensor(mat2);
    require_dims(o, 2, "addmm", "out"), require_dims(a, 2, "addmm", "mat1"), require_dims(b, 2, "addmm", "mat2");
    int64_t M = o.sizes[0], N = o.sizes[1];
    float* target = o.floats();
    if (beta != 0) {  // out = beta * self, broadcast to [M, N] (a missing or size-1 dim repeats)
      int64_t rows = bias.ndim() == 2 && bias.sizes[0] != 1 ? bias.strides[0] : 0;
      int64_t cols = bias.ndim() >= 1 && bias.sizes[bias.ndim() - 1] != 1 ? bias.strides[bias.ndim() - 1] : 0;
      const float* source = bias.floats();
      for (int64_t r = 0; r < M; ++r)
        for (int64_t c = 0; c < N; ++c) target[r * o.strides[0] + c * o.strides[1]] = static_cast<float>(beta) * source[r * rows + c * cols];
    }
    gemm(M, N, a.sizes[1], static_cast<float>(alpha), a.floats(), a.strides[0], a.strides[1], b.floats(), b.strides[0], b.strides[1], beta != 0 ? 1.0f : 0.0f,
         target, o.strides[0], o.strides[1]);
  });
}

AOTITorchError aoti_torch_cpu_mm_out(void* out, void* self, void* mat2) {
  return guarded([&] {
    const Tensor &o = *tensor(out), &a = *tensor(self), &b = *tensor(mat2);
    require_dims(o, 2, "mm", "out"), require_dims(a, 2, "mm", "self"), require_dims(b, 2, "mm", "mat2");
    gemm(o.sizes[0], o.sizes[1], a.sizes[1], 1.0f, a.floats(), a.strides[0], a.strides[1], b.floats(), b.strides[0], b.strides[1], 0.0f, o.floats(), o.strides[0],
         o.strides[1]);
  });
}

AOTITorchError aoti_torch_cpu_bmm_out(void* out, void* self, void* mat2) {
  return guarded([&] {
    const Tensor &o = *tensor(out), &a = *tensor(self), &b = *tensor(mat2);
    require_dims(o, 3, "bmm", "out"), require_dims(a, 3, "bmm", "self"), require_dims(b, 3, "bmm", "mat2");
    for (int64_t n = 0; n < o.sizes[0]; ++n)
      gemm(o.sizes[1], o.sizes[2], a.sizes[2], 1.0f, a.floats() + n * a.strides[0], a.strides[1], a.strides[2], b.floats() + n * b.strides[0], b.strides[1],
           b.strides[2], 0.0f, o.floats() + n * o.strides[0], o.strides[1], o.strides[2]);
  });
}

// out = beta * self + alpha * batch1 @ batch2, self broadcast to out's [B, M, N]
// (a missing or size-1 dim repeats), as attention with an additive mask calls it.
AOTITorchError aoti_torch_cpu_baddbmm_out(void* out, void* self, void* batch1, void* batch2, double beta, double alpha) {
  return guarded([&] {
    const Tensor &o = *tensor(out), &bias = *tensor(self), &a = *tensor(batch1), &b = *tensor(batch2);
    require_dims(o, 3, "baddbmm", "out"), require_dims(a, 3, "baddbmm", "batch1"), require_dims(b, 3, "baddbmm", "batch2");
    if (bias.ndim() > 3) throw std::invalid_argument("baddbmm: self has " + std::to_string(bias.ndim()) + " dims, expected at most 3");
    int64_t stride[3] = {0, 0, 0};
    for (int64_t d = 0; d < bias.ndim(); ++d)
      if (bias.sizes[d] != 1) stride[3 - bias.ndim() + d] = bias.strides[d];
    const float* source = bias.floats();
    float* target = o.floats();
    for (int64_t n = 0; n < o.sizes[0]; ++n) {
      if (beta != 0)
        for (int64_t r = 0; r < o.sizes[1]; ++r)
          for (int64_t c = 0; c < o.sizes[2]; ++c)
            target[n * o.strides[0] + r * o.strides[1] + c * o.strides[2]] = static_cast<float>(beta) * source[n * stride[0] + r * stride[1] + c * stride[2]];
      gemm(o.sizes[1], o.sizes[2], a.sizes[2], static_cast<float>(alpha), a.floats() + n * a.strides[0], a.strides[1], a.strides[2], b.floats() + n * b.strides[0],
           b.strides[1], b.strides[2], beta != 0 ? 1.0f : 0.0f, target + n * o.strides[0], o.strides[1], o.strides[2]);
    }
  });
}

// A convolution (not transposed) over 1 to 3 spatial dims, with groups, as one
// sgemm per sample and group: the weight [O/g, C/g * kernel] times the input
// unfolded into [C/g * kernel, output positions] (im2col). The output keeps the
// input's memory format (channels-last in, channels-last out), as torch's does.
AOTITorchError aoti_torch_cpu_convolution(void* input, void* weight, void** bias, const int64_t* stride, int64_t stride_len, const int64_t* padding,
                                          int64_t padding_len, const int64_t* dilation, int64_t dilation_len, int32_t transposed, const int64_t*, int64_t,
                                          int64_t groups, void** ret0) {
  return guarded([&] {
    const Tensor &x = *tensor(input), &w = *tensor(weight);
    const Tensor* b = bias && *bias ? tensor(*bias) : nullptr;
    int64_t spatial = x.ndim() - 2;
    if (transposed) throw std::invalid_argument("convolution: transposed convolutions are not in this shim");
    if (spatial < 1 || spatial > 3 || w.ndim() != x.ndim()) throw std::invalid_argument("convolution: input and weight must have 3 to 5 dims alike");
    auto at = [](const int64_t* values, int64_t length, int64_t d) { return length == 1 ? values[0] : values[d]; };
    int64_t N = x.sizes[0], C = x.sizes[1], O = w.sizes[0], Cg = C / groups, Og = O / groups;
    std::vector<int64_t> out_sizes = {N, O}, kernel(spatial), in(spatial), out(spatial);
    int64_t taps = 1, positions = 1;
    for (int64_t d = 0; d < spatial; ++d) {
      kernel[d] = w.sizes[2 + d], in[d] = x.sizes[2 + d];
      out[d] = (in[d] + 2 * at(padding, padding_len, d) - at(dilation, dilation_len, d) * (kernel[d] - 1) - 1) / at(stride, stride_len, d) + 1;
      out_sizes.push_back(out[d]), taps *= kernel[d], positions *= out[d];
    }
    std::vector<int64_t> out_strides = strides_like(x, &out_sizes);
    Tensor* result = allocate(x.ndim(), out_sizes.data(), out_strides.data(), F32);
    // The output positions of one channel lie at a fixed stride only if its spatial dims are dense among themselves.
    bool flat = true;
    for (int64_t d = 2; d + 1 < x.ndim(); ++d) flat = flat && out_strides[d] == out_strides[d + 1] * out_sizes[d + 1];
    std::vector<float> columns(Cg * taps * positions), staged(flat ? 0 : Og * positions), dense_weight(O * Cg * taps);
    const float* xs = x.floats();
    std::vector<int64_t> index(w.ndim(), 0);  // the weight as [O, C/g * kernel], row-major (it may come in any layout)
    for (int64_t n = 0; n < O * Cg * taps; ++n) {
      int64_t from = 0;
      for (int64_t d = 0; d < w.ndim(); ++d) from += index[d] * w.strides[d];
      dense_weight[n] = w.floats()[from];
      for (int64_t d = w.ndim() - 1; d >= 0 && ++index[d] == w.sizes[d]; --d) index[d] = 0;
    }
    for (int64_t n = 0; n < N; ++n)
      for (int64_t g = 0; g < groups; ++g) {
#pragma omp parallel for
        for (int64_t row = 0; row < Cg * taps; ++row) {  // row = (channel, tap), the tap's offsets in the kernel
          int64_t channel = g * Cg + row / taps, tap = row % taps, offset[3] = {0, 0, 0};
          for (int64_t d = spatial - 1, rest = tap; d >= 0; --d) offset[d] = rest % kernel[d], rest /= kernel[d];
          for (int64_t p = 0; p < positions; ++p) {
            int64_t from = n * x.strides[0] + channel * x.strides[1], rest = p;
            bool inside = true;
            for (int64_t d = spatial - 1; d >= 0; --d) {
              int64_t position = rest % out[d];
              rest /= out[d];
              int64_t coordinate = position * at(stride, stride_len, d) - at(padding, padding_len, d) + offset[d] * at(dilation, dilation_len, d);
              inside = inside && coordinate >= 0 && coordinate < in[d];
              from += coordinate * x.strides[2 + d];
            }
            columns[row * positions + p] = inside ? xs[from] : 0.0f;
          }
        }
        float* target = result->floats() + n * out_strides[0] + g * Og * out_strides[1];
        int64_t position_stride = out_strides[x.ndim() - 1];
        gemm(Og, positions, Cg * taps, 1.0f, dense_weight.data() + g * Og * Cg * taps, Cg * taps, 1, columns.data(), positions, 1, 0.0f,
             flat ? target : staged.data(), flat ? out_strides[1] : positions, flat ? position_stride : 1);
        for (int64_t o = 0; o < Og; ++o)
          for (int64_t p = 0; p < positions; ++p) {
            int64_t to = o * out_strides[1], rest = p;
            for (int64_t d = spatial - 1; d >= 0; --d) to += (rest % out[d]) * out_strides[2 + d], rest /= out[d];
            float value = flat ? target[to] : staged[o * positions + p];
            target[to] = value + (b ? b->floats()[(g * Og + o) * b->strides[0]] : 0.0f);
          }
      }
    *ret0 = result;
  });
}

// softmax(q k^T * scale + mask) v for each batch and head, as torch's CPU flash
// attention returns it: the output in the query's layout and the logsumexp of
// each row ([B, H, L] over [B, L, H] memory). A causal mask keeps key j <= query i.
AOTITorchError aoti_torch_cpu__scaled_dot_product_flash_attention_for_cpu(void* query, void* key, void* value, double dropout_p, int32_t is_causal,
                                                                           void** attn_mask, double* scale, void** ret0, void** ret1) {
  return guarded([&] {
    const Tensor &q = *tensor(query), &k = *tensor(key), &v = *tensor(value);
    require_dims(q, 4, "attention", "query"), require_dims(k, 4, "attention", "key"), require_dims(v, 4, "attention", "value");
    if (dropout_p != 0) throw std::invalid_argument("attention with dropout is not for inference");
    const Tensor* mask = attn_mask && *attn_mask ? tensor(*attn_mask) : nullptr;
    if (mask && mask->dtype != F32 && mask->dtype != BOOL) throw std::invalid_argument("attention masks are float32 or bool here");
    int64_t B = q.sizes[0], H = q.sizes[1], L = q.sizes[2], E = q.sizes[3], S = k.sizes[2], Ev = v.sizes[3];
    int64_t out_sizes[4] = {B, H, L, Ev};
    std::vector<int64_t> out_strides = strides_like(q);
    Tensor* out = allocate(4, out_sizes, out_strides.data(), F32);
    int64_t lse_sizes[3] = {B, H, L}, lse_strides[3] = {L * H, 1, H};
    Tensor* lse = allocate(3, lse_sizes, lse_strides, F32);
    float factor = scale ? static_cast<float>(*scale) : 1.0f / std::sqrt(static_cast<float>(E));
    // The mask broadcast to [B, H, L, S]: a missing or size-1 dim repeats.
    int64_t mstride[4] = {0, 0, 0, 0};
    if (mask)
      for (int64_t d = 0; d < mask->ndim(); ++d) {
        int64_t dim = 4 - mask->ndim() + d;
        if (mask->sizes[d] != 1) mstride[dim] = mask->strides[d];
      }
    const bool* mask_bits = mask && mask->dtype == BOOL ? reinterpret_cast<const bool*>(mask->data()) : nullptr;
    const float* mask_values = mask && mask->dtype == F32 ? mask->floats() : nullptr;
    float* lse_data = lse->floats();
    std::string failure;
#pragma omp parallel for collapse(2)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        try {
          std::vector<float> scores(L * S);
          gemm(L, S, E, factor, q.floats() + b * q.strides[0] + h * q.strides[1], q.strides[2], q.strides[3], k.floats() + b * k.strides[0] + h * k.strides[1],
               k.strides[3], k.strides[2], 0.0f, scores.data(), S, 1);
          for (int64_t i = 0; i < L; ++i) {
            float* row = scores.data() + i * S;
            if (mask_bits) {
              const bool* allowed = mask_bits + b * mstride[0] + h * mstride[1] + i * mstride[2];
              for (int64_t j = 0; j < S; ++j) row[j] = allowed[j * mstride[3]] ? row[j] : -INFINITY;
            } else if (mask_values) {
              const float* added = mask_values + b * mstride[0] + h * mstride[1] + i * mstride[2];
              for (int64_t j = 0; j < S; ++j) row[j] += added[j * mstride[3]];
            }
            if (is_causal)
              for (int64_t j = i + 1; j < S; ++j) row[j] = -INFINITY;
            lse_data[b * lse_strides[0] + h * lse_strides[1] + i * lse_strides[2]] = softmax(row, S);
          }
          gemm(L, Ev, S, 1.0f, scores.data(), S, 1, v.floats() + b * v.strides[0] + h * v.strides[1], v.strides[2], v.strides[3], 0.0f,
               out->floats() + b * out_strides[0] + h * out_strides[1], out_strides[2], out_strides[3]);
        } catch (const std::exception& error) {
#pragma omp critical
          failure = error.what();
        }
      }
    if (!failure.empty()) {
      delete out, delete lse;
      throw std::runtime_error(failure);
    }
    *ret0 = out, *ret1 = lse;
  });
}

}  // extern "C"

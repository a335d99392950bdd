// The shim's matrix products: cblas_sgemm from the BLAS NumPy loaded (handed in
// by the loader, `runtime/_shim.py`), split over the kernels' OpenMP threads.
#include "shim.h"

namespace shim {
namespace {

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

}  // namespace

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

}  // namespace shim

extern "C" void hatch_precompile_shim_use_blas(void* sgemm, int32_t ilp64, void* threads_local) {
  shim::sgemm_function = sgemm, shim::sgemm_ilp64 = ilp64 != 0, shim::blas_threads_local = reinterpret_cast<shim::ThreadsLocal>(threads_local);
}

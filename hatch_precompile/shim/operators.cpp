// The shim's operators, on float32: addmm, mm, bmm, baddbmm (blas.cpp's gemm),
// convolution (im2col, then gemm) and CPU flash attention (gemm, softmax, gemm).
#include "shim.h"

using namespace shim;

namespace {

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

// A convolution's per-dim argument: one value for every dim, or one each.
int64_t at(const int64_t* values, int64_t length, int64_t d) { return length == 1 ? values[0] : values[d]; }

// A tensor's elements in row-major order, into `to`.
void dense(const Tensor& t, float* to) {
  const float* from = t.floats();
  for_each_element(t, [&](int64_t n, int64_t offset, int64_t) { to[n] = from[offset]; });
}

// A transposed convolution (weight [C, O/g, kernel]): per sample and group, the
// weight's transpose times the input ([O/g * kernel, input positions]), each
// column then added where its tap lands in the output (col2im), after the bias.
Tensor* transposed_convolution(const Tensor& x, const Tensor& w, const Tensor* b, const int64_t* stride, int64_t stride_len, const int64_t* padding,
                               int64_t padding_len, const int64_t* dilation, int64_t dilation_len, const int64_t* output_padding, int64_t output_padding_len,
                               int64_t groups) {
  int64_t spatial = x.ndim() - 2, N = x.sizes[0], C = x.sizes[1], Cg = C / groups, Og = w.sizes[1], O = Og * groups;
  std::vector<int64_t> out_sizes = {N, O}, kernel(spatial), in(spatial), out(spatial);
  int64_t taps = 1, positions = 1, out_positions = 1;
  for (int64_t d = 0; d < spatial; ++d) {
    kernel[d] = w.sizes[2 + d], in[d] = x.sizes[2 + d];
    int64_t extra = output_padding_len ? at(output_padding, output_padding_len, d) : 0;
    out[d] = (in[d] - 1) * at(stride, stride_len, d) - 2 * at(padding, padding_len, d) + at(dilation, dilation_len, d) * (kernel[d] - 1) + extra + 1;
    out_sizes.push_back(out[d]), taps *= kernel[d], positions *= in[d], out_positions *= out[d];
  }
  std::vector<int64_t> out_strides = strides_like(x, &out_sizes);
  Tensor* result = allocate(x.ndim(), out_sizes.data(), out_strides.data(), F32);
  float* ys = result->floats();
  std::vector<float> dense_weight(C * Og * taps), dense_input(x.numel()), columns(Og * taps * positions);
  dense(w, dense_weight.data());
  dense(x, dense_input.data());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < groups; ++g) {
      // columns [O/g * kernel, positions] = weight[g]^T [O/g * kernel, C/g] @ input[n, g] [C/g, positions]
      gemm(Og * taps, positions, Cg, 1.0f, dense_weight.data() + g * Cg * Og * taps, 1, Og * taps, dense_input.data() + (n * C + g * Cg) * positions, positions, 1,
           0.0f, columns.data(), positions, 1);
#pragma omp parallel for
      for (int64_t o = 0; o < Og; ++o) {
        float* channel = ys + n * out_strides[0] + (g * Og + o) * out_strides[1];
        float start = b ? b->floats()[(g * Og + o) * b->strides[0]] : 0.0f;
        for (int64_t q = 0; q < out_positions; ++q) {
          int64_t to = 0;
          for (int64_t d = spatial - 1, rest = q; d >= 0; --d) to += (rest % out[d]) * out_strides[2 + d], rest /= out[d];
          channel[to] = start;
        }
        for (int64_t tap = 0; tap < taps; ++tap) {
          int64_t offset[3] = {0, 0, 0};
          for (int64_t d = spatial - 1, rest = tap; d >= 0; --d) offset[d] = rest % kernel[d], rest /= kernel[d];
          const float* column = columns.data() + (o * taps + tap) * positions;
          for (int64_t p = 0; p < positions; ++p) {
            int64_t to = 0, rest = p;
            bool inside = true;
            for (int64_t d = spatial - 1; d >= 0; --d) {
              int64_t coordinate = (rest % in[d]) * at(stride, stride_len, d) - at(padding, padding_len, d) + offset[d] * at(dilation, dilation_len, d);
              rest /= in[d];
              inside = inside && coordinate >= 0 && coordinate < out[d];
              to += coordinate * out_strides[2 + d];
            }
            if (inside) channel[to] += column[p];
          }
        }
      }
    }
  return result;
}

}  // namespace

extern "C" {

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

// A convolution over 1 to 3 spatial dims, with groups, as one sgemm per sample
// and group: the weight [O/g, C/g * kernel] times the input unfolded into
// [C/g * kernel, output positions] (im2col); a transposed one, the other way
// round (`transposed_convolution`). The output keeps the input's memory format
// (channels-last in, channels-last out), as torch's does.
AOTITorchError aoti_torch_cpu_convolution(void* input, void* weight, void** bias, const int64_t* stride, int64_t stride_len, const int64_t* padding,
                                          int64_t padding_len, const int64_t* dilation, int64_t dilation_len, int32_t transposed, const int64_t* output_padding,
                                          int64_t output_padding_len, int64_t groups, void** ret0) {
  return guarded([&] {
    const Tensor &x = *tensor(input), &w = *tensor(weight);
    const Tensor* b = bias && *bias ? tensor(*bias) : nullptr;
    int64_t spatial = x.ndim() - 2;
    if (spatial < 1 || spatial > 3 || w.ndim() != x.ndim()) throw std::invalid_argument("convolution: input and weight must have 3 to 5 dims alike");
    if (transposed) {
      *ret0 = transposed_convolution(x, w, b, stride, stride_len, padding, padding_len, dilation, dilation_len, output_padding, output_padding_len, groups);
      return;
    }
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
    dense(w, dense_weight.data());  // the weight as [O, C/g * kernel] (it may come in any layout)
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

// The torch-free form's shim: AOTInductor's C shim (`aoti_torch_*`, as declared
// in torch/csrc/inductor/aoti_torch/c/shim.h and generated/c_shim_cpu.h) over
// tensors of its own, for a model container library compiled with
// `aot_inductor.link_libtorch = False`. This file: the tensor functions (make,
// view, copy, free and describe a tensor), the dtype and device codes, grad
// mode (a flag: the container only turns it off) and `aoti_torch_check`.
// blas.cpp has the matrix products, operators.cpp the operators (float32);
// vector math (`Sleef_*`) is generated per wheel (`build.py`), which also
// checks that every shim symbol a library references is exported here, and
// names the ones that are not.
//
// Errors: each function returns 0 (AOTI_TORCH_SUCCESS) or 1 and keeps the
// reason for `hatch_precompile_shim_last_error`; `aoti_torch_check` throws, as
// torch's does, and the container turns that into its own error code.

#include "shim.h"

using namespace shim;

namespace shim {
thread_local std::string last_error;
}  // namespace shim

namespace {
thread_local bool grad_enabled = false;
}  // namespace

extern "C" {


const char* hatch_precompile_shim_last_error() { return last_error.c_str(); }

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
    int64_t size = itemsize(source.dtype);
    for_each_element(
        source, [&](int64_t, int64_t from, int64_t to) { std::memcpy(copy->data() + to * size, source.data() + from * size, size); }, &strides);
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

}  // extern "C"

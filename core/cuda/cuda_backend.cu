// CUDA memory, copies (host <-> device, device <-> device) and fills; the CUDA backend that
// core's backend_for returns.
#include "core/cuda/cuda_backend.h"

#include <cstring>

#include "core/cuda/allocator.h"
#include "core/cuda/loops.cuh"

namespace gw::cuda {

namespace {

template <typename D, typename S>
struct CopyFn {
  __device__ void operator()(char** p) const {
    *reinterpret_cast<D*>(p[0]) = cast<D>(*reinterpret_cast<const S*>(p[1]));
  }
};

// Writes one element's bit pattern: a fill only needs the element width.
template <typename U>
struct FillFn {
  U bits;
  __device__ void operator()(char** p) const { *reinterpret_cast<U*>(p[0]) = bits; }
};

template <typename T>
__global__ void iota_kernel(T* out, int64_t n, double start, double step) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    out[i] = cast<T>(start + static_cast<double>(i) * step);
  }
}

bool is_pinned(const void* host) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, host) != cudaSuccess) {
    clear_last_error();
    return false;
  }
  return attr.type == cudaMemoryTypeHost;
}

// src on the CPU, dst on a device. The host side is converted and made contiguous on the CPU,
// then uploaded; a strided dst gets it through a contiguous device buffer.
void copy_h2d(const Tensor& src, const Tensor& dst) {
  Tensor host = src.detach();
  if (host.dtype() != dst.dtype()) host = host.to(dst.dtype());
  host = host.contiguous();
  OnDevice on(dst);
  Tensor landing = contiguous_target(dst);
  GW_CUDA_CHECK(cudaMemcpyAsync(landing.raw_data(), host.raw_data(), host.nbytes(),
                                cudaMemcpyHostToDevice, on.stream));
  // From pageable memory the call returns once the bytes are staged; from pinned memory the
  // DMA is still running, and the caller may overwrite `src` as soon as we return.
  if (is_pinned(host.raw_data())) GW_CUDA_CHECK(cudaStreamSynchronize(on.stream));
  write_back(landing, dst);
}

// src on a device, dst on the CPU: converted and made contiguous on the device, downloaded,
// and waited for (the caller reads dst right after). A strided dst is filled through a pinned
// staging buffer.
void copy_d2h(const Tensor& src, const Tensor& dst) {
  OnDevice on(src);
  Tensor dev = src.detach();
  if (dev.dtype() != dst.dtype() || !dev.is_contiguous()) {
    Tensor tmp = empty(src.sizes(), src.options().with_dtype(dst.dtype()));
    copy_on_device(dev, tmp);
    dev = tmp;
  }
  Tensor landing = dst.is_contiguous() ? dst : empty_pinned(dst.sizes(), dst.dtype());
  GW_CUDA_CHECK(cudaMemcpyAsync(landing.raw_data(), dev.raw_data(), dev.nbytes(),
                                cudaMemcpyDeviceToHost, on.stream));
  GW_CUDA_CHECK(cudaStreamSynchronize(on.stream));
  if (!landing.same(dst)) backend_for(DeviceType::CPU, "copy").copy(landing, dst);
}

// Between two devices: contiguous on the source device, a peer copy after the source's
// stream has finished (streams of two devices are not ordered), then the layout on dst.
void copy_across_devices(const Tensor& src, const Tensor& dst) {
  Tensor s = src.detach();
  {
    OnDevice on(src);
    if (s.dtype() != dst.dtype() || !s.is_contiguous()) {
      Tensor tmp = empty(src.sizes(), src.options().with_dtype(dst.dtype()));
      copy_on_device(s, tmp);
      s = tmp;
    }
    GW_CUDA_CHECK(cudaStreamSynchronize(on.stream));
  }
  OnDevice on(dst);
  Tensor landing = contiguous_target(dst);
  GW_CUDA_CHECK(cudaMemcpyPeerAsync(landing.raw_data(), dst.device().index, s.raw_data(),
                                    src.device().index, s.nbytes(), on.stream));
  write_back(landing, dst);
  // The source's stream is not ordered after this one: wait here, before the caller writes to
  // src or the temporary goes back to the source device's cache.
  GW_CUDA_CHECK(cudaStreamSynchronize(on.stream));
}

}  // namespace

void copy_on_device(const Tensor& src, const Tensor& dst) {
  if (dst.numel() == 0) return;
  OnDevice on(dst);
  if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous()) {
    GW_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), dst.nbytes(),
                                  cudaMemcpyDeviceToDevice, on.stream));
    return;
  }
  auto it = make_iter<2>(dst.sizes(), {&dst, &src}, "copy");
  dispatch<CudaAllTypes>(dst.dtype(), "copy", [&]<typename D>() {
    dispatch<CudaAllTypes>(src.dtype(), "copy", [&]<typename S>() {
      launch_strided(it, CopyFn<cuda_type_t<D>, cuda_type_t<S>>{}, on.stream);
    });
  });
}

Tensor contiguous_target(const Tensor& t) {
  return t.is_contiguous() ? t : empty(t.sizes(), t.options());
}

void write_back(const Tensor& written, const Tensor& out) {
  if (!written.same(out)) copy_on_device(written, out);
}

Backend& cuda_backend() {
  static CudaBackend backend;
  return backend;
}

std::shared_ptr<Storage> CudaBackend::allocate(size_t nbytes, Device device) {
  return allocate_storage(nbytes, device);
}

void CudaBackend::copy(const Tensor& src, const Tensor& dst) {
  GW_CHECK(src.sizes() == dst.sizes(), ShapeError, "[cuda copy] shapes ", shape_str(src.sizes()),
           " and ", shape_str(dst.sizes()), " differ");
  if (dst.numel() == 0) return;
  const bool from_cuda = src.device().is_cuda(), to_cuda = dst.device().is_cuda();
  if (from_cuda && to_cuda) {
    if (src.device() == dst.device()) return copy_on_device(src, dst);
    return copy_across_devices(src, dst);
  }
  if (to_cuda) return copy_h2d(src, dst);
  if (from_cuda) return copy_d2h(src, dst);
  backend_for(DeviceType::CPU, "copy").copy(src, dst);
}

void CudaBackend::fill(const Tensor& dst, const Scalar& value) {
  // The element's bits are made on the host (core's conversions, which refuse a value the dtype
  // cannot hold, empty or not, as on the CPU), so the kernel only stores.
  uint64_t bits = 0;
  dispatch<CudaAllTypes>(dst.dtype(), "fill_", [&]<typename T>() {
    const T v = value.to<T>();
    std::memcpy(&bits, &v, sizeof(T));
  });
  if (dst.numel() == 0) return;
  OnDevice on(dst);
  const size_t size = dst.element_size();
  if (bits == 0 && dst.is_contiguous()) {
    GW_CUDA_CHECK(cudaMemsetAsync(dst.raw_data(), 0, dst.nbytes(), on.stream));
    return;
  }
  auto it = make_iter<1>(dst.sizes(), {&dst}, "fill_");
  dispatch_by_size(size, "fill_", [&]<typename U>() {
    launch_strided(it, FillFn<U>{static_cast<U>(bits)}, on.stream);
  });
}

void CudaBackend::iota(const Tensor& out, double start, double step) {
  dispatch<CudaNumericTypes>(out.dtype(), "arange", [&]<typename T>() {
    const int64_t n = out.numel();
    if (n == 0) return;
    OnDevice on(out);
    iota_kernel<<<grid_for(n), kThreads, 0, on.stream>>>(
        static_cast<cuda_type_t<T>*>(out.raw_data()), n, start, step);
    GW_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace gw::cuda

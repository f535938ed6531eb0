// The fused Adam/AdamW step: every parameter of a step in a few launches, instead of about ten
// elementwise launches per parameter.
//
// Parameters go in groups of up to kGroup, whose pointers and per-parameter scalars travel in
// the kernel's arguments. grid.y picks the parameter, grid.x strides over its elements; each
// element reads param, grad and the moments once and writes param and the moments once, with
// the arithmetic of the op-by-op update (core/backend.h, AdamUpdate) in the compute type.
#include "core/cuda/cuda_backend.h"
#include "core/cuda/loops.cuh"

namespace gw::cuda {

namespace {

constexpr int kGroup = 32;  // parameters per launch: 32 x 64 bytes of kernel arguments

template <typename T>
struct AdamSlot {
  T* param;
  const T* grad;
  T* exp_avg;
  T* exp_avg_sq;
  T* max_exp_avg_sq;  // null without amsgrad
  int64_t n;
  double step_size;
  double bias_correction2_sqrt;
};

template <typename T>
struct AdamGroup {
  AdamSlot<T> slots[kGroup];
};

template <typename T>
__global__ void adam_kernel(AdamGroup<T> group, AdamUpdate u) {
  using C = compute_t<T>;
  const AdamSlot<T>& s = group.slots[blockIdx.y];
  const C beta1 = static_cast<C>(u.beta1), beta2 = static_cast<C>(u.beta2);
  const C one_minus_beta1 = static_cast<C>(1 - u.beta1),
          one_minus_beta2 = static_cast<C>(1 - u.beta2);
  const C eps = static_cast<C>(u.eps), decay = static_cast<C>(u.weight_decay);
  const C scale = static_cast<C>(u.param_scale), step_size = static_cast<C>(s.step_size);
  const C correction = static_cast<C>(s.bias_correction2_sqrt);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < s.n;
       i += stride) {
    C p = cast<C>(s.param[i]) * scale;
    C g = cast<C>(s.grad[i]);
    if (u.maximize) g = -g;
    g += decay * p;
    const C m = cast<C>(s.exp_avg[i]) * beta1 + one_minus_beta1 * g;
    const C v = cast<C>(s.exp_avg_sq[i]) * beta2 + one_minus_beta2 * (g * g);
    C second = v;
    if (s.max_exp_avg_sq) {
      const C old = cast<C>(s.max_exp_avg_sq[i]);
      second = is_nan(old) || is_nan(v) ? old + v : (old > v ? old : v);  // as maximum()
      s.max_exp_avg_sq[i] = cast<T>(second);
    }
    p -= step_size * (m / (sqrt(second) / correction + eps));
    s.exp_avg[i] = cast<T>(m);
    s.exp_avg_sq[i] = cast<T>(v);
    s.param[i] = cast<T>(p);
  }
}

}  // namespace

void CudaBackend::adam_step(std::span<const AdamParam> params, const AdamUpdate& update) {
  if (params.empty()) return;
  const Tensor& first = params.front().param;
  OnDevice on(first);
  dispatch<CudaFloatTypes>(first.dtype(), "adam_step", [&]<typename T>() {
    using D = cuda_type_t<T>;
    for (size_t begin = 0; begin < params.size(); begin += kGroup) {
      const size_t count = std::min<size_t>(kGroup, params.size() - begin);
      AdamGroup<D> group{};
      int64_t largest = 1;
      for (size_t k = 0; k < count; ++k) {
        const AdamParam& a = params[begin + k];
        for (const Tensor* t : {&a.param, &a.grad, &a.exp_avg, &a.exp_avg_sq, &a.max_exp_avg_sq}) {
          GW_CHECK(
              !t->defined() || (t->is_contiguous() && t->dtype() == first.dtype() &&
                                t->device() == first.device() && t->numel() == a.param.numel()),
              InternalError, "[adam_step] parameter ", begin + k,
              ": param, grad and moments must be contiguous, of one dtype, device and size");
        }
        group.slots[k] = {
            static_cast<D*>(a.param.raw_data()),
            static_cast<const D*>(a.grad.raw_data()),
            static_cast<D*>(a.exp_avg.raw_data()),
            static_cast<D*>(a.exp_avg_sq.raw_data()),
            a.max_exp_avg_sq.defined() ? static_cast<D*>(a.max_exp_avg_sq.raw_data()) : nullptr,
            a.param.numel(),
            a.step_size,
            a.bias_correction2_sqrt};
        largest = std::max(largest, a.param.numel());
      }
      // Enough blocks along x for the largest parameter to fill the GPU; smaller ones idle
      // their extra blocks.
      const auto blocks =
          static_cast<unsigned>(std::clamp<int64_t>((largest + kThreads - 1) / kThreads, 1, 1024));
      adam_kernel<D>
          <<<dim3(blocks, static_cast<unsigned>(count)), kThreads, 0, on.stream>>>(group, update);
      GW_CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace gw::cuda

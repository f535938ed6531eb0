#include "core/ops/conv.h"

#include <limits>

#include "core/autocast.h"
#include "core/backend.h"
#include "core/grad_hooks.h"
#include "core/ops/creation.h"
#include "core/ops/elementwise.h"
#include "core/ops/linalg.h"
#include "core/ops/reduce.h"

namespace gw {

namespace {

std::array<int64_t, 8> pack(std::array<int64_t, 2> kernel, const Conv2dOptions& o) {
  return {kernel[0],     kernel[1],     o.stride[0],   o.stride[1],
          o.padding[0],  o.padding[1],  o.dilation[0], o.dilation[1]};
}

// Output height and width of a sliding window, checked to be positive.
std::array<int64_t, 2> output_hw(const char* op, int64_t h, int64_t w,
                                 const std::array<int64_t, 8>& p) {
  for (int i = 0; i < 8; i += 2) {
    GW_CHECK(p[i] >= (i == 4 ? 0 : 1) && p[i + 1] >= (i == 4 ? 0 : 1), InvalidArgumentError,
             "[", op, "] kernel, stride and dilation must be positive and padding non-negative, "
             "got kernel (", p[0], ",", p[1], ") stride (", p[2], ",", p[3], ") padding (", p[4],
             ",", p[5], ") dilation (", p[6], ",", p[7], ")");
  }
  const int64_t oh = conv_output_size(h, p[0], p[2], p[4], p[6]);
  const int64_t ow = conv_output_size(w, p[1], p[3], p[5], p[7]);
  GW_CHECK(oh > 0 && ow > 0, ShapeError, "[", op, "] input of size (", h, ",", w,
           ") is too small for kernel (", p[0], ",", p[1], ") with padding (", p[4], ",", p[5],
           ") and dilation (", p[6], ",", p[7], ")");
  return {oh, ow};
}

}  // namespace

Tensor unfold(const Tensor& x, std::array<int64_t, 2> kernel, const Conv2dOptions& options) {
  GW_CHECK(x.dim() == 4, ShapeError, "[unfold] expects an (N,C,H,W) input, got shape ",
           shape_str(x.sizes()));
  GW_CHECK(x.is_floating_point(), DTypeError, "[unfold] needs a floating point input, got ",
           x.dtype());
  auto params = pack(kernel, options);
  auto [oh, ow] = output_hw("unfold", x.size(2), x.size(3), params);
  GradRecorder* rec = detail::recorder_for(x);
  detail::NoRecordScope no_record;
  Tensor cols = empty({x.size(0), x.size(1) * kernel[0] * kernel[1], oh * ow}, x.options());
  backend_for(x, "unfold").unfold2d(x, params, cols);
  if (rec) rec->unfold2d(x, params, cols);
  return cols;
}

Tensor fold(const Tensor& cols, std::array<int64_t, 2> output_size, std::array<int64_t, 2> kernel,
            const Conv2dOptions& options) {
  GW_CHECK(cols.dim() == 3 && cols.size(1) % (kernel[0] * kernel[1]) == 0, ShapeError,
           "[fold] expects (N, C*kh*kw, L) columns, got shape ", shape_str(cols.sizes()),
           " for kernel (", kernel[0], ",", kernel[1], ")");
  auto params = pack(kernel, options);
  auto [oh, ow] = output_hw("fold", output_size[0], output_size[1], params);
  GW_CHECK(cols.size(2) == oh * ow, ShapeError, "[fold] columns hold ", cols.size(2),
           " blocks but output size (", output_size[0], ",", output_size[1], ") gives ",
           oh * ow);
  Tensor x = empty({cols.size(0), cols.size(1) / (kernel[0] * kernel[1]), output_size[0],
                    output_size[1]},
                   cols.options());
  backend_for(cols, "fold").fold2d(cols, params, x);
  return x;
}

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
              const Conv2dOptions& options) {
  if (autocast_lowers({&x, &weight, &bias})) {
    return conv2d(autocast_lower(x), autocast_lower(weight), autocast_lower(bias), options);
  }
  GW_CHECK(x.dim() == 4 && weight.dim() == 4 && x.size(1) == weight.size(1), ShapeError,
           "[conv2d] input ", shape_str(x.sizes()), " and weight ", shape_str(weight.sizes()),
           " do not fit (expected (N,C,H,W) and (O,C,kh,kw))");
  const int64_t n = x.size(0), o = weight.size(0);
  Tensor cols = unfold(x, {weight.size(2), weight.size(3)}, options);  // (N, C*kh*kw, L)
  auto [oh, ow] = output_hw("conv2d", x.size(2), x.size(3), pack({weight.size(2), weight.size(3)}, options));
  Tensor y = matmul(weight.reshape({o, -1}), cols).view({n, o, oh, ow});
  if (bias.defined()) y = add(y, bias.view({1, o, 1, 1}));
  return y;
}

Tensor max_pool2d(const Tensor& x, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                  std::array<int64_t, 2> padding) {
  GW_CHECK(x.dim() == 4, ShapeError, "[max_pool2d] expects an (N,C,H,W) input, got shape ",
           shape_str(x.sizes()));
  if (stride[0] == 0 && stride[1] == 0) stride = kernel;
  Conv2dOptions opts{stride, padding, {1, 1}};
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  auto [oh, ow] = output_hw("max_pool2d", h, w, pack(kernel, opts));
  Tensor cols = unfold(x.reshape({n * c, 1, h, w}), kernel, opts);  // (N*C, kh*kw, L)
  if (padding[0] > 0 || padding[1] > 0) {
    // Padded taps must never win: mark them by unfolding a plane of ones.
    Tensor inside = unfold(ones({1, 1, h, w}, x.options()), kernel, opts);
    cols = where(gt(inside, 0), cols, Scalar(-std::numeric_limits<double>::infinity()));
  }
  return max(cols, 1).values.view({n, c, oh, ow});
}

}  // namespace gw

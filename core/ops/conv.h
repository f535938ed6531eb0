// Convolution and pooling for images in NCHW layout, built on im2col (unfold) and a GEMM.
#pragma once

#include <array>

#include "core/tensor.h"

namespace gw {

struct Conv2dOptions {
  std::array<int64_t, 2> stride{1, 1};
  std::array<int64_t, 2> padding{0, 0};
  std::array<int64_t, 2> dilation{1, 1};
};

// torch.nn.functional.unfold: (N,C,H,W) -> (N, C*kh*kw, L) sliding blocks, and its adjoint
// fold back to (N,C,H,W) (overlapping blocks are summed).
Tensor unfold(const Tensor& x, std::array<int64_t, 2> kernel, const Conv2dOptions& options = {});
Tensor fold(const Tensor& cols, std::array<int64_t, 2> output_size,
            std::array<int64_t, 2> kernel, const Conv2dOptions& options = {});

// x (N,C,H,W), weight (O,C,kh,kw), bias (O) or undefined.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = {},
              const Conv2dOptions& options = {});
// Max over kernel windows; stride defaults to the kernel size, padding counts as -inf.
Tensor max_pool2d(const Tensor& x, std::array<int64_t, 2> kernel,
                  std::array<int64_t, 2> stride = {0, 0}, std::array<int64_t, 2> padding = {0, 0});

}  // namespace gw

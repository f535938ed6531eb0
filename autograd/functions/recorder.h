// The autograd layer's GradRecorder (see core/grad_hooks.h). Its methods are defined next to
// the derivative rules of each op family: elementwise.cpp, reduce.cpp, linalg.cpp, shape.cpp,
// index.cpp, conv.cpp.
#pragma once

#include "core/grad_hooks.h"

namespace gw::autograd {

class Recorder final : public GradRecorder {
 public:
  void unary(UnaryOp op, const Tensor& x, const Tensor& out) override;
  void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) override;
  void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) override;
  void clamp(const Tensor& x, std::optional<Scalar> lo, std::optional<Scalar> hi,
             const Tensor& out) override;
  void reduce(ReduceOp op, const Tensor& x, const Shape& dims, bool keepdim,
              const Tensor& out) override;
  void reduce_with_index(const Tensor& x, int64_t dim, bool keepdim, const Tensor& values,
                         const Tensor& indices) override;
  void matmul(const Tensor& a, const Tensor& b, const Tensor& out) override;
  void addmm(const Tensor& input, const Tensor& a, const Tensor& b, const Tensor& out) override;
  void softmax(const Tensor& x, int64_t dim, bool log, const Tensor& out) override;
  void index_select(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& out) override;
  void gather(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& out) override;
  void scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src,
                   const Tensor& out) override;
  void cat(const std::vector<Tensor>& inputs, int64_t dim, const Tensor& out) override;
  void convert(const Tensor& x, const Tensor& out) override;
  void reshape(const Tensor& x, const Tensor& out) override;
  void permute(const Tensor& x, const Shape& dims, const Tensor& out) override;
  void expand(const Tensor& x, const Tensor& out) override;
  void sub_view(const Tensor& x, const Tensor& out,
                std::function<Tensor(const Tensor&)> replay) override;
  void unfold2d(const Tensor& x, const std::array<int64_t, 8>& params, const Tensor& out) override;
};

}  // namespace gw::autograd

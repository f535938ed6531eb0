#include "core/ops/index.h"

#include "core/backend.h"
#include "core/grad_hooks.h"
#include "core/ops/creation.h"
#include "core/ops/shape_ops.h"

namespace gw {

namespace {
Tensor as_index(const Tensor& index, const char* op) {
  GW_CHECK(index.dtype() == kInt64 || index.dtype() == kInt32, DTypeError, "[", op,
           "] index must be int64 or int32, got ", index.dtype());
  if (index.dtype() == kInt64) return index;
  // A broadcast index (index_select's, the embedding's gradient) stays broadcast, which the
  // backends' whole-row paths look for.
  return unexpanded(index).to(kInt64).expand(index.sizes());
}

// gather/scatter_add: index has x's rank and is no larger than `other` outside `dim`.
void check_index_shape(const char* op, const Tensor& index, const Tensor& x, int64_t dim,
                       const char* what) {
  GW_CHECK(index.dim() == x.dim(), ShapeError, "[", op, "] index has ", index.dim(),
           " dims but ", what, " has ", x.dim(), " (index shape ", shape_str(index.sizes()),
           ", ", what, " shape ", shape_str(x.sizes()), ")");
  for (int64_t d = 0; d < x.dim(); ++d) {
    GW_CHECK(d == dim || index.size(d) <= x.size(d), ShapeError, "[", op, "] index shape ",
             shape_str(index.sizes()), " is larger than ", what, " shape ",
             shape_str(x.sizes()), " in dim ", d);
  }
}
}  // namespace

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  check_same_device("index_select", {&x, &index});
  Tensor idx = as_index(index, "index_select");
  GW_CHECK(idx.dim() <= 1, ShapeError, "[index_select] index must be 1-D, got shape ",
           shape_str(idx.sizes()));
  if (x.dim() == 0) return index_select(x.reshape({1}), dim, index).reshape({});
  int64_t d = wrap_dim(dim, x.dim(), "index_select");
  Shape shape = x.sizes();
  shape[d] = idx.numel();
  GradRecorder* rec = detail::recorder_for(x);
  detail::NoRecordScope no_record;
  Tensor flat = idx.reshape({-1});
  Tensor out = empty(shape, x.options());
  backend_for(x, "index_select").index_select(x, d, flat, out);
  if (rec) rec->index_select(x, d, flat, out);
  return out;
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  check_same_device("gather", {&x, &index});
  Tensor idx = as_index(index, "gather");
  if (x.dim() == 0) {  // a 0-dim tensor gathers like a 1-element vector
    wrap_dim(dim, 1, "gather");
    return gather(x.reshape({1}), 0, idx.reshape({-1})).reshape(idx.sizes());
  }
  int64_t d = wrap_dim(dim, std::max<int64_t>(x.dim(), 1), "gather");
  check_index_shape("gather", idx, x, d, "input");
  GradRecorder* rec = detail::recorder_for(x);
  detail::NoRecordScope no_record;
  Tensor out = empty(idx.sizes(), x.options());
  backend_for(x, "gather").gather(x, d, idx, out);
  if (rec) rec->gather(x, d, idx, out);
  return out;
}

Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  check_same_device("scatter_add", {&x, &index, &src});
  GradRecorder* rec = detail::recorder_for({&x, &src});
  detail::NoRecordScope no_record;
  Tensor out = x.clone();
  out.scatter_add_(dim, index, src);
  if (rec) rec->scatter_add(x, dim, index, src, out);
  return out;
}

Tensor& Tensor::scatter_add_(int64_t dim, const Tensor& index, const Tensor& src) {
  check_same_device("scatter_add", {this, &index, &src});
  detail::check_inplace_allowed(*this, "scatter_add_");
  check_writable("scatter_add_", *this);
  GW_CHECK(!detail::recorder_for(src), InvalidArgumentError,
           "[scatter_add_] an in-place op records no gradient, and src requires grad; use "
           "scatter_add(), or run it under NoGradGuard");
  Tensor idx = as_index(index, "scatter_add");
  if (this->dim() == 0) {  // a 0-dim tensor scatters like a 1-element vector, as it gathers
    wrap_dim(dim, 1, "scatter_add");
    view({1}).scatter_add_(0, idx.reshape({-1}), src.reshape({-1}));
    bump_version();
    return *this;
  }
  int64_t d = wrap_dim(dim, std::max<int64_t>(this->dim(), 1), "scatter_add");
  GW_CHECK(src.dtype() == dtype(), DTypeError, "[scatter_add] src has dtype ", src.dtype(),
           " but self has ", dtype());
  check_index_shape("scatter_add", idx, *this, d, "self");
  check_index_shape("scatter_add", idx, src, -1, "src");
  backend_for(*this, "scatter_add").scatter_add(*this, d, idx, src);
  bump_version();
  return *this;
}

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  GW_CHECK(weight.dim() == 2, ShapeError, "[embedding] weight must be 2-D, got shape ",
           shape_str(weight.sizes()));
  Shape shape = indices.sizes();
  shape.push_back(weight.size(1));
  return index_select(weight, 0, indices.reshape({-1})).view(shape);
}

Tensor one_hot(const Tensor& indices, int64_t num_classes) {
  Tensor idx = as_index(indices, "one_hot");
  GW_CHECK(num_classes > 0, InvalidArgumentError, "[one_hot] num_classes must be positive, got ",
           num_classes);
  Shape shape = idx.sizes();
  shape.push_back(num_classes);
  Tensor out = zeros(shape, idx.options());
  std::vector<int64_t> values = idx.to_vector<int64_t>();
  for (int64_t v : values) {
    GW_CHECK(v >= 0 && v < num_classes, IndexError, "[one_hot] class ", v,
             " is out of range for num_classes ", num_classes);
  }
  out.scatter_add_(-1, idx.unsqueeze(-1), ones(idx.unsqueeze(-1).sizes(), idx.options()));
  return out;
}

}  // namespace gw

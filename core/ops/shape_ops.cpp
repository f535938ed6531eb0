#include "core/ops/shape_ops.h"

#include "core/grad_hooks.h"
#include "core/ops/creation.h"
#include "core/ops/elementwise.h"

namespace gw {

Tensor reshape(const Tensor& x, Shape shape) { return x.reshape(std::move(shape)); }
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) { return x.transpose(dim0, dim1); }
Tensor permute(const Tensor& x, Shape dims) { return x.permute(std::move(dims)); }
Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  return x.flatten(start_dim, end_dim);
}
Tensor squeeze(const Tensor& x) { return x.squeeze(); }
Tensor squeeze(const Tensor& x, int64_t dim) { return x.squeeze(dim); }
Tensor unsqueeze(const Tensor& x, int64_t dim) { return x.unsqueeze(dim); }
Tensor expand(const Tensor& x, Shape shape) { return x.expand(std::move(shape)); }
Tensor broadcast_to(const Tensor& x, Shape shape) { return x.expand(std::move(shape)); }
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  return x.narrow(dim, start, length);
}
Tensor select(const Tensor& x, int64_t dim, int64_t index) { return x.select(dim, index); }
Tensor unexpanded(const Tensor& x) {
  Tensor distinct = x;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (x.stride(d) == 0 && x.size(d) > 1) distinct = distinct.narrow(d, 0, 1);
  return distinct;
}

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  GW_CHECK(!tensors.empty(), InvalidArgumentError, "[cat] expects a non-empty list of tensors");
  // Like PyTorch, 1-D empty tensors are skipped (a legacy convenience for accumulating).
  std::vector<const Tensor*> parts;
  for (const Tensor& t : tensors) {
    if (!(t.dim() == 1 && t.numel() == 0)) parts.push_back(&t);
  }
  if (parts.empty()) return tensors.front().clone();
  const Tensor& first = *parts.front();
  DType dtype = first.dtype();
  for (const Tensor& t : tensors) dtype = promote_types(dtype, t.dtype());  // skipped ones too
  GW_CHECK(first.dim() > 0, ShapeError, "[cat] zero-dimensional tensor cannot be concatenated");
  int64_t d = wrap_dim(dim, first.dim(), "cat");
  Shape shape = first.sizes();
  shape[d] = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Tensor& t = *parts[i];
    GW_CHECK(t.dim() == first.dim(), ShapeError, "[cat] tensor ", i, " has ", t.dim(),
             " dims but tensor 0 has ", first.dim());
    GW_CHECK(t.device() == first.device(), InvalidArgumentError, "[cat] tensor ", i, " is on ",
             t.device(), " but tensor 0 is on ", first.device());
    for (int64_t k = 0; k < t.dim(); ++k) {
      GW_CHECK(k == d || t.size(k) == first.size(k), ShapeError, "[cat] sizes must match except in dim ",
               d, ": tensor ", i, " has shape ", shape_str(t.sizes()), ", tensor 0 has ",
               shape_str(first.sizes()));
    }
    shape[d] += t.size(d);
  }
  GradRecorder* rec = nullptr;
  for (const Tensor& t : tensors) rec = rec ? rec : detail::recorder_for(t);
  detail::NoRecordScope no_record;
  Tensor out = empty(shape, first.options().with_dtype(dtype));
  int64_t offset = 0;
  for (const Tensor* t : parts) {
    out.narrow(d, offset, t->size(d)).copy_(*t);
    offset += t->size(d);
  }
  if (rec) rec->cat(tensors, d, out);
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  GW_CHECK(!tensors.empty(), InvalidArgumentError, "[stack] expects a non-empty list of tensors");
  int64_t d = wrap_dim(dim, tensors.front().dim() + 1, "stack");
  std::vector<Tensor> parts;
  parts.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    GW_CHECK(tensors[i].sizes() == tensors.front().sizes(), ShapeError,
             "[stack] expects tensors of one shape, got ", shape_str(tensors.front().sizes()),
             " at 0 and ", shape_str(tensors[i].sizes()), " at ", i);
    parts.push_back(tensors[i].unsqueeze(d));
  }
  return cat(parts, d);
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  GW_CHECK(x.dim() > 0, ShapeError, "[split] a 0-dim tensor has no dim to split");
  int64_t d = wrap_dim(dim, x.dim(), "split");
  GW_CHECK(split_size > 0 || (split_size == 0 && x.size(d) == 0), InvalidArgumentError,
           "[split] split_size must be positive, got ", split_size);
  std::vector<Tensor> out;
  int64_t n = x.size(d);
  for (int64_t start = 0; start < n; start += split_size) {
    out.push_back(x.narrow(d, start, std::min(split_size, n - start)));
  }
  if (out.empty()) out.push_back(x);
  return out;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  GW_CHECK(x.dim() > 0, ShapeError, "[split] a 0-dim tensor has no dim to split");
  int64_t d = wrap_dim(dim, x.dim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    GW_CHECK(s >= 0, InvalidArgumentError, "[split] negative split size ", s);
    total += s;
  }
  GW_CHECK(total == x.size(d), ShapeError, "[split] sizes sum to ", total,
           " but dim ", d, " has size ", x.size(d));
  std::vector<Tensor> out;
  int64_t start = 0;
  for (int64_t s : sizes) {
    out.push_back(x.narrow(d, start, s));
    start += s;
  }
  return out;
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  GW_CHECK(chunks > 0, InvalidArgumentError, "[chunk] chunks must be positive, got ", chunks);
  GW_CHECK(x.dim() > 0, ShapeError, "[chunk] a 0-dim tensor has no dim to split");
  int64_t d = wrap_dim(dim, x.dim(), "chunk");
  // An empty dim splits into `chunks` empty tensors, as in PyTorch (split alone would give one).
  if (x.size(d) == 0) {
    std::vector<Tensor> out;
    for (int64_t i = 0; i < chunks; ++i) out.push_back(x.narrow(d, 0, 0));
    return out;
  }
  return split(x, (x.size(d) + chunks - 1) / chunks, d);
}

}  // namespace gw

#include "dist/process_group/process_group.h"

#include "core/ops.h"

namespace gw::dist {

namespace {
constexpr int64_t kMaxDims = 8;

std::string describe(const Tensor& summary) {
  auto v = summary.to_vector<int64_t>();
  std::string shape = "(";
  for (int64_t d = 0; d < v[1]; ++d) shape += (d ? ", " : "") + std::to_string(v[2 + d]);
  return shape + (v[1] == 1 ? ",) " : ") ") +
         std::string(dtype_name(static_cast<DType>(v[0])));
}
}  // namespace

void ProcessGroup::check_same_shape(const Tensor& tensor, const std::string& what) {
  GW_CHECK(tensor.dim() <= kMaxDims, InvalidArgumentError, "[", what, "] tensors of more than ",
           kMaxDims, " dimensions cannot be checked across ranks");
  std::vector<int64_t> mine(2 + kMaxDims, 0);
  mine[0] = static_cast<int64_t>(tensor.dtype());
  mine[1] = tensor.dim();
  for (int64_t d = 0; d < tensor.dim(); ++d) mine[2 + d] = tensor.size(d);
  Tensor summary = from_vector<int64_t>(mine);
  std::vector<Tensor> all;
  for (int r = 0; r < size(); ++r) all.push_back(empty_like(summary));
  allgather(all, summary)->wait();
  for (int r = 0; r < size(); ++r)
    GW_CHECK(equal(all[r], summary), InvalidArgumentError, "[", what, "] rank ", rank(),
             " has ", describe(summary), " but rank ", r, " has ", describe(all[r]));
}

}  // namespace gw::dist

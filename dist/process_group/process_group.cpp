#include "dist/process_group/process_group.h"

#include <algorithm>
#include <cstring>
#include <string_view>

#include "core/ops.h"
#include "dist/process_group/debug_process_group.h"
#include "store/prefix_store.h"

namespace gw::dist {

namespace {
constexpr int64_t kMaxDims = 8;

std::string describe(const Tensor& summary) {
  auto v = summary.to_vector<int64_t>();
  std::string shape = "(";
  for (int64_t d = 0; d < v[1]; ++d) shape += (d ? ", " : "") + std::to_string(v[2 + d]);
  return shape + (v[1] == 1 ? ",) " : ") ") + std::string(dtype_name(static_cast<DType>(v[0])));
}
}  // namespace

std::string to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM:
      return "SUM";
    case ReduceOp::AVG:
      return "AVG";
    case ReduceOp::PRODUCT:
      return "PRODUCT";
    case ReduceOp::MIN:
      return "MIN";
    case ReduceOp::MAX:
      return "MAX";
  }
  return "?";
}

ProcessGroup::ProcessGroup(int rank, int size, std::shared_ptr<store::Store> store)
    : rank_(rank),
      size_(size),
      barrier_store_(
          store ? std::make_shared<store::PrefixStore>("monitored_barrier", std::move(store))
                : nullptr) {}

void ProcessGroup::monitored_barrier(Milliseconds timeout) {
  GW_CHECK(barrier_store_, StateError, "[monitored_barrier] this ", backend(),
           " group was made without a store");
  GW_CHECK(timeout.count() > 0, InvalidArgumentError,
           "[monitored_barrier] the timeout must be positive, got ", timeout.count(), " ms");
  const int64_t n = ++barriers_;
  const auto got =
      detail::store_round(*barrier_store_, std::to_string(n) + "/", rank(), size(), "", timeout);
  GW_CHECK(got.missing.empty(), TimeoutError, "[monitored_barrier] ",
           detail::ranks_text(got.missing), " did not arrive within ", timeout.count(),
           " ms (barrier #", n, ", rank ", rank(), " of ", size(), ")");
  if (n > 1) detail::delete_round(*barrier_store_, std::to_string(n - 1) + "/", rank());
}

void ProcessGroup::check_tensor(const char* op, const Tensor& t, const char* what) const {
  GW_CHECK(t.defined(), InvalidArgumentError, "[", op, "] the ", what, " is undefined");
  GW_CHECK(t.device() == device(), InvalidArgumentError, "[", op, "] the ", backend(),
           " group of rank ", rank(), " takes tensors on ", device().str(), "; the ", what,
           " is on ", t.device().str());
  GW_CHECK(t.is_contiguous(), InvalidArgumentError, "[", op, "] the ", what,
           " must be contiguous; got shape ", shape_str(t.sizes()), " with strides ",
           shape_str(t.strides()));
}

void ProcessGroup::check_like(const char* op, const Tensor& t, const Tensor& like,
                              const char* what) const {
  check_tensor(op, t, what);
  GW_CHECK(t.dtype() == like.dtype() && t.numel() == like.numel(), InvalidArgumentError, "[", op,
           "] every ", what, " must have ", like.numel(), " elements of ", dtype_name(like.dtype()),
           "; got ", t.numel(), " of ", dtype_name(t.dtype()));
}

void ProcessGroup::check_count(const char* op, size_t got, const char* what) const {
  GW_CHECK(got == static_cast<size_t>(size()), InvalidArgumentError, "[", op, "] needs ", size(),
           " ", what, " (one per rank), got ", got);
}

void ProcessGroup::check_rank(const char* op, int r, const char* what) const {
  GW_CHECK(r >= 0 && r < size(), InvalidArgumentError, "[", op, "] ", what, " ", r,
           " is outside [0, ", size(), ")");
}

void ProcessGroup::check_p2p(const char* op, const Tensor& t, int peer, int tag) const {
  check_tensor(op, t);
  const bool sending = std::string_view(op) == "send";
  check_rank(op, peer, sending ? "destination" : "source");
  GW_CHECK(peer != rank(), InvalidArgumentError, "[", op, "] rank ", rank(),
           sending ? " cannot send to itself" : " cannot receive from itself");
  GW_CHECK(tag >= 0, InvalidArgumentError, "[", op, "] tag must be >= 0, got ", tag);
}

Tensor ProcessGroup::concat(const std::vector<Tensor>& parts) {
  std::vector<Tensor> flat;
  for (const auto& p : parts) flat.push_back(p.reshape({-1}));
  return cat(flat, 0);
}

void ProcessGroup::split(const Tensor& flat, std::vector<Tensor>& parts) {
  const auto* from = static_cast<const uint8_t*>(flat.raw_data());
  for (auto& p : parts) {
    std::memcpy(p.raw_data(), from, p.nbytes());
    from += p.nbytes();
  }
}

void ProcessGroup::divide(const Tensor& t, int n, const char* op) {
  dispatch<FloatTypes>(t.dtype(), op, [&]<typename T>() {
    divide(t.data_ptr<T>(), static_cast<size_t>(t.numel()), n);
  });
}

void ProcessGroup::check_avg(const char* op, const Tensor& t, ReduceOp reduce) {
  GW_CHECK(reduce != ReduceOp::AVG || t.is_floating_point(), InvalidArgumentError, "[", op,
           "] AVG needs a floating point tensor, got ", dtype_name(t.dtype()));
}

void ProcessGroup::check_coalesced(const char* op, const std::vector<Tensor>& tensors) const {
  GW_CHECK(!tensors.empty(), InvalidArgumentError, "[", op, "] no tensors given");
  for (const auto& t : tensors) {
    check_tensor(op, t);
    GW_CHECK(t.dtype() == tensors[0].dtype(), InvalidArgumentError, "[", op,
             "] every tensor must be ", dtype_name(tensors[0].dtype()), "; got ",
             dtype_name(t.dtype()));
  }
}

void ProcessGroup::check_allgather(const std::vector<Tensor>& outputs, const Tensor& input) const {
  check_tensor("allgather", input, "input");
  check_count("allgather", outputs.size(), "outputs");
  for (const auto& t : outputs) check_like("allgather", t, input, "output");
}

void ProcessGroup::check_reduce_scatter(const Tensor& output,
                                        const std::vector<Tensor>& inputs) const {
  check_tensor("reduce_scatter", output, "output");
  check_count("reduce_scatter", inputs.size(), "inputs");
  for (const auto& t : inputs) check_like("reduce_scatter", t, output, "input");
}

void ProcessGroup::check_flat(const char* op, const Tensor& whole, const char* whole_name,
                              const Tensor& chunk, const char* chunk_name) const {
  check_tensor(op, chunk, chunk_name);
  check_tensor(op, whole, whole_name);
  GW_CHECK(whole.dtype() == chunk.dtype() && whole.numel() == chunk.numel() * size(),
           InvalidArgumentError, "[", op, "] the ", whole_name, " must hold ", size(),
           " chunks like the ", chunk_name, " (", size(), " x ", chunk.numel(), " elements of ",
           dtype_name(chunk.dtype()), "); got ", whole.numel(), " of ", dtype_name(whole.dtype()));
}

void ProcessGroup::check_alltoall(const std::vector<Tensor>& outputs,
                                  const std::vector<Tensor>& inputs) const {
  check_count("alltoall", inputs.size(), "inputs");
  check_count("alltoall", outputs.size(), "outputs");
  for (const auto& t : inputs) check_like("alltoall", t, inputs[0], "input");
  for (const auto& t : outputs) check_like("alltoall", t, inputs[0], "output");
}

void ProcessGroup::check_root_parts(const char* op, const std::vector<Tensor>& parts,
                                    const Tensor& like, int root, const char* what) const {
  check_rank(op, root, "root");
  if (rank() == root) {
    check_count(op, parts.size(), (std::string(what) + " on the root").c_str());
    for (const auto& t : parts) check_like(op, t, like, what);
  } else {
    GW_CHECK(parts.empty(), InvalidArgumentError, "[", op, "] only the root (rank ", root,
             ") takes ", what, "; rank ", rank(), " got ", parts.size());
  }
}

void ProcessGroup::check_group_args(const char* who, bool has_store, int rank, int size,
                                    Milliseconds timeout) {
  GW_CHECK(has_store, InvalidArgumentError, "[", who, "] no store given");
  GW_CHECK(size > 0 && rank >= 0 && rank < size, InvalidArgumentError, "[", who, "] rank ", rank,
           " is outside [0, world_size=", size, ")");
  GW_CHECK(timeout.count() > 0, InvalidArgumentError, "[", who,
           "] the timeout must be positive, got ", timeout.count(), " ms");
}

void ProcessGroup::check_same_shape(const Tensor& tensor, const std::string& what) {
  check_same_shapes({tensor}, {"tensor"}, what);
}

void ProcessGroup::check_same_shapes(const std::vector<Tensor>& tensors,
                                     const std::vector<std::string>& names,
                                     const std::string& what) {
  GW_CHECK(tensors.size() == names.size(), InvalidArgumentError, "[", what, "] ", tensors.size(),
           " tensors but ", names.size(), " names");
  auto gather = [&](const Tensor& mine) {  // on the CPU, through the group's device
    Tensor sent = mine.to(device());
    std::vector<Tensor> all;
    for (int r = 0; r < size(); ++r) all.push_back(empty_like(sent));
    allgather(all, sent)->wait();
    for (auto& t : all) t = t.to(kCPU);
    return all;
  };
  // Every rank takes part in both steps, even one that is about to fail, so none is left
  // waiting in a collective the others never join.
  const auto count = static_cast<int64_t>(tensors.size());
  auto counts = gather(from_vector<int64_t>({count}));
  for (int r = 0; r < size(); ++r)
    GW_CHECK(counts[r].item<int64_t>() == count, InvalidArgumentError, "[", what, "] rank ", rank(),
             " has ", count, " tensors but rank ", r, " has ", counts[r].item<int64_t>());
  if (count == 0) return;
  constexpr int64_t kRow = 2 + kMaxDims;  // dtype, dims (-1: too many), sizes
  std::vector<int64_t> mine(static_cast<size_t>(count * kRow), 0);
  for (int64_t i = 0; i < count; ++i) {
    const Tensor& t = tensors[static_cast<size_t>(i)];
    mine[i * kRow] = static_cast<int64_t>(t.dtype());
    mine[i * kRow + 1] = t.dim() <= kMaxDims ? t.dim() : -1;
    for (int64_t d = 0; d < std::min(t.dim(), kMaxDims); ++d) mine[i * kRow + 2 + d] = t.size(d);
  }
  Tensor summary = from_vector<int64_t>(mine).view({count, kRow});
  auto all = gather(summary);
  for (int64_t i = 0; i < count; ++i) {
    const std::string& name = names[static_cast<size_t>(i)];
    Tensor row = summary.select(0, i);
    GW_CHECK(row[1].item<int64_t>() >= 0, InvalidArgumentError, "[", what, "] ", name,
             " has more than ", kMaxDims, " dimensions: shapes cannot be compared across ranks");
    for (int r = 0; r < size(); ++r)
      GW_CHECK(equal(all[r].select(0, i), row), InvalidArgumentError, "[", what, "] ", name,
               ": rank ", rank(), " has ", describe(row), " but rank ", r, " has ",
               describe(all[r].select(0, i)));
  }
}

}  // namespace gw::dist

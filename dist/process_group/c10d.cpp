#include "dist/process_group/c10d.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>

#include "core/error.h"
#include "core/ops.h"
#include "dist/process_group/init_process_group.h"

namespace gw::dist {
namespace {

std::string list(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// What a rank brings to all_to_all_single, as every rank checks it: whether its own arguments
// are sound (else `problem` says why), its dtype and row size, and its splits.
struct Plan {
  std::string problem;
  std::vector<int64_t> in, out;  // rows to each rank, from each rank
  int64_t dtype = 0, row = 0;    // row: elements per row
};

Plan plan_of(const Tensor& output, const Tensor& input, const std::vector<int64_t>& out_given,
             const std::vector<int64_t>& in_given, const ProcessGroup& group) {
  const int n = group.size();
  Plan p;
  auto splits = [&](const std::vector<int64_t>& given, const Tensor& t, const char* what) {
    if (!t.defined() || t.dim() < 1) {
      p.problem = std::string("the ") + what + " is not a tensor of at least one dimension";
      return std::vector<int64_t>(static_cast<size_t>(n), 0);
    }
    const int64_t rows = t.size(0);
    if (given.empty()) {
      if (rows % n != 0)
        p.problem = std::string("the ") + what + "'s " + std::to_string(rows) +
                    " rows do not divide into " + std::to_string(n) +
                    " equal chunks: give its split sizes";
      return std::vector<int64_t>(static_cast<size_t>(n), rows / n);
    }
    if (given.size() != static_cast<size_t>(n) ||
        std::any_of(given.begin(), given.end(), [](int64_t s) { return s < 0; }) ||
        std::accumulate(given.begin(), given.end(), int64_t{0}) != rows) {
      p.problem = std::string(what) + " split sizes " + list(given) + " must be " +
                  std::to_string(n) + " sizes >= 0 adding up to its " + std::to_string(rows) +
                  " rows";
      return std::vector<int64_t>(static_cast<size_t>(n), 0);
    }
    return given;
  };
  p.in = splits(in_given, input, "input");
  p.out = splits(out_given, output, "output");
  if (!p.problem.empty()) return p;
  Shape in_row = input.sizes(), out_row = output.sizes();
  in_row[0] = out_row[0] = 1;
  if (in_row != out_row || input.dtype() != output.dtype())
    p.problem = "the output's rows (" + shape_str(output.sizes()) + ", " +
                std::string(dtype_name(output.dtype())) + ") differ from the input's (" +
                shape_str(input.sizes()) + ", " + std::string(dtype_name(input.dtype())) + ")";
  else if (input.device() != group.device() || output.device() != group.device())
    p.problem = "the tensors must be on " + group.device().str();
  else if (output.requires_grad())
    p.problem = "the output requires grad (all_to_all_single is not differentiable)";
  p.dtype = static_cast<int64_t>(input.dtype());
  p.row = std::accumulate(in_row.begin(), in_row.end(), int64_t{1}, std::multiplies<>());
  return p;
}

// A tensor of `rows` rows shaped like `like`'s rows.
Tensor rows_like(const Tensor& like, int64_t rows) {
  Shape shape = like.sizes();
  shape[0] = rows;
  return zeros(shape, TensorOptions(like.dtype()).with_device(like.device()));
}

// Bytes travel as int32 words (every backend reduces and moves those).
Tensor words_of(const std::vector<uint8_t>& bytes, int64_t words, Device device) {
  Tensor t = zeros({words}, TensorOptions(kInt32));
  if (!bytes.empty()) std::memcpy(t.raw_data(), bytes.data(), bytes.size());
  return t.to(device);
}

std::vector<uint8_t> bytes_of(const Tensor& words, int64_t length) {
  const Tensor cpu = words.to(kCPU).contiguous();
  const auto* p = static_cast<const uint8_t*>(cpu.raw_data());
  return std::vector<uint8_t>(p, p + length);
}

int64_t words_for(int64_t bytes) { return (bytes + 3) / 4; }

}  // namespace

int get_rank() { return default_process_group()->rank(); }
int get_world_size() { return default_process_group()->size(); }

void all_to_all_single(ProcessGroup& group, Tensor& output, const Tensor& input,
                       const std::vector<int64_t>& output_split_sizes,
                       const std::vector<int64_t>& input_split_sizes) {
  const int n = group.size(), me = group.rank();
  const Plan mine = plan_of(output, input, output_split_sizes, input_split_sizes, group);
  // One allgather of every rank's plan, so that every rank checks the same things and raises
  // alike, instead of one raising while the others wait in a collective.
  std::vector<int64_t> row{mine.problem.empty() ? 1 : 0, mine.dtype, mine.row};
  row.insert(row.end(), mine.in.begin(), mine.in.end());
  row.insert(row.end(), mine.out.begin(), mine.out.end());
  const auto on_device = TensorOptions(kInt64).with_device(group.device());
  std::vector<Tensor> rows;
  for (int r = 0; r < n; ++r) rows.push_back(zeros({static_cast<int64_t>(row.size())}, on_device));
  group.allgather(rows, from_vector<int64_t>(row).to(group.device()))->wait();
  std::vector<std::vector<int64_t>> plans;
  for (const Tensor& t : rows) plans.push_back(t.to(kCPU).to_vector<int64_t>());
  auto in_of = [&](int r, int to) { return plans[r][3 + to]; };
  auto out_of = [&](int r, int from) { return plans[r][3 + n + from]; };
  GW_CHECK(mine.problem.empty(), InvalidArgumentError, "[all_to_all_single] rank ", me, ": ",
           mine.problem);
  int64_t largest = 0;
  for (int r = 0; r < n; ++r) {
    GW_CHECK(plans[r][0] == 1, InvalidArgumentError, "[all_to_all_single] rank ", r,
             "'s arguments are wrong (it says why)");
    GW_CHECK(plans[r][1] == mine.dtype && plans[r][2] == mine.row, InvalidArgumentError,
             "[all_to_all_single] rank ", r, " has rows of ", plans[r][2], " elements of dtype #",
             plans[r][1], ", rank ", me, " of ", mine.row, " of dtype #", mine.dtype);
    for (int d = 0; d < n; ++d) {
      GW_CHECK(in_of(r, d) == out_of(d, r), InvalidArgumentError, "[all_to_all_single] rank ", r,
               " sends ", in_of(r, d), " rows to rank ", d, ", which expects ", out_of(d, r));
      largest = std::max(largest, in_of(r, d));
    }
  }
  // Chunks of one size everywhere travel as they are; others padded to the largest chunk of
  // any rank (n x largest rows per rank: skewed splits cost memory), and cut again.
  bool even = true;
  for (int r = 0; r < n; ++r)
    for (int d = 0; d < n; ++d) even = even && in_of(r, d) == largest;
  const Tensor source = input.detach();
  std::vector<Tensor> inputs, outputs;
  int64_t in_at = 0;
  for (int r = 0; r < n; ++r) {
    Tensor chunk = source.narrow(0, in_at, mine.in[r]);
    in_at += mine.in[r];
    if (even) {
      inputs.push_back(chunk.contiguous());
    } else {
      Tensor padded = rows_like(source, largest);
      padded.narrow(0, 0, mine.in[r]).copy_(chunk);
      inputs.push_back(padded);
    }
    outputs.push_back(rows_like(output, largest));
  }
  group.alltoall(outputs, inputs)->wait();
  int64_t out_at = 0;
  for (int r = 0; r < n; ++r) {
    output.narrow(0, out_at, mine.out[r]).copy_(outputs[r].narrow(0, 0, mine.out[r]));
    out_at += mine.out[r];
  }
}

std::vector<WorkPtr> batch_isend_irecv(ProcessGroup& group, const std::vector<P2POp>& ops) {
  // NCCL runs ungrouped sends and receives one after the other on its stream: a ring would wait.
  GW_CHECK(group.backend() != "nccl", InvalidArgumentError,
           "[batch_isend_irecv] not on the nccl group yet (its sends and receives are not "
           "grouped): use send and recv in an order that pairs them");
  // Every operation checked before any starts: none is left half begun for a peer to wait on.
  for (size_t i = 0; i < ops.size(); ++i) {
    const P2POp& op = ops[i];
    GW_CHECK(op.tensor.defined() && op.tensor.is_contiguous() &&
                 op.tensor.device() == group.device() && op.peer >= 0 && op.peer < group.size() &&
                 op.peer != group.rank() && op.tag >= 0,
             InvalidArgumentError, "[batch_isend_irecv] operation ", i,
             ": needs a defined contiguous tensor on ", group.device().str(),
             ", a peer other than this rank (", group.rank(), ") in [0, ", group.size(),
             ") and a tag >= 0; got peer ", op.peer, ", tag ", op.tag);
  }
  std::vector<WorkPtr> works;
  works.reserve(ops.size());
  for (const P2POp& op : ops) {
    Tensor t = op.tensor;
    works.push_back(op.kind == P2POp::kSend ? group.send(t, op.peer, op.tag)
                                            : group.recv(t, op.peer, op.tag));
  }
  return works;
}

std::vector<uint8_t> broadcast_bytes(ProcessGroup& group, const std::vector<uint8_t>& bytes,
                                     int root) {
  GW_CHECK(root >= 0 && root < group.size(), InvalidArgumentError, "[broadcast_bytes] root ", root,
           " is not a rank of a group of ", group.size());
  const bool mine = group.rank() == root;
  Tensor length = full({1}, mine ? static_cast<int64_t>(bytes.size()) : 0,
                       TensorOptions(kInt64).with_device(group.device()));
  group.broadcast(length, {.root = root})->wait();
  const int64_t n = length.to(kCPU).to_vector<int64_t>()[0];
  if (n == 0) return {};
  Tensor words = words_of(mine ? bytes : std::vector<uint8_t>{}, words_for(n), group.device());
  group.broadcast(words, {.root = root})->wait();
  return mine ? bytes : bytes_of(words, n);
}

std::vector<std::vector<uint8_t>> all_gather_bytes(ProcessGroup& group,
                                                   const std::vector<uint8_t>& bytes) {
  const int n = group.size();
  const auto on_device = TensorOptions(kInt64).with_device(group.device());
  Tensor length = full({1}, static_cast<int64_t>(bytes.size()), on_device);
  std::vector<Tensor> lengths;
  for (int r = 0; r < n; ++r) lengths.push_back(zeros({1}, on_device));
  group.allgather(lengths, length)->wait();
  std::vector<int64_t> sizes;
  for (const Tensor& l : lengths) sizes.push_back(l.to(kCPU).to_vector<int64_t>()[0]);
  const int64_t words = words_for(*std::max_element(sizes.begin(), sizes.end()));
  std::vector<std::vector<uint8_t>> all(static_cast<size_t>(n));
  if (words == 0) return all;
  std::vector<Tensor> gathered;
  for (int r = 0; r < n; ++r)
    gathered.push_back(zeros({words}, TensorOptions(kInt32).with_device(group.device())));
  group.allgather(gathered, words_of(bytes, words, group.device()))->wait();
  for (int r = 0; r < n; ++r) all[r] = bytes_of(gathered[r], sizes[r]);
  return all;
}

}  // namespace gw::dist

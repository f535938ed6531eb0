#include "dist/process_group/c10d.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>

#include "core/error.h"
#include "core/ops.h"
#include "dist/process_group/init.h"

namespace gw::dist {
namespace {

std::string list(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// The splits given, or equal ones; checked against the rows they cut.
std::vector<int64_t> splits_of(const std::vector<int64_t>& given, const Tensor& t, int n,
                               const char* what) {
  GW_CHECK(t.defined() && t.dim() >= 1, InvalidArgumentError, "[all_to_all_single] the ", what,
           " must be a tensor of at least one dimension");
  const int64_t rows = t.size(0);
  if (given.empty()) {
    GW_CHECK(rows % n == 0, InvalidArgumentError, "[all_to_all_single] the ", what, "'s ", rows,
             " rows do not divide into ", n, " equal chunks: give its split sizes");
    return std::vector<int64_t>(static_cast<size_t>(n), rows / n);
  }
  GW_CHECK(given.size() == static_cast<size_t>(n) &&
               std::all_of(given.begin(), given.end(), [](int64_t s) { return s >= 0; }) &&
               std::accumulate(given.begin(), given.end(), int64_t{0}) == rows,
           InvalidArgumentError, "[all_to_all_single] ", what, " split sizes ", list(given),
           " must be ", n, " sizes >= 0 adding up to its ", rows, " rows");
  return given;
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
  const int n = group.size();
  const auto in = splits_of(input_split_sizes, input, n, "input");
  const auto out = splits_of(output_split_sizes, output, n, "output");
  Shape in_row = input.sizes(), out_row = output.sizes();
  in_row[0] = out_row[0] = 1;
  GW_CHECK(in_row == out_row && input.dtype() == output.dtype(), InvalidArgumentError,
           "[all_to_all_single] the output's rows (", shape_str(output.sizes()), ", ",
           dtype_name(output.dtype()), ") differ from the input's (", shape_str(input.sizes()),
           ", ", dtype_name(input.dtype()), ")");
  // Chunks of one size everywhere travel as they are; others padded to the largest chunk of
  // any rank, and cut again.
  int64_t largest =
      std::max(*std::max_element(in.begin(), in.end()), *std::max_element(out.begin(), out.end()));
  Tensor m = full({1}, largest, TensorOptions(kInt64).with_device(group.device()));
  group.allreduce(m, {.op = ReduceOp::MAX})->wait();
  largest = m.to(kCPU).to_vector<int64_t>()[0];
  const bool even = std::all_of(in.begin(), in.end(), [&](int64_t s) { return s == largest; }) &&
                    std::all_of(out.begin(), out.end(), [&](int64_t s) { return s == largest; });
  std::vector<Tensor> inputs, outputs;
  int64_t in_at = 0;
  for (int r = 0; r < n; ++r) {
    Tensor chunk = input.narrow(0, in_at, in[r]);
    in_at += in[r];
    if (even) {
      inputs.push_back(chunk.contiguous());
    } else {
      Tensor padded = rows_like(input, largest);
      padded.narrow(0, 0, in[r]).copy_(chunk);
      inputs.push_back(padded);
    }
    outputs.push_back(rows_like(output, largest));
  }
  group.alltoall(outputs, inputs)->wait();
  int64_t out_at = 0;
  for (int r = 0; r < n; ++r) {
    output.narrow(0, out_at, out[r]).copy_(outputs[r].narrow(0, 0, out[r]));
    out_at += out[r];
  }
}

std::vector<WorkPtr> batch_isend_irecv(ProcessGroup& group, const std::vector<P2POp>& ops) {
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

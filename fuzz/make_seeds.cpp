// Writes the seed corpus of fuzz_frame: a few valid frames made by rpc::encode, one file each.
// `./gw fuzz` runs it into its working corpus, so the seeds always follow wire.capnp.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "core/storage.h"
#include "fuzz/support.h"

namespace {

using gw::Tensor;
using gw::rpc::IValue;
using gw::rpc::Message;
using gw::rpc::Request;

// A contiguous tensor whose bytes count up from `first`, so seeds are small but not all zero.
Tensor counting(gw::Shape sizes, gw::DType dtype, uint8_t first = 1) {
  size_t nbytes = static_cast<size_t>(gw::numel(sizes)) * gw::itemsize(dtype);
  Tensor t = Tensor::make(gw::Storage::allocate(nbytes, gw::kCPU), sizes,
                          gw::contiguous_strides(sizes), 0, dtype);
  auto* p = static_cast<uint8_t*>(t.raw_data());
  for (size_t i = 0; i < nbytes; ++i) p[i] = dtype == gw::DType::Bool ? i % 2 : first + i;
  return t;
}

Message message(uint64_t id, gw::rpc::Body body) {
  Message m;
  m.id = id;
  m.body = std::move(body);
  return m;
}

Message handshake() {
  return message(0, gw::rpc::Handshake{gw::rpc::kProtocolVersion, "worker0", 0, {}});
}

Message request_tensors() {
  Tensor x = counting({2, 3}, gw::kFloat32);
  // x twice: one payload each
  return message(
      1, Request(gw::rpc::Call{"my_add", {x, counting({}, gw::kFloat64).requires_grad_(true), x}}));
}

Message request_scalars() {
  return message(
      2, Request(gw::rpc::Call{
             "builtin::echo",
             {int64_t{-7}, 2.5, true, IValue(), std::string("text"), IValue::bytes({0, 1, 2, 255}),
              gw::rpc::IValueList{counting({4}, gw::kInt32), gw::rpc::IValueList{IValue()}},
              IValue::rref_fork({1, {1, 10}, {0, 11}, 0})}}));
}

Message response_tensors() {
  return message(3, gw::rpc::Response{gw::rpc::IValueList{
                                          counting({3}, gw::kInt64), counting({2}, gw::kFloat16),
                                          counting({2, 1}, gw::kBFloat16),
                                          counting({0, 3}, gw::kFloat32), counting({5}, gw::kBool)},
                                      std::nullopt});
}

Message response_error() {
  return message(4, gw::rpc::Response{
                        IValue(), gw::rpc::Failure{"worker1", "[rpc] boom", gw::ErrorCode::kIo}});
}

// The system messages: one of each typed variant.
std::vector<Message> system_messages() {
  return {message(5, Request(gw::rpc::RRefCreate{
                         {1, 2}, {1, 3}, "make", {counting({2}, gw::kFloat32)}})),
          message(6, Request(gw::rpc::RRefFetch{{1, 2}})),
          message(7, Request(gw::rpc::RRefFork{{1, 2}, {0, 4}})),
          message(8, Request(gw::rpc::RRefAccept{{0, 4}})),
          message(9, Request(gw::rpc::RRefDelete{{1, 2}, {0, 4}})),
          message(10, Request(gw::rpc::AutogradGradients{
                          7, 8, 9, false, {counting({3}, gw::kFloat32), Tensor()}, true, true})),
          message(11, Request(gw::rpc::AutogradRelease{{1, 2}})),
          message(13, Request(gw::rpc::AutogradDiscover{7, 9, true, {8, 10}, false})),
          message(12, Request(gw::rpc::AutogradBackward{IValue::rref_fork({1, {1, 2}, {0, 5}, 0}),
                                                        7, false}))};
}

bool write(const std::string& path, const std::vector<std::vector<uint8_t>>& frames) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  for (const auto& b : frames) f.write(reinterpret_cast<const char*>(b.data()), b.size());
  return static_cast<bool>(f);
}

std::vector<uint8_t> bytes_of(const Message& m) {
  return gw::fuzz::frame_bytes(gw::rpc::encode(m));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus dir>\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  std::vector<std::pair<std::string, std::vector<std::vector<uint8_t>>>> seeds = {
      {"handshake", {bytes_of(handshake())}},
      {"request_tensors", {bytes_of(request_tensors())}},
      {"request_scalars", {bytes_of(request_scalars())}},
      {"response_tensors", {bytes_of(response_tensors())}},
      {"response_error", {bytes_of(response_error())}},
      // A connection carries frames back to back: the reader must find the second one.
      {"stream", {bytes_of(handshake()), bytes_of(request_scalars())}},
  };
  std::vector<std::vector<uint8_t>> system;
  for (const Message& m : system_messages()) system.push_back(bytes_of(m));
  seeds.emplace_back("system", std::move(system));
  for (const auto& [name, frames] : seeds) {
    if (!write(dir + "/" + name, frames)) {
      std::fprintf(stderr, "make_seeds: cannot write %s/%s\n", dir.c_str(), name.c_str());
      return 1;
    }
  }
  return 0;
}

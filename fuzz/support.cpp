// Frame reading, frame bytes and message comparison for the fuzz targets (see support.h).
#include "fuzz/support.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/shape.h"
#include "rpc/frame_reader.h"

namespace gw::fuzz {

using rpc::IValue;
using rpc::Message;

std::vector<Message> read_frames(std::span<const uint8_t> data, uint64_t max_frame_bytes,
                                 size_t chunk) {
  rpc::FrameReader reader(max_frame_bytes);
  std::vector<Message> out;
  while (!data.empty()) {
    std::span<const uint8_t> piece = data.first(std::min(chunk, data.size()));
    data = data.subspan(piece.size());
    while (!piece.empty()) {
      const size_t used = reader.feed(piece.data(), piece.size());
      piece = piece.subspan(used);
      if (auto m = reader.take()) out.push_back(std::move(*m));
    }
  }
  return out;
}

std::vector<uint8_t> frame_bytes(const rpc::OutgoingFrame& frame) {
  std::vector<uint8_t> out(frame.prefix.begin(), frame.prefix.end());
  auto header = frame.header.asBytes();
  out.insert(out.end(), header.begin(), header.end());
  for (const Tensor& t : frame.tensors) {
    const auto* p = static_cast<const uint8_t*>(t.raw_data());
    if (t.nbytes() > 0) out.insert(out.end(), p, p + t.nbytes());
  }
  return out;
}

namespace {

std::string tensor_difference(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype()) return detail::str("dtype ", a.dtype(), " vs ", b.dtype());
  if (a.sizes() != b.sizes())
    return detail::str("sizes ", shape_str(a.sizes()), " vs ", shape_str(b.sizes()));
  if (a.requires_grad() != b.requires_grad())
    return detail::str("requires_grad ", a.requires_grad(), " vs ", b.requires_grad());
  // Views are sent as their own elements in row-major order: compare that, not the storage.
  Tensor ca = a.contiguous(), cb = b.contiguous();
  if (ca.nbytes() > 0 && std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()) != 0)
    return "tensor bytes differ";
  return "";
}

std::string value_difference(const IValue& a, const IValue& b, const std::string& where) {
  auto differ = [&](const std::string& what) { return where + ": " + what; };
  if (a.kind() != b.kind())
    return differ(detail::str("kind ", a.kind_name(), " vs ", b.kind_name()));
  switch (a.kind()) {
    case IValue::Kind::kNone:
      return "";
    case IValue::Kind::kBool:
      return a.to_bool() == b.to_bool() ? "" : differ("bool");
    case IValue::Kind::kInt:
      return a.to_int() == b.to_int() ? ""
                                      : differ(detail::str("int ", a.to_int(), " vs ", b.to_int()));
    case IValue::Kind::kDouble: {
      double x = a.to_double(), y = b.to_double();
      return std::memcmp(&x, &y, sizeof x) == 0 ? "" : differ(detail::str("float ", x, " vs ", y));
    }
    case IValue::Kind::kString:
      return a.to_string() == b.to_string()
                 ? ""
                 : differ(detail::str("string of ", a.to_string().size(), " bytes vs ",
                                      b.to_string().size()));
    case IValue::Kind::kTensor: {
      std::string d = tensor_difference(a.to_tensor(), b.to_tensor());
      return d.empty() ? "" : differ(d);
    }
    case IValue::Kind::kList: {
      const auto &la = a.to_list(), &lb = b.to_list();
      if (la.size() != lb.size())
        return differ(detail::str("list of ", la.size(), " vs ", lb.size()));
      for (size_t i = 0; i < la.size(); ++i) {
        std::string d = value_difference(la[i], lb[i], detail::str(where, "[", i, "]"));
        if (!d.empty()) return d;
      }
      return "";
    }
    case IValue::Kind::kBytes:
      return a.to_bytes() == b.to_bytes() ? "" : differ("bytes");
    case IValue::Kind::kRRefFork: {
      const auto &fa = a.to_rref_fork(), &fb = b.to_rref_fork();
      bool same = fa.owner == fb.owner && fa.rref_id == fb.rref_id && fa.fork_id == fb.fork_id &&
                  fa.parent == fb.parent;
      return same ? "" : differ("RRef fork ids");
    }
    case IValue::Kind::kRRef:
    case IValue::Kind::kObject:
      return differ(detail::str(a.kind_name(), " is never sent, so never compared"));
  }
  return differ("unknown kind");
}

}  // namespace

std::string message_difference(const Message& a, const Message& b) {
  if (a.id != b.id) return detail::str("id ", a.id, " vs ", b.id);
  if (a.kind != b.kind)
    return detail::str("kind ", static_cast<int>(a.kind), " vs ", static_cast<int>(b.kind));
  switch (a.kind) {
    case rpc::MessageKind::kHandshake:
      if (a.protocol_version != b.protocol_version) return "protocol_version";
      if (a.worker_name != b.worker_name)
        return detail::str("worker_name of ", a.worker_name.size(), " bytes vs ",
                           b.worker_name.size());
      if (a.worker_id != b.worker_id) return "worker_id";
      return "";
    case rpc::MessageKind::kRequest: {
      if (a.function != b.function)
        return detail::str("function of ", a.function.size(), " bytes vs ", b.function.size());
      return value_difference(IValue(a.args), IValue(b.args), "args");
    }
    case rpc::MessageKind::kResponse:
      if (a.error.has_value() != b.error.has_value()) return "error vs value";
      if (!a.error) return value_difference(a.value, b.value, "value");
      if (a.error->worker != b.error->worker) return "error.worker";
      if (a.error->message != b.error->message) return "error.message";
      if (a.error->code != b.error->code) return "error.code";
      return "";
  }
  return "unknown message kind";
}

void report_finding(const std::string& what) {
  std::fprintf(stderr, "gradwire fuzz finding: %s\n", what.c_str());
  std::abort();
}

}  // namespace gw::fuzz

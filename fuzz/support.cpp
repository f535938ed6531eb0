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

namespace {
std::string id_difference(const rpc::GloballyUniqueId& a, const rpc::GloballyUniqueId& b,
                          const char* what) {
  return a == b ? "" : std::string(what) + " differs";
}

template <typename... Diffs>
std::string first_of(Diffs... diffs) {
  std::string out;
  ((out.empty() ? (void)(out = std::move(diffs)) : (void)0), ...);
  return out;
}

std::string request_difference(const rpc::Request& ra, const rpc::Request& rb) {
  if (ra.index() != rb.index()) return detail::str("request kind ", ra.index(), " vs ", rb.index());
  return std::visit(
      [&](const auto& a) -> std::string {
        using T = std::decay_t<decltype(a)>;
        const T& b = std::get<T>(rb);
        if constexpr (std::is_same_v<T, rpc::Call>) {
          if (a.function != b.function)
            return detail::str("function of ", a.function.size(), " bytes vs ", b.function.size());
          return value_difference(IValue(a.args), IValue(b.args), "args");
        } else if constexpr (std::is_same_v<T, rpc::RRefCreate>) {
          if (a.function != b.function) return "RRefCreate function";
          return first_of(id_difference(a.rref_id, b.rref_id, "rref_id"),
                          id_difference(a.fork_id, b.fork_id, "fork_id"),
                          value_difference(IValue(a.args), IValue(b.args), "args"));
        } else if constexpr (std::is_same_v<T, rpc::RRefFetch>) {
          return id_difference(a.rref_id, b.rref_id, "rref_id");
        } else if constexpr (std::is_same_v<T, rpc::RRefFork> ||
                             std::is_same_v<T, rpc::RRefDelete>) {
          return first_of(id_difference(a.rref_id, b.rref_id, "rref_id"),
                          id_difference(a.fork_id, b.fork_id, "fork_id"));
        } else if constexpr (std::is_same_v<T, rpc::RRefAccept>) {
          return id_difference(a.fork_id, b.fork_id, "fork_id");
        } else if constexpr (std::is_same_v<T, rpc::AutogradGradients>) {
          if (a.context_id != b.context_id || a.message_id != b.message_id ||
              a.pass_id != b.pass_id || a.retain_graph != b.retain_graph ||
              a.returned != b.returned || a.smart != b.smart)
            return "gradients' ids or flags";
          if (a.grads.size() != b.grads.size()) return "number of gradients";
          for (size_t i = 0; i < a.grads.size(); ++i) {
            if (a.grads[i].defined() != b.grads[i].defined()) return "a gradient's presence";
            if (a.grads[i].defined()) {
              std::string d = tensor_difference(a.grads[i], b.grads[i]);
              if (!d.empty()) return detail::str("grads[", i, "]: ", d);
            }
          }
          return "";
        } else if constexpr (std::is_same_v<T, rpc::AutogradDiscover>) {
          if (a.context_id != b.context_id || a.pass_id != b.pass_id ||
              a.retain_graph != b.retain_graph || a.closed != b.closed)
            return "discovery's ids or flags";
          return a.message_ids == b.message_ids ? "" : "discovered message ids";
        } else if constexpr (std::is_same_v<T, rpc::AutogradRelease>) {
          return a.context_ids == b.context_ids ? "" : "released context ids";
        } else {
          static_assert(std::is_same_v<T, rpc::AutogradBackward>);
          if (a.context_id != b.context_id || a.retain_graph != b.retain_graph)
            return "backward's context or flag";
          return value_difference(a.rref, b.rref, "rref");
        }
      },
      ra);
}
}  // namespace

std::string message_difference(const Message& a, const Message& b) {
  if (a.id != b.id) return detail::str("id ", a.id, " vs ", b.id);
  if (a.autograd.has_value() != b.autograd.has_value() ||
      (a.autograd && (a.autograd->context_id != b.autograd->context_id ||
                      a.autograd->message_id != b.autograd->message_id)))
    return "autograd info";
  if (a.body.index() != b.body.index())
    return detail::str("body kind ", a.body.index(), " vs ", b.body.index());
  if (const auto* ha = a.get<rpc::Handshake>()) {
    const auto* hb = b.get<rpc::Handshake>();
    if (ha->protocol_version != hb->protocol_version) return "protocol_version";
    if (ha->worker_name != hb->worker_name)
      return detail::str("worker_name of ", ha->worker_name.size(), " bytes vs ",
                         hb->worker_name.size());
    if (ha->worker_id != hb->worker_id) return "worker_id";
    if (ha->shm != hb->shm) return "shm";
    return a.device_map == b.device_map ? "" : "device_map";
  }
  if (const auto* ra = a.get<rpc::Response>()) {
    const auto* rb = b.get<rpc::Response>();
    if (ra->error.has_value() != rb->error.has_value()) return "error vs value";
    if (!ra->error) return value_difference(ra->value, rb->value, "value");
    if (ra->error->worker != rb->error->worker) return "error.worker";
    if (ra->error->message != rb->error->message) return "error.message";
    if (ra->error->code != rb->error->code) return "error.code";
    return "";
  }
  return request_difference(*a.request(), *b.request());
}

void report_finding(const std::string& what) {
  std::fprintf(stderr, "gradwire fuzz finding: %s\n", what.c_str());
  std::abort();
}

}  // namespace gw::fuzz

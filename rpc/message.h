// RPC messages and their frames (see wire.capnp for the layout on the socket).
//
// A Message is what the agent works with: the handshake that opens a connection, a request (a
// user's Call, or one of the RRef protocol's and distributed autograd's typed messages) or the
// response to one (an IValue or a failure). `encode` turns it
// into an OutgoingFrame whose buffers point at the Cap'n Proto header and straight at tensor
// storage, for one gathered write. Reading goes the other way in two steps, so that tensor bytes
// land directly in new tensor storage: `parse_prefix` and a FrameHeader validate what the peer
// claims before anything is allocated, then the FrameHeader builds the Message once the payload
// has been read into the tensors. rpc/frame_reader.h strings these steps together for a stream.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include <capnp/common.h>
#include <capnp/serialize.h>
#include <kj/array.h>

#include "core/dtype.h"
#include "core/shape.h"
#include "core/tensor.h"
#include "rpc/ivalue.h"
#include "rpc/rref_id.h"

namespace gw::rpc {

// 2: autograd info; 3: CUDA tensors; 4: every system message a typed variant of the body.
inline constexpr uint32_t kProtocolVersion = 4;
inline constexpr size_t kFramePrefixBytes = 16;

// An error raised by the callee, carried back to the caller.
struct Failure {
  std::string worker;
  std::string message;
  ErrorCode code = ErrorCode::kRemote;
};

// The autograd part of a message (rpc/autograd_hook.h): the distributed autograd context it was
// sent in and, when it carries tensors that require grad, the send function recorded for them
// (message_id 0: none).
struct AutogradInfo {
  uint64_t context_id = 0;
  uint64_t message_id = 0;
};

// A worker's CUDA devices and the devices of another worker they map to (RpcBackendOptions
// device_maps), as (from, to) pairs.
using DeviceMap = std::vector<std::pair<int, int>>;

// The messages, one per variant of the envelope's body (wire.capnp has what each field means).
// The first on a connection, from the side that opened it.
struct Handshake {
  uint32_t protocol_version = kProtocolVersion;
  std::string worker_name;
  int32_t worker_id = -1;
};
// The answer to a request: its result or the callee's failure.
struct Response {
  IValue value;
  std::optional<Failure> error;
};
// Requests. A user's function:
struct Call {
  std::string function;
  IValueList args;
};
// The RRef protocol (rpc/rref_context.h):
struct RRefCreate {
  RRefId rref_id;
  ForkId fork_id;
  std::string function;
  IValueList args;
};
struct RRefFetch {
  RRefId rref_id;
};
struct RRefFork {
  RRefId rref_id;
  ForkId fork_id;
};
struct RRefAccept {
  ForkId fork_id;
};
struct RRefDelete {
  RRefId rref_id;
  ForkId fork_id;
};
// Distributed autograd (dist/autograd/engine.h, container.h):
struct AutogradGradients {
  uint64_t context_id = 0;
  uint64_t message_id = 0;
  uint64_t pass_id = 0;
  bool retain_graph = false;
  std::vector<Tensor> grads;  // undefined: no gradient for that tensor
  bool returned = false;
};
struct AutogradRelease {
  std::vector<uint64_t> context_ids;
};
struct AutogradBackward {
  IValue rref;  // an RRef (a fork on the wire)
  uint64_t context_id = 0;
  bool retain_graph = false;
};
using Request = std::variant<Call, RRefCreate, RRefFetch, RRefFork, RRefAccept, RRefDelete,
                             AutogradGradients, AutogradRelease, AutogradBackward>;
using Body = std::variant<Handshake, Response, Request>;

// What a request is, for messages: "call of 'my_add'", "rref.fetch", ...
std::string describe(const Request& r);

struct Message {
  uint64_t id = 0;  // a request's, and its response's
  Body body;
  // Requests and responses: set when sent inside a distributed autograd context.
  std::optional<AutogradInfo> autograd;
  // Sending: where CUDA tensors go on the receiver (they travel through host memory); a CUDA
  // tensor on a device the map lacks cannot be sent. A Handshake: the sender's map toward the
  // receiver, which the receiver inverts for its responses.
  DeviceMap device_map;
  // Received: tensors (already in the values) to move to the given CUDA device
  // (place_on_devices), which the network thread leaves to the agent.
  std::vector<std::pair<Tensor, int>> placements;

  template <typename T>
  T* get() { return std::get_if<T>(&body); }
  template <typename T>
  const T* get() const { return std::get_if<T>(&body); }
  Request* request() { return std::get_if<Request>(&body); }
  const Request* request() const { return std::get_if<Request>(&body); }
};

// The values a request carries (arguments, an RRef), in wire order; fn(IValue&).
template <typename F>
void for_each_value(Request& r, F&& fn) {
  std::visit(
      [&](auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, Call> || std::is_same_v<T, RRefCreate>)
          for (auto& a : m.args) fn(a);
        else if constexpr (std::is_same_v<T, AutogradBackward>)
          fn(m.rref);
      },
      r);
}

// Moves every placement to its CUDA device in place (Tensor::set_data), so the values that hold
// the tensors see them there; throws (e.g. CudaError) without a usable device.
void place_on_devices(Message& m);

struct OutgoingFrame {
  std::array<uint8_t, kFramePrefixBytes> prefix{};
  kj::Array<capnp::word> header;
  std::vector<Tensor> tensors;  // contiguous; keeps the payload alive until written
  size_t total_bytes() const;
};

OutgoingFrame encode(const Message& m);

struct FramePrefix {
  uint32_t header_bytes = 0;
  uint64_t payload_bytes = 0;
};

// Validates magic, alignment and sizes against `max_frame_bytes`; throws IoError.
FramePrefix parse_prefix(const uint8_t* bytes, uint64_t max_frame_bytes);

struct TensorLayout {
  DType dtype;
  Shape sizes;
  size_t nbytes;
  bool requires_grad;
};

// A received header, parsed once: first the tensors it announces, checked against the prefix's
// payload size (so that their storage can be allocated and the payload read into it), then the
// message once the payload is there. `words` must outlive it. Throws IoError on a malformed
// header.
class FrameHeader {
 public:
  FrameHeader(kj::ArrayPtr<const capnp::word> words, uint64_t payload_bytes);
  const std::vector<TensorLayout>& tensors() const { return layouts_; }
  // The message, with `tensors` (one per layout) holding the payload.
  Message decode(std::vector<Tensor> tensors);

 private:
  capnp::FlatArrayMessageReader reader_;
  std::vector<TensorLayout> layouts_;
};

// FrameHeader's two steps on their own, for tests and tools.
std::vector<TensorLayout> tensor_layouts(kj::ArrayPtr<const capnp::word> header,
                                         uint64_t payload_bytes);
Message decode(kj::ArrayPtr<const capnp::word> header, std::vector<Tensor> tensors);

}  // namespace gw::rpc

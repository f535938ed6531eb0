// The RPC protocol's messages, as the agent works with them (rpc/wire.capnp has their layout
// on the socket, rpc/message.h turns them into frames and back).
//
// A Message is the handshake that opens a connection, a request (a user's Call, or one of the
// RRef protocol's and distributed autograd's typed messages) or the response to one (a value
// or a failure). Every system message is its own type with named fields, and a receiver
// dispatches on the variant:
//
//   Message m;
//   m.id = 7;
//   m.body = Request(RRefFetch{rref_id});
//   if (const Request* r = m.request()) std::visit([](auto& msg) { ... }, *r);
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "core/error.h"
#include "core/ipc.h"
#include "core/tensor.h"
#include "rpc/ivalue.h"
#include "rpc/rref_id.h"

namespace gw::rpc {

// 2: autograd info; 3: CUDA tensors; 4: every system message a typed variant of the body;
// 5: heartbeats (empty frames); 6: SMART mode distributed autograd (AutogradDiscover,
// AutogradGradients.smart); 7: CUDA tensors by IPC handle between processes of one host; 8: a
// user's RRef sent to its owner in a request is not answered with RRefAccept.
inline constexpr uint32_t kProtocolVersion = 8;

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

// What comes with CUDA tensors another process of this host shared by IPC handle, from the
// connection that read them (rpc/connection.h): the copies out of the sender's memory run inside
// while_open(), which throws IoError once the connection is closed and holds its closing back
// meanwhile (the sender lets go of its memory when it sees the close); dropping the receipt
// tells the sender that it may have its memory back.
class CudaIpcReceipt {
 public:
  virtual ~CudaIpcReceipt() = default;
  virtual void while_open(const std::function<void()>& copy) = 0;
  virtual int64_t sender() const = 0;  // the sending process, for import_cuda_tensor
};

// A worker's CUDA devices and the devices of another worker they map to (RpcBackendOptions
// device_maps), as (from, to) pairs.
using DeviceMap = std::vector<std::pair<int, int>>;

// The messages, one per variant of the envelope's body (wire.capnp has what each field means).
// Shared memory for a connection whose two ends are on one host (rpc/shm.h, negotiated by
// rpc/connection.h): the opener's Handshake offers a segment; the other side answers kAccept
// (from then on it writes into the segment) or kDecline; after an accept, the opener's last
// frame on the socket is kSwitch. These travel as Handshakes that carry nothing else, and never
// reach the agent.
struct SharedMemory {
  enum class Step : uint8_t { kOffer, kAccept, kDecline, kSwitch };
  Step step = Step::kOffer;
  std::string host;  // the offer's fields: shm::Offer
  int32_t pid = 0;
  int32_t fd = -1;
  uint64_t ring_bytes = 0;
  std::string token;
  bool operator==(const SharedMemory&) const = default;
};
// The first on a connection, from the side that opened it.
struct Handshake {
  uint32_t protocol_version = kProtocolVersion;
  std::string worker_name;
  int32_t worker_id = -1;
  std::optional<SharedMemory> shm;
  // Not a handshake but the connection's own note, which never reaches the agent either: the
  // receiver has copied the CUDA tensors shared under these leases (Message::cuda_ipc_lease).
  std::vector<uint64_t> cuda_ipc_released{};
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
// Distributed autograd (dist/autograd/dist_engine.h, context_container.h):
struct AutogradGradients {
  uint64_t context_id = 0;
  uint64_t message_id = 0;
  uint64_t pass_id = 0;
  bool retain_graph = false;
  std::vector<Tensor> grads;  // undefined: no gradient for that tensor
  bool returned = false;
  bool smart = false;  // the pass runs in SMART mode
};
// SMART mode: the send functions `message_ids` are on the backward path of the pass; or, when
// `closed`, every send function not yet known to be is not.
struct AutogradDiscover {
  uint64_t context_id = 0;
  uint64_t pass_id = 0;
  bool retain_graph = false;
  std::vector<uint64_t> message_ids;
  bool closed = false;
};
struct AutogradRelease {
  std::vector<uint64_t> context_ids;
};
struct AutogradBackward {
  IValue rref;  // an RRef (a fork on the wire)
  uint64_t context_id = 0;
  bool retain_graph = false;
};
using Request =
    std::variant<Call, RRefCreate, RRefFetch, RRefFork, RRefAccept, RRefDelete, AutogradGradients,
                 AutogradDiscover, AutogradRelease, AutogradBackward>;
using Body = std::variant<Request, Response, Handshake>;

// What a request is, for error messages: "call of 'my_add'", "RRef fetch", ...
std::string describe(const Request& r);
// Makes `r` the failure `e` raised on `worker`: its message, and its code (ours for a
// gw::Error, kRemote for anything else).
void set_failure(Response& r, const std::string& worker, const std::exception& e);

struct Message {
  uint64_t id = 0;  // a request's, and its response's
  Body body;
  // Requests and responses: set when sent inside a distributed autograd context.
  std::optional<AutogradInfo> autograd;
  // Sending: where CUDA tensors go on the receiver; a CUDA tensor on a device the map lacks
  // cannot be sent. A Handshake: the sender's map toward the receiver, which the receiver
  // inverts for its responses.
  DeviceMap device_map;
  // Received: tensors (already in the values) to put on a CUDA device (place_on_devices), which
  // the network thread leaves to the agent: copied from the host, or from the sender's device
  // memory when `shared` (then the value holds an empty stand-in until then).
  struct Placement {
    Tensor tensor;
    int device = 0;
    std::optional<SharedCudaTensor> shared{};
    Shape sizes{};  // of a shared tensor
  };
  std::vector<Placement> placements;
  // Received: nonzero when the sender shared CUDA tensors by IPC handle (core/ipc.h) and keeps
  // them until told that they were copied; the connection then gives the message a receipt,
  // which place_on_devices copies under and drops once done.
  uint64_t cuda_ipc_lease = 0;
  std::shared_ptr<CudaIpcReceipt> cuda_ipc_receipt;
  // Sending: what must live until the message is written, queued behind its connect or handed
  // back unsent (a user's RRef sent home: its RRefDelete must come after; rpc/rref_context.h).
  std::vector<std::shared_ptr<const void>> keep_alive;

  template <typename T>
  T* get() {
    return std::get_if<T>(&body);
  }
  template <typename T>
  const T* get() const {
    return std::get_if<T>(&body);
  }
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

// The values a request or a response carries.
template <typename F>
void for_each_value(Message& m, F&& fn) {
  if (Request* r = m.request())
    for_each_value(*r, fn);
  else if (Response* r = m.get<Response>())
    fn(r->value);
}

}  // namespace gw::rpc

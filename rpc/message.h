// RPC frames: Messages (rpc/protocol.h) as bytes on the socket (wire.capnp has the layout).
//
// `encode` turns a Message into an OutgoingFrame whose buffers point at the Cap'n Proto header
// and straight at tensor storage, for one gathered write. Reading goes the other way in two steps,
// so that tensor bytes land directly in new tensor storage: `parse_prefix` and a FrameHeader
// validate what the peer claims before anything is allocated, then the FrameHeader builds the
// Message once the payload has been read into the tensors. rpc/frame_reader.h strings these steps
// together for a stream.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include <capnp/common.h>
#include <capnp/serialize.h>
#include <kj/array.h>

#include "core/dtype.h"
#include "core/shape.h"
#include "core/tensor.h"
#include "rpc/protocol.h"

namespace gw::rpc {

inline constexpr size_t kFramePrefixBytes = 16;

// Moves every placement to its CUDA device in place (Tensor::set_data), so the values that hold
// the tensors see them there, then drops m.cuda_ipc_receipt; throws (e.g. CudaError) without a
// usable device.
void place_on_devices(Message& m);

struct OutgoingFrame {
  std::array<uint8_t, kFramePrefixBytes> prefix{};
  kj::Array<capnp::word> header;
  std::vector<Tensor> tensors;  // contiguous; keeps the payload alive until written
  CudaIpcLease lease;  // the CUDA tensors shared instead, to keep until the receiver releases it
  size_t total_bytes() const;
};

// `cuda_ipc_lease` nonzero: the receiver is another process on this host, and CUDA tensors that
// can be (core/ipc.h) are shared by IPC handle under that lease instead of sent as bytes.
OutgoingFrame encode(const Message& m, uint64_t cuda_ipc_lease = 0);
// The empty frame a connection sends when it has had nothing else to send for a while.
OutgoingFrame heartbeat_frame();

struct FramePrefix {
  uint32_t header_bytes = 0;
  uint64_t payload_bytes = 0;
};

// Validates magic, alignment and sizes against `max_frame_bytes`; throws IoError. A prefix with
// no header and no payload is a heartbeat (heartbeat_frame()): it carries nothing but liveness.
FramePrefix parse_prefix(const uint8_t* bytes, uint64_t max_frame_bytes);

struct TensorLayout {
  DType dtype;
  Shape sizes;
  size_t nbytes;  // in the payload: 0 for a tensor shared by IPC handle
  bool requires_grad;
  bool shared = false;  // by IPC handle: the reader makes an empty stand-in
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

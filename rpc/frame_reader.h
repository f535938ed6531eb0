// The bytes of one RPC connection, turned into messages: the frame parser rpc::Connection reads
// its socket with, and the one the fuzzer (fuzz/fuzz_frame.cpp) drives.
//
// Bytes arrive in pieces of any size. A frame's 16-byte prefix is checked first (magic, sizes
// against max_frame_bytes), then its header is parsed once (FrameHeader): the tensors it
// announces are checked against the payload's size and their storage allocated before a payload
// byte is read, so the payload lands straight in tensor storage. When much of a tensor is still
// due, the caller may read it from the socket directly into that storage (direct_target).
// Heartbeats (empty frames) are taken and dropped. Everything a peer claims is validated
// before it is used; a bad frame throws IoError, after which the reader must not be used again
// (the connection closes).
//
//   FrameReader reader(max_frame_bytes);
//   while (n > 0) {
//     size_t used = reader.feed(bytes, n);
//     bytes += used, n -= used;
//     if (auto m = reader.take()) handle(std::move(*m));
//   }
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "rpc/message.h"

namespace gw::rpc {

class FrameReader {
 public:
  explicit FrameReader(uint64_t max_frame_bytes) : max_frame_bytes_(max_frame_bytes) {}
  FrameReader(const FrameReader&) = delete;
  FrameReader& operator=(const FrameReader&) = delete;

  // Takes bytes from `data` up to the end of the next complete frame (then take() has its
  // message) or all `n` of them; returns how many it took. Throws IoError on a bad frame.
  size_t feed(const uint8_t* data, size_t n);
  // The message of the frame feed() or direct_filled() just completed, once.
  std::optional<Message> take();

  // The rest of the tensor being received, when at least `at_least` bytes of it are due (else
  // empty): read some of it in place, then say how many bytes with direct_filled().
  std::span<uint8_t> direct_target(size_t at_least);
  void direct_filled(size_t n);

  // No part of a frame is held (nothing received since the last complete frame).
  bool between_frames() const { return stage_ == Stage::kPrefix && got_ == 0; }

 private:
  void begin_payload();
  void next_tensor();
  void skip_empty_tensors();  // finishes the frame when no tensor bytes are left
  void finish_frame();

  enum class Stage { kPrefix, kHeader, kPayload };
  const uint64_t max_frame_bytes_;
  Stage stage_ = Stage::kPrefix;
  uint8_t prefix_[kFramePrefixBytes];
  size_t got_ = 0;  // bytes of the current stage (or tensor) received so far
  FramePrefix frame_{};
  kj::Array<capnp::word> header_;  // aligned: Cap'n Proto reads words
  std::optional<FrameHeader> parsed_;
  std::vector<Tensor> tensors_;
  size_t tensor_index_ = 0;
  std::optional<Message> ready_;
};

}  // namespace gw::rpc

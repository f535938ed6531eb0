#include "rpc/frame_reader.h"

#include <algorithm>
#include <cstring>

#include "core/shape.h"
#include "core/storage.h"

namespace gw::rpc {

size_t FrameReader::feed(const uint8_t* data, size_t n) {
  const size_t start = n;
  while (n > 0 && !ready_) {
    switch (stage_) {
      case Stage::kPrefix: {
        const size_t take = std::min(n, kFramePrefixBytes - got_);
        std::memcpy(prefix_ + got_, data, take);
        got_ += take, data += take, n -= take;
        if (got_ < kFramePrefixBytes) break;
        frame_ = parse_prefix(prefix_, max_frame_bytes_);
        got_ = 0;
        if (frame_.header_bytes == 0) break;  // a heartbeat: nothing to deliver
        header_ = kj::heapArray<capnp::word>(frame_.header_bytes / sizeof(capnp::word));
        stage_ = Stage::kHeader;
        break;
      }
      case Stage::kHeader: {
        const size_t take = std::min<size_t>(n, frame_.header_bytes - got_);
        std::memcpy(reinterpret_cast<uint8_t*>(header_.begin()) + got_, data, take);
        got_ += take, data += take, n -= take;
        if (got_ == frame_.header_bytes) begin_payload();
        break;
      }
      case Stage::kPayload: {
        const Tensor& t = tensors_[tensor_index_];
        const size_t take = std::min(n, t.nbytes() - got_);
        std::memcpy(static_cast<uint8_t*>(t.raw_data()) + got_, data, take);
        got_ += take, data += take, n -= take;
        if (got_ == t.nbytes()) next_tensor();
        break;
      }
    }
  }
  return start - n;
}

std::optional<Message> FrameReader::take() {
  std::optional<Message> m = std::move(ready_);
  ready_.reset();
  return m;
}

std::span<uint8_t> FrameReader::direct_target(size_t at_least) {
  if (stage_ != Stage::kPayload || ready_) return {};
  const Tensor& t = tensors_[tensor_index_];
  const size_t left = t.nbytes() - got_;
  if (left < at_least) return {};
  return {static_cast<uint8_t*>(t.raw_data()) + got_, left};
}

void FrameReader::direct_filled(size_t n) {
  GW_CHECK(stage_ == Stage::kPayload && !ready_ && n <= tensors_[tensor_index_].nbytes() - got_,
           InvalidArgumentError, "[rpc] direct_filled(", n, ") past the tensor being received");
  got_ += n;
  if (got_ == tensors_[tensor_index_].nbytes()) next_tensor();
}

void FrameReader::begin_payload() {
  parsed_.emplace(header_.asPtr(), frame_.payload_bytes);
  tensors_.clear();
  for (const auto& l : parsed_->tensors()) {
    // A tensor shared by IPC handle gets an empty stand-in, replaced on its device later.
    const Shape sizes = l.shared ? Shape{0} : l.sizes;
    Tensor t = Tensor::make(Storage::allocate(l.nbytes, kCPU), sizes, contiguous_strides(sizes), 0,
                            l.dtype);
    if (l.requires_grad) t.requires_grad_(true);
    tensors_.push_back(std::move(t));
  }
  stage_ = Stage::kPayload;
  tensor_index_ = 0;
  skip_empty_tensors();
}

void FrameReader::next_tensor() {
  ++tensor_index_;
  skip_empty_tensors();
}

void FrameReader::skip_empty_tensors() {
  got_ = 0;
  while (tensor_index_ < tensors_.size() && tensors_[tensor_index_].nbytes() == 0) ++tensor_index_;
  if (tensor_index_ == tensors_.size()) finish_frame();
}

void FrameReader::finish_frame() {
  ready_ = parsed_->decode(std::move(tensors_));
  parsed_.reset();
  tensors_.clear();
  header_ = nullptr;
  stage_ = Stage::kPrefix, got_ = 0;
}

}  // namespace gw::rpc

#include "core/cuda/stream.h"

#include <array>
#include <utility>

#include "core/cuda/allocator.h"
#include "core/cuda/cuda_error.h"
#include "core/cuda/device.h"

namespace gw::cuda {

namespace {
// nullptr stands for the legacy default stream, the initial current stream of every device.
thread_local std::array<cudaStream_t, kMaxDevices> tls_current_stream{};

int resolve(int device) { return device < 0 ? current_device() : device; }

void check_index(int device) { check_device_index(device, "cuda stream"); }

// Waits for the stream's work, then destroys it. The caching allocator keys free blocks by the
// handle, which the driver may hand out again: the blocks are returned first, and the wait
// makes sure none of them is still in use by the old stream's work.
void destroy(cudaStream_t stream) {
  if (!stream) return;
  if (cudaStreamSynchronize(stream) != cudaSuccess) clear_last_error();
  forget_stream(stream);
  if (cudaStreamDestroy(stream) != cudaSuccess) clear_last_error();
}
}  // namespace

Stream::Stream(int device, StreamOptions options) : device_(resolve(device)) {
  DeviceGuard guard(device_);
  unsigned flags = options.non_blocking ? cudaStreamNonBlocking : cudaStreamDefault;
  GW_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, flags, options.priority));
}

Stream::~Stream() { destroy(stream_); }

Stream::Stream(Stream&& other) noexcept
    : stream_(std::exchange(other.stream_, nullptr)), device_(other.device_) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    destroy(stream_);
    stream_ = std::exchange(other.stream_, nullptr);
    device_ = other.device_;
  }
  return *this;
}

void Stream::synchronize() const { GW_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

bool Stream::query() const {
  cudaError_t status = cudaStreamQuery(stream_);
  if (status == cudaErrorNotReady) {
    clear_last_error();
    return false;
  }
  GW_CUDA_CHECK(status);
  return true;
}

Event::Event(EventOptions options) {
  unsigned flags = (options.timing ? cudaEventDefault : cudaEventDisableTiming) |
                   (options.blocking_sync ? cudaEventBlockingSync : 0u);
  GW_CUDA_CHECK(cudaEventCreateWithFlags(&event_, flags));
}

Event::~Event() {
  if (event_ && cudaEventDestroy(event_) != cudaSuccess) clear_last_error();
}

Event::Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (event_ && cudaEventDestroy(event_) != cudaSuccess) clear_last_error();
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

void Event::record(cudaStream_t stream) { GW_CUDA_CHECK(cudaEventRecord(event_, stream)); }
void Event::record() { record(current_stream()); }
void Event::block(cudaStream_t stream) const {
  GW_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0));
}
void Event::synchronize() const { GW_CUDA_CHECK(cudaEventSynchronize(event_)); }

bool Event::query() const {
  cudaError_t status = cudaEventQuery(event_);
  if (status == cudaErrorNotReady) {
    clear_last_error();
    return false;
  }
  GW_CUDA_CHECK(status);
  return true;
}

float Event::elapsed_time(const Event& end) const {
  float ms = 0;
  GW_CUDA_CHECK(cudaEventElapsedTime(&ms, event_, end.event_));
  return ms;
}

cudaStream_t current_stream(int device) {
  int d = resolve(device);
  check_index(d);
  cudaStream_t s = tls_current_stream[d];
  return s ? s : cudaStreamLegacy;
}

void set_current_stream(cudaStream_t stream, int device) {
  check_index(device);
  tls_current_stream[device] = stream == cudaStreamLegacy ? nullptr : stream;
}

StreamGuard::StreamGuard(const Stream& stream)
    : device_(stream.device()), previous_(current_stream(stream.device())) {
  set_current_stream(stream.handle(), device_);
}

StreamGuard::~StreamGuard() {
  tls_current_stream[device_] = previous_ == cudaStreamLegacy ? nullptr : previous_;
}

}  // namespace gw::cuda

// Streams and events, and the current stream that kernels are launched on.
//
// Work issued by gradwire on a device goes to that device's *current stream*, kept per thread
// and per device. By default it is the legacy default stream (cudaStreamLegacy): it is ordered
// with every other blocking stream and with synchronous runtime calls, so code that never
// mentions streams (the whole CPU-shaped API) stays correct, and the caching allocator may
// reuse a freed block at once (the next user is ordered after the last one). StreamGuard
// switches to a Stream of your own for a scope; tensors used across streams must then be
// synchronized by the caller (Event::block).
//
//   gw::cuda::Stream side;                          // a new stream on the current device
//   {
//     gw::cuda::StreamGuard on(side);              // ops in this scope launch on `side`
//     y = gw::matmul(a, b);
//   }
//   gw::cuda::Event done;
//   done.record(side);
//   done.block(gw::cuda::current_stream());        // the default stream waits for `side`
#pragma once

#include <cuda_runtime_api.h>

namespace gw::cuda {

struct StreamOptions {
  // A non-blocking stream does not synchronize with the legacy default stream.
  bool non_blocking = false;
  int priority = 0;  // lower numbers are higher priority (cudaDeviceGetStreamPriorityRange)
};

class Stream {
 public:
  // A new stream on `device` (the current device when -1).
  explicit Stream(int device = -1, StreamOptions options = {});
  // Waits for the work queued on the stream first (the caching allocator needs it finished
  // before the handle can be reused).
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  cudaStream_t handle() const { return stream_; }
  int device() const { return device_; }
  void synchronize() const;
  // True when everything queued on the stream has finished.
  bool query() const;

 private:
  cudaStream_t stream_ = nullptr;
  int device_ = 0;
};

struct EventOptions {
  bool timing = true;          // needed by elapsed_time; costs a little per record
  bool blocking_sync = false;  // synchronize() sleeps instead of spinning
};

class Event {
 public:
  // Created on the current device; record it only on streams of that device.
  explicit Event(EventOptions options = {});
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(cudaStream_t stream);
  void record(const Stream& stream) { record(stream.handle()); }
  void record();  // on the current stream of the current device
  // Makes `stream` wait (on the device, not the host) until this event has happened.
  void block(cudaStream_t stream) const;
  void synchronize() const;
  bool query() const;  // true when the recorded work has finished
  // Milliseconds from this event to `end`; both must be recorded and finished, with timing.
  float elapsed_time(const Event& end) const;
  cudaEvent_t handle() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// The calling thread's current stream on `device` (the current device when -1).
cudaStream_t current_stream(int device = -1);
// Makes `stream` current for this thread on `device`; nullptr means the legacy default.
void set_current_stream(cudaStream_t stream, int device);

// Makes a stream current on its device for a scope and restores the previous one after.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int device_;
  cudaStream_t previous_;
};

}  // namespace gw::cuda

#include "core/ipc.h"

#include <atomic>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "core/ops.h"
#include "core/trace.h"

#ifdef GW_HAVE_CUDA
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <optional>

#include "core/cuda/cuda_error.h"
#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#endif

namespace gw {

namespace {
std::atomic<uint64_t> g_shared{0}, g_imported{0}, g_leases_held{0}, g_handles_opened{0},
    g_handles_mapped{0};
}  // namespace

CudaIpcStats cuda_ipc_stats() {
  return {g_shared.load(), g_imported.load(), g_leases_held.load(), g_handles_opened.load(),
          g_handles_mapped.load()};
}

CudaIpcLease::CudaIpcLease() = default;
CudaIpcLease::~CudaIpcLease() {
  if (!empty()) --g_leases_held;
}
CudaIpcLease::CudaIpcLease(CudaIpcLease&& o) noexcept
    : tensors_(std::exchange(o.tensors_, {})), events_(std::exchange(o.events_, {})) {}
CudaIpcLease& CudaIpcLease::operator=(CudaIpcLease&& o) noexcept {
  if (this != &o) {
    if (!empty()) --g_leases_held;
    tensors_ = std::exchange(o.tensors_, {});
    events_ = std::exchange(o.events_, {});
  }
  return *this;
}

#ifndef GW_HAVE_CUDA

bool cuda_ipc_shareable(const Tensor&) { return false; }

SharedCudaTensor share_cuda_tensor(const Tensor& t, CudaIpcLease&) {
  throw InvalidArgumentError(detail::str("[share_cuda_tensor] a tensor on ", t.device(),
                                         ": this build has no CUDA backend"));
}

Tensor import_cuda_tensor(const SharedCudaTensor&, DType, const Shape&, int device, int64_t) {
  throw IoError(detail::str("[import_cuda_tensor] a tensor for cuda:", device,
                            ": this build has no CUDA backend"));
}

void forget_cuda_ipc_sender(int64_t) {}

#else

namespace {

// The allocation that holds `ptr` (base and size), through the driver's cuMemGetAddressRange:
// none for memory that is not the device's (host memory labelled as a device, say).
std::optional<std::pair<char*, size_t> > allocation_of(const void* ptr) {
  using AddressRange = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  static const AddressRange address_range = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cuda::clear_last_error();
      return AddressRange{nullptr};
    }
    return reinterpret_cast<AddressRange>(fn);
  }();
  CUdeviceptr base = 0;
  size_t size = 0;
  if (!address_range ||
      address_range(&base, &size, reinterpret_cast<CUdeviceptr>(ptr)) != CUDA_SUCCESS)
    return std::nullopt;
  return std::pair{reinterpret_cast<char*>(base), size};
}

// Interprocess events, kept per device and reused: creating one and getting its handle costs
// more than a small transfer. A lease holds each until the receiver is done waiting on it.
struct IpcEvent {
  cudaEvent_t event = nullptr;
  cudaIpcEventHandle_t handle{};
  int device = 0;
};

class EventPool {
 public:
  std::shared_ptr<void> take(int device) {
    IpcEvent* e = nullptr;
    {
      std::lock_guard lock(mu_);
      auto& free = free_[device];
      if (!free.empty()) {
        e = free.back();
        free.pop_back();
      }
    }
    if (!e) {
      auto fresh = std::make_unique<IpcEvent>();
      fresh->device = device;
      GW_CUDA_CHECK(
          cudaEventCreateWithFlags(&fresh->event, cudaEventDisableTiming | cudaEventInterprocess));
      if (cudaIpcGetEventHandle(&fresh->handle, fresh->event) != cudaSuccess) {
        cuda::clear_last_error();
        cudaEventDestroy(fresh->event);
        throw CudaError("[share_cuda_tensor] cudaIpcGetEventHandle failed");
      }
      e = fresh.release();
    }
    return std::shared_ptr<void>(e, [this](void* p) {
      std::lock_guard lock(mu_);
      auto* ev = static_cast<IpcEvent*>(p);
      free_[ev->device].push_back(ev);
    });
  }

 private:
  std::mutex mu_;
  std::map<int, std::vector<IpcEvent*> > free_;  // never destroyed (see events())
};

// Leaked: leases may be dropped by threads that outlive static destruction.
EventPool& events() {
  static auto* pool = new EventPool;
  return *pool;
}

// The receiver's side: memory and events of other processes, opened once and cached. An import
// holds what it uses, so the cache may forget an entry while a copy still reads through it.
struct OpenedMemory {
  char* base = nullptr;
  size_t size = 0;
  int device = 0;
  int64_t sender = 0;
  ~OpenedMemory() {
    if (!base) return;
    --g_handles_mapped;
    cuda::DeviceGuard guard(device);
    if (cudaIpcCloseMemHandle(base) != cudaSuccess) cuda::clear_last_error();
  }
};
struct OpenedEvent {
  cudaEvent_t event = nullptr;
  int64_t sender = 0;
  ~OpenedEvent() {
    if (cudaEventDestroy(event) != cudaSuccess) cuda::clear_last_error();
  }
};

using Handle = std::array<uint8_t, 64>;

class ImportCache {
 public:
  // Senders free and reallocate blocks, which makes new handles: a bound keeps old mappings
  // from piling up. Past it the cache starts over (imports in flight keep theirs).
  static constexpr size_t kMaxEntries = 1024;

  std::shared_ptr<OpenedMemory> memory(const Handle& h, int device, int64_t sender) {
    std::lock_guard lock(mu_);
    auto key = std::pair{h, device};
    if (auto it = memory_.find(key); it != memory_.end()) return it->second;
    if (memory_.size() >= kMaxEntries) memory_.clear();
    cudaIpcMemHandle_t handle;
    std::memcpy(&handle, h.data(), sizeof handle);
    void* ptr = nullptr;
    const cudaError_t status = cudaIpcOpenMemHandle(&ptr, handle, cudaIpcMemLazyEnablePeerAccess);
    if (status != cudaSuccess) {
      cuda::clear_last_error();
      throw IoError(
          detail::str("[import_cuda_tensor] cannot open the sender's memory handle on "
                      "cuda:",
                      device, ": ", cudaGetErrorString(status)));
    }
    auto opened = std::make_shared<OpenedMemory>();
    ++g_handles_mapped;
    opened->base = static_cast<char*>(ptr);
    opened->device = device;
    opened->sender = sender;
    const auto range = allocation_of(ptr);
    GW_CHECK(range && range->first == opened->base, IoError,
             "[import_cuda_tensor] the driver does not say how large the sender's memory is");
    opened->size = range->second;
    ++g_handles_opened;
    return memory_[key] = std::move(opened);
  }

  std::shared_ptr<OpenedEvent> event(const Handle& h, int64_t sender) {
    std::lock_guard lock(mu_);
    if (auto it = events_.find(h); it != events_.end()) return it->second;
    if (events_.size() >= kMaxEntries) events_.clear();
    cudaIpcEventHandle_t handle;
    std::memcpy(&handle, h.data(), sizeof handle);
    auto opened = std::make_shared<OpenedEvent>();
    opened->sender = sender;
    const cudaError_t status = cudaIpcOpenEventHandle(&opened->event, handle);
    if (status != cudaSuccess) {
      cuda::clear_last_error();
      opened->event = nullptr;
      throw IoError(detail::str("[import_cuda_tensor] cannot open the sender's event handle: ",
                                cudaGetErrorString(status)));
    }
    return events_[h] = std::move(opened);
  }

  void forget(int64_t sender) {
    std::vector<std::shared_ptr<void> > closing;  // closed outside the lock
    std::lock_guard lock(mu_);
    std::erase_if(memory_, [&](auto& kv) {
      if (kv.second->sender != sender) return false;
      closing.push_back(std::move(kv.second));
      return true;
    });
    std::erase_if(events_, [&](auto& kv) {
      if (kv.second->sender != sender) return false;
      closing.push_back(std::move(kv.second));
      return true;
    });
  }

 private:
  std::mutex mu_;
  std::map<std::pair<Handle, int>, std::shared_ptr<OpenedMemory> > memory_;
  std::map<Handle, std::shared_ptr<OpenedEvent> > events_;
};

ImportCache& imports() {
  static auto* cache = new ImportCache;  // leaked, as events()
  return *cache;
}

}  // namespace

bool cuda_ipc_shareable(const Tensor& t) {
  if (!t.device().is_cuda() || t.nbytes() == 0) return false;
  cuda::DeviceGuard guard(t.device().index);
  return allocation_of(t.raw_data()).has_value();
}

SharedCudaTensor share_cuda_tensor(const Tensor& t, CudaIpcLease& lease) {
  GW_CHECK(t.device().is_cuda() && t.is_contiguous(), InvalidArgumentError,
           "[share_cuda_tensor] needs a contiguous CUDA tensor, got one on ", t.device(),
           t.is_contiguous() ? "" : " (not contiguous)");
  const int device = t.device().index;
  cuda::DeviceGuard guard(device);
  char* data = static_cast<char*>(t.raw_data());
  const auto range = allocation_of(data);
  GW_CHECK(range, InvalidArgumentError, "[share_cuda_tensor] the tensor on ", t.device(),
           " is not in device memory of this process");
  cudaIpcMemHandle_t memory;
  GW_CUDA_CHECK(cudaIpcGetMemHandle(&memory, range->first));
  std::shared_ptr<void> event = events().take(device);
  const auto& e = *static_cast<IpcEvent*>(event.get());
  GW_CUDA_CHECK(cudaEventRecord(e.event, cuda::current_stream(device)));

  SharedCudaTensor s;
  static_assert(sizeof memory == sizeof s.memory && sizeof e.handle == sizeof s.event);
  std::memcpy(s.memory.data(), &memory, sizeof memory);
  std::memcpy(s.event.data(), &e.handle, sizeof e.handle);
  s.offset = static_cast<uint64_t>(data - range->first);
  if (lease.empty()) ++g_leases_held;
  lease.tensors_.push_back(t);
  lease.events_.push_back(std::move(event));
  ++g_shared;
  return s;
}

Tensor import_cuda_tensor(const SharedCudaTensor& s, DType dtype, const Shape& sizes, int device,
                          int64_t sender) {
  cuda::check_device(cuda_device(device), "import_cuda_tensor");
  cuda::DeviceGuard guard(device);
  trace::Scope span("cuda", "import_cuda_tensor");
  const auto memory = imports().memory(s.memory, device, sender);
  const auto event = imports().event(s.event, sender);
  const size_t nbytes = static_cast<size_t>(numel(sizes)) * itemsize(dtype);
  GW_CHECK(s.offset <= memory->size && nbytes <= memory->size - s.offset, IoError,
           "[import_cuda_tensor] ", nbytes, " bytes at offset ", s.offset,
           " lie outside the sender's allocation of ", memory->size, " bytes");
  Tensor out = empty(sizes, TensorOptions(dtype).with_device(cuda_device(device)));
  if (nbytes == 0) return out;
  cudaStream_t stream = cuda::current_stream(device);
  trace::Scope copy("cuda", "wait, copy, synchronize");
  GW_CUDA_CHECK(cudaStreamWaitEvent(stream, event->event, 0));
  GW_CUDA_CHECK(cudaMemcpyAsync(out.raw_data(), memory->base + s.offset, nbytes,
                                cudaMemcpyDeviceToDevice, stream));
  // The sender may reuse the memory as soon as it hears back: the copy must be over by then.
  GW_CUDA_CHECK(cudaStreamSynchronize(stream));
  ++g_imported;
  return out;
}

void forget_cuda_ipc_sender(int64_t sender) { imports().forget(sender); }

#endif

}  // namespace gw

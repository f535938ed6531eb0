#include "dist/process_group/process_group_nccl.h"

#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#include "core/ops.h"
#include "debug/flight_recorder.h"
#include "dist/process_group/debug_process_group.h"

namespace gw::dist {

namespace {

using Clock = std::chrono::steady_clock;

std::string nccl_message(ncclResult_t r, ncclComm_t comm) {
  std::string m = ncclGetErrorString(r);
  if (const char* last = comm ? ncclGetLastError(comm) : nullptr; last && *last)
    m += std::string(": ") + last;
  return m;
}

ncclDataType_t nccl_type(DType dtype, const char* op) {
  switch (dtype) {
    case DType::Float32:
      return ncclFloat32;
    case DType::Float64:
      return ncclFloat64;
    case DType::Float16:
      return ncclFloat16;
    case DType::BFloat16:
      return ncclBfloat16;
    case DType::Int32:
      return ncclInt32;
    case DType::Int64:
      return ncclInt64;
    case DType::Bool:
      return ncclUint8;
  }
  throw InvalidArgumentError(gw::detail::str("[", op, "] unsupported dtype"));
}

ncclRedOp_t nccl_op(ReduceOp op, const Tensor& t, const char* name) {
  GW_CHECK(t.dtype() != DType::Bool, InvalidArgumentError, "[", name,
           "] bool tensors cannot be reduced");
  switch (op) {
    case ReduceOp::SUM:
      return ncclSum;
    case ReduceOp::PRODUCT:
      return ncclProd;
    case ReduceOp::MIN:
      return ncclMin;
    case ReduceOp::MAX:
      return ncclMax;
    case ReduceOp::AVG:
      ProcessGroup::check_avg(name, t, op);
      return ncclAvg;
  }
  throw InvalidArgumentError(gw::detail::str("[", name, "] unknown reduce op"));
}

size_t count_of(const Tensor& t) { return static_cast<size_t>(t.numel()); }

// A device-to-device copy on the group's stream, as an NCCL result for grouped calls.
ncclResult_t copy_async(const Tensor& dst, const Tensor& src, cudaStream_t s) {
  return cudaMemcpyAsync(dst.raw_data(), src.raw_data(), src.nbytes(), cudaMemcpyDeviceToDevice,
                         s) == cudaSuccess
             ? ncclSuccess
             : ncclUnhandledCudaError;
}

int default_device(int rank) {
  const int count = cuda::device_count();
  GW_CHECK(count > 0, CudaError, "[ProcessGroupNCCL] no CUDA device: ", cuda::no_device_reason());
  const char* local = std::getenv("LOCAL_RANK");
  if (!local || !*local) return rank % count;
  const int local_rank = std::atoi(local);
  GW_CHECK(local_rank < count, CudaError, "[ProcessGroupNCCL] LOCAL_RANK ", local_rank,
           " has no GPU of its own: ", count, " CUDA device", count == 1 ? "" : "s",
           " visible (NCCL takes one process per GPU)");
  return local_rank;
}

// The communicator is non-blocking, so that a rank that never arrives cannot hang the others:
// calls may return ncclInProgress, and the communicator is ready again once its asynchronous
// error leaves that state. Returns its final state, or ncclInProgress past the deadline or
// once `give_up` is set.
ncclResult_t settle(ncclComm_t comm, ncclResult_t r, Clock::time_point deadline,
                    const std::atomic<bool>* give_up = nullptr) {
  while (r == ncclInProgress) {
    if (Clock::now() > deadline || (give_up && give_up->load())) return ncclInProgress;
    std::this_thread::yield();
    if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) return ncclInternalError;
  }
  return r;
}

// Grouped point-to-point calls: the first error of the calls inside, else ncclGroupEnd's.
struct GroupCalls {
  ncclResult_t first = ncclSuccess;
  GroupCalls() { ncclGroupStart(); }
  void operator()(ncclResult_t r) {
    if (first == ncclSuccess && r != ncclSuccess && r != ncclInProgress) first = r;
  }
  ncclResult_t end() {
    const ncclResult_t r = ncclGroupEnd();
    return first != ncclSuccess ? first : r;
  }
};

}  // namespace

bool nccl_available(std::string* why) {
  if (cuda::device_count() > 0) return true;
  if (why) *why = "no CUDA device: " + cuda::no_device_reason();
  return false;
}

struct ProcessGroupNCCL::Impl {
  // Enqueues the NCCL calls of one collective on `stream`.
  using Body = std::function<ncclResult_t(ncclComm_t comm, cudaStream_t stream)>;
  // Enqueues what must follow those calls on the stream (copies out of a staging buffer). It
  // runs once the calls are launched, which on a non-blocking communicator may be well after
  // they returned ncclInProgress.
  using After = std::function<ncclResult_t(cudaStream_t stream)>;
  struct Pending {
    WorkPtr work;
    std::shared_ptr<cuda::Event> done;  // shared: the watchdog queries it unlocked
    Clock::time_point deadline;
    Milliseconds timeout;
    std::vector<Tensor> keep;  // alive until the GPU is done with them
  };

  int rank = 0, size = 0, device = 0;
  NcclOptions options;
  ncclComm_t comm = nullptr;
  std::unique_ptr<cuda::Stream> stream;

  // Lock order: launch_mu, then mu. A launch may wait long for NCCL (settle()) holding only
  // launch_mu, so that the watchdog keeps completing and timing out earlier Works meanwhile.
  std::mutex launch_mu;  // one launch at a time: the NCCL calls on `comm`, the stream's order
  std::mutex mu;         // `pending`, `broken`, `aborted`, `stopping`
  std::atomic<bool> abort_requested{false};  // a launch still settling gives way to an abort
  std::condition_variable cv;
  std::deque<Pending> pending;
  std::exception_ptr broken;
  bool aborted = false;
  bool stopping = false;
  std::thread watchdog;
  int64_t next_seq = 1;  // the flight recorder's number of the next collective (launch_mu)

  Milliseconds timeout_of(Milliseconds t) const { return t.count() > 0 ? t : options.timeout; }
  std::string where(const std::string& op) const {
    return gw::detail::str("[", op, "] rank ", rank, " of ", size);
  }
  WorkPtr launch(const CollectiveSignature& sig, Milliseconds timeout, std::vector<Tensor> keep,
                 Body body, After after = nullptr);
  void watch();
  // With launch_mu held: makes `error` the group's failure unless it has one, aborts the
  // communicator, waits for the stream (so that what the Works keep alive may go), and hands
  // back what was pending, for fail() once no lock is held: failing a Work runs its callbacks,
  // which may launch.
  std::deque<Pending> abort_locked(std::exception_ptr error);
  void fail(std::deque<Pending>& failed);      // with the group's first failure
  void abort_group(std::exception_ptr error);  // no lock held
};

WorkPtr ProcessGroupNCCL::Impl::launch(const CollectiveSignature& sig, Milliseconds timeout,
                                       std::vector<Tensor> keep, Body body, After after) {
  const std::string& op = sig.op;
  auto work = std::make_shared<Work>(op);
  const Milliseconds limit = timeout_of(timeout);
  cuda::DeviceGuard on_device(device);
  std::exception_ptr error;
  std::deque<Pending> failed;
  {
    std::lock_guard serial(launch_mu);  // the watchdog aborts only between launches
    {
      std::lock_guard lock(mu);
      if (broken)
        throw StateError(where(op) + ": the nccl group is unusable after an earlier failure: " +
                         what_of(broken));
    }
    // Recorded once it will be launched; a launch that fails completes its Work below.
    const uint64_t record = record_collective(options.group_name, rank, size,
                                              sig.is_p2p() ? -1 : next_seq++, sig, work);
    debug::update(record, debug::State::kStarted);  // queued on the stream at once
    // The group's stream starts where the caller's stream is now.
    cuda::Event ready(cuda::EventOptions{.timing = false});
    ready.record(cuda::current_stream(device));
    ready.block(stream->handle());
    ncclResult_t r =
        settle(comm, body(comm, stream->handle()), Clock::now() + limit, &abort_requested);
    if (r == ncclSuccess && after) r = after(stream->handle());
    if (r == ncclSuccess) {
      auto done = std::make_shared<cuda::Event>(cuda::EventOptions{.timing = false});
      done->record(*stream);
      std::lock_guard lock(mu);
      pending.push_back({work, std::move(done), Clock::now() + limit, limit, std::move(keep)});
    } else if (r == ncclInProgress && abort_requested) {
      // The watchdog is failing the group (abort_group set `broken` first): abort here, so
      // that NCCL is done with `keep` before it goes.
      failed = abort_locked(nullptr);
      error = std::make_exception_ptr(StateError(
          where(op) + ": the nccl group failed while it was starting: " + what_of(broken)));
    } else {
      // Whatever NCCL refused, it leaves that error on the communicator, which takes no call
      // after it: the group is unusable from here on, whatever the cause.
      if (r == ncclInvalidArgument || r == ncclInvalidUsage)
        error = std::make_exception_ptr(InvalidArgumentError(
            where(op) + ": NCCL refused the operation: " + nccl_message(r, comm)));
      else if (r == ncclInProgress)
        error = std::make_exception_ptr(TimeoutError(
            where(op) + gw::detail::str(" could not start within ", limit.count(), " ms")));
      else
        error = std::make_exception_ptr(IoError(where(op) + " failed: " + nccl_message(r, comm)));
      failed = abort_locked(error);
    }
  }
  if (!error) {
    cv.notify_one();
    return work;
  }
  fail(failed);
  work->finish(error);  // its record ends too
  std::rethrow_exception(error);
}

std::deque<ProcessGroupNCCL::Impl::Pending> ProcessGroupNCCL::Impl::abort_locked(
    std::exception_ptr error) {
  std::deque<Pending> failed;
  {
    std::lock_guard lock(mu);
    if (!broken) broken = std::move(error);
    if (!aborted && comm) {
      aborted = true;
      ncclCommAbort(comm);  // kernels waiting for a dead or late peer return
    }
    failed.swap(pending);
  }
  // The aborted kernels return, but copies queued behind them may still touch the tensors:
  // they go back to the allocator only once the stream is idle.
  try {
    stream->synchronize();
  } catch (const std::exception&) {
  }
  return failed;
}

void ProcessGroupNCCL::Impl::fail(std::deque<Pending>& failed) {
  std::exception_ptr error;
  {
    std::lock_guard lock(mu);
    error = broken;
  }
  for (auto& p : failed) p.work->finish(error);  // and its record
  failed.clear();
}

void ProcessGroupNCCL::Impl::abort_group(std::exception_ptr error) {
  {
    std::lock_guard lock(mu);
    if (!broken) broken = std::move(error);  // the cause, for a launch that gives way
  }
  abort_requested = true;  // a launch waiting in settle() lets go of launch_mu
  std::deque<Pending> failed;
  {
    std::lock_guard serial(launch_mu);
    failed = abort_locked(nullptr);
  }
  fail(failed);
}

// Completes Works in order as their events pass, and turns a late collective or an NCCL error
// into a failure of all of them. It polls: NCCL offers no callback, and a host function on the
// stream may not call CUDA, which the Works' continuations may do.
void ProcessGroupNCCL::Impl::watch() {
  std::unique_lock lock(mu);
  std::exception_ptr crashed;
  try {
    cuda::set_device(device);
    int idle_polls = 0;
    while (true) {
      cv.wait(lock, [&] { return stopping || !pending.empty(); });
      if (pending.empty()) return;  // stopping, and nothing is left
      std::shared_ptr<cuda::Event> front = pending.front().done;
      lock.unlock();
      const bool finished = front->query();
      lock.lock();
      if (pending.empty() || pending.front().done != front) continue;  // failed meanwhile
      // Under the lock: an abort (abort_locked) must not free the communicator meanwhile.
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(comm, &async) != ncclSuccess) async = ncclInternalError;
      std::exception_ptr error;
      const Pending& p = pending.front();
      // Checked before success too: a kernel that left early after a remote error finishes.
      if (async != ncclSuccess && async != ncclInProgress)
        error = std::make_exception_ptr(
            IoError(where(p.work->op()) +
                    gw::detail::str(" failed (a peer died?): ", nccl_message(async, comm))));
      const auto now = Clock::now();
      for (const Pending& q : pending)  // a finished front is not late, whatever its deadline
        if (!error && !(finished && &q == &p) && now > q.deadline)
          error = std::make_exception_ptr(
              TimeoutError(where(q.work->op()) +
                           gw::detail::str(" timed out after ", q.timeout.count(), " ms")));
      if (error) {
        lock.unlock();
        abort_group(error);
        lock.lock();
      } else if (finished) {
        Pending done = std::move(pending.front());
        pending.pop_front();
        idle_polls = 0;
        lock.unlock();
        {
          detail::GroupThreadScope on_group_thread;
          done.work->finish(nullptr);  // and its record
        }
        lock.lock();
      } else {
        // In flight: look again soon, yielding at first, then sleeping, so that a long
        // collective does not keep a core busy.
        lock.unlock();
        if (++idle_polls < 200)
          std::this_thread::yield();
        else
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        lock.lock();
      }
    }
  } catch (...) {  // e.g. a CUDA error: fail what is pending rather than end the process
    crashed = std::current_exception();
  }
  if (crashed) {  // outside the catch: the Works' waiters may drop the error first
    if (lock.owns_lock()) lock.unlock();
    abort_group(std::move(crashed));
  }
}

ProcessGroupNCCL::ProcessGroupNCCL(std::shared_ptr<store::Store> store, int rank, int size,
                                   NcclOptions options)
    : ProcessGroup(rank, size, store), impl_(std::make_unique<Impl>()) {
  debug::dump_on_sigusr1();
  check_group_args("ProcessGroupNCCL", store != nullptr, rank, size, options.timeout);
  Impl& m = *impl_;
  m.rank = rank;
  m.size = size;
  m.options = options;
  m.device = options.device >= 0 ? options.device : default_device(rank);
  cuda::check_device(cuda_device(m.device), "ProcessGroupNCCL");
  // The rank's GPU becomes this thread's current device (PyTorch scripts call
  // torch.cuda.set_device(local_rank)): a guard restoring device 0 would make a context there.
  cuda::set_device(m.device);
  cuda::DeviceGuard on_device(m.device);

  ncclUniqueId id;
  if (rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    GW_CHECK(r == ncclSuccess, IoError,
             "[ProcessGroupNCCL] ncclGetUniqueId failed: ", ncclGetErrorString(r));
    const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
    store->set("nccl_unique_id", store::Bytes(bytes, bytes + sizeof(id)));
  } else {
    store->wait({"nccl_unique_id"}, options.timeout);
    const store::Bytes bytes = store->get("nccl_unique_id");
    GW_CHECK(bytes.size() == sizeof(id), InvalidArgumentError,
             "[ProcessGroupNCCL] the store holds a unique id of ", bytes.size(),
             " bytes, expected ", sizeof(id));
    std::memcpy(&id, bytes.data(), sizeof(id));
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // see settle()
  ncclResult_t r = ncclCommInitRankConfig(&m.comm, size, id, rank, &config);
  r = settle(m.comm, r, Clock::now() + options.timeout);
  if (r != ncclSuccess) {
    if (m.comm) ncclCommAbort(m.comm);
    m.comm = nullptr;
    if (r == ncclInProgress)
      throw TimeoutError(gw::detail::str("[ProcessGroupNCCL] rank ", rank, " of ", size,
                                         ": the other ranks did not join within ",
                                         options.timeout.count(), " ms"));
    throw IoError(gw::detail::str("[ProcessGroupNCCL] rank ", rank, " of ", size,
                                  " could not build its communicator on cuda:", m.device, ": ",
                                  ncclGetErrorString(r)));
  }
  try {
    // Non-blocking: the caller's default stream must not wait for communication it did not
    // ask to wait for.
    m.stream = std::make_unique<cuda::Stream>(m.device, cuda::StreamOptions{.non_blocking = true});
    m.watchdog = std::thread([&m] { m.watch(); });
  } catch (...) {
    ncclCommDestroy(m.comm);
    throw;
  }
  if (const Milliseconds window =
          store::failure_timeout(options.failure_timeout, "ProcessGroupNCCL");
      window.count() > 0)
    liveness_ = std::make_unique<GroupLiveness>(
        std::move(store), rank, size, window, [&m](const std::string& why) {
          m.abort_group(std::make_exception_ptr(IoError(
              gw::detail::str("[process_group] rank ", m.rank, " of ", m.size, ": ", why))));
        });
}

ProcessGroupNCCL::~ProcessGroupNCCL() {
  liveness_.reset();  // first: it aborts through impl_
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  impl_->watchdog.join();
  if (impl_->comm && !impl_->aborted) ncclCommDestroy(impl_->comm);
}

Device ProcessGroupNCCL::device() const { return cuda_device(impl_->device); }

WorkPtr ProcessGroupNCCL::allreduce(Tensor& tensor, AllreduceOptions o) {
  check_tensor("allreduce", tensor);
  const ncclRedOp_t op = nccl_op(o.op, tensor, "allreduce");
  const ncclDataType_t type = nccl_type(tensor.dtype(), "allreduce");
  return impl_->launch(signature::allreduce(tensor, o), o.timeout, {tensor},
                       [=](ncclComm_t c, cudaStream_t s) {
                         return ncclAllReduce(tensor.raw_data(), tensor.raw_data(),
                                              count_of(tensor), type, op, c, s);
                       });
}

WorkPtr ProcessGroupNCCL::allreduce_coalesced(std::vector<Tensor>& tensors, AllreduceOptions o) {
  GW_CHECK(!tensors.empty(), InvalidArgumentError, "[allreduce_coalesced] no tensors given");
  std::vector<std::pair<ncclDataType_t, ncclRedOp_t>> kinds;
  for (const auto& t : tensors) {
    check_tensor("allreduce_coalesced", t);
    kinds.emplace_back(nccl_type(t.dtype(), "allreduce_coalesced"),
                       nccl_op(o.op, t, "allreduce_coalesced"));
  }
  return impl_->launch(
      signature::allreduce_coalesced(tensors, o), o.timeout, tensors,
      [tensors, kinds](ncclComm_t c, cudaStream_t s) {
        GroupCalls calls;  // one launch for all of them
        for (size_t i = 0; i < tensors.size(); ++i)
          calls(ncclAllReduce(tensors[i].raw_data(), tensors[i].raw_data(), count_of(tensors[i]),
                              kinds[i].first, kinds[i].second, c, s));
        return calls.end();
      });
}

WorkPtr ProcessGroupNCCL::broadcast(Tensor& tensor, BroadcastOptions o) {
  check_tensor("broadcast", tensor);
  check_rank("broadcast", o.root, "root");
  const ncclDataType_t type = nccl_type(tensor.dtype(), "broadcast");
  return impl_->launch(signature::broadcast(tensor, o), o.timeout, {tensor},
                       [=](ncclComm_t c, cudaStream_t s) {
                         return ncclBroadcast(tensor.raw_data(), tensor.raw_data(),
                                              count_of(tensor), type, o.root, c, s);
                       });
}

WorkPtr ProcessGroupNCCL::reduce(Tensor& tensor, ReduceOptions o) {
  check_tensor("reduce", tensor);
  check_rank("reduce", o.root, "root");
  const ncclRedOp_t op = nccl_op(o.op, tensor, "reduce");
  const ncclDataType_t type = nccl_type(tensor.dtype(), "reduce");
  // The receive buffer matters on the root only: the other ranks keep their values.
  return impl_->launch(signature::reduce(tensor, o), o.timeout, {tensor},
                       [=](ncclComm_t c, cudaStream_t s) {
                         return ncclReduce(tensor.raw_data(), tensor.raw_data(), count_of(tensor),
                                           type, op, o.root, c, s);
                       });
}

WorkPtr ProcessGroupNCCL::allgather(std::vector<Tensor>& outputs, const Tensor& input,
                                    CollectiveOptions o) {
  check_tensor("allgather", input, "input");
  check_count("allgather", outputs.size(), "outputs");
  for (const auto& t : outputs) check_like("allgather", t, input, "output");
  const ncclDataType_t type = nccl_type(input.dtype(), "allgather");
  Tensor flat = empty({input.numel() * size()},
                      TensorOptions().with_dtype(input.dtype()).with_device(input.device()));
  std::vector<Tensor> keep = outputs;
  keep.push_back(input);
  keep.push_back(flat);
  return impl_->launch(
      signature::allgather(input), o.timeout, std::move(keep),
      [=](ncclComm_t c, cudaStream_t s) {
        return ncclAllGather(input.raw_data(), flat.raw_data(), count_of(input), type, c, s);
      },
      [=](cudaStream_t s) {  // behind the gather on the stream
        const int64_t n = input.numel();
        ncclResult_t r = ncclSuccess;
        for (size_t i = 0; i < outputs.size() && r == ncclSuccess; ++i)
          r = copy_async(outputs[i], flat.narrow(0, static_cast<int64_t>(i) * n, n), s);
        return r;
      });
}

// gather, scatter and alltoall are grouped sends and receives, the copy to itself a memcpy.

WorkPtr ProcessGroupNCCL::gather(std::vector<Tensor>& outputs, const Tensor& input,
                                 GatherOptions o) {
  check_tensor("gather", input, "input");
  check_root_parts("gather", outputs, input, o.root, "outputs");
  const bool root = rank() == o.root;
  const ncclDataType_t type = nccl_type(input.dtype(), "gather");
  std::vector<Tensor> keep = outputs;
  keep.push_back(input);
  const int me = rank(), n = size();
  return impl_->launch(
      signature::gather(input, o), o.timeout, std::move(keep), [=](ncclComm_t c, cudaStream_t s) {
        GroupCalls calls;
        if (!root) {
          calls(ncclSend(input.raw_data(), count_of(input), type, o.root, c, s));
        } else {
          for (int r = 0; r < n; ++r)
            calls(r == me ? copy_async(outputs[r], input, s)
                          : ncclRecv(outputs[r].raw_data(), count_of(outputs[r]), type, r, c, s));
        }
        return calls.end();
      });
}

WorkPtr ProcessGroupNCCL::scatter(Tensor& output, const std::vector<Tensor>& inputs,
                                  ScatterOptions o) {
  check_tensor("scatter", output, "output");
  check_root_parts("scatter", inputs, output, o.root, "inputs");
  const bool root = rank() == o.root;
  const ncclDataType_t type = nccl_type(output.dtype(), "scatter");
  std::vector<Tensor> keep = inputs;
  keep.push_back(output);
  const int me = rank(), n = size();
  return impl_->launch(
      signature::scatter(output, o), o.timeout, std::move(keep), [=](ncclComm_t c, cudaStream_t s) {
        GroupCalls calls;
        if (!root) {
          calls(ncclRecv(output.raw_data(), count_of(output), type, o.root, c, s));
        } else {
          for (int r = 0; r < n; ++r)
            calls(r == me ? copy_async(output, inputs[r], s)
                          : ncclSend(inputs[r].raw_data(), count_of(inputs[r]), type, r, c, s));
        }
        return calls.end();
      });
}

WorkPtr ProcessGroupNCCL::reduce_scatter(Tensor& output, const std::vector<Tensor>& inputs,
                                         CollectiveOptions o) {
  check_tensor("reduce_scatter", output, "output");
  check_count("reduce_scatter", inputs.size(), "inputs");
  for (const auto& t : inputs) check_like("reduce_scatter", t, output, "input");
  const ncclRedOp_t op = nccl_op(o.op, output, "reduce_scatter");
  const ncclDataType_t type = nccl_type(output.dtype(), "reduce_scatter");
  Tensor flat = concat(inputs);  // on the caller's stream, before the group's waits for it
  return impl_->launch(signature::reduce_scatter(output, o), o.timeout, {flat, output},
                       [=](ncclComm_t c, cudaStream_t s) {
                         return ncclReduceScatter(flat.raw_data(), output.raw_data(),
                                                  count_of(output), type, op, c, s);
                       });
}

WorkPtr ProcessGroupNCCL::all_gather_into_tensor(Tensor& output, const Tensor& input,
                                                 CollectiveOptions o) {
  check_flat("all_gather_into_tensor", output, "output", input, "input");
  const ncclDataType_t type = nccl_type(input.dtype(), "all_gather_into_tensor");
  return impl_->launch(signature::all_gather_into_tensor(input), o.timeout, {input, output},
                       [=](ncclComm_t c, cudaStream_t s) {
                         return ncclAllGather(input.raw_data(), output.raw_data(), count_of(input),
                                              type, c, s);
                       });
}

WorkPtr ProcessGroupNCCL::reduce_scatter_tensor(Tensor& output, const Tensor& input,
                                                CollectiveOptions o) {
  check_flat("reduce_scatter_tensor", input, "input", output, "output");
  const ncclRedOp_t op = nccl_op(o.op, output, "reduce_scatter_tensor");
  const ncclDataType_t type = nccl_type(output.dtype(), "reduce_scatter_tensor");
  return impl_->launch(signature::reduce_scatter_tensor(output, o), o.timeout, {input, output},
                       [=](ncclComm_t c, cudaStream_t s) {
                         return ncclReduceScatter(input.raw_data(), output.raw_data(),
                                                  count_of(output), type, op, c, s);
                       });
}

WorkPtr ProcessGroupNCCL::alltoall(std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                                   CollectiveOptions o) {
  check_count("alltoall", inputs.size(), "inputs");
  check_count("alltoall", outputs.size(), "outputs");
  for (const auto& t : inputs) check_like("alltoall", t, inputs[0], "input");
  for (const auto& t : outputs) check_like("alltoall", t, inputs[0], "output");
  const ncclDataType_t type = nccl_type(inputs[0].dtype(), "alltoall");
  std::vector<Tensor> keep = inputs;
  keep.insert(keep.end(), outputs.begin(), outputs.end());
  const int me = rank(), n = size();
  return impl_->launch(
      signature::alltoall(inputs), o.timeout, std::move(keep), [=](ncclComm_t c, cudaStream_t s) {
        GroupCalls calls;
        for (int r = 0; r < n; ++r) {
          if (r == me) {
            calls(copy_async(outputs[r], inputs[r], s));
            continue;
          }
          calls(ncclSend(inputs[r].raw_data(), count_of(inputs[r]), type, r, c, s));
          calls(ncclRecv(outputs[r].raw_data(), count_of(outputs[r]), type, r, c, s));
        }
        return calls.end();
      });
}

WorkPtr ProcessGroupNCCL::barrier(CollectiveOptions o) {
  // An allreduce of one element: waiting for its Work waits for every rank to reach it.
  Tensor token = zeros({1}, TensorOptions().with_device(device()));
  return impl_->launch(
      signature::barrier(), o.timeout, {token}, [token](ncclComm_t c, cudaStream_t s) {
        return ncclAllReduce(token.raw_data(), token.raw_data(), 1, ncclFloat32, ncclSum, c, s);
      });
}

WorkPtr ProcessGroupNCCL::send(const Tensor& tensor, int dst, int tag, CollectiveOptions o) {
  check_p2p("send", tensor, dst, tag);
  const ncclDataType_t type = nccl_type(tensor.dtype(), "send");
  return impl_->launch(signature::p2p("send", tensor, dst, tag), o.timeout, {tensor},
                       [=](ncclComm_t c, cudaStream_t s) {
                         return ncclSend(tensor.raw_data(), count_of(tensor), type, dst, c, s);
                       });
}

WorkPtr ProcessGroupNCCL::recv(Tensor& tensor, int src, int tag, CollectiveOptions o) {
  check_p2p("recv", tensor, src, tag);
  const ncclDataType_t type = nccl_type(tensor.dtype(), "recv");
  return impl_->launch(signature::p2p("recv", tensor, src, tag), o.timeout, {tensor},
                       [=](ncclComm_t c, cudaStream_t s) {
                         return ncclRecv(tensor.raw_data(), count_of(tensor), type, src, c, s);
                       });
}

}  // namespace gw::dist

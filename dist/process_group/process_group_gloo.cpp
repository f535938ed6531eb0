#include "dist/process_group/process_group_gloo.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <vector>

#include <gloo/alltoall.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/gather.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/scatter.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include "core/ops.h"
#include "core/sigpipe.h"
#include "debug/flight_recorder.h"
#include "dist/process_group/collective_queue.h"
#include "dist/process_group/debug_process_group.h"
#include "dist/process_group/gloo_collectives.h"
#include "dist/process_group/group_liveness.h"
#include "dist/process_group/shm_collectives.h"
#include "store/liveness.h"

namespace gw::dist {

namespace {

// Gloo's view of our store.
class GlooStore final : public gloo::rendezvous::Store {
 public:
  explicit GlooStore(std::shared_ptr<store::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, store::Bytes(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    store::Bytes b = store_->get(key);
    return {b.begin(), b.end()};
  }
  void wait(const std::vector<std::string>& keys) override { store_->wait(keys); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& t) override {
    store_->wait(keys, t);
  }

 private:
  std::shared_ptr<store::Store> store_;
};

// Point-to-point slots live apart from the collectives' (Gloo builds those from small
// prefixes in the top byte).
constexpr uint64_t kSendRecvSlot = uint64_t{1} << 63;

// GlooOptions::shared_memory, or when unset, not GW_GLOO_SHM=0.
bool wants_shared_memory(const std::optional<bool>& given) {
  if (given) return *given;
  const char* env = std::getenv("GW_GLOO_SHM");
  return env == nullptr || std::string_view(env) != "0";
}

// Runs `job` and turns Gloo's errors into ours, naming the op and this rank.
std::exception_ptr attempt(int rank, int size, const std::string& op, Milliseconds timeout,
                           const std::function<void()>& job) {
  SigpipeBlocked no_sigpipe;  // Gloo writes without MSG_NOSIGNAL (core/sigpipe.h)
  try {
    job();
    return nullptr;
  } catch (const gloo::EnforceNotMet& e) {
    return std::make_exception_ptr(InvalidArgumentError(gw::detail::str(
        "[", op, "] rank ", rank, " of ", size, ": Gloo refused the operation: ", e.what())));
  } catch (const gloo::Exception& e) {
    const std::string what = e.what();
    const std::string where = gw::detail::str("[", op, "] rank ", rank, " of ", size, " ");
    if (what.find("Timed out") != std::string::npos || what.find("timed out") != std::string::npos)
      return std::make_exception_ptr(TimeoutError(
          where + gw::detail::str("timed out after ", timeout.count(), " ms: ", what)));
    return std::make_exception_ptr(IoError(where + "failed (a peer died?): " + what));
  } catch (...) {
    return std::current_exception();
  }
}

}  // namespace

namespace {

// A send or receive posted to Gloo, until one waiter claims it: the caller's wait() on its own
// thread, or a side thread (for future(), wait(timeout) and is_completed()), or, when the Work is
// dropped unwaited or the group destroyed first, a side thread that waits for the buffer and the
// tensor to be done with.
struct PostedP2P {
  std::atomic<bool> claimed{false};
  std::weak_ptr<Work> work;
  std::function<void(WorkPtr)> to_side_thread;  // waits there, then finishes the Work if any
  bool claim() { return !claimed.exchange(true); }
  ~PostedP2P() {
    if (!claimed.load() && to_side_thread) to_side_thread(nullptr);
  }
};

}  // namespace

struct ProcessGroupGloo::Impl : std::enable_shared_from_this<ProcessGroupGloo::Impl> {
  int rank = 0, size = 0;
  GlooOptions options;
  std::shared_ptr<gloo::rendezvous::Context> context;
  std::shared_ptr<detail::ShmCollectives> shm;  // every rank on this host, and wanted
  std::shared_ptr<detail::CollectiveQueue> queue;
  detail::SideThreads p2p_threads;  // send and receive
  std::mutex posted_mu;
  std::vector<std::weak_ptr<PostedP2P>> unclaimed;  // sends and receives, maybe claimed since
  // The buffers and tensors of transfers that failed or timed out (their Work is finished):
  // Gloo may still hold them, so they go with the group only.
  std::vector<std::function<std::exception_ptr()>> failed_transfers;
  detail::Transport transport() const { return {context, shm}; }
  void hold(std::function<std::exception_ptr()> transfer) {
    std::lock_guard lock(posted_mu);
    failed_transfers.push_back(std::move(transfer));
  }

  // Before the group goes: every transfer still unclaimed gets a side thread, which join_all
  // then waits for, so that no Work is left unfinished and no buffer freed while in flight.
  void claim_posted();

  // A rank was declared dead (group_liveness.h): fails the running collective, everything queued
  // and every send/recv with IoError(why) now, and every later one at once. The collective's thread
  // may stay in Gloo until its own timeout: it is left behind when the group is destroyed.
  void abort(const std::string& why);
  template <typename Post, typename Wait, typename Abort>
  WorkPtr p2p(const char* op, const Tensor& tensor, int peer, int tag, Milliseconds timeout,
              Post post, Wait wait, Abort abort_wait);
};

void ProcessGroupGloo::Impl::abort(const std::string& why) {
  auto failure = std::make_exception_ptr(
      IoError(gw::detail::str("[process_group] rank ", rank, " of ", size, ": ", why)));
  // Send and receive are woken first: a Work's callback may destroy the group, joining them.
  std::vector<WorkPtr> sides = p2p_threads.close(failure);
  // The queue first: a collective that a waiter runs inline through shared memory, woken by the
  // segment's abort, must find the queue aborted when it returns (a later one is "unusable").
  const bool first = queue->abort(failure);
  if (shm) shm->abort(gw::detail::str("[process_group] rank ", rank, " of ", size, ": ", why));
  if (!first) return;
  for (auto& w : sides) w->finish(failure);
}

ProcessGroupGloo::ProcessGroupGloo(std::shared_ptr<store::Store> store, int rank, int size,
                                   GlooOptions options)
    : ProcessGroup(rank, size, store), impl_(std::make_shared<Impl>()) {
  debug::dump_on_sigusr1();
  check_group_args("ProcessGroupGloo", store != nullptr, rank, size, options.timeout);
  impl_->rank = rank;
  impl_->size = size;
  impl_->options = options;
  impl_->options.failure_timeout =
      store::failure_timeout(options.failure_timeout, "ProcessGroupGloo");
  std::shared_ptr<store::Store> liveness_store = store;  // `store` itself goes to Gloo below
  gloo::transport::tcp::attr attr;
  attr.hostname = options.hostname;
  std::exception_ptr failed = attempt(rank, size, "init_process_group", options.timeout, [&] {
    auto device = gloo::transport::tcp::CreateDevice(attr);
    impl_->context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    impl_->context->setTimeout(options.timeout);
    GlooStore gloo_store(store);
    impl_->context->connectFullMesh(gloo_store, device);
  });
  if (failed) std::rethrow_exception(failed);
  impl_->shm = detail::ShmCollectives::connect(
      *store, rank, size, wants_shared_memory(options.shared_memory), options.timeout);
  const bool watched = impl_->options.failure_timeout.count() > 0;
  impl_->queue = detail::CollectiveQueue::start(
      {.backend = "gloo",
       .group_name = options.group_name,
       .rank = rank,
       .size = size,
       .timeout = options.timeout,
       // Inline, a collective would run on the waiter's thread, which a dead rank could then
       // hold in Gloo: with liveness on, collectives run on the group's thread only, but for
       // those through shared memory, which abort() wakes.
       .run_inline = !watched,
       .attempt = [rank, size](const std::string& op, Milliseconds timeout,
                               const std::function<void()>& job) {
         return attempt(rank, size, op, timeout, job);
       }});
  if (watched)
    liveness_ = std::make_unique<GroupLiveness>(
        std::move(liveness_store), rank, size, impl_->options.failure_timeout,
        [weak = std::weak_ptr<Impl>(impl_)](const std::string& why) {
          if (auto impl = weak.lock()) impl->abort(why);
        });
}

ProcessGroupGloo::~ProcessGroupGloo() {
  // What was queued still runs. Liveness keeps watching meanwhile, so that a rank dying now
  // aborts the group instead of holding this destructor for the collective's timeout; then this
  // rank leaves, not to be declared dead.
  impl_->queue->shutdown([&] { liveness_.reset(); });
  impl_->claim_posted();
  // Each woken by an abort; left behind on a group thread, which cannot join itself.
  if (detail::t_on_group_thread)
    impl_->p2p_threads.detach_all();
  else
    impl_->p2p_threads.join_all();
}

bool ProcessGroupGloo::uses_shared_memory() const { return impl_->shm != nullptr; }

// Whether no two of `tensors` share a byte (reduced in place, a shared byte would be reduced
// twice).
static bool disjoint(const std::vector<Tensor>& tensors) {
  std::vector<std::pair<uintptr_t, size_t>> spans;
  for (const Tensor& t : tensors)
    if (t.nbytes() > 0) spans.emplace_back(reinterpret_cast<uintptr_t>(t.raw_data()), t.nbytes());
  std::sort(spans.begin(), spans.end());
  for (size_t k = 1; k < spans.size(); ++k)
    if (spans[k - 1].first + spans[k - 1].second > spans[k].first) return false;
  return true;
}

// The checks every reducing collective makes before anything is queued.
static void check_reducible(const char* name, const Tensor& t, ReduceOp op) {
  ProcessGroupGloo::check_avg(name, t, op);
  detail::dispatch_reduce(t.dtype(), op, name, []<typename T>() {});  // a supported dtype
}

WorkPtr ProcessGroupGloo::allreduce(Tensor& tensor, AllreduceOptions o) {
  check_tensor("allreduce", tensor);
  check_reducible("allreduce", tensor, o.op);
  return impl_->queue->enqueue(
      signature::allreduce(tensor, o), o.timeout,
      [t = tensor, op = o.op, via = impl_->transport()](uint32_t tag, Milliseconds to) {
        detail::allreduce_now("allreduce", via, t, op, tag, to);
      },
      impl_->shm != nullptr);
}

WorkPtr ProcessGroupGloo::allreduce_coalesced(std::vector<Tensor>& tensors, AllreduceOptions o) {
  check_coalesced("allreduce_coalesced", tensors);
  check_reducible("allreduce_coalesced", tensors[0], o.op);
  if (impl_->shm && disjoint(tensors))  // each tensor reduced where it is: no flat copy
    return impl_->queue->enqueue(
        signature::allreduce_coalesced(tensors, o), o.timeout,
        [tensors, op = o.op, via = impl_->transport()](uint32_t tag, Milliseconds to) {
          detail::allreduce_in_place_now("allreduce_coalesced", via, tensors, op, tag, to);
        },
        true);
  Tensor flat = concat(tensors);
  return impl_->queue->enqueue(
      signature::allreduce_coalesced(tensors, o), o.timeout,
      [flat, tensors, op = o.op, via = impl_->transport()](uint32_t tag, Milliseconds to) mutable {
        detail::allreduce_now("allreduce_coalesced", via, flat, op, tag, to);
        split(flat, tensors);
      },
      impl_->shm != nullptr);
}

WorkPtr ProcessGroupGloo::broadcast(Tensor& tensor, BroadcastOptions o) {
  check_tensor("broadcast", tensor);
  check_rank("broadcast", o.root, "root");
  return impl_->queue->enqueue(
      signature::broadcast(tensor, o), o.timeout,
      [t = tensor, root = o.root, via = impl_->transport()](uint32_t tag, Milliseconds to) {
        detail::broadcast_now(via, t, root, tag, to);
      },
      impl_->shm != nullptr);
}

WorkPtr ProcessGroupGloo::reduce(Tensor& tensor, ReduceOptions o) {
  check_tensor("reduce", tensor);
  check_rank("reduce", o.root, "root");
  GW_CHECK(tensor.dtype() != DType::Float16 && tensor.dtype() != DType::BFloat16,
           InvalidArgumentError, "[reduce] ", dtype_name(tensor.dtype()),
           " tensors are reduced with allreduce only");
  check_reducible("reduce", tensor, o.op);
  const bool root = rank() == o.root;
  // Gloo uses the output of other ranks as scratch space: theirs stay as they were.
  Tensor out = root ? tensor : tensor.clone();
  return impl_->queue->enqueue(signature::reduce(tensor, o), o.timeout,
                               [out, o, root, ctx = impl_->context](uint32_t tag, Milliseconds to) {
                                 if (out.numel() == 0) return;
                                 dispatch<detail::ReduceTypes>(
                                     out.dtype(), "reduce", [&]<typename T>() {
                                       gloo::ReduceOptions g(ctx);
                                       g.setOutput<T>(out.data_ptr<T>(),
                                                      static_cast<size_t>(out.numel()));
                                       g.setRoot(o.root);
                                       g.setReduceFunction(detail::reduce_function<T>(o.op));
                                       g.setTag(tag);
                                       g.setTimeout(to);
                                       gloo::reduce(g);
                                     });
                                 if (root && o.op == ReduceOp::AVG)
                                   divide(out, ctx->size, "reduce");
                               });
}

WorkPtr ProcessGroupGloo::allgather(std::vector<Tensor>& outputs, const Tensor& input,
                                    CollectiveOptions o) {
  check_allgather(outputs, input);
  Tensor flat = empty({input.numel() * size()}, TensorOptions().with_dtype(input.dtype()));
  return impl_->queue->enqueue(
      signature::allgather(input), o.timeout,
      [flat, input, outputs, via = impl_->transport()](uint32_t tag, Milliseconds to) mutable {
        detail::allgather_now("allgather", via, input, flat, tag, to);
        split(flat, outputs);
      },
      impl_->shm != nullptr);
}

WorkPtr ProcessGroupGloo::all_gather_into_tensor(Tensor& output, const Tensor& input,
                                                 CollectiveOptions o) {
  check_flat("all_gather_into_tensor", output, "output", input, "input");
  return impl_->queue->enqueue(
      signature::all_gather_into_tensor(input), o.timeout,
      [output, input, via = impl_->transport()](uint32_t tag, Milliseconds to) {
        detail::allgather_now("all_gather_into_tensor", via, input, output, tag, to);
      },
      impl_->shm != nullptr);
}

WorkPtr ProcessGroupGloo::gather(std::vector<Tensor>& outputs, const Tensor& input,
                                 GatherOptions o) {
  check_tensor("gather", input, "input");
  check_root_parts("gather", outputs, input, o.root, "outputs");
  const bool root = rank() == o.root;
  Tensor flat =
      root ? empty({input.numel() * size()}, TensorOptions().with_dtype(input.dtype())) : Tensor();
  return impl_->queue->enqueue(signature::gather(input, o), o.timeout,
                               [flat, input, outputs, root, r = o.root, ctx = impl_->context](
                                   uint32_t tag, Milliseconds to) mutable {
                                 if (input.nbytes() == 0) return;
                                 gloo::GatherOptions g(ctx);
                                 g.setInput<uint8_t>(detail::bytes_of(input), input.nbytes());
                                 if (root)
                                   g.setOutput<uint8_t>(detail::bytes_of(flat), flat.nbytes());
                                 g.setRoot(r);
                                 g.setTag(tag);
                                 g.setTimeout(to);
                                 gloo::gather(g);
                                 if (root) split(flat, outputs);
                               });
}

WorkPtr ProcessGroupGloo::scatter(Tensor& output, const std::vector<Tensor>& inputs,
                                  ScatterOptions o) {
  check_tensor("scatter", output, "output");
  check_root_parts("scatter", inputs, output, o.root, "inputs");
  return impl_->queue->enqueue(
      signature::scatter(output, o), o.timeout,
      [output, inputs, r = o.root, ctx = impl_->context](uint32_t tag, Milliseconds to) {
        if (output.nbytes() == 0) return;
        gloo::ScatterOptions g(ctx);
        std::vector<uint8_t*> ptrs;
        for (const auto& t : inputs) ptrs.push_back(detail::bytes_of(t));
        if (!ptrs.empty()) g.setInputs<uint8_t>(ptrs, output.nbytes());
        g.setOutput<uint8_t>(detail::bytes_of(output), output.nbytes());
        g.setRoot(r);
        g.setTag(tag);
        g.setTimeout(to);
        gloo::scatter(g);
      });
}

WorkPtr ProcessGroupGloo::reduce_scatter(Tensor& output, const std::vector<Tensor>& inputs,
                                         CollectiveOptions o) {
  check_reduce_scatter(output, inputs);
  check_reducible("reduce_scatter", output, o.op);
  Tensor flat = concat(inputs);
  return impl_->queue->enqueue(
      signature::reduce_scatter(output, o), o.timeout,
      [flat, output, op = o.op, via = impl_->transport()](uint32_t tag, Milliseconds to) {
        detail::reduce_scatter_now("reduce_scatter", via, flat, output, op, tag, to);
      },
      impl_->shm != nullptr);
}

WorkPtr ProcessGroupGloo::reduce_scatter_tensor(Tensor& output, const Tensor& input,
                                                CollectiveOptions o) {
  check_flat("reduce_scatter_tensor", input, "input", output, "output");
  check_reducible("reduce_scatter_tensor", output, o.op);
  return impl_->queue->enqueue(
      signature::reduce_scatter_tensor(output, o), o.timeout,
      [input, output, op = o.op, via = impl_->transport()](uint32_t tag, Milliseconds to) {
        detail::reduce_scatter_now("reduce_scatter_tensor", via, input, output, op, tag, to);
      },
      impl_->shm != nullptr);
}

WorkPtr ProcessGroupGloo::alltoall(std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                                   CollectiveOptions o) {
  check_alltoall(outputs, inputs);
  Tensor in = concat(inputs);
  Tensor out = empty_like(in);
  return impl_->queue->enqueue(
      signature::alltoall(inputs), o.timeout,
      [in, out, outputs, ctx = impl_->context](uint32_t tag, Milliseconds to) mutable {
        if (in.nbytes() == 0) return;
        gloo::AlltoallOptions g(ctx);
        g.setInput<uint8_t>(detail::bytes_of(in), in.nbytes());
        g.setOutput<uint8_t>(detail::bytes_of(out), out.nbytes());
        g.setTag(tag);
        g.setTimeout(to);
        gloo::alltoall(g);
        split(out, outputs);
      });
}

WorkPtr ProcessGroupGloo::barrier(CollectiveOptions o) {
  return impl_->queue->enqueue(
      signature::barrier(), o.timeout,
      [via = impl_->transport()](uint32_t tag, Milliseconds to) {
        detail::barrier_now(via, tag, to);
      },
      impl_->shm != nullptr);
}

// Point-to-point transfers do not take part in the collectives' order: each is posted to Gloo at
// once, on the caller's thread, and waited for by whoever comes first (PostedP2P): a wait() on
// its own thread (no hand-off: a ping-pong costs what raw Gloo's does), or a side thread of its
// own when the Work is used asynchronously (future(), wait(timeout), is_completed()) or dropped.
template <typename Post, typename Wait, typename Abort>
WorkPtr ProcessGroupGloo::Impl::p2p(const char* op, const Tensor& tensor, int peer, int tag,
                                    Milliseconds timeout, Post post, Wait wait, Abort abort_wait) {
  auto work = std::make_shared<Work>(op);
  record_collective(options.group_name, rank, size, -1, signature::p2p(op, tensor, peer, tag),
                    work);
  timeout = queue->timeout_of(timeout);
  if (std::exception_ptr refused = p2p_threads.closed()) {
    work->finish(queue->unusable(op, refused));
    return work;
  }
  // Posted now, on the caller's thread: Gloo's send and recv only hand the buffer to its pair.
  if (std::exception_ptr failed = attempt(rank, size, op, timeout, post)) {
    work->finish(failed);
    return work;
  }
  // The wait: the outcome of the op, by the timeout counted from now (or its abort: then the
  // group's failure). It holds the buffer and the tensor.
  const std::weak_ptr<Impl> self = weak_from_this();
  const auto posted_at = std::chrono::steady_clock::now();
  auto outcome = [self, op, peer, tag, rank = rank, size = size, timeout, posted_at, wait] {
    return attempt(rank, size, op, timeout, [&] {
      const auto elapsed =
          std::chrono::duration_cast<Milliseconds>(std::chrono::steady_clock::now() - posted_at);
      if (wait(std::max(timeout - elapsed, Milliseconds(1)))) return;
      if (auto impl = self.lock())
        if (std::exception_ptr closed = impl->p2p_threads.closed()) std::rethrow_exception(closed);
      throw TimeoutError(gw::detail::str("[", op, "] rank ", rank, " of ", size, " with peer ",
                                         peer, ", tag ", tag, ": timed out after ", timeout.count(),
                                         " ms"));
    });
  };
  auto posted = std::make_shared<PostedP2P>();
  posted->work = work;
  // The Work finishes with `result`; a transfer that failed stays held by the group.
  auto conclude = [self, outcome](const WorkPtr& w, std::exception_ptr result) {
    if (result)
      if (auto impl = self.lock()) impl->hold(outcome);
    if (w) w->finish(std::move(result));
  };
  posted->to_side_thread = [self, outcome, conclude, abort_wait, op](WorkPtr w) {
    auto body = [w, outcome, conclude] { conclude(w, outcome()); };
    auto impl = self.lock();
    if (!impl) return body();  // the group is gone, the buffer keeps its transport: wait here
    try {
      if (std::exception_ptr refused = impl->p2p_threads.start(body, w, abort_wait))
        conclude(w, impl->queue->unusable(op, refused));
    } catch (...) {  // no thread to be had
      conclude(w, std::current_exception());
    }
  };
  {
    std::lock_guard lock(posted_mu);
    std::erase_if(unclaimed, [](const std::weak_ptr<PostedP2P>& p) {
      auto alive = p.lock();
      return !alive || alive->claimed.load();
    });
    unclaimed.push_back(posted);
  }
  // These live in the Work, so they hold it weakly (whoever waits holds it).
  const std::weak_ptr<Work> weak_work = work;
  work->set_driver(Work::driver_of(
      [self, posted, weak_work, outcome, conclude, abort_wait, op](const Work*, Work::Drive drive) {
        WorkPtr w = weak_work.lock();
        if (!w || !posted->claim()) return;
        if (drive == Work::Drive::kLaunch) {
          posted->to_side_thread(w);
          return;
        }
        auto impl = self.lock();
        if (!impl)
          return conclude(w, outcome());  // the group is gone; the buffer keeps its transport
        uint64_t token = 0;  // closing the group wakes this wait as it wakes a side thread's
        if (std::exception_ptr closed = impl->p2p_threads.watch(w, abort_wait, &token)) {
          conclude(w, impl->queue->unusable(op, closed));
          return;
        }
        struct Unwatch {
          detail::SideThreads& threads;
          uint64_t token;
          ~Unwatch() { threads.unwatch(token); }
        } unwatch{impl->p2p_threads, token};
        conclude(w, outcome());
      }));
  return work;
}

void ProcessGroupGloo::Impl::claim_posted() {
  std::vector<std::weak_ptr<PostedP2P>> all;
  {
    std::lock_guard lock(posted_mu);
    all.swap(unclaimed);
  }
  for (const auto& weak : all)
    if (auto p = weak.lock(); p && p->claim()) p->to_side_thread(p->work.lock());
}

WorkPtr ProcessGroupGloo::send(const Tensor& tensor, int dst, int tag, CollectiveOptions o) {
  check_p2p("send", tensor, dst, tag);
  auto buf = std::shared_ptr<gloo::transport::UnboundBuffer>(
      impl_->context->createUnboundBuffer(tensor.raw_data(), tensor.nbytes()));
  const uint64_t slot = kSendRecvSlot | static_cast<uint64_t>(tag);
  return impl_->p2p(
      "send", tensor, dst, tag, o.timeout, [buf, dst, slot] { buf->send(dst, slot); },
      [buf, tensor](Milliseconds to) { return buf->waitSend(to); },
      [buf] { buf->abortWaitSend(); });
}

WorkPtr ProcessGroupGloo::recv(Tensor& tensor, int src, int tag, CollectiveOptions o) {
  check_p2p("recv", tensor, src, tag);
  auto buf = std::shared_ptr<gloo::transport::UnboundBuffer>(
      impl_->context->createUnboundBuffer(tensor.raw_data(), tensor.nbytes()));
  const uint64_t slot = kSendRecvSlot | static_cast<uint64_t>(tag);
  return impl_->p2p(
      "recv", tensor, src, tag, o.timeout, [buf, src, slot] { buf->recv(src, slot); },
      [buf, tensor](Milliseconds to) { return buf->waitRecv(to); },
      [buf] { buf->abortWaitRecv(); });
}

}  // namespace gw::dist

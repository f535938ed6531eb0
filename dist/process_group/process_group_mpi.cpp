#include "dist/process_group/process_group_mpi.h"

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <optional>
#include <string_view>
#include <thread>

#include "core/ops.h"
#include "debug/flight_recorder.h"
#include "dist/process_group/collective_queue.h"
#include "dist/process_group/debug_process_group.h"
#include "dist/process_group/mpi_runtime.h"

namespace gw::dist {

namespace {

using Clock = std::chrono::steady_clock;
using Runtime = detail::MpiRuntime;

// A communicator, freed when the group and the last of its queued operations let it go.
struct Communicator {
  MPI_Comm comm = MPI_COMM_NULL;
  explicit Communicator(MPI_Comm c) : comm(c) {}
  ~Communicator() {
    if (comm != MPI_COMM_NULL && !detail::mpi_finalized()) MPI_Comm_free(&comm);
  }
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
};
using CommPtr = std::shared_ptr<Communicator>;

// MPI counts are ints.
int count_of(const char* op, int64_t n) {
  GW_CHECK(n <= INT_MAX, InvalidArgumentError, "[", op, "] ", n,
           " elements is more than MPI's counts reach (", INT_MAX, ")");
  return static_cast<int>(n);
}

// The MPI type that carries `dtype`'s elements.
MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::Bool:
      return MPI_C_BOOL;
    case DType::Int32:
      return MPI_INT32_T;
    case DType::Int64:
      return MPI_INT64_T;
    case DType::Float16:
    case DType::BFloat16:
      return MPI_UINT16_T;
    case DType::Float32:
      return MPI_FLOAT;
    case DType::Float64:
      return MPI_DOUBLE;
  }
  throw InvalidArgumentError("[ProcessGroupMPI] unknown dtype");
}

// The MPI operation that reduces `dtype` by `op`; InvalidArgumentError naming `name` for a pair
// MPI cannot reduce (the same pairs as the Gloo group, and bfloat16 sums).
MPI_Op mpi_op(const char* name, DType dtype, ReduceOp op) {
  if (dtype == DType::Float16 || dtype == DType::BFloat16) {
    GW_CHECK(op == ReduceOp::SUM, InvalidArgumentError, "[", name, "] ", dtype_name(dtype),
             " tensors are reduced with SUM only, got ", to_string(op));
    return dtype == DType::Float16 ? Runtime::get().half_sum : Runtime::get().bf16_sum;
  }
  GW_CHECK(dtype != DType::Bool, InvalidArgumentError, "[", name,
           "] bool tensors cannot be reduced");
  switch (op) {
    case ReduceOp::SUM:
    case ReduceOp::AVG:
      return MPI_SUM;
    case ReduceOp::PRODUCT:
      return MPI_PROD;
    case ReduceOp::MIN:
      return MPI_MIN;
    case ReduceOp::MAX:
      return MPI_MAX;
  }
  throw InvalidArgumentError("[ProcessGroupMPI] unknown reduce op");
}

void* data(const Tensor& t) { return t.raw_data(); }

}  // namespace

bool mpi_available(std::string* why) {
  if (why) why->clear();
  return true;
}

// A send or receive: posted on the calling thread, in call order (MPI matches the messages of
// one sender and tag in the order they were posted), completed on a thread of its own.
struct Transfer {
  bool receive;
  int peer, tag, count;
  MPI_Datatype type;
  Milliseconds timeout;
  std::string op, where;  // "recv"; "rank 1 of 2 in group default_pg with peer 0, tag 7"
  MPI_Request request = MPI_REQUEST_NULL;
  std::atomic<bool> cancel{false};  // the group is going away

  // Waits for it by polling, and returns its failure: a receive can be cancelled (at its
  // timeout: TimeoutError; when the group goes away: StateError); a send cannot, and past its
  // timeout the watchdog ends the job.
  std::exception_ptr complete();
};

struct ProcessGroupMPI::Impl {
  int rank = 0, size = 0;
  MpiOptions options;
  CommPtr comm;
  std::shared_ptr<detail::CollectiveQueue> queue;
  detail::SideThreads p2p_threads;
  uint64_t remembered = 0;  // by the runtime, which shuts the group down at exit

  // The group over `c`, which it frees; remembered by the runtime until destroyed.
  static std::shared_ptr<Impl> make(CommPtr c, MpiOptions o) {
    GW_CHECK(o.timeout.count() > 0, InvalidArgumentError, "[ProcessGroupMPI] group ", o.group_name,
             ": the timeout must be positive, got ", o.timeout.count(), " ms");
    auto impl = std::make_shared<Impl>(std::move(c), std::move(o));
    impl->remembered = Runtime::get().remember([weak = std::weak_ptr<Impl>(impl)] {
      if (auto alive = weak.lock()) alive->shut_down();
    });
    return impl;
  }
  Impl(CommPtr c, MpiOptions o) : options(std::move(o)), comm(std::move(c)) {
    // A program that made MPI_COMM_WORLD return errors would have them ignored here.
    MPI_Comm_set_errhandler(comm->comm, MPI_ERRORS_ARE_FATAL);
    MPI_Comm_rank(comm->comm, &rank);
    MPI_Comm_size(comm->comm, &size);
    queue = detail::CollectiveQueue::start(
        {.backend = "mpi",
         .group_name = options.group_name,
         .rank = rank,
         .size = size,
         .timeout = options.timeout,
         .run_inline = true,  // a collective past its timeout ends the job wherever it runs
         .lazy_start = true,
         .attempt = [where = this->where()](const std::string& op, Milliseconds timeout,
                                            const std::function<void()>& job) {
           return attempt(where, op, timeout, job);
         }});
  }
  ~Impl() { Runtime::get().forget(remembered); }
  // What was queued still runs; a receive still waiting is cancelled.
  void shut_down() {
    queue->shutdown();
    if (detail::t_on_group_thread) {  // it cannot join itself
      p2p_threads.detach_all();
      return;
    }
    p2p_threads.close(std::make_exception_ptr(
        StateError("[process_group] the mpi group " + options.group_name + " was destroyed")));
    p2p_threads.join_all();
  }
  // "rank 0 of 2 in group default_pg"
  std::string where() const {
    return gw::detail::str("rank ", rank, " of ", size, " in group ", options.group_name);
  }
  // Runs `job` under the watchdog (an MPI error ends the job by MPI's rules); returns what it
  // threw.
  static std::exception_ptr attempt(const std::string& where, const std::string& op,
                                    Milliseconds timeout, const std::function<void()>& job) {
    try {
      Runtime::Watch watch(op, where, timeout);
      job();
      return nullptr;
    } catch (...) {
      return std::current_exception();
    }
  }
  // The reducing collectives' body: an in-place allreduce of `t`.
  static void allreduce_now(MPI_Comm comm, int size, const Tensor& t, ReduceOp op) {
    const int n = count_of("allreduce", t.numel());
    MPI_Allreduce(MPI_IN_PLACE, data(t), n, mpi_type(t.dtype()), mpi_op("allreduce", t.dtype(), op),
                  comm);
    if (op == ReduceOp::AVG) divide(t, size, "allreduce");
  }
  WorkPtr p2p(const char* op, const Tensor& tensor, int peer, int tag, Milliseconds timeout);
};

ProcessGroupMPI::ProcessGroupMPI(MpiOptions options)
    : ProcessGroupMPI([&] {
        debug::dump_on_sigusr1();
        Runtime::get().check_open("ProcessGroupMPI");
        MPI_Comm world = MPI_COMM_NULL;
        MPI_Comm_dup(MPI_COMM_WORLD, &world);  // its own context: the program's MPI stays apart
        return Impl::make(std::make_shared<Communicator>(world), std::move(options));
      }()) {}

ProcessGroupMPI::ProcessGroupMPI(std::shared_ptr<Impl> impl)
    : ProcessGroup(impl->rank, impl->size), impl_(std::move(impl)) {}

ProcessGroupMPI::~ProcessGroupMPI() { impl_->shut_down(); }

std::shared_ptr<ProcessGroupMPI> ProcessGroupMPI::subgroup(const std::vector<int>& ranks,
                                                           MpiOptions options) const {
  GW_CHECK(!ranks.empty(), InvalidArgumentError, "[new_group] no ranks given");
  GW_CHECK(!detail::t_on_group_thread, StateError,
           "[new_group] called on a process group's own thread (a callback or communication "
           "hook), where it would wait for itself");
  for (size_t i = 0; i < ranks.size(); ++i) {
    check_rank("new_group", ranks[i], "rank");
    GW_CHECK(i == 0 || ranks[i - 1] < ranks[i], InvalidArgumentError,
             "[new_group] ranks must be sorted and distinct; got ", ranks[i - 1], " before ",
             ranks[i]);
  }
  std::string listed;
  for (int r : ranks) listed += (listed.empty() ? "[" : ", ") + std::to_string(r);
  // A collective of this group's communicator: in its order with the others.
  auto made = std::make_shared<MPI_Comm>(MPI_COMM_NULL);
  impl_->queue
      ->enqueue({"new_group", listed + "]"}, kGroupTimeout,
                [c = impl_->comm, ranks, made](uint32_t, Milliseconds) {
                  MPI_Group all = MPI_GROUP_NULL, some = MPI_GROUP_NULL;
                  MPI_Comm_group(c->comm, &all);
                  MPI_Group_incl(all, static_cast<int>(ranks.size()), ranks.data(), &some);
                  MPI_Comm_create(c->comm, some, made.get());
                  MPI_Group_free(&some);
                  MPI_Group_free(&all);
                })
      ->wait();
  if (*made == MPI_COMM_NULL) return nullptr;  // not one of `ranks`
  auto impl = Impl::make(std::make_shared<Communicator>(*made), std::move(options));
  return std::shared_ptr<ProcessGroupMPI>(new ProcessGroupMPI(std::move(impl)));
}

WorkPtr ProcessGroupMPI::allreduce(Tensor& tensor, AllreduceOptions o) {
  check_tensor("allreduce", tensor);
  check_avg("allreduce", tensor, o.op);
  mpi_op("allreduce", tensor.dtype(), o.op);
  count_of("allreduce", tensor.numel());
  return impl_->queue->enqueue(
      signature::allreduce(tensor, o), o.timeout,
      [c = impl_->comm, size = size(), t = tensor, op = o.op](uint32_t, Milliseconds) {
        Impl::allreduce_now(c->comm, size, t, op);
      });
}

WorkPtr ProcessGroupMPI::allreduce_coalesced(std::vector<Tensor>& tensors, AllreduceOptions o) {
  check_coalesced("allreduce_coalesced", tensors);
  check_avg("allreduce_coalesced", tensors[0], o.op);
  mpi_op("allreduce_coalesced", tensors[0].dtype(), o.op);
  Tensor flat = concat(tensors);
  count_of("allreduce_coalesced", flat.numel());
  return impl_->queue->enqueue(
      signature::allreduce_coalesced(tensors, o), o.timeout,
      [c = impl_->comm, size = size(), flat, tensors, op = o.op](uint32_t, Milliseconds) mutable {
        Impl::allreduce_now(c->comm, size, flat, op);
        split(flat, tensors);
      });
}

WorkPtr ProcessGroupMPI::broadcast(Tensor& tensor, BroadcastOptions o) {
  check_tensor("broadcast", tensor);
  check_rank("broadcast", o.root, "root");
  const int n = count_of("broadcast", tensor.numel());
  return impl_->queue->enqueue(
      signature::broadcast(tensor, o), o.timeout,
      [c = impl_->comm, t = tensor, n, root = o.root](uint32_t, Milliseconds) {
        MPI_Bcast(data(t), n, mpi_type(t.dtype()), root, c->comm);
      });
}

WorkPtr ProcessGroupMPI::reduce(Tensor& tensor, ReduceOptions o) {
  check_tensor("reduce", tensor);
  check_rank("reduce", o.root, "root");
  check_avg("reduce", tensor, o.op);
  mpi_op("reduce", tensor.dtype(), o.op);
  const int n = count_of("reduce", tensor.numel());
  const bool root = rank() == o.root;
  return impl_->queue->enqueue(
      signature::reduce(tensor, o), o.timeout,
      [c = impl_->comm, size = size(), t = tensor, n, o, root](uint32_t, Milliseconds) {
        // Only the root's tensor changes: MPI reads the others'.
        MPI_Reduce(root ? MPI_IN_PLACE : data(t), root ? data(t) : nullptr, n, mpi_type(t.dtype()),
                   mpi_op("reduce", t.dtype(), o.op), o.root, c->comm);
        if (root && o.op == ReduceOp::AVG) divide(t, size, "reduce");
      });
}

WorkPtr ProcessGroupMPI::allgather(std::vector<Tensor>& outputs, const Tensor& input,
                                   CollectiveOptions o) {
  check_allgather(outputs, input);
  const int n = count_of("allgather", input.numel());
  count_of("allgather", input.numel() * size());
  Tensor flat = empty({input.numel() * size()}, TensorOptions().with_dtype(input.dtype()));
  return impl_->queue->enqueue(
      signature::allgather(input), o.timeout,
      [c = impl_->comm, flat, input, outputs, n](uint32_t, Milliseconds) mutable {
        const MPI_Datatype type = mpi_type(input.dtype());
        MPI_Allgather(data(input), n, type, data(flat), n, type, c->comm);
        split(flat, outputs);
      });
}

WorkPtr ProcessGroupMPI::gather(std::vector<Tensor>& outputs, const Tensor& input,
                                GatherOptions o) {
  check_tensor("gather", input, "input");
  check_root_parts("gather", outputs, input, o.root, "outputs");
  const int n = count_of("gather", input.numel());
  count_of("gather", input.numel() * size());
  const bool root = rank() == o.root;
  Tensor flat =
      root ? empty({input.numel() * size()}, TensorOptions().with_dtype(input.dtype())) : Tensor();
  return impl_->queue->enqueue(
      signature::gather(input, o), o.timeout,
      [c = impl_->comm, flat, input, outputs, n, root, r = o.root](uint32_t, Milliseconds) mutable {
        const MPI_Datatype type = mpi_type(input.dtype());
        MPI_Gather(data(input), n, type, root ? data(flat) : nullptr, n, type, r, c->comm);
        if (root) split(flat, outputs);
      });
}

WorkPtr ProcessGroupMPI::scatter(Tensor& output, const std::vector<Tensor>& inputs,
                                 ScatterOptions o) {
  check_tensor("scatter", output, "output");
  check_root_parts("scatter", inputs, output, o.root, "inputs");
  const int n = count_of("scatter", output.numel());
  count_of("scatter", output.numel() * size());
  Tensor flat = rank() == o.root ? concat(inputs) : Tensor();
  return impl_->queue->enqueue(
      signature::scatter(output, o), o.timeout,
      [c = impl_->comm, flat, output, n, r = o.root](uint32_t, Milliseconds) {
        const MPI_Datatype type = mpi_type(output.dtype());
        MPI_Scatter(flat.defined() ? data(flat) : nullptr, n, type, data(output), n, type, r,
                    c->comm);
      });
}

WorkPtr ProcessGroupMPI::reduce_scatter(Tensor& output, const std::vector<Tensor>& inputs,
                                        CollectiveOptions o) {
  check_reduce_scatter(output, inputs);
  check_avg("reduce_scatter", output, o.op);
  mpi_op("reduce_scatter", output.dtype(), o.op);
  const int n = count_of("reduce_scatter", output.numel());
  Tensor flat = concat(inputs);
  count_of("reduce_scatter", flat.numel());
  return impl_->queue->enqueue(
      signature::reduce_scatter(output, o), o.timeout,
      [c = impl_->comm, size = size(), flat, output, n, op = o.op](uint32_t, Milliseconds) {
        MPI_Reduce_scatter_block(data(flat), data(output), n, mpi_type(output.dtype()),
                                 mpi_op("reduce_scatter", output.dtype(), op), c->comm);
        if (op == ReduceOp::AVG) divide(output, size, "reduce_scatter");
      });
}

WorkPtr ProcessGroupMPI::all_gather_into_tensor(Tensor& output, const Tensor& input,
                                                CollectiveOptions o) {
  check_flat("all_gather_into_tensor", output, "output", input, "input");
  const int n = count_of("all_gather_into_tensor", input.numel());
  count_of("all_gather_into_tensor", output.numel());
  return impl_->queue->enqueue(signature::all_gather_into_tensor(input), o.timeout,
                               [c = impl_->comm, output, input, n](uint32_t, Milliseconds) {
                                 const MPI_Datatype type = mpi_type(input.dtype());
                                 MPI_Allgather(data(input), n, type, data(output), n, type,
                                               c->comm);
                               });
}

WorkPtr ProcessGroupMPI::reduce_scatter_tensor(Tensor& output, const Tensor& input,
                                               CollectiveOptions o) {
  check_flat("reduce_scatter_tensor", input, "input", output, "output");
  check_avg("reduce_scatter_tensor", output, o.op);
  mpi_op("reduce_scatter_tensor", output.dtype(), o.op);
  const int n = count_of("reduce_scatter_tensor", output.numel());
  count_of("reduce_scatter_tensor", input.numel());
  return impl_->queue->enqueue(
      signature::reduce_scatter_tensor(output, o), o.timeout,
      [c = impl_->comm, size = size(), input, output, n, op = o.op](uint32_t, Milliseconds) {
        MPI_Reduce_scatter_block(data(input), data(output), n, mpi_type(output.dtype()),
                                 mpi_op("reduce_scatter_tensor", output.dtype(), op), c->comm);
        if (op == ReduceOp::AVG) divide(output, size, "reduce_scatter_tensor");
      });
}

WorkPtr ProcessGroupMPI::alltoall(std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                                  CollectiveOptions o) {
  check_alltoall(outputs, inputs);
  Tensor in = concat(inputs);
  Tensor out = empty_like(in);
  const int n = count_of("alltoall", inputs[0].numel());
  count_of("alltoall", in.numel());
  return impl_->queue->enqueue(
      signature::alltoall(inputs), o.timeout,
      [c = impl_->comm, in, out, outputs, n](uint32_t, Milliseconds) mutable {
        const MPI_Datatype type = mpi_type(in.dtype());
        MPI_Alltoall(data(in), n, type, data(out), n, type, c->comm);
        split(out, outputs);
      });
}

WorkPtr ProcessGroupMPI::barrier(CollectiveOptions o) {
  return impl_->queue->enqueue(signature::barrier(), o.timeout,
                               [c = impl_->comm](uint32_t, Milliseconds) { MPI_Barrier(c->comm); });
}

WorkPtr ProcessGroupMPI::Impl::p2p(const char* op, const Tensor& tensor, int peer, int tag,
                                   Milliseconds timeout) {
  Runtime& runtime = Runtime::get();
  GW_CHECK(tag <= runtime.tag_upper_bound, InvalidArgumentError, "[", op, "] tag ", tag,
           " is above MPI's largest (", runtime.tag_upper_bound, ")");
  runtime.check_open(op);
  auto work = std::make_shared<Work>(op);
  record_collective(options.group_name, rank, size, -1, signature::p2p(op, tensor, peer, tag),
                    work);
  std::shared_ptr<Transfer> transfer(
      new Transfer{.receive = std::string_view(op) == "recv",
                   .peer = peer,
                   .tag = tag,
                   .count = count_of(op, tensor.numel()),
                   .type = mpi_type(tensor.dtype()),
                   .timeout = queue->timeout_of(timeout),
                   .op = op,
                   .where = gw::detail::str(where(), " with peer ", peer, ", tag ", tag)});
  Transfer& t = *transfer;
  if (t.receive)
    MPI_Irecv(data(tensor), t.count, t.type, peer, tag, comm->comm, &t.request);
  else
    MPI_Isend(data(tensor), t.count, t.type, peer, tag, comm->comm, &t.request);
  // The thread keeps the tensor and the communicator until the transfer is done.
  std::exception_ptr refused =
      p2p_threads.start([work, transfer, tensor, c = comm] { work->finish(transfer->complete()); },
                        work, [transfer] { transfer->cancel = true; });
  if (refused) {  // the group is going away: a receive is cancelled, a send finished
    t.cancel = true;
    const std::exception_ptr failed = t.complete();
    work->finish(failed ? failed : refused);
  }
  return work;
}

std::exception_ptr Transfer::complete() {
  try {
    std::optional<Runtime::Watch> watch;
    if (!receive) watch.emplace(op, where, timeout);
    const auto deadline = Clock::now() + timeout;
    auto pause = std::chrono::microseconds(1);
    MPI_Status status;
    while (true) {  // bounded: by the deadline for a receive, by the watchdog for a send
      int done = 0;
      MPI_Test(&request, &done, &status);
      if (done) break;
      if (receive && (cancel || Clock::now() >= deadline)) {
        MPI_Cancel(&request);
        MPI_Wait(&request, &status);
        int cancelled = 0;
        MPI_Test_cancelled(&status, &cancelled);
        if (!cancelled) break;  // it came before the cancel
        GW_CHECK(!cancel, StateError, "[recv] ", where,
                 ": the group was destroyed before the message came");
        throw TimeoutError(
            gw::detail::str("[recv] ", where, ": timed out after ", timeout.count(), " ms"));
      }
      std::this_thread::sleep_for(pause);
      pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(1));
    }
    if (receive) {
      int got = 0;
      MPI_Get_count(&status, type, &got);
      GW_CHECK(got == count, InvalidArgumentError, "[recv] ", where, ": expected ", count,
               " elements from rank ", peer, " with tag ", tag, ", got ", got);
    }
    return nullptr;
  } catch (...) {
    return std::current_exception();
  }
}

WorkPtr ProcessGroupMPI::send(const Tensor& tensor, int dst, int tag, CollectiveOptions o) {
  check_p2p("send", tensor, dst, tag);
  return impl_->p2p("send", tensor, dst, tag, o.timeout);
}

WorkPtr ProcessGroupMPI::recv(Tensor& tensor, int src, int tag, CollectiveOptions o) {
  check_p2p("recv", tensor, src, tag);
  return impl_->p2p("recv", tensor, src, tag, o.timeout);
}

}  // namespace gw::dist

#include "dist/autograd/dist_engine.h"

#include "dist/autograd/smart_task.h"
#include "rpc/agent.h"
#include "rpc/autograd_hook.h"

namespace gw::dist::autograd {

namespace {
thread_local Pass* t_pass = nullptr;

}  // namespace

// The engaging message's answer, completed outside the lock.
struct Pass::Finished {
  Future<rpc::IValue> answer;
  rpc::IValue value;
  std::exception_ptr error;
  void complete() {
    if (error)
      answer.set_exception(error);
    else
      answer.set_result(std::move(value));
  }
};

Pass* Pass::current() { return t_pass; }

Pass::Pass(rpc::Agent& agent, const std::shared_ptr<DistAutogradContext>& ctx, uint64_t pass_id,
           bool retain_graph, bool smart, std::shared_ptr<gw::autograd::Node> graph_root,
           std::vector<std::shared_ptr<gw::autograd::Node>> sends)
    : agent_(agent),
      ctx_(ctx),
      context_id_(ctx->id()),
      id_(pass_id),
      retain_graph_(retain_graph),
      smart_(smart) {
  gw::autograd::ExecuteOptions options;
  options.keep_graph = retain_graph;
  options.extra_roots = std::move(sends);
  options.leaf_sink = [weak = ctx_](const Tensor& leaf, const Tensor& grad) {
    if (auto c = weak.lock()) c->accumulate_grad(leaf, grad);
  };
  if (smart) {
    auto is_recv = [](const gw::autograd::Node& n) {
      return dynamic_cast<const RecvRpcBackward*>(&n) != nullptr;
    };
    task_ = std::make_unique<SmartTask>(std::move(graph_root), std::move(options), is_recv);
  } else {
    task_ = std::make_unique<gw::autograd::GraphTask>(std::move(graph_root), std::move(options));
  }
}

bool Pass::busy() const {
  std::lock_guard lock(mu_);
  return draining_ || rooting_ || engaged_.has_value();
}

Future<void> Pass::run_root() {
  Future<rpc::IValue> done;
  Discoveries found;
  {
    std::lock_guard lock(mu_);
    engaged_ = done;
    draining_ = true;
    rooting_ = true;
    found = take_discoveries_locked();
  }
  send_discoveries(found, false);
  drain();
  auto self = shared_from_this();
  Future<rpc::IValue> last = done;
  if (smart_)
    last = done.then([self](Future<rpc::IValue>& f) { return self->close_wave(f.value()); });
  return last.then([self](Future<rpc::IValue>& f) {
    {
      std::lock_guard lock(self->mu_);
      self->rooting_ = false;
    }
    self->check(f.value());
  });
}

Future<rpc::IValue> Pass::close_wave(const rpc::IValue& answer) {
  std::vector<int> open;
  for (const auto& r : answer.to_list().at(0).to_list())
    if (r.to_list()[4].to_int() > 0) open.push_back(static_cast<int>(r.to_list()[0].to_int()));
  if (open.empty()) return Future<rpc::IValue>::ready(answer);
  Future<rpc::IValue> done;
  Discoveries closing;
  {
    std::lock_guard lock(mu_);
    engaged_ = done;
    for (int w : open) closing[w] = {};
    outstanding_ += static_cast<int>(closing.size());
  }
  // This worker closes through a message to itself too: the held nodes run on the pool.
  send_discoveries(closing, true);
  return done;
}

void Pass::check(const rpc::IValue& answer) const {
  int64_t stalled = 0;
  int64_t open = 0;
  std::string where;
  for (const auto& r : answer.to_list().at(0).to_list()) {
    const auto& fields = r.to_list();
    const int64_t counted = smart_ ? fields[2].to_int() + fields[4].to_int() : fields[2].to_int();
    if (counted == 0) continue;
    stalled += fields[2].to_int();
    open += fields[4].to_int();
    if (where.empty())
      where = fields[3].to_string() + " on worker '" +
              agent_.get_worker_info(static_cast<int>(fields[0].to_int())).name + "'";
  }
  GW_CHECK(smart_ || stalled == 0, StateError, "[dist_autograd.backward] context ", context_id_,
           ": ", stalled, " autograd function(s) (e.g. ", where,
           ") received gradients but still wait for others that will never come: an RPC made "
           "in this context returned tensors the loss does not use. FAST mode requires every "
           "RPC in a context to be part of the backward pass; SMART mode "
           "(backward(context_id, roots, {.mode = Mode::kSmart})) does not.");
  GW_CHECK(!smart_ || open == 0, StateError, "[dist_autograd.backward] context ", context_id_,
           ": SMART mode ended with ", open, " autograd function(s) (e.g. ", where,
           ") that never ran");
}

Future<rpc::IValue> Pass::receive(int from, uint64_t message_id, std::vector<Tensor> grads,
                                  bool returned) {
  // Looked up before taking mu_: the context's lock is never taken inside it.
  std::shared_ptr<SendRpcBackward> send;
  std::exception_ptr lookup_failed;
  try {
    send = context()->send_function(message_id);
  } catch (...) {
    lookup_failed = std::current_exception();
  }
  return arrive(from, returned, [&] {
    if (lookup_failed) std::rethrow_exception(lookup_failed);
    GW_CHECK(received_.insert(message_id).second, StateError, "[dist_autograd] send function ",
             message_id, " of context ", context_id_, " received gradients twice in one pass");
    task_->add_gradients(send, std::move(grads));
  });
}

Future<rpc::IValue> Pass::discover(int from, const std::vector<uint64_t>& message_ids,
                                   bool closed) {
  std::vector<std::shared_ptr<SendRpcBackward>> sends;
  std::exception_ptr lookup_failed;
  try {
    auto ctx = context();
    for (uint64_t id : message_ids) sends.push_back(ctx->send_function(id));
  } catch (...) {
    lookup_failed = std::current_exception();
  }
  return arrive(from, false, [&] {
    if (lookup_failed) std::rethrow_exception(lookup_failed);
    GW_CHECK(smart_, StateError, "[dist_autograd] context ", context_id_, ": backward pass ", id_,
             " runs in FAST mode, yet worker '", agent_.get_worker_info(from).name,
             "' sent it SMART mode's discovery");
    auto& task = static_cast<SmartTask&>(*task_);
    for (const auto& send : sends) task.mark(send);
    if (closed) task.close();
  });
}

std::shared_ptr<DistAutogradContext> Pass::context() const {
  auto ctx = ctx_.lock();
  GW_CHECK(ctx, StateError, "[dist_autograd] context ", context_id_, " was released on worker '",
           agent_.get_worker_info().name, "' during its backward pass");
  return ctx;
}

Future<rpc::IValue> Pass::arrive(int from, bool returned, const std::function<void()>& apply) {
  Future<rpc::IValue> answer;
  std::optional<Finished> failed;
  Discoveries found;
  bool drain_here = false;
  {
    std::lock_guard lock(mu_);
    // A returned message counts as arrived even when it cannot be used: its sender does not
    // wait for this answer, so a failure must end the pass here.
    if (returned) ++returned_received_[from];
    try {
      if (error_) std::rethrow_exception(error_);
      apply();
      found = take_discoveries_locked();
    } catch (...) {
      if (!error_) error_ = std::current_exception();
      if (returned) failed = take_finished_locked();
      answer = Future<rpc::IValue>::failed(error_);
    }
    if (!failed && !answer.done()) {
      if (engaged_ || returned) {
        answer = Future<rpc::IValue>::ready(rpc::IValue());
      } else {
        engaged_ = answer;  // answered when this worker is done (see take_finished_locked)
        engaged_by_ = from;
        returned_sent_ = 0;
      }
      drain_here = !draining_;
      draining_ = true;
    }
  }
  send_discoveries(found, false);
  if (failed) failed->complete();
  if (drain_here) drain();
  return answer;
}

void Pass::drain() {
  Pass* previous = t_pass;
  t_pass = this;
  std::optional<Finished> finished;
  while (true) {
    std::exception_ptr failed;
    try {
      task_->run();
    } catch (...) {
      failed = std::current_exception();
    }
    std::lock_guard lock(mu_);
    if (failed && !error_) error_ = failed;
    if (!error_ && task_->has_ready()) continue;  // gradients arrived while we ran
    draining_ = false;
    finished = take_finished_locked();
    break;
  }
  t_pass = previous;
  if (finished) finished->complete();
}

void Pass::send_gradients(int to, uint64_t context_id, uint64_t message_id,
                          const std::vector<Tensor>& grads) {
  GW_CHECK(context_id == context_id_, StateError, "[dist_autograd] a recv function of context ",
           context_id, " was reached by a backward pass of context ", context_id_);
  bool returned;
  {
    std::lock_guard lock(mu_);
    if (error_) return;
    returned = engaged_ && to == engaged_by_;
    if (returned)
      ++returned_sent_;
    else
      ++outstanding_;
  }
  Future<rpc::IValue> answer = request(
      to,
      rpc::AutogradGradients{context_id, message_id, id_, retain_graph_, grads, returned, smart_});
  if (returned) {
    // The receiver counts a returned message in and reports its own failures; one that could
    // not even leave fails this worker's pass, which answers the receiver with the error.
    if (auto e = answer.done() ? answer.exception() : nullptr) {
      std::lock_guard lock(mu_);
      if (!error_) error_ = e;
    }
    return;
  }
  track(to, std::move(answer));
}

Future<rpc::IValue> Pass::request(int to, rpc::Request r) {
  try {
    return agent_.request(to, std::move(r));
  } catch (...) {
    return Future<rpc::IValue>::failed(std::current_exception());
  }
}

void Pass::track(int to, Future<rpc::IValue> answer) {
  answer.add_done_callback(
      [self = shared_from_this(), to](Future<rpc::IValue>& a) { self->on_answer(to, a); });
}

Pass::Discoveries Pass::take_discoveries_locked() {
  Discoveries found;
  if (!smart_) return found;
  for (const auto& node : static_cast<SmartTask&>(*task_).take_uncertain()) {
    const auto& recv = static_cast<const RecvRpcBackward&>(*node);
    found[recv.from()].push_back(recv.message_id());
  }
  outstanding_ += static_cast<int>(found.size());
  return found;
}

void Pass::send_discoveries(const Discoveries& found, bool closed) {
  for (const auto& [to, ids] : found)
    track(to, request(to, rpc::AutogradDiscover{context_id_, id_, retain_graph_, ids, closed}));
}

void Pass::on_answer(int from, Future<rpc::IValue>& answer) {
  std::optional<Finished> finished;
  {
    std::lock_guard lock(mu_);
    --outstanding_;
    try {
      const rpc::IValue value = answer.value();  // [reports, returned], or none
      if (value.is(rpc::IValue::Kind::kList)) {  // not a non-engaging message's answer
        const auto& fields = value.to_list();
        GW_CHECK(fields.size() == 2, IoError, "[dist_autograd] an answer from worker '",
                 agent_.get_worker_info(from).name, "' has ", fields.size(),
                 " fields instead of 2");
        merge_reports_locked(fields[0]);
        const int64_t returned = fields[1].to_int();
        returned_expected_[from] += returned;
        GW_CHECK(returned == 0 || !lost_.contains(from), IoError,
                 "[dist_autograd.backward] context ", context_id_, ": the connection to worker '",
                 agent_.get_worker_info(from).name, "' was lost before the ", returned,
                 " gradient message(s) it sent arrived");
      }
    } catch (...) {
      if (!error_) error_ = std::current_exception();
    }
    finished = take_finished_locked();
  }
  if (finished) finished->complete();
}

bool Pass::returned_all_locked() const {
  for (const auto& [worker, n] : returned_expected_) {
    auto it = returned_received_.find(worker);
    if ((it == returned_received_.end() ? 0 : it->second) < n) return false;
  }
  return true;
}

void Pass::peer_lost(int worker, const std::string& why) {
  std::optional<Finished> finished;
  {
    std::lock_guard lock(mu_);
    lost_.insert(worker);  // gradients it announces later can no longer come
    if (error_ || returned_all_locked()) return;
    error_ = std::make_exception_ptr(
        IoError(gw::detail::str("[dist_autograd.backward] context ", context_id_,
                                ": the connection to worker '", agent_.get_worker_info(worker).name,
                                "' was lost (", why, ") before the gradients it sent arrived")));
    finished = take_finished_locked();
  }
  if (finished) finished->complete();
}

std::optional<Pass::Finished> Pass::take_finished_locked() {
  if (!engaged_ || draining_) return std::nullopt;
  // A failure is answered at once; otherwise only when nothing here can send gradients again.
  if (!error_ && (outstanding_ > 0 || !returned_all_locked())) return std::nullopt;
  Finished f{std::move(*engaged_), {}, error_};
  engaged_.reset();
  if (!error_) {
    Report& mine = reports_[agent_.get_worker_info().id];
    mine.seq = ++report_seq_;
    mine.example.clear();  // not an earlier wave's
    mine.stalled = static_cast<int64_t>(task_->stalled_nodes(&mine.example));
    mine.open =
        static_cast<int64_t>(task_->open_nodes(mine.example.empty() ? &mine.example : nullptr));
    f.value = rpc::IValue(rpc::IValueList{reports_value_locked(), rpc::IValue(returned_sent_)});
  }
  return f;
}

// [[worker, seq, stalled, example, open], ...]: every worker's latest state seen by this one.
rpc::IValue Pass::reports_value_locked() const {
  rpc::IValueList out;
  for (const auto& [worker, r] : reports_)
    out.push_back(rpc::IValue(rpc::IValueList{
        rpc::IValue(static_cast<int64_t>(worker)), rpc::IValue(static_cast<int64_t>(r.seq)),
        rpc::IValue(r.stalled), rpc::IValue(r.example), rpc::IValue(r.open)}));
  return rpc::IValue(std::move(out));
}

void Pass::merge_reports_locked(const rpc::IValue& v) {
  for (const auto& item : v.to_list()) {
    const auto& f = item.to_list();
    GW_CHECK(f.size() == 5, IoError, "[dist_autograd] a pass report has ", f.size(),
             " fields instead of 5");
    Report& r = reports_[static_cast<int>(f[0].to_int())];
    const auto seq = static_cast<uint64_t>(f[1].to_int());
    if (seq > r.seq) r = Report{seq, f[2].to_int(), f[3].to_string(), f[4].to_int()};
  }
}

}  // namespace gw::dist::autograd

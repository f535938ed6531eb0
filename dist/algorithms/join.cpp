#include "dist/algorithms/join.h"

#include <algorithm>
#include <atomic>
#include <string>

#include "core/error.h"
#include "core/ops.h"

namespace gw::dist {

Joinable::~Joinable() {
  if (join_ != nullptr) std::erase(join_->joinables_, this);
}

std::optional<JoinIteration> Joinable::notify_join_context() {
  return join_ == nullptr ? std::nullopt : join_->notify(*this);
}

const JoinOptions* Joinable::join_options() const {
  return join_ == nullptr ? nullptr : &join_->options_;
}

uint64_t Joinable::join_id() const { return join_ == nullptr ? 0 : join_->id_; }

namespace {
std::atomic<uint64_t> next_join_id{1};
}

Join::Join(std::vector<Joinable*> joinables, JoinOptions options)
    : joinables_(std::move(joinables)), options_(options), id_(next_join_id++) {
  GW_CHECK(!joinables_.empty(), InvalidArgumentError, "[Join] no joinable given");
  for (size_t i = 0; i < joinables_.size(); ++i) {
    Joinable* j = joinables_[i];
    GW_CHECK(j != nullptr, InvalidArgumentError, "[Join] joinable ", i, " is null");
    GW_CHECK(j->join_ == nullptr || !options_.enable, InvalidArgumentError, "[Join] joinable ", i,
             " is in another Join already");
    GW_CHECK(std::find(joinables_.begin(), joinables_.begin() + static_cast<ptrdiff_t>(i), j) ==
                 joinables_.begin() + static_cast<ptrdiff_t>(i),
             InvalidArgumentError, "[Join] joinable ", i, " is given twice");
    auto group = j->join_process_group();
    GW_CHECK(group, InvalidArgumentError, "[Join] joinable ", i, " has no process group");
    if (i == 0) group_ = group;
    GW_CHECK(group == group_, InvalidArgumentError, "[Join] joinable ", i,
             " trains on another process group than joinable 0");
  }
  if (!options_.enable) {
    joinables_.clear();  // a disabled Join holds nothing
    return;
  }
  // Made here, as PyTorch does, so that a joinable that cannot be joined refuses on every rank
  // before any collective.
  for (Joinable* j : joinables_) hooks_.push_back(j->join_hook(options_));
  for (Joinable* j : joinables_) j->join_ = this;
}

Join::~Join() { detach(); }

void Join::detach() {
  // Only its own: a joinable destroyed while attached took itself off the list.
  for (Joinable* j : joinables_)
    if (j->join_ == this) j->join_ = nullptr;
  joinables_.clear();
}

std::optional<JoinIteration> Join::notify(const Joinable& from) {
  GW_CHECK(!joined_, StateError, "[Join] an iteration started on a rank that has joined");
  if (&from == joinables_.front()) {
    last_ = announce(true);
  } else {
    GW_CHECK(!last_.training.empty(), StateError,
             "[Join] a joinable other than the first started an iteration before the first "
             "announced one: each iteration starts with the first joinable given to the Join");
  }
  return last_;
}

JoinIteration Join::announce(bool training) {
  const int world = group_->size(), rank = group_->rank();
  // Slot r: rank r trains this iteration; slot `world`: a joined rank asks everyone to stop.
  std::vector<int64_t> slots(static_cast<size_t>(world) + 1, 0);
  if (training)
    slots[static_cast<size_t>(rank)] = 1;
  else if (options_.throw_on_early_termination)
    slots.back() = 1;
  Tensor t = from_vector<int64_t>(slots).to(group_->device());
  group_->allreduce(t, {.op = ReduceOp::SUM})->wait();
  slots = t.to(kCPU).to_vector<int64_t>();
  JoinIteration it;
  std::string joined;
  for (int r = 0; r < world; ++r) {
    if (slots[static_cast<size_t>(r)] > 0)
      it.training.push_back(r);
    else
      joined += (joined.empty() ? "" : ", ") + std::to_string(r);
  }
  GW_CHECK(!(training && slots.back() > 0), StateError, "[Join] rank(s) ", joined,
           " exhausted their inputs and throw_on_early_termination is set: every rank stops "
           "(rank ",
           rank, " here)");
  return it;
}

void Join::join() {
  GW_CHECK(!joined_, StateError, "[Join] join() was called twice");
  joined_ = true;
  if (!options_.enable) return;
  bool is_last_joiner = true;
  // Once per iteration of the ranks still training: bounded by their loops, and each collective
  // by the group's timeout.
  for (;;) {
    const JoinIteration it = announce(false);
    if (it.training.empty()) break;
    GW_CHECK(!options_.throw_on_early_termination, StateError, "[Join] rank ", group_->rank(),
             " exhausted its inputs and throw_on_early_termination is set: every rank stops");
    for (auto& h : hooks_) h->main_hook(it);
    is_last_joiner = false;
  }
  for (auto& h : hooks_) h->post_hook(is_last_joiner);
  detach();
}

}  // namespace gw::dist

#include "dist/optim/zero_redundancy_optimizer.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "autograd/autograd.h"
#include "core/error.h"
#include "dist/process_group/c10d.h"

namespace gw::dist {

namespace {

constexpr const char* kOp = "[ZeroRedundancyOptimizer]";

std::vector<uint8_t> to_bytes(const std::string& s) { return {s.begin(), s.end()}; }

// "(16,8) float32" per parameter, one per line: what every rank must agree on.
std::string describe(const std::vector<Tensor>& params) {
  std::string out;
  for (const Tensor& p : params)
    out += shape_str(p.sizes()) + " " + std::string(dtype_name(p.dtype())) + "\n";
  return out;
}

std::vector<std::string> lines(const std::vector<uint8_t>& bytes) {
  std::vector<std::string> out;
  std::string line;
  for (uint8_t b : bytes) {
    if (b == '\n') {
      out.push_back(std::move(line));
      line.clear();
    } else {
      line += static_cast<char>(b);
    }
  }
  return out;
}

// Every rank's parameters must match rank 0's: checked on every rank from the same gathered
// descriptions, so every rank raises alike.
void check_same_parameters(ProcessGroup& group, const std::vector<Tensor>& params) {
  const auto all = all_gather_bytes(group, to_bytes(describe(params)));
  const std::vector<std::string> first = lines(all[0]);
  for (size_t r = 1; r < all.size(); ++r) {
    const std::vector<std::string> theirs = lines(all[r]);
    GW_CHECK(theirs.size() == first.size(), InvalidArgumentError, kOp, " rank 0 has ", first.size(),
             " parameters but rank ", r, " has ", theirs.size());
    for (size_t i = 0; i < first.size(); ++i)
      GW_CHECK(theirs[i] == first[i], InvalidArgumentError, kOp, " parameter ", i, " is ", first[i],
               " on rank 0 but ", theirs[i], " on rank ", r);
  }
}

}  // namespace

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<Tensor> params,
                                                 const optim::OptimizerOptions& options,
                                                 std::shared_ptr<ProcessGroup> group)
    : params_(std::move(params)),
      group_(std::move(group)),
      lr_(std::visit([](const auto& o) { return o.lr; }, options)) {
  GW_CHECK(group_ != nullptr, InvalidArgumentError, kOp, " the process group is null");
  GW_CHECK(!params_.empty(), InvalidArgumentError, kOp, " got an empty parameter list");
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    GW_CHECK(p.defined() && p.is_floating_point() && p.is_leaf(), InvalidArgumentError, kOp,
             " parameter ", i, " must be a floating point leaf tensor");
    GW_CHECK(p.is_contiguous(), InvalidArgumentError, kOp, " parameter ", i,
             " is not contiguous (shape ", shape_str(p.sizes()), ")");
  }
  check_same_parameters(*group_, params_);

  // The elements end to end, cut into `world` ranges of ceil(total / world).
  const int world = group_->size(), me = group_->rank();
  int64_t total = 0;
  for (const Tensor& p : params_) total += p.numel();
  const int64_t range = (total + world - 1) / world;
  int64_t start = 0;  // of the current parameter, in the whole
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t n = params_[i].numel();
    for (int64_t offset = 0; offset < n;) {
      const auto owner = static_cast<int>((start + offset) / range);
      const int64_t length = std::min(n - offset, (owner + 1) * range - (start + offset));
      pieces_.push_back({i, offset, length, owner});
      views_.push_back(params_[i].detach().reshape({-1}).narrow(0, offset, length));
      if (owner == me) mine_.push_back(pieces_.size() - 1);
      offset += length;
    }
    start += n;
  }
  if (!mine_.empty()) {
    std::vector<Tensor> local;
    for (size_t k : mine_) local.push_back(views_[k]);
    local_ = optim::make_optimizer(std::move(local), options);
  }
}

void ZeroRedundancyOptimizer::step() {
  consolidated_.reset();
  if (local_) {
    optim::GradMap grads;
    for (size_t k : mine_) {
      const Piece& piece = pieces_[k];
      const Tensor g = params_[piece.param].grad();
      if (g.defined())
        grads.emplace(views_[k], g.reshape({-1}).narrow(0, piece.offset, piece.length));
    }
    local_->step(grads);
  }
  // Every range from its owner, straight into the parameters' storage.
  std::vector<WorkPtr> works;
  for (size_t k = 0; k < pieces_.size(); ++k)
    works.push_back(group_->broadcast(views_[k], {.root = pieces_[k].owner}));
  for (const WorkPtr& w : works) w->wait();
}

void ZeroRedundancyOptimizer::zero_grad() {
  for (Tensor& p : params_) p.set_grad(Tensor());
}

void ZeroRedundancyOptimizer::set_lr(double lr) {
  GW_CHECK(lr >= 0, InvalidArgumentError, kOp,
           " set_lr: the learning rate must not be negative, got ", lr);
  if (local_) local_->set_lr(lr);
  lr_ = lr;
  consolidated_.reset();
}

int64_t ZeroRedundancyOptimizer::state_bytes() const {
  int64_t bytes = 0;
  if (local_)
    for (const auto& [key, t] : local_->state_dict())
      if (key != "lr") bytes += static_cast<int64_t>(t.nbytes());
  return bytes;
}

void ZeroRedundancyOptimizer::consolidate_state_dict(int to) {
  GW_CHECK(to >= 0 && to < group_->size(), InvalidArgumentError, kOp,
           " consolidate_state_dict: rank ", to, " is not in a group of ", group_->size());
  consolidated_.reset();
  const int me = group_->rank();
  NamedTensors whole;
  if (me == to) whole.emplace("lr", scalar_tensor(lr_, kFloat64));
  // Each rank's state in turn, from that rank (as PyTorch does; the others drop it).
  for (int r = 0; r < group_->size(); ++r) {
    std::vector<uint8_t> bytes;
    if (r == me && local_) bytes = to_safetensors(local_->state_dict());
    bytes = broadcast_bytes(*group_, bytes, r);
    if (me != to || bytes.empty()) continue;
    // Its pieces in the order it owns them: local index j is its j-th piece.
    std::vector<size_t> theirs;
    for (size_t k = 0; k < pieces_.size(); ++k)
      if (pieces_[k].owner == r) theirs.push_back(k);
    for (const auto& [key, t] : from_safetensors(bytes)) {
      size_t j = 0;
      std::string name;
      if (!optim::parse_state_key(key, j, name)) continue;  // "lr": this rank's
      const Piece& piece = pieces_.at(theirs.at(j));
      const Tensor& p = params_[piece.param];
      const std::string global = "state." + std::to_string(piece.param) + "." + name;
      if (name == "step") {  // a count: the same in every piece of a parameter
        whole.emplace(global, t);
        continue;
      }
      auto [it, fresh] = whole.try_emplace(global);
      if (fresh) it->second = zeros(p.sizes(), TensorOptions(t.dtype()).with_device(p.device()));
      it->second.reshape({-1}).narrow(0, piece.offset, piece.length).copy_(t);
    }
  }
  if (me == to) consolidated_ = std::move(whole);
}

NamedTensors ZeroRedundancyOptimizer::state_dict() const {
  GW_CHECK(consolidated_.has_value(), StateError, kOp,
           " state_dict: no consolidated state on rank ", group_->rank(),
           "; every rank calls consolidate_state_dict(to) after the last step, and rank `to` "
           "then holds it");
  return *consolidated_;
}

void ZeroRedundancyOptimizer::load_state_dict(const NamedTensors& state) {
  const std::string op = std::string(kOp) + " load_state_dict: ";
  auto lr = state.find("lr");
  GW_CHECK(lr != state.end() && lr->second.defined() && lr->second.numel() == 1,
           InvalidArgumentError, op, "missing key \"lr\" (one element)");
  // Each of this rank's pieces takes its range of every entry of its parameter.
  std::vector<std::vector<std::pair<std::string, Tensor>>> by_param(params_.size());
  for (const auto& [key, t] : state) {
    if (key == "lr") continue;
    size_t i = 0;
    std::string name;
    GW_CHECK(optim::parse_state_key(key, i, name), InvalidArgumentError, op, "unexpected key \"",
             key, "\" (keys are \"lr\" and \"state.<index>.<name>\")");
    GW_CHECK(i < params_.size(), IndexError, op, "key \"", key, "\" names parameter ", i,
             " but there are ", params_.size(), " parameters");
    const bool count = name == "step";
    GW_CHECK(
        t.defined() && (count ? t.numel() == 1 : t.sizes() == params_[i].sizes()), ShapeError, op,
        "key \"", key, "\" has shape ", t.defined() ? shape_str(t.sizes()) : "(none)", " but ",
        count ? std::string("a step count has one element")
              : "parameter " + std::to_string(i) + " has shape " + shape_str(params_[i].sizes()));
    by_param[i].emplace_back(name, t);
  }
  NamedTensors local{{"lr", lr->second}};
  for (size_t j = 0; j < mine_.size(); ++j) {
    const Piece& piece = pieces_[mine_[j]];
    for (const auto& [name, t] : by_param[piece.param]) {
      local.emplace("state." + std::to_string(j) + "." + name,
                    name == "step" ? t : t.reshape({-1}).narrow(0, piece.offset, piece.length));
    }
  }
  if (local_) local_->load_state_dict(local);  // checks the names; copies
  set_lr(lr->second.item<double>());
  consolidated_.reset();
}

checkpoint::ShardedState ZeroRedundancyOptimizer::sharded_state_dict(
    const std::string& prefix) const {
  checkpoint::ShardedState out;
  out.emplace(prefix + "lr", checkpoint::Shard{scalar_tensor(lr_, kFloat64), {}, 0});
  if (!local_) return out;
  for (const auto& [key, t] : local_->state_dict()) {
    size_t j = 0;
    std::string name;
    if (!optim::parse_state_key(key, j, name)) continue;  // "lr", above
    // A rank holds one range of a parameter at most: its pieces are consecutive elements.
    const Piece& piece = pieces_[mine_.at(j)];
    const std::string global = prefix + "state." + std::to_string(piece.param) + "." + name;
    if (name == "step")  // a count: the same in every piece of the parameter, on every rank
      out.emplace(global, checkpoint::Shard{t, t.sizes(), 0});
    else
      out.emplace(global, checkpoint::Shard{t, params_[piece.param].sizes(), piece.offset});
  }
  return out;
}

void ZeroRedundancyOptimizer::load_state_dict(const checkpoint::Reader& ckpt,
                                              const std::string& prefix) {
  // First every rank reads its ranges and checks them as its optimizer would load them (all
  // I/O, shapes, step counts); then, once all have, each takes them, which cannot fail.
  NamedTensors local;
  std::optional<optim::Optimizer::PreparedState> prepared;
  double lr = 0;
  checkpoint::on_every_rank(*group_, [&] {
    const std::string op = std::string(kOp) + " load_state_dict: ";
    GW_CHECK(ckpt.contains(prefix + "lr"), InvalidArgumentError, op, "the checkpoint in '",
             ckpt.dir(), "' has no \"", prefix, "lr\"");
    local.emplace("lr", ckpt.read(prefix + "lr"));
    for (size_t j = 0; j < mine_.size(); ++j) {
      const Piece& piece = pieces_[mine_[j]];
      const Tensor& p = params_[piece.param];
      const std::string head = prefix + "state." + std::to_string(piece.param) + ".";
      for (auto it = ckpt.tensors().lower_bound(head);
           it != ckpt.tensors().end() && it->first.starts_with(head); ++it) {
        const std::string name = it->first.substr(head.size());
        const std::string key = "state." + std::to_string(j) + "." + name;
        if (name == "step") {
          local.emplace(key, ckpt.read(it->first));
          continue;
        }
        GW_CHECK(it->second.shape == p.sizes(), ShapeError, op, "\"", it->first, "\" is ",
                 shape_str(it->second.shape), " in the checkpoint but parameter ", piece.param,
                 " is ", shape_str(p.sizes()));
        Tensor range =
            empty({piece.length}, TensorOptions(it->second.dtype).with_device(p.device()));
        ckpt.read(it->first, range, piece.offset);  // this rank's elements only
        local.emplace(key, std::move(range));
      }
    }
    const Tensor& saved_lr = local.at("lr");
    GW_CHECK(saved_lr.numel() == 1, ShapeError, op, "\"", prefix, "lr\" holds ", saved_lr.numel(),
             " elements, not one");
    lr = saved_lr.item<double>();
    GW_CHECK(lr >= 0 && std::isfinite(lr), InvalidArgumentError, op, "\"", prefix, "lr\" holds ",
             lr, " (set_lr takes a finite lr >= 0)");
    if (local_) prepared = local_->prepare_state_dict(local);  // names, shapes, step counts
  });
  if (prepared) local_->take_state_dict(std::move(*prepared));
  set_lr(lr);
}

}  // namespace gw::dist

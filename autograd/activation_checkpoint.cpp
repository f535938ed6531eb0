#include "autograd/activation_checkpoint.h"

#include "autograd/autograd.h"

namespace gw::autograd {

namespace {

// The generators a segment draws from, each with the state it was in when the segment first
// ran (saved before it runs).
class RandomStates {
 public:
  explicit RandomStates(const CheckpointOptions& options) {
    if (!options.preserve_rng_state) return;
    keep(&default_generator());
    for (Generator* g : options.generators) {
      GW_CHECK(g != nullptr, InvalidArgumentError, "[checkpoint] a generator to keep is null");
      keep(g);
    }
  }
  // Sets the saved states while alive; puts back what they were when it goes.
  class Replay {
   public:
    explicit Replay(const RandomStates& saved) {
      for (const auto& [g, state] : saved.states_) {
        now_.emplace_back(g, g->get_state());
        g->set_state(state);
      }
    }
    ~Replay() {
      for (const auto& [g, state] : now_) g->set_state(state);
    }
    Replay(const Replay&) = delete;
    Replay& operator=(const Replay&) = delete;

   private:
    std::vector<std::pair<Generator*, Generator::State>> now_;
  };

 private:
  void keep(Generator* g) {
    for (const auto& kept : states_)
      if (kept.first == g) return;
    states_.emplace_back(g, g->get_state());
  }
  std::vector<std::pair<Generator*, Generator::State>> states_;
};

class CheckpointBackward final : public Node {
 public:
  CheckpointBackward(CheckpointFunction fn, const std::vector<Tensor>& inputs, RandomStates random)
      : fn_(std::move(fn)), autocast_(autocast_state()), random_(std::move(random)) {
    for (const Tensor& t : inputs) {
      inputs_.emplace_back(t);
      requires_grad_.push_back(t.requires_grad());
    }
  }

  TensorList apply(TensorList&& grads) override {
    GW_CHECK(current_leaf_sink() == nullptr, StateError,
             "[checkpoint] a distributed autograd pass reached a checkpointed segment: its "
             "reentrant pass would accumulate into .grad, not into the context (not supported)");
    GW_CHECK(!released(), StateError,
             "[checkpoint] backward through a checkpointed segment a second time: its inputs "
             "were freed (pass retain_graph = true to the first backward)");
    // The inputs as leaves of a graph of their own, so that the pass below stops at them.
    std::vector<Tensor> leaves;
    for (size_t i = 0; i < inputs_.size(); ++i) {
      Tensor leaf = inputs_[i].unpack(*this).detach();
      if (requires_grad_[i]) leaf.requires_grad_();
      leaves.push_back(std::move(leaf));
    }
    std::vector<Tensor> outputs;
    {
      EnableGradGuard recording;
      AutocastGuard as_forward(autocast_);  // the dtypes the first run computed in
      RandomStates::Replay draws(random_);  // and the numbers it drew
      outputs = fn_(leaves);
    }
    GW_CHECK(outputs.size() == grads.size(), StateError, "[checkpoint] the recomputation returned ",
             outputs.size(), " outputs where the first run returned ", grads.size());
    std::vector<Tensor> roots, root_grads;
    for (size_t i = 0; i < outputs.size(); ++i)
      if (outputs[i].requires_grad() && grads[i].defined()) {
        roots.push_back(outputs[i]);
        root_grads.push_back(grads[i]);
      }
    if (!roots.empty()) backward(roots, root_grads);
    TensorList out;
    for (size_t i = 0; i < leaves.size(); ++i)
      out.push_back(requires_grad_[i] ? leaves[i].grad() : Tensor());
    return out;
  }

  std::string name() const override { return "CheckpointFunctionBackward"; }
  bool needs_weight_gradients() const override { return true; }
  void release_variables() override {
    for (SavedTensor& s : inputs_) s.reset();
    mark_released();
  }

 private:
  CheckpointFunction fn_;
  std::vector<SavedTensor> inputs_;
  std::vector<bool> requires_grad_;
  AutocastState autocast_;
  RandomStates random_;
};

}  // namespace

std::vector<Tensor> checkpoint(CheckpointFunction fn, const std::vector<Tensor>& inputs,
                               const CheckpointOptions& options) {
  GW_CHECK(fn, InvalidArgumentError, "[checkpoint] the function is empty");
  for (size_t i = 0; i < inputs.size(); ++i)
    GW_CHECK(inputs[i].defined(), InvalidArgumentError, "[checkpoint] input ", i, " is undefined");
  RandomStates random(options);
  std::vector<Tensor> outputs;
  {
    NoGradGuard no_grad;
    outputs = fn(inputs);
  }
  bool any = false;
  for (const Tensor& t : inputs) any = any || t.requires_grad();
  if (!any || !is_grad_enabled()) return outputs;
  auto node = std::make_shared<CheckpointBackward>(std::move(fn), inputs, std::move(random));
  for (const Tensor& t : inputs) node->next_edges.push_back(gradient_edge(t));
  node->num_inputs = static_cast<uint32_t>(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    GW_CHECK(outputs[i].defined() && outputs[i].is_floating_point(), InvalidArgumentError,
             "[checkpoint] output ", i, " must be a defined floating point tensor");
    outputs[i] = outputs[i].detach();  // an input returned as is must keep its own history
    set_history(outputs[i], node, static_cast<uint32_t>(i));
  }
  return outputs;
}

Tensor checkpoint(std::function<Tensor(const Tensor&)> fn, const Tensor& input,
                  const CheckpointOptions& options) {
  GW_CHECK(fn, InvalidArgumentError, "[checkpoint] the function is empty");
  return checkpoint([fn = std::move(fn)](
                        const std::vector<Tensor>& in) { return std::vector<Tensor>{fn(in[0])}; },
                    std::vector<Tensor>{input}, options)[0];
}

}  // namespace gw::autograd

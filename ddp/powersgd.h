// PowerSGD: DDP's gradients compressed to low rank on the wire, as a communication hook
// (Vogels, Karimireddy and Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for
// Distributed Optimization", NeurIPS 2019; PyTorch's ddp_comm_hooks.powerSGD_hook).
//
// Mental model: a gradient of shape (n, ...) is a matrix M of n rows and m = numel / n columns,
// sent as P Q^T of rank r — one step of power iteration per training step, starting from the
// last step's Q (warm start). Each rank computes P = M Q from its own M; the ranks sum P (n r
// numbers instead of n m) and orthonormalize its columns; each computes Q = M^T P; the ranks
// average Q (m r numbers); every rank then takes P Q^T, the same everywhere. What compression
// loses, each rank adds to its next gradient (error feedback), so nothing is lost for good, only
// late. Biases (1-D) and matrices too small to shrink by min_compression_rate travel as they
// are, averaged in one allreduce per bucket.
//
//   auto state = std::make_shared<gw::ddp::PowerSGDState>(
//       gw::ddp::PowerSGDOptions{.matrix_approximation_rank = 2, .start_powerSGD_iter = 10});
//   model.register_comm_hook(gw::ddp::hooks::powersgd(state));
//   ...
//   state->compression_stats().rate();  // e.g. 80: numbers before / numbers sent
//
// The first start_powerSGD_iter backward passes average plainly (a model's first gradients are
// large and noisy; compressing them costs accuracy). The batched variant sends each bucket as
// one square matrix (its gradients back to back, padded with zeros): fewer and larger
// products, each bucket one P and one Q.
//
// A bucket costs three collectives, in this order: the uncompressed tensors, P, then Q once P
// is summed. Q's starts on the group's thread when P completes; so that every rank issues the
// same collectives in the same order, a bucket's first waits until the previous bucket's Q was
// issued. Backward goes on meanwhile, as with any hook.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "core/future.h"
#include "ddp/reducer.h"

namespace gw::ddp {

struct PowerSGDOptions {
  int64_t matrix_approximation_rank = 1;  // r: at most min(n, m) per matrix
  // Plain averaging for the first backward passes. At least 2 with error feedback or warm
  // start: DDP rebuilds its buckets after the first pass, which renumbers them.
  int64_t start_powerSGD_iter = 1000;
  double min_compression_rate = 2;  // a matrix is compressed when (n + m) r * this < n m
  bool use_error_feedback = true;
  bool warm_start = true;
  double orthogonalization_epsilon = 0;  // added to each column's norm (0: none)
  uint64_t random_seed = 0;              // of the initial Qs: the same on every rank
};

// One model's PowerSGD state (per bucket: error, P and Q memories), shared by the hook and the
// user; the hook keeps it alive. Not shareable between two models.
class PowerSGDState {
 public:
  // Throws InvalidArgumentError naming the option and its value.
  explicit PowerSGDState(PowerSGDOptions options = {});
  const PowerSGDOptions& options() const { return options_; }
  // Backward passes whose last bucket the hook has seen.
  int64_t iteration() const;

  // Numbers the compressed passes reduced: the gradients' (before) and what went on the wire
  // instead (after: P, Q and the uncompressed tensors). PyTorch's compression_stats().
  struct Stats {
    int64_t numel_before = 0, numel_after = 0;
    double rate() const;  // before / after (0 before the first compressed pass)
  };
  Stats compression_stats() const;

 private:
  friend class PowerSGDHook;  // powersgd.cpp

  PowerSGDOptions options_;
  mutable std::mutex mu_;
  int64_t iteration_ = 0;
  Stats stats_;
  uint64_t draws_ = 0;              // initialisations of Q so far: each draws a new seed
  std::map<size_t, Tensor> error_;  // by bucket index
  std::map<size_t, Tensor> p_, q_;  // flat memories of a bucket's Ps and Qs
  Future<void> issued_ = Future<void>::ready();  // the last bucket's Q collective was issued
};

namespace hooks {
CommHook powersgd(std::shared_ptr<PowerSGDState> state);
CommHook batched_powersgd(std::shared_ptr<PowerSGDState> state);
}  // namespace hooks

}  // namespace gw::ddp

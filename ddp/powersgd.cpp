#include "ddp/powersgd.h"

#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "core/error.h"
#include "core/ops.h"
#include "core/random.h"

namespace gw::ddp {

namespace {

// Gram-Schmidt, each column orthogonalized twice against the ones before ("twice is enough"):
// the columns of the contiguous rows x cols matrix `m` (cols <= rows) made orthonormal in place.
// Gradients are often rank-deficient (a softmax layer's rows sum to zero; batched PowerSGD pads
// with rows of zeros), so a column can be all but in the span of the ones before; what is left
// of it is rounding noise, which normalized would be a skewed basis vector and put P Q^T off
// (PyTorch's single pass keeps such columns, and zero ones). Such a column — its remainder
// below 1024 epsilons of its length — is replaced by the unit vector the columns before leave
// most of (the same on every rank), so the columns stay a full orthonormal set: P P^T still
// projects onto every direction M has, and a warm-started Q keeps its rank for when the
// gradient regains it.
template <typename T>
void orthonormalize(T* m, int64_t rows, int64_t cols, double epsilon) {
  auto at = [&](int64_t row, int64_t col) -> T& { return m[row * cols + col]; };
  auto length = [&](int64_t col) {
    double sum = 0;
    for (int64_t k = 0; k < rows; ++k) sum += static_cast<double>(at(k, col)) * at(k, col);
    return std::sqrt(sum);
  };
  // The squared lengths of the finished columns: 1, or a little less with epsilon.
  std::vector<double> squared(static_cast<size_t>(cols), 1);
  auto orthogonalize = [&](int64_t i) {  // against columns [0, i), twice
    for (int pass = 0; pass < 2; ++pass)
      for (int64_t j = 0; j < i; ++j) {
        double dot = 0;
        for (int64_t k = 0; k < rows; ++k) dot += static_cast<double>(at(k, i)) * at(k, j);
        const double along = dot / squared[static_cast<size_t>(j)];
        for (int64_t k = 0; k < rows; ++k) at(k, i) = static_cast<T>(at(k, i) - along * at(k, j));
      }
    return length(i);
  };
  auto unit = [&](int64_t i, int64_t e) {
    for (int64_t k = 0; k < rows; ++k) at(k, i) = static_cast<T>(k == e ? 1 : 0);
  };
  constexpr double kNoise = 1024 * std::numeric_limits<T>::epsilon();
  for (int64_t i = 0; i < cols; ++i) {
    const double before = length(i);
    double left = orthogonalize(i);
    if (left <= kNoise * before || left == 0) {
      int64_t best = 0;
      double best_left = -1;
      for (int64_t e = 0; e < rows && best_left < 0.5; ++e) {  // usually the first will do
        unit(i, e);
        if (const double l = orthogonalize(i); l > best_left) best = e, best_left = l;
      }
      unit(i, best);
      left = orthogonalize(i);
    }
    const double scale = 1 / (left + epsilon);
    for (int64_t k = 0; k < rows; ++k) at(k, i) = static_cast<T>(at(k, i) * scale);
    squared[static_cast<size_t>(i)] = left * scale * left * scale;
  }
}

void orthonormalize(const Tensor& m, double epsilon) {
  if (m.dtype() == kFloat64)
    orthonormalize(m.data_ptr<double>(), m.size(0), m.size(1), epsilon);
  else
    orthonormalize(m.data_ptr<float>(), m.size(0), m.size(1), epsilon);
}

// Views of `flat` shaped like `shapes`, back to back.
std::vector<Tensor> carve(const Tensor& flat, const std::vector<Shape>& shapes) {
  std::vector<Tensor> out;
  int64_t offset = 0;
  for (const Shape& s : shapes) {
    const int64_t n = s[0] * s[1];
    out.push_back(flat.narrow(0, offset, n).view(s));
    offset += n;
  }
  return out;
}

}  // namespace

// One bucket's compression in flight: what the hook prepared on the backward thread and its
// continuations finish on the group's (Q's and the decompression's products run there, ahead
// of the group's next collective).
struct BucketCompression {
  Tensor buffer;  // the bucket's gradients: the result is written back here
  Tensor input;   // what the matrices view: `buffer`, or its padded copy
  // Error feedback: the state's error memory of this bucket. It holds `input` before
  // decompression, from which decompress() subtracts what was delivered.
  Tensor error;
  std::vector<Tensor> matrices;      // views of `input`
  std::vector<Tensor> ps, qs;        // views of p and q
  Tensor p, q;                       // reduced as one tensor each
  std::vector<Tensor> uncompressed;  // views of `input`
  Tensor uncompressed_flat;
  std::optional<Future<void>> uncompressed_reduced;
  int world = 1;
  double epsilon = 0;

  // Runs on the group's thread once P is summed: Qs from the orthonormal Ps.
  void compute_qs() {
    for (size_t i = 0; i < ps.size(); ++i) {
      orthonormalize(ps[i], epsilon);
      qs[i].copy_(mm(matrices[i].t(), ps[i]));
    }
  }

  // Once everything is reduced: each matrix becomes P Q^T, the uncompressed tensors their
  // average, and what this rank's gradients lost is remembered.
  Tensor decompress() {
    if (uncompressed_reduced) {
      uncompressed_reduced->wait();
      uncompressed_flat.div_(static_cast<double>(world));
      int64_t offset = 0;
      for (Tensor& t : uncompressed) {
        t.copy_(uncompressed_flat.narrow(0, offset, t.numel()).view(t.sizes()));
        offset += t.numel();
      }
    }
    if (q.defined()) q.div_(static_cast<double>(world));
    for (size_t i = 0; i < matrices.size(); ++i) matrices[i].copy_(mm(ps[i], qs[i].t()));
    if (error.defined()) error.sub_(input);
    if (!same_storage(input, buffer)) buffer.copy_(input.narrow(0, 0, buffer.numel()));
    return buffer;
  }

  static bool same_storage(const Tensor& a, const Tensor& b) { return a.storage() == b.storage(); }
};

class PowerSGDHook {
 public:
  static Future<Tensor> run(const std::shared_ptr<PowerSGDState>& state, dist::ProcessGroup& group,
                            GradBucket& bucket, bool batched) {
    const PowerSGDOptions& o = state->options_;
    const DType dtype = bucket.buffer.dtype();
    GW_CHECK((dtype == kFloat32 || dtype == kFloat64) && bucket.buffer.device().is_cpu(),
             InvalidArgumentError, "[powerSGD] bucket ", bucket.index, " holds ", dtype_name(dtype),
             " gradients on ", bucket.buffer.device(),
             "; PowerSGD compresses float32 and float64 on the CPU");
    std::unique_lock lock(state->mu_);
    const bool compress = state->iteration_ >= o.start_powerSGD_iter;
    if (bucket.is_last) ++state->iteration_;
    if (!compress) {
      lock.unlock();
      return hooks::allreduce()(group, bucket);
    }
    auto c = std::make_shared<BucketCompression>();
    c->buffer = bucket.buffer;
    c->world = group.size();
    c->epsilon = o.orthogonalization_epsilon;

    // The matrices (n, m) and the rank of each.
    std::vector<Shape> p_shapes, q_shapes;
    auto add_matrix = [&](const Tensor& m) {
      const int64_t r = std::min({m.size(0), m.size(1), o.matrix_approximation_rank});
      c->matrices.push_back(m);
      p_shapes.push_back({m.size(0), r});
      q_shapes.push_back({m.size(1), r});
    };
    if (batched) {
      const int64_t total = bucket.buffer.numel();
      const auto side = static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(total))));
      c->input = zeros({side * side}, TensorOptions(dtype).with_device(bucket.buffer.device()));
      c->input.narrow(0, 0, total).copy_(bucket.buffer);
      add_matrix(c->input.view({side, side}));
    } else {
      c->input = bucket.buffer;
      for (Tensor& g : bucket.gradients()) {
        if (g.dim() > 1 && g.numel() > 0) {
          const int64_t n = g.size(0), m = g.numel() / n;
          const int64_t r = std::min({n, m, o.matrix_approximation_rank});
          if (static_cast<double>((n + m) * r) * o.min_compression_rate <
              static_cast<double>(n * m)) {
            add_matrix(g.view({n, m}));
            continue;
          }
        }
        c->uncompressed.push_back(g);
      }
    }

    // A joined rank (Join) feeds its memory in with its zeros, as PyTorch's joined ranks run
    // the hook like any other: at full rank every rank's error is its input minus the average,
    // and these cancel only when every rank feeds its own back.
    if (o.use_error_feedback) {
      Tensor& error = state->error_[bucket.index];
      if (error.defined() && error.numel() == c->input.numel())
        c->input.add_(error);
      else
        error = zeros_like(c->input);
      c->error = error;
      error.copy_(c->input);
    }

    // P and Q memories: kept between passes for the warm start.
    int64_t p_numel = 0, q_numel = 0;
    for (size_t i = 0; i < p_shapes.size(); ++i) {
      p_numel += p_shapes[i][0] * p_shapes[i][1];
      q_numel += q_shapes[i][0] * q_shapes[i][1];
    }
    if (!c->matrices.empty()) {
      const TensorOptions like = TensorOptions(dtype).with_device(bucket.buffer.device());
      Tensor& p = state->p_[bucket.index];
      Tensor& q = state->q_[bucket.index];
      if (!p.defined() || p.numel() != p_numel) p = empty({p_numel}, like);
      const bool fresh = !o.warm_start || !q.defined() || q.numel() != q_numel;
      if (!q.defined() || q.numel() != q_numel) q = empty({q_numel}, like);
      c->p = p;
      c->q = q;
      c->ps = carve(p, p_shapes);
      c->qs = carve(q, q_shapes);
      if (fresh) {  // every rank draws the same Qs: same seed, same count of draws
        Generator gen(o.random_seed + 0x9e3779b97f4a7c15ULL * ++state->draws_);
        for (Tensor& qi : c->qs) {
          qi.copy_(randn(qi.sizes(), gen));
          orthonormalize(qi, o.orthogonalization_epsilon);
        }
      }
    }
    int64_t uncompressed_numel = 0;
    for (const Tensor& t : c->uncompressed) uncompressed_numel += t.numel();
    state->stats_.numel_before += bucket.buffer.numel();
    state->stats_.numel_after += uncompressed_numel + p_numel + q_numel;

    // This rank's Ps, while backward goes on.
    for (size_t i = 0; i < c->matrices.size(); ++i) c->ps[i].copy_(mm(c->matrices[i], c->qs[i]));
    if (uncompressed_numel > 0) {
      c->uncompressed_flat =
          empty({uncompressed_numel}, TensorOptions(dtype).with_device(bucket.buffer.device()));
      int64_t offset = 0;
      for (const Tensor& t : c->uncompressed) {
        c->uncompressed_flat.narrow(0, offset, t.numel()).copy_(t.reshape({t.numel()}));
        offset += t.numel();
      }
    }

    // The collectives, in an order every rank shares (see the header).
    Future<void> previous = state->issued_;
    Future<void> issued;
    state->issued_ = issued;
    lock.unlock();
    dist::ProcessGroup* g = &group;
    return previous
        .then([c, g](Future<void>&) {  // only its order matters: a failure shows in our own
          if (c->uncompressed_flat.defined())
            c->uncompressed_reduced =
                g->allreduce(c->uncompressed_flat, {.op = dist::ReduceOp::SUM})->future();
          // What the next stage waits for, as a continuation: never by blocking, since this
          // may run on the group's thread, which the waited collective needs.
          if (c->p.defined()) return g->allreduce(c->p, {.op = dist::ReduceOp::SUM})->future();
          return c->uncompressed_reduced ? *c->uncompressed_reduced : Future<void>::ready();
        })
        .then([c, g, issued](Future<void>& p_summed) mutable {
          std::exception_ptr failure;
          Future<void> q_summed = Future<void>::ready();
          try {
            p_summed.wait();
            if (c->q.defined()) {
              c->compute_qs();
              q_summed = g->allreduce(c->q, {.op = dist::ReduceOp::SUM})->future();
            }
          } catch (...) {
            failure = std::current_exception();
          }
          if (failure) {  // the next bucket must not wait for a Q never issued
            issued.set_exception(failure);
            std::rethrow_exception(failure);
          }
          issued.set_result();
          return q_summed;
        })
        .then([c](Future<void>& q_summed) {
          q_summed.wait();
          return c->decompress();
        });
  }
};

PowerSGDState::PowerSGDState(PowerSGDOptions options) : options_(options) {
  GW_CHECK(options_.matrix_approximation_rank >= 1, InvalidArgumentError,
           "[PowerSGDState] matrix_approximation_rank must be at least 1, got ",
           options_.matrix_approximation_rank);
  GW_CHECK(options_.min_compression_rate > 0, InvalidArgumentError,
           "[PowerSGDState] min_compression_rate must be positive, got ",
           options_.min_compression_rate);
  GW_CHECK(options_.orthogonalization_epsilon >= 0, InvalidArgumentError,
           "[PowerSGDState] orthogonalization_epsilon must not be negative, got ",
           options_.orthogonalization_epsilon);
  GW_CHECK(
      options_.start_powerSGD_iter >= 2 || (!options_.use_error_feedback && !options_.warm_start),
      InvalidArgumentError,
      "[PowerSGDState] start_powerSGD_iter must be at least 2 with error feedback or warm "
      "start (DDP renumbers its buckets after the first backward), got ",
      options_.start_powerSGD_iter);
}

int64_t PowerSGDState::iteration() const {
  std::lock_guard lock(mu_);
  return iteration_;
}

PowerSGDState::Stats PowerSGDState::compression_stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

double PowerSGDState::Stats::rate() const {
  return numel_after > 0 ? static_cast<double>(numel_before) / static_cast<double>(numel_after) : 0;
}

namespace hooks {

CommHook powersgd(std::shared_ptr<PowerSGDState> state) {
  GW_CHECK(state != nullptr, InvalidArgumentError, "[powerSGD] the state is null");
  return [state](dist::ProcessGroup& group, GradBucket& bucket) {
    return PowerSGDHook::run(state, group, bucket, /*batched=*/false);
  };
}

CommHook batched_powersgd(std::shared_ptr<PowerSGDState> state) {
  GW_CHECK(state != nullptr, InvalidArgumentError, "[batched_powerSGD] the state is null");
  return [state](dist::ProcessGroup& group, GradBucket& bucket) {
    return PowerSGDHook::run(state, group, bucket, /*batched=*/true);
  };
}

}  // namespace hooks

}  // namespace gw::ddp

// A character-level GPT trained on the King James Bible (Debian's bible-kjv), as nanoGPT trains
// its Shakespeare model:
//
//   build/examples/gpt_train [--steps 2000] [--width 128] [--context 128] ...
//   build/tools/gwrun/gwrun --nproc-per-node 2 build/examples/gpt_train --ddp gloo
//   mpirun -np 2 build/examples/gpt_train --ddp mpi
//   build/tools/gwrun/gwrun --nproc-per-node 4 build/examples/gpt_train --fsdp gloo
//   build/tools/gwrun/gwrun --nproc-per-node 2 build/examples/gpt_train --pp 2 --schedule 1f1b
//   build/tools/gwrun/gwrun --nproc-per-node 4 build/examples/gpt_train --pp 2 --ddp gloo
//   build/tools/gwrun/gwrun --nproc-per-node 8 build/examples/gpt_train --device cuda
//       --fsdp nccl --amp bf16 --cpu-offload on          (one process per GPU)
//
// The model is gw::nn::GPT (4 blocks of 4 heads, width 128, context 128, its head tied to the
// token embedding: 0.8M parameters); AdamW with weight decay on the matrices only, a linear
// warm-up and a cosine decay of the learning rate, gradients clipped to norm 1. Every step takes
// --batch-size windows of the training split per rank, drawn by a DistributedSampler (with --ddp
// each rank takes its own share of the same shuffled order, and DDP averages the gradients);
// rank 0 shows a progress bar (loss, tokens/s over all ranks), the validation loss every
// --eval-every steps (over --eval-batches fixed batches of the validation split, shared among
// the ranks), and at the end a passage the model writes (--sample characters). --fsdp instead
// of --ddp shards the model (fully_shard on each block, then on the root): each rank keeps
// 1/ranks of the parameters, gradients and AdamW's state, and rank 0 reports the largest
// rank's peak memory. Its checkpoints are sharded (gw::dist::checkpoint, in
// --checkpoint-dir/sharded): each rank writes its rows, and a run on another number of ranks
// with the same global batch reads its own rows of them.
//
// --hsdp R with --fsdp splits the ranks into R replicas of world / R ranks each (HSDP, a
// DeviceMesh (replicate, shard)): each replica shards the model over its ranks, the gathers stay
// within it, and the gradients are averaged over the replicas too; e.g. a replica per host, the
// shards within each host.
//
// --grad-accum N runs each step's batch as N micro-batches (gradient accumulation: the same
// step in less activation memory), the ranks' gradients combined once, at the last: DDP's
// no_sync; --fsdp without gradient sync; --fsdp --hsdp R reduce-scattering within each replica
// every micro-batch and summing over the replicas at the last (set_requires_all_reduce).
//
// --device cuda trains on a GPU; with --ddp nccl or --fsdp nccl, one process per GPU (the one
// its LOCAL_RANK names). --cpu-offload on with --fsdp nccl keeps the shards, their gradients and
// AdamW's state in host memory (fully_shard's CPUOffloadPolicy), the GPU holding the blocks
// gathered at the moment and the activations.
//
// --pp N instead cuts the model into a pipeline of N ranks (GPT::stage; its head untied from
// the embedding), each rank training its stages on every batch, cut into --microbatches under
// --schedule (pipeline/schedule.h). Every rank builds the whole model, and before each
// evaluation and the sample the ranks bring each other's stages over. --pp N with --ddp on
// N x R ranks runs R replicas of the pipeline (2D: a DeviceMesh of R x N ranks), each on its own
// share of the batches, the stages' gradients averaged over the replicas; with --fsdp instead,
// each stage is sharded over its replicas.
//
// With --checkpoint-every N, rank 0 saves the model, the optimizer and the step every N steps
// and at the end (one safetensors file, written aside and renamed into place), and a run that
// finds a checkpoint in --checkpoint-dir goes on from it, with the same data order, learning
// rate and dropout masks as if it had not stopped, also on another number of ranks with the same
// global batch (--batch-size x ranks; the masks then differ, as each rank draws for its own
// windows). A
// checkpoint of another run (its width, layers, steps, ...) or a torn or malformed one is refused
// with the reason before anything is loaded. Every rank reads the checkpoint: across hosts,
// --checkpoint-dir must be on a shared file system.
//
// --activation-checkpointing on keeps only each block's input for backward and recomputes the
// rest there (GPTOptions::checkpoint_activations: less memory for about a third more compute,
// the same losses; with --fsdp, each block's recomputation and backward share one gather).
//
// --amp bf16 runs the forward under bfloat16 autocast (products
// and attention in bfloat16, norms and the loss in float32, float32 parameters); --curve PREFIX
// writes the training and validation loss as PREFIX.csv and PREFIX.svg; --trace FILE writes a
// timeline; --target LOSS makes the exit status say whether the final validation loss reached it.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "core/checkpoint.h"
#include "core/memory.h"
#include "core/ops.h"
#include "core/parallel.h"
#include "dist/checkpoint/dist_checkpoint.h"
#include "dist/data/distributed_sampler.h"
#include "dist/process_group/c10d.h"
#include "dist/process_group/init_process_group.h"
#include "examples/common/char_corpus.h"
#include "examples/common/gpt_recipe.h"
#include "examples/common/launch.h"
#include "examples/common/progress.h"
#include "nn/transformer.h"

namespace {

struct Args {
  gw::nn::GPTOptions model{.context = 128, .layers = 4, .heads = 4, .width = 128};
  // warmup -1 until parsed: then min(100, steps / 10) unless given.
  gw::examples::GPTRecipe recipe{.warmup = -1};
  int64_t batch_size = 32, eval_every = 250, eval_batches = 20;
  int64_t sample = 500, top_k = 0, threads = 1;
  double temperature = 0.8;
  double target = 0;  // > 0: the final validation loss must be at most this
  uint64_t seed = 0;
  std::string ddp, device = "cpu", curve, prompt = "And ";
  bool fsdp = false;         // the group (--fsdp gloo|mpi|nccl, kept in `ddp`) shards instead
  bool cpu_offload = false;  // --cpu-offload on: --fsdp nccl's shards in host memory
  int64_t hsdp = 0;          // --hsdp R: --fsdp's ranks as R replicas, each sharded (HSDP)
  int64_t pp = 0;     // --pp N: a pipeline of N ranks (its backend: --pp-backend, gloo)
  std::string pp_backend = "gloo";
  bool pp_backend_given = false;
  gw::examples::PipelineOptions pipeline;
  gw::examples::CheckpointArgs checkpoint{"gpt_train"};
  gw::examples::TraceArgs trace;
};

// --eval-batches past this (x the batch: the validation windows read) is a typo, not a plan.
constexpr int64_t kMaxEvalBatches = 100000;

constexpr const char* kUsage =
    "usage: gpt_train [--steps N] [--batch-size N (per rank)] [--context N] [--layers N] "
    "[--heads N] [--width N] [--dropout P] [--activation-checkpointing on|off] [--lr X] [--warmup "
    "N] [--min-lr-factor X] "
    "[--weight-decay X] [--clip X] [--grad-accum N] [--eval-every N] [--eval-batches N] "
    "[--sample N] "
    "[--prompt TEXT] [--temperature X] [--top-k N] [--seed N] [--threads N] [--ddp gloo|mpi|nccl"
    " | --fsdp gloo|mpi|nccl [--hsdp R] [--cpu-offload on]] [--pp N [--pp-backend gloo|mpi] "
    "[--schedule gpipe|1f1b|interleaved|zb] [--microbatches N]] "
    "[--device cpu|cuda] [--amp bf16] [--curve PREFIX] [--target LOSS] [--checkpoint-every N] "
    "[--checkpoint-dir DIR] [--trace FILE]\n";

Args parse(int argc, char** argv) {
  Args a;
  bool ok = (argc - 1) % 2 == 0;  // every flag takes a value
  for (int i = 1; ok && i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    const int64_t n = std::atoll(v.c_str());
    const double x = std::atof(v.c_str());
    if (k == "--steps")
      a.recipe.steps = n;
    else if (k == "--batch-size")
      a.batch_size = n;
    else if (k == "--context")
      a.model.context = n;
    else if (k == "--layers")
      a.model.layers = n;
    else if (k == "--heads")
      a.model.heads = n;
    else if (k == "--width")
      a.model.width = n;
    else if (k == "--dropout")
      a.model.dropout = x;
    else if (k == "--activation-checkpointing" && (v == "on" || v == "off"))
      a.model.checkpoint_activations = v == "on";
    else if (k == "--lr")
      a.recipe.lr = x;
    else if (k == "--warmup")
      a.recipe.warmup = n;
    else if (k == "--min-lr-factor")
      a.recipe.min_lr_factor = x;
    else if (k == "--weight-decay")
      a.recipe.weight_decay = x;
    else if (k == "--clip")
      a.recipe.clip = x;
    else if (k == "--grad-accum")
      a.recipe.accumulate = n;
    else if (k == "--eval-every")
      a.eval_every = n;
    else if (k == "--eval-batches")
      a.eval_batches = n;
    else if (k == "--sample")
      a.sample = n;
    else if (k == "--prompt" && !v.empty())
      a.prompt = v;
    else if (k == "--temperature")
      a.temperature = x;
    else if (k == "--top-k")
      a.top_k = n;
    else if (k == "--seed")
      a.seed = static_cast<uint64_t>(n);
    else if (k == "--threads")
      a.threads = n;
    else if ((k == "--ddp" || k == "--fsdp") && (v == "gloo" || v == "mpi" || v == "nccl") &&
             a.ddp.empty()) {
      a.ddp = v;
      a.fsdp = k == "--fsdp";
    } else if (k == "--hsdp")
      a.hsdp = n;
    else if (k == "--cpu-offload" && v == "on")
      a.cpu_offload = true;
    else if (k == "--device" && (v == "cpu" || v == "cuda"))
      a.device = v;
    else if (k == "--amp" && v == "bf16")  // float16 would need a gradient scaler
      a.recipe.autocast = gw::kBFloat16;
    else if (k == "--curve")
      a.curve = v;
    else if (k == "--pp")
      a.pp = n;
    else if (k == "--pp-backend" && (v == "gloo" || v == "mpi")) {
      a.pp_backend = v;
      a.pp_backend_given = true;
    } else if (k == "--schedule")
      a.pipeline.schedule = v;
    else if (k == "--microbatches")
      a.pipeline.microbatches = static_cast<int>(n);
    else if (k == "--target")
      a.target = x;
    else
      ok = a.checkpoint.parse(k, v) || a.trace.parse(k, v);
  }
  if (!ok) {
    std::fputs(kUsage, stderr);
    std::exit(2);
  }
  if (a.recipe.warmup == -1) a.recipe.warmup = std::min<int64_t>(100, a.recipe.steps / 10);
  // Values the flags parsed to that cannot run, named.
  const char* bad =
      a.recipe.steps < 1 ? "--steps must be at least 1"
      : a.batch_size < 1 ? "--batch-size must be at least 1"
      : a.recipe.warmup < 0 || a.recipe.warmup >= a.recipe.steps
          ? "--warmup must be in [0, --steps)"
      : a.eval_every < 1 || a.eval_batches < 1 || a.eval_batches > kMaxEvalBatches
          ? "--eval-every must be at least 1, --eval-batches in [1, 100000]"
      : a.sample < 0                                      ? "--sample must not be negative"
      : a.threads < 1                                     ? "--threads must be at least 1"
      : !(a.recipe.lr > 0) || !std::isfinite(a.recipe.lr) ? "--lr must be positive and finite"
      : !(a.recipe.weight_decay >= 0) || !std::isfinite(a.recipe.weight_decay)
          ? "--weight-decay must be finite and >= 0"
      : !(a.recipe.clip >= 0)   ? "--clip must not be negative (0: no clipping)"
      : a.recipe.accumulate < 1 ? "--grad-accum must be at least 1"
      : a.pp > 0 && a.recipe.accumulate > 1
          ? "--pp cuts the batch into --microbatches itself: drop --grad-accum"
      : a.batch_size % a.recipe.accumulate != 0
          ? "--batch-size must split into --grad-accum micro-batches of one size"
      : !(a.temperature > 0) || a.top_k < 0 ? "--temperature must be positive, --top-k >= 0"
      : a.pp > 0 && a.ddp == "nccl"
          ? "--pp runs on the CPU: with --pp, --ddp and --fsdp take gloo or mpi"
      : a.ddp == "nccl" && a.device != "cuda"
          ? "--ddp nccl and --fsdp nccl train on GPUs: add --device cuda"
      : !a.ddp.empty() && a.ddp != "nccl" && a.device == "cuda"
          ? "--device cuda trains data-parallel over NCCL: --ddp nccl or --fsdp nccl"
      : a.cpu_offload && !(a.fsdp && a.ddp == "nccl")
          ? "--cpu-offload keeps --fsdp nccl's shards in host memory: it takes --fsdp nccl and "
            "--device cuda"
      : a.ddp == "nccl" && a.checkpoint.every > 0
          ? "--ddp nccl and --fsdp nccl do not take --checkpoint-every yet"
      : a.pp < 0 || (a.pp > 0 && a.device == "cuda")
          ? "--pp N runs a pipeline of N ranks on the CPU, alone or with --ddp or --fsdp"
      : a.pp > 0 && a.fsdp && a.pipeline.schedule == "zb"
          ? "--pp with --fsdp runs gpipe, 1f1b or interleaved: zero bubble's weight part would "
            "come after fully_shard's reductions"
      : a.pp > 0 && !a.ddp.empty() && a.pp_backend_given && a.pp_backend != a.ddp
          ? "--pp with --ddp or --fsdp runs on their backend: drop --pp-backend"
      : a.pp > 0 && a.checkpoint.every > 0 ? "--pp does not take --checkpoint-every yet"
      : a.hsdp < 0 || a.hsdp == 1 || (a.hsdp > 0 && (!a.fsdp || a.pp > 0))
          ? "--hsdp R splits --fsdp's ranks into R >= 2 replicas, each sharded: it takes "
            "--fsdp, not --pp"
      : a.pp > 0 && a.model.checkpoint_activations
          ? "--pp does not take --activation-checkpointing yet"
      : a.pp > 0 && (a.pipeline.microbatches < 1 || a.batch_size % a.pipeline.microbatches != 0)
          ? "--batch-size must split into --microbatches micro-batches of one size"
      : a.pp > 0 && a.batch_size % a.pp != 0
          ? "--batch-size must split among the --pp ranks (they share the evaluation)"
          : nullptr;
  if (bad) {
    std::fprintf(stderr,
                 "gpt_train: %s (steps %lld, batch size %lld, warmup %lld, lr %g, clip %g, "
                 "temperature %g, top-k %lld)\n",
                 bad, static_cast<long long>(a.recipe.steps), static_cast<long long>(a.batch_size),
                 static_cast<long long>(a.recipe.warmup), a.recipe.lr, a.recipe.clip, a.temperature,
                 static_cast<long long>(a.top_k));
    std::exit(2);
  }
  return a;
}

// The seed of step s's dropout masks on `rank` from `stream` (0: the model's Dropout modules, 1:
// attention's, on the default generator): a function of the run's seed, the step, the rank and
// the stream alone, so that a run resumed from a checkpoint on as many ranks draws the masks the
// uninterrupted run drew, each rank its own (on another number of ranks each rank's windows
// and so their masks differ). The two streams apart: generators seeded alike draw alike, and a
// mask drawn on one would repeat one drawn on the other. Each part goes through splitmix64's
// finalizer, so that nearby seeds give unrelated ones.
uint64_t step_seed(uint64_t seed, int64_t s, int rank, int stream) {
  auto mix = [](uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  uint64_t z = seed;
  for (uint64_t part :
       {static_cast<uint64_t>(s), static_cast<uint64_t>(rank), static_cast<uint64_t>(stream)})
    z = mix(z ^ (0x9e3779b97f4a7c15ULL * (part + 1)));
  return z;
}

// What a checkpoint must agree with to be resumed: the model, the recipe, and the steps and
// their global batch (each step's windows are the same at any number of ranks with the same
// global batch, so a run may resume on more or fewer ranks).
std::map<std::string, std::string> run_identity(const Args& a, int64_t vocab, int world) {
  const auto& m = a.model;
  std::map<std::string, std::string> identity = gw::examples::recipe_metadata(a.recipe);
  identity.insert({{"vocab_size", std::to_string(vocab)},
                   {"context", std::to_string(m.context)},
                   {"layers", std::to_string(m.layers)},
                   {"heads", std::to_string(m.heads)},
                   {"width", std::to_string(m.width)},
                   {"dropout", gw::examples::exact_text(m.dropout)},
                   {"global_batch", std::to_string(a.batch_size * world)}});
  return identity;
}

// Loads checkpoint `c` into the trainer after checking that it is this run's; throws naming
// what differs before anything is loaded (load_state_dict checks every tensor before it copies
// one).
void check_identity(const std::map<std::string, std::string>& saved, int64_t step, uint64_t seed,
                    const Args& args, const std::map<std::string, std::string>& identity) {
  for (const auto& [key, want] : identity) {
    auto it = saved.find(key);
    GW_CHECK(it != saved.end() && gw::examples::same_value(it->second, want),
             gw::InvalidArgumentError, "[gpt_train] the checkpoint in ", args.checkpoint.dir,
             " is of another run: its ", key, " is ",
             it == saved.end() ? std::string("missing") : it->second, ", this run's ", want);
  }
  GW_CHECK(step >= 0 && step <= args.recipe.steps && seed == args.seed, gw::InvalidArgumentError,
           "[gpt_train] the checkpoint in ", args.checkpoint.dir, " is at step ", step, " of seed ",
           seed, "; this run has ", args.recipe.steps, " steps of seed ", args.seed);
}

void restore(gw::examples::GPTTrainer& trainer, const gw::Checkpoint& c, const Args& args,
             const std::map<std::string, std::string>& identity) {
  check_identity(c.extra, c.step, c.seed, args, identity);
  trainer.model().load_state_dict(c.model);
  trainer.optimizer().load_state_dict(c.optimizer);
  trainer.schedule_from(c.step);
}

// The sharded form (--fsdp): every rank's rows through gw::dist::checkpoint, the run's identity,
// step and seed in its metadata.
std::string sharded_dir(const Args& args) { return args.checkpoint.dir + "/sharded"; }

void save_sharded(gw::examples::GPTTrainer& trainer, gw::dist::ProcessGroup& group,
                  const Args& args, std::map<std::string, std::string> identity, int64_t step) {
  namespace dcp = gw::dist::checkpoint;
  dcp::ShardedState state = trainer.sharded()->sharded_state_dict("model.");
  state.merge(trainer.sharded()->sharded_optimizer_state(trainer.optimizer(), "optim."));
  identity["step"] = std::to_string(step);
  identity["seed"] = std::to_string(args.seed);
  dcp::save(sharded_dir(args), state, group, identity);
}

// Returns the step it resumes at. A collective: every rank opens and checks the checkpoint, and
// when any cannot, every rank throws before anything is loaded; dcp::load and
// load_optimizer_state change nothing on any rank when one cannot load.
int64_t restore_sharded(gw::examples::GPTTrainer& trainer, gw::dist::ProcessGroup& group,
                        const Args& args, const std::map<std::string, std::string>& identity) {
  namespace dcp = gw::dist::checkpoint;
  std::optional<dcp::Reader> ckpt;
  int64_t step = 0;
  dcp::on_every_rank(group, [&] {
    ckpt.emplace(sharded_dir(args));
    const auto& saved = ckpt->metadata();
    const auto value = [&](const char* key) {
      auto it = saved.find(key);
      GW_CHECK(it != saved.end(), gw::InvalidArgumentError, "[gpt_train] the checkpoint in ",
               args.checkpoint.dir, " has no ", key);
      return it->second;
    };
    // A whole number, all of the text: "20x" or "x20" is a damaged checkpoint.
    const auto whole = [&](const char* key) {
      const std::string& text = value(key);
      uint64_t n = 0;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
      GW_CHECK(ec == std::errc() && end == text.data() + text.size(), gw::InvalidArgumentError,
               "[gpt_train] the checkpoint in ", args.checkpoint.dir, " has ", key, " \"", text,
               "\", not a whole number");
      return n;
    };
    const uint64_t saved_step = whole("step");
    step = static_cast<int64_t>(std::min<uint64_t>(saved_step, INT64_MAX));
    check_identity(saved, step, whole("seed"), args, identity);
  });
  dcp::load(*ckpt, trainer.sharded()->sharded_state_dict("model."), group);
  trainer.sharded()->load_optimizer_state(trainer.optimizer(), *ckpt, "optim.");
  trainer.schedule_from(step);
  return step;
}

}  // namespace

int main(int argc, char** argv) {
  Args args = parse(argc, argv);
  if (args.pp > 0 && !args.ddp.empty()) args.pp_backend = args.ddp;  // 2D: --ddp's backend
  if (args.ddp == "gloo" || args.ddp == "nccl" || (args.pp > 0 && args.pp_backend == "gloo"))
    gw::examples::launch_env("gpt_train");  // one line on a bad launcher
  int rank = 0, world = 1;
  try {
    // What can fail on one rank alone is checked before the ranks meet.
    gw::Device device = args.device == "cuda" ? gw::cuda_device(0) : gw::kCPU;
    // Without a GPU, or in a build without CUDA, this throws and says which (with NCCL the
    // group does, and each rank takes its own GPU from it below).
    if (device.is_cuda() && args.ddp != "nccl") gw::zeros({1}, device);
    const gw::data::CharCorpus corpus = gw::data::load_bible_kjv();
    const std::vector<int64_t> prompt = corpus.encode(args.prompt);
    const gw::data::CharWindows train(corpus, gw::data::CorpusSplit::Train, args.model.context);
    const gw::data::CharWindows val(corpus, gw::data::CorpusSplit::Validation, args.model.context);

    args.trace.start();
    gw::set_num_threads(static_cast<int>(args.threads));
    std::shared_ptr<gw::dist::ProcessGroup> group;
    if (!args.ddp.empty() || args.pp > 0) {
      // Ranks, master: from the launcher.
      group = gw::dist::init_process_group(args.pp > 0 ? args.pp_backend : args.ddp);
      rank = group->rank();
      world = group->size();
      if (args.ddp == "nccl") device = group->device();  // cuda:LOCAL_RANK
      GW_CHECK(args.pp == 0 || (args.ddp.empty() ? args.pp == world : world % args.pp == 0),
               gw::InvalidArgumentError, "[gpt_train] --pp ", args.pp, " needs ",
               args.ddp.empty() ? gw::detail::str(args.pp, " ranks")
                                : gw::detail::str("a multiple of ", args.pp, " ranks with --ddp"),
               "; the launcher started ", world);
    }
    // The data-parallel ranks: a pipeline's ranks all train on the same batches.
    const int replicas = args.pp > 0 ? world / static_cast<int>(args.pp) : world,
              replica = args.pp > 0 ? rank / static_cast<int>(args.pp) : rank;
    // 2D: rank = replica x pp + its place in the pipeline, which runs over the mesh's "pp" group.
    std::shared_ptr<gw::dist::ProcessGroup> pipeline_group = group;
    GW_CHECK(!(args.pp > 0 && args.fsdp) || replicas > 1, gw::InvalidArgumentError,
             "[gpt_train] --pp ", args.pp,
             " with --fsdp shards each stage over its replicas: it "
             "needs at least ",
             2 * args.pp, " ranks; the launcher started ", world);
    if (args.pp > 0 && replicas > 1) {
      const gw::dist::DeviceMesh mesh =
          gw::dist::init_device_mesh({replicas, static_cast<int>(args.pp)}, {"dp", "pp"});
      pipeline_group = mesh.group("pp");
      args.pipeline.data_parallel = mesh.group("dp");
      args.pipeline.shard = args.fsdp;
    }
    gw::dist::DistributedSampler sampler(
        train.size(),
        {.num_replicas = replicas, .rank = replica, .seed = args.seed, .drop_last = true});
    const int64_t steps_per_epoch = sampler.num_samples() / args.batch_size;
    GW_CHECK(steps_per_epoch > 0, gw::InvalidArgumentError, "[gpt_train] a batch of ",
             args.batch_size, " windows on each of ", world, " ranks is more than the ",
             train.size(), " windows of the training split");

    gw::nn::GPTOptions options = args.model;
    options.vocab_size = corpus.vocab_size();
    if (args.pp > 0) options.tie_weights = false;  // a pipeline cuts the head from the embedding
    // The same on every rank (and DDP broadcasts rank 0's weights anyway); the model's dropout
    // modules draw from it, so it lives as long as the model. Attention's dropout draws its
    // seed from gw::default_generator() (as PyTorch's from torch's), seeded alike; both are
    // reseeded at every step (step_seed).
    gw::Generator gen(args.seed);
    gw::manual_seed(args.seed);
    auto model = std::make_shared<gw::nn::GPT>(options, gen);
    model->to(device);
    int64_t parameter_count = 0;  // before sharding
    for (const gw::Tensor& p : model->parameters()) parameter_count += p.numel();
    gw::fsdp::FullyShardOptions sharding{
        .offload_policy =
            args.cpu_offload ? std::optional(gw::fsdp::CPUOffloadPolicy{}) : std::nullopt};
    std::shared_ptr<gw::dist::ProcessGroup> trainer_group = pipeline_group;
    if (args.hsdp > 0) {  // FSDP2's 2-D mesh: sharded along "shard", replicated along the other
      GW_CHECK(world % args.hsdp == 0, gw::InvalidArgumentError, "[gpt_train] --hsdp ", args.hsdp,
               " needs a multiple of ", args.hsdp, " ranks; the launcher started ", world);
      const gw::dist::DeviceMesh mesh = gw::dist::init_device_mesh(
          {static_cast<int>(args.hsdp), world / static_cast<int>(args.hsdp)},
          {"replicate", "shard"});
      trainer_group = mesh.group("shard");
      sharding.replicate_group = mesh.group("replicate");
    }
    gw::examples::GPTTrainer trainer(model, args.recipe, trainer_group,
                                     args.pp > 0 ? gw::examples::Parallelism::pipeline
                                     : args.fsdp ? gw::examples::Parallelism::fsdp
                                                 : gw::examples::Parallelism::ddp,
                                     args.pipeline, sharding);
    gw::reset_peak_memory_stats(device);
    const auto identity = run_identity(args, corpus.vocab_size(), replicas);
    // A collective: what throws on one rank throws on all (without a group, just f).
    auto on_every_rank = [&](const std::function<void()>& f) {
      group ? gw::dist::checkpoint::on_every_rank(*group, f) : f();
    };

    // Resuming: rank 0 says whether there is a checkpoint, so that all ranks agree; every rank
    // loads it, and when one cannot, every rank stops.
    int64_t first = 0;
    // Rank 0's finding: 0 none, 1 a checkpoint to resume, 2 one of the other form (a sharded one
    // where this run writes one file, or the other way): refused, as resuming from this form's
    // older file, or ignoring the other, would train on from the wrong step.
    const std::string single = args.checkpoint.dir + "/checkpoint.safetensors",
                      sharded = sharded_dir(args) + "/index.json";
    const std::string& other = args.fsdp ? single : sharded;
    const uint8_t found = args.checkpoint.every == 0                              ? 0
                          : std::filesystem::exists(other)                        ? 2
                          : std::filesystem::exists(args.fsdp ? sharded : single) ? 1
                                                                                  : 0;
    const uint8_t agreed = group ? gw::dist::broadcast_bytes(*group, {found}, 0)[0] : found;
    GW_CHECK(agreed != 2, gw::InvalidArgumentError, "[gpt_train] ", other,
             " is the checkpoint of a run ", args.fsdp ? "without" : "with",
             " --fsdp: resume it as it was run, or give another --checkpoint-dir");
    const bool resume = agreed == 1;
    if (resume && args.fsdp) {
      first = restore_sharded(trainer, *group, args, identity);
    } else if (resume) {
      on_every_rank([&] {
        std::optional<gw::Checkpoint> c = gw::load_checkpoint(args.checkpoint.dir);
        GW_CHECK(c.has_value(), gw::IoError, "[gpt_train] no checkpoint in ", args.checkpoint.dir,
                 " on rank ", rank);
        restore(trainer, *c, args, identity);
        first = c->step;
      });
    }
    if (resume && rank == 0)
      std::printf("resuming from %s at step %lld\n", args.checkpoint.dir.c_str(),
                  static_cast<long long>(first));

    const int64_t tokens_per_step = args.batch_size * args.model.context * replicas;
    if (rank == 0) {
      std::string parallel;
      if (group && args.pp > 0)
        parallel = gw::detail::str(
            ", ", replicas > 1 ? gw::detail::str(replicas, " replicas of ") : std::string(),
            "a pipeline of ", args.pp, " ranks (", args.pipeline.schedule, ", ",
            args.pipeline.microbatches, " micro-batches, ", args.pp_backend, ")",
            args.fsdp ? ", each stage sharded over the replicas (FSDP)" : "");
      else if (group)  // with NCCL, this rank's GPU; where the shards are, as they are
        parallel = gw::detail::str(
            ", ", args.fsdp ? "FSDP" : "DDP", " on ", world, " ranks (", args.ddp,
            args.hsdp > 0 ? gw::detail::str(", HSDP: ", args.hsdp, " replicas of ",
                                            world / args.hsdp, " shards")
                          : std::string(),
            args.ddp == "nccl" ? ", " + device.str() : std::string(),
            trainer.sharded() && device.is_cuda() && !trainer.sharded()->shards().empty() &&
                    trainer.sharded()->shards()[0].device().is_cpu()
                ? ", shards in host memory"
                : "",
            ")");
      std::printf(
          "%s\n%.2fM parameters; %zu characters of text, vocabulary of %lld; %s%s%s\n"
          "AdamW lr %g (warm-up %lld, cosine to %g), weight decay %g, clip %g; %lld steps of "
          "%lld tokens%s\n",
          model->repr().c_str(), static_cast<double>(parameter_count) / 1e6, corpus.text.size(),
          static_cast<long long>(corpus.vocab_size()), args.device.c_str(), parallel.c_str(),
          args.recipe.autocast ? ", bfloat16 autocast over float32 parameters" : "", args.recipe.lr,
          static_cast<long long>(args.recipe.warmup), args.recipe.lr * args.recipe.min_lr_factor,
          args.recipe.weight_decay, args.recipe.clip, static_cast<long long>(args.recipe.steps),
          static_cast<long long>(tokens_per_step),
          args.recipe.accumulate > 1
              ? gw::detail::str(", each in ", args.recipe.accumulate, " micro-batches").c_str()
              : "");
      std::fflush(stdout);
    }

    std::unique_ptr<gw::examples::ProgressBar> bar;  // rank 0's
    if (rank == 0)
      bar =
          std::make_unique<gw::examples::ProgressBar>("train", args.recipe.steps - first, "tokens");
    // Rank 0 writes; when it cannot, every rank stops (rather than wait for it in a collective).
    auto save = [&](int64_t step) {
      if (args.fsdp) {  // a collective: every rank writes its rows
        save_sharded(trainer, *group, args, identity, step);
        if (bar) bar->print("checkpoint saved: step " + std::to_string(step));
        return;
      }
      on_every_rank([&] {
        if (rank != 0) return;
        gw::save_checkpoint(args.checkpoint.dir, {.model = model->state_dict(),
                                                  .optimizer = trainer.optimizer().state_dict(),
                                                  .step = step,
                                                  .seed = args.seed,
                                                  .extra = identity});
      });
      if (bar) bar->print("checkpoint saved: step " + std::to_string(step));
    };
    // The validation loss on the same windows at any number of ranks (a pipeline's ranks first
    // bring each other's stages over: every rank then holds the whole model).
    auto validate = [&] {
      trainer.gather_stages();
      return gw::examples::validation_loss(trainer.evaluation_model(), val, args.eval_batches,
                                           args.batch_size * replicas, group.get());
    };
    // losses[i]: step first + i + 1's loss, this rank's until averaged over the ranks (one
    // collective per evaluation, for the steps since the last).
    std::vector<double> losses;
    size_t averaged = 0;
    auto average_losses = [&] {
      if (!group || averaged == losses.size()) return;
      gw::Tensor t = gw::from_vector(std::vector<double>(losses.begin() + averaged, losses.end()))
                         .to(group->device());  // NCCL's: the GPU
      group->allreduce(t)->wait();
      const std::vector<double> sums = t.to_vector<double>();
      for (size_t i = 0; i < sums.size(); ++i) losses[averaged + i] = sums[i] / world;
      averaged = losses.size();
    };
    std::vector<gw::examples::LossPoint> val_losses;
    std::vector<int64_t> order;
    double final_val = std::nan("");
    for (int64_t s = first; s < args.recipe.steps; ++s) {
      const int64_t epoch = s / steps_per_epoch, b = s % steps_per_epoch;
      if (order.empty() || b == 0) {
        sampler.set_epoch(epoch);
        order = sampler.indices();
      }
      auto [x, y] = train.batch(order, b * args.batch_size, args.batch_size);
      gen.manual_seed(step_seed(args.seed, s, rank, 0));  // this step's dropout masks
      gw::manual_seed(step_seed(args.seed, s, rank, 1));
      const double lr = trainer.optimizer().lr();  // this step's
      losses.push_back(trainer.step(x, y));
      if (bar) bar->update(s + 1 - first, losses.back(), (s + 1 - first) * tokens_per_step);
      const bool last = s + 1 == args.recipe.steps;
      if ((s + 1) % args.eval_every == 0 || last) {
        final_val = validate();
        average_losses();
        val_losses.push_back({s + 1, final_val});
        char line[128];
        std::snprintf(line, sizeof line, "step %lld: train loss %.4f, val loss %.4f, lr %.3g",
                      static_cast<long long>(s + 1), losses.back(), final_val, lr);
        if (bar) bar->print(line);
      }
      if (args.checkpoint.every > 0 && ((s + 1) % args.checkpoint.every == 0 || last)) save(s + 1);
    }
    if (bar) bar->finish();
    if (first == args.recipe.steps) {  // resumed after the last step
      final_val = validate();
      if (rank == 0) std::printf("val loss %.4f\n", final_val);
    }
    {  // each rank's peak in training, from the allocator's counters
      const double mine = static_cast<double>(gw::memory_stats(device).peak_allocated_bytes);
      const double largest =
          gw::examples::reduce_over_ranks(mine, group.get(), gw::dist::ReduceOp::MAX);
      if (rank == 0)
        std::printf("peak memory allocated in training: rank 0 %.1f MiB, largest rank %.1f MiB\n",
                    mine / 1048576.0, largest / 1048576.0);
    }

    trainer.gather_stages();  // a pipeline's: the whole model on every rank
    // Sharded, every rank runs the model (its calls gather); each draws the same passage.
    // Sharded pipeline stages: rank 0 samples from its whole copy.
    if ((rank == 0 || (args.fsdp && args.pp == 0)) && args.sample > 0) {
      gw::Generator sampling(args.seed);
      const std::vector<int64_t> text = trainer.evaluation_model().generate(
          prompt, args.sample, sampling, {.temperature = args.temperature, .top_k = args.top_k});
      if (rank == 0)
        std::printf("--- a sample (%lld characters, temperature %g) ---\n%s\n---\n",
                    static_cast<long long>(args.sample), args.temperature,
                    corpus.decode(text).c_str());
    }
    if (rank == 0 && !args.curve.empty()) {
      gw::examples::write_loss_curve(args.curve, losses, "char-GPT on the King James Bible",
                                     val_losses, first + 1);
      std::printf("wrote %s.csv and %s.svg\n", args.curve.c_str(), args.curve.c_str());
    }
    const bool reached = args.target <= 0 || final_val <= args.target;
    if (rank == 0 && args.target > 0)
      std::printf("val loss %.4f (target %.4f): %s\n", final_val, args.target,
                  reached ? "reached" : "NOT reached");
    if (group) gw::dist::destroy_process_group();
    args.trace.finish(rank, world);
    return reached ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt_train (rank %d): %s\n", rank, e.what());
    return 1;
  }
}

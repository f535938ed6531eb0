// Distributed checkpoints (dist/checkpoint/dist_checkpoint.h) over real Gloo and RPC, ranks as
// threads, real files: a checkpoint of DDP + ZeRO saved at world size 2 loads at 3 (and 3 at 2)
// and training continues exactly as an uninterrupted run; RemoteModules saved on one placement
// load on another; every error raises on every rank; a failed save leaves the last one whole.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <mutex>

#include <nlohmann/json.hpp>

#include "autograd/autograd.h"
#include "core/ops.h"
#include "core/random.h"
#include "core/safetensors_file.h"
#include "ddp/distributed_data_parallel.h"
#include "dist/autograd/dist_autograd.h"
#include "dist/checkpoint/dist_checkpoint.h"
#include "dist/optim/distributed_optimizer.h"
#include "dist/optim/zero_redundancy_optimizer.h"
#include "nn/nn.h"
#include "optim/factory.h"
#include "tests/dist/autograd/dist_functions.h"  // "d_linear", RemoteModule's constructor
#include "tests/dist/autograd/dist_group.h"
#include "tests/dist/process_group/ranks.h"
#include "tests/temp_dir.h"

using namespace gw;
namespace dcp = gw::dist::checkpoint;
using gw::dist::testing::Checks;
using gw::dist::testing::run_ranks;

namespace {
constexpr int64_t kGlobal = 6;  // samples per step: 3 per rank at world 2, 2 at world 3
constexpr int kSteps = 6, kSavedAt = 3;

std::shared_ptr<nn::Sequential> mlp(uint64_t seed) {
  Generator gen(seed);
  auto m = std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(8, 16, true, gen),
                                            std::make_shared<nn::ReLU>(),
                                            std::make_shared<nn::Linear>(16, 4, true, gen));
  m->to(kFloat64);
  return m;
}

std::pair<Tensor, Tensor> batch(int step) {
  Generator gen(900 + static_cast<uint64_t>(step));
  return {randn({kGlobal, 8}, gen, kFloat64), randint(0, 4, {kGlobal}, gen)};
}

std::shared_ptr<dist::ProcessGroup> borrow(dist::ProcessGroupGloo& pg) {
  return {&pg, [](dist::ProcessGroup*) {}};
}

const optim::OptimizerOptions kAdam = optim::AdamOptions{.lr = 0.01, .weight_decay = 0.1};

// Steps [from, to) of DDP + ZeRO, each rank on its rows of the global batch.
void train(dist::ProcessGroupGloo& pg, ddp::DistributedDataParallel& model,
           dist::ZeroRedundancyOptimizer& opt, int from, int to) {
  const int64_t rows = kGlobal / pg.size();
  for (int step = from; step < to; ++step) {
    auto [x, y] = batch(step);
    opt.zero_grad();
    nn::functional::cross_entropy(model.forward(x.narrow(0, pg.rank() * rows, rows)),
                                  y.narrow(0, pg.rank() * rows, rows))
        .backward();
    opt.step();
  }
}

// The uninterrupted run: one process, the whole batch, the plain optimizer.
struct Reference {
  std::shared_ptr<nn::Sequential> model = mlp(7);
  std::unique_ptr<optim::Optimizer> opt = optim::make_optimizer(model->parameters(), kAdam);
  NamedTensors state_at_save;  // the optimizer's, after kSavedAt steps
  Reference() {
    for (int step = 0; step < kSteps; ++step) {
      if (step == kSavedAt) state_at_save = opt->state_dict();
      auto [x, y] = batch(step);
      opt->zero_grad();
      nn::functional::cross_entropy(model->forward(x), y).backward();
      opt->step();
    }
  }
};

dcp::ShardedState training_state(ddp::DistributedDataParallel& model,
                                 const dist::ZeroRedundancyOptimizer& opt) {
  dcp::ShardedState state = dcp::whole(model.module()->state_dict(), "model.");
  state.merge(opt.sharded_state_dict("optim."));
  return state;
}

// Saves after kSavedAt steps at world `from`, then at world `to` loads into a model built from
// other weights and trains to kSteps, which must end where the uninterrupted run does.
void save_then_resume(int from, int to, const std::string& dir, const Reference& ref) {
  run_ranks(from, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    ddp::DistributedDataParallel model(mlp(7), borrow(pg));
    dist::ZeroRedundancyOptimizer opt(model.module()->parameters(), kAdam, borrow(pg));
    train(pg, model, opt, 0, kSavedAt);
    dcp::save(dir, training_state(model, opt), pg, {{"step", std::to_string(kSavedAt)}});
    EXPECT(c, dcp::Reader(dir).world_size() == from);
  });
  run_ranks(to, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    ddp::DistributedDataParallel model(mlp(100 + static_cast<uint64_t>(pg.rank())), borrow(pg));
    dist::ZeroRedundancyOptimizer opt(model.module()->parameters(), kAdam, borrow(pg));
    dcp::Reader ckpt(dir);
    dcp::load(ckpt, dcp::whole(model.module()->state_dict(), "model."), pg);
    opt.load_state_dict(ckpt, "optim.");
    const int step = std::stoi(ckpt.metadata().at("step"));
    EXPECT(c, step == kSavedAt);
    train(pg, model, opt, step, kSteps);
    auto p = model.module()->parameters(), q = ref.model->parameters();
    for (size_t i = 0; i < p.size(); ++i) EXPECT(c, allclose(p[i], q[i], 1e-10, 1e-12));
  });
}
}  // namespace

TEST_CASE(
    "a DDP + ZeRO checkpoint saved at world size 2 loads at 3 and training continues "
    "as if uninterrupted",
    "[dist_checkpoint]") {
  const Reference ref;
  test::TempDir dir("gw_dcp");
  save_then_resume(2, 3, dir.path, ref);

  // What was written: one file per rank, each with its share; the index says who has what.
  const dcp::Reader ckpt(dir.path);
  CHECK(ckpt.generation() == 1);
  std::vector<std::string> files;
  for (const auto& f : std::filesystem::directory_iterator(dir.path))
    files.push_back(f.path().filename().string());
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() == 3);  // "1-<nonce>-rank0.safetensors", "...rank1...", "index.json"
  CHECK(files[0].starts_with("1-"));
  CHECK(files[0].ends_with("-rank0.safetensors"));
  CHECK(files[1].ends_with("-rank1.safetensors"));
  CHECK(files[2] == "index.json");
  // The replicas were written once, spread over both ranks; the moments by their owners.
  int64_t model_keys[2] = {0, 0};
  for (int r = 0; r < 2; ++r) {
    SafetensorsFile f(dir.path + "/" + files[static_cast<size_t>(r)]);
    for (const auto& [key, info] : f.tensors()) model_keys[r] += key.starts_with("model.") ? 1 : 0;
  }
  CHECK(model_keys[0] + model_keys[1] == 4);
  CHECK(model_keys[0] > 0);
  CHECK(model_keys[1] > 0);
  // The checkpoint holds the plain optimizer's state: it loads into one.
  const NamedTensors state = ckpt.read_all("optim.");
  REQUIRE(state.size() == ref.state_at_save.size());
  for (const auto& [key, t] : ref.state_at_save) {
    INFO(key);
    REQUIRE(state.contains(key));
    CHECK(allclose(state.at(key), t, 1e-12, 1e-14));
  }
  auto plain = optim::make_optimizer(mlp(7)->parameters(), kAdam);
  plain->load_state_dict(state);
}

TEST_CASE("a checkpoint saved at world size 3 loads at 2", "[dist_checkpoint]") {
  const Reference ref;
  test::TempDir dir("gw_dcp");
  save_then_resume(3, 2, dir.path, ref);
}

TEST_CASE("a checkpoint reads only the ranges a rank asks for, in place", "[dist_checkpoint]") {
  test::TempDir dir("gw_dcp");
  Tensor whole = arange(0, 30, 1, kFloat32).reshape({5, 6});
  run_ranks(3, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    const int64_t begin = pg.rank() * 10;  // three ranges of ten
    dcp::ShardedState mine{
        {"w", {whole.reshape({-1}).narrow(0, begin, 10).clone(), whole.sizes(), begin}},
        {"replica", dcp::Shard{full({2}, 7.0), {2}, 0}}};
    dcp::save(dir.path, mine, pg);
    // Each rank wrote its own range.
    bool found = false;
    for (const auto& file : std::filesystem::directory_iterator(dir.path))
      if (file.path().string().ends_with("-rank" + std::to_string(pg.rank()) + ".safetensors"))
        found =
            SafetensorsFile(file.path().string()).tensors().contains("w@" + std::to_string(begin));
    EXPECT(c, found);
  });
  const dcp::Reader ckpt(dir.path);
  CHECK(equal(ckpt.read("w"), whole));
  Tensor part = zeros({2, 4}).t();  // not contiguous: read through a copy
  ckpt.read("w", part, 7);          // elements 7..14 span two ranks' files
  CHECK(equal(part.contiguous().reshape({-1}), arange(7, 15, 1, kFloat32)));
  CHECK(equal(ckpt.read("replica"), full({2}, 7.0)));
  CHECK_THROWS_AS(ckpt.read("w", zeros({8}), 25), IndexError);
  CHECK_THROWS_WITH(ckpt.read("w", zeros({2}, kFloat64)), Catch::Contains("float32"));
  CHECK_THROWS_WITH(ckpt.read("nope"), Catch::Contains("no tensor \"nope\""));
}

TEST_CASE("checkpoint errors raise on every rank, naming the rank and the tensor",
          "[dist_checkpoint][errors]") {
  test::TempDir dir("gw_dcp");
  run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    const int r = pg.rank();
    dcp::save(dir.path, dcp::whole({{"a", full({3}, 1.0)}}), pg, {{"v", "1"}});  // generation 1
    // Disagreeing shapes, a gap, an undefined tensor: refused before anything is written.
    EXPECT_THROWS(c, InvalidArgumentError,
                  dcp::save(dir.path, dcp::whole({{"a", zeros({r == 0 ? 3 : 4})}}), pg),
                  "tensor \"a\" is float32 (3) on rank 0 but float32 (4) on rank 1");
    EXPECT_THROWS(c, InvalidArgumentError,
                  dcp::save(dir.path, {{"b", dcp::Shard{zeros({2}), {6}, r == 0 ? 0 : 4}}}, pg),
                  "elements [2, 4) of tensor \"b\" (6) are held by no rank");
    EXPECT_THROWS(
        c, InvalidArgumentError,
        dcp::save(dir.path, {{"c", dcp::Shard{r == 1 ? Tensor() : zeros({1}), {1}, 0}}}, pg),
        "tensor \"c\" is undefined");
    if (r == 0)  // the other rank's failure arrives as its own type, naming the rank
      EXPECT_THROWS(c, RemoteError,
                    dcp::save(dir.path, {{"c", dcp::Shard{zeros({1}), {1}, 0}}}, pg), "[rank 1]",
                    "tensor \"c\" is undefined");
    else
      EXPECT_THROWS(c, InvalidArgumentError,
                    dcp::save(dir.path, {{"c", dcp::Shard{Tensor(), {1}, 0}}}, pg),
                    "tensor \"c\" is undefined");
    // A piece and a whole tensor whose names would share a key in a file.
    dcp::ShardedState clash{{"x", dcp::Shard{zeros({2}), {4}, r == 0 ? 0 : 2}}};
    if (r == 1) clash.emplace("x@2", dcp::Shard{zeros({2}), {2}, 0});
    EXPECT_THROWS(c, InvalidArgumentError, dcp::save(dir.path, clash, pg), "would share a key");
    // The failed saves left generation 1 whole.
    const dcp::Reader ckpt(dir.path);
    EXPECT(c, ckpt.generation() == 1 && ckpt.metadata().at("v") == "1");
    // Loading: a name only rank 1 asks for (nothing is read anywhere), a shape that differs.
    Tensor untouched = zeros({3});
    dcp::ShardedState want = dcp::whole({{"a", untouched}});
    if (r == 1) want.emplace("missing", dcp::Shard{zeros({1}), {1}, 0});
    EXPECT_THROWS(c, IndexError, dcp::load(ckpt, want, pg), "no tensor \"missing\"");
    EXPECT(c, equal(untouched, zeros({3})));
    EXPECT_THROWS(c, ShapeError, dcp::load(ckpt, dcp::whole({{"a", zeros({4})}}), pg),
                  "tensor \"a\" is (3) in the checkpoint but (4) here");
    EXPECT_THROWS(c, IoError, dcp::load(dir.path + "/none", want, pg), "no checkpoint in");
    // A second save replaces the first; the first one's files go.
    dcp::save(dir.path, dcp::whole({{"a", full({3}, 2.0)}}), pg, {{"v", "2"}});
    Tensor a = zeros({3});
    dcp::load(dir.path, dcp::whole({{"a", a}}), pg);
    EXPECT(c, equal(a, full({3}, 2.0)));
  });
  // The last save is newer than the first, and its files are all that is left: the first
  // one's, and what the save that failed while writing left, are gone.
  const int64_t last = dcp::Reader(dir.path).generation();
  CHECK(last > 1);
  for (const auto& f : std::filesystem::directory_iterator(dir.path)) {
    const std::string name = f.path().filename().string();
    INFO(name);
    CHECK((name == "index.json" || name.starts_with(std::to_string(last) + "-")));
  }
}

TEST_CASE("a ZeRO state one rank cannot load is loaded by no rank", "[dist_checkpoint][errors]") {
  test::TempDir dir("gw_dcp");
  // A plain Adam's state of two parameters after one step, with step counts edited: parameter
  // 0's to 5 (sound), parameter 1's to -1 (refused by the optimizer).
  std::vector<Tensor> plain_params{full({4}, 1.0f).requires_grad_(),
                                   full({4}, 2.0f).requires_grad_()};
  auto plain = optim::make_optimizer(plain_params, kAdam);
  for (auto& p : plain_params) p.set_grad(full({4}, 0.5f));
  plain->step();
  NamedTensors saved = plain->state_dict();
  saved["state.0.step"] = scalar_tensor(5.0, kFloat32);
  saved["state.1.step"] = scalar_tensor(-1.0, kFloat32);
  run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    dcp::save(dir.path, dcp::whole(saved, "optim."), pg);
    // 8 elements over 2 ranks: rank 0's range is parameter 0, rank 1's parameter 1.
    std::vector<Tensor> params{zeros({4}).requires_grad_(), zeros({4}).requires_grad_()};
    dist::ZeroRedundancyOptimizer zero(params, kAdam, borrow(pg));
    for (auto& p : params) p.set_grad(ones({4}));
    zero.step();
    std::map<std::string, Tensor> before;
    for (const auto& [name, s] : zero.sharded_state_dict("optim.")) before[name] = s.local.clone();
    EXPECT_THROWS(c, InvalidArgumentError, zero.load_state_dict(dcp::Reader(dir.path), "optim."),
                  "step count -1");
    for (const auto& [name, s] : zero.sharded_state_dict("optim."))
      EXPECT(c, before.contains(name) && equal(s.local, before.at(name)));
  });
}

TEST_CASE("a damaged index is refused by name", "[dist_checkpoint][errors]") {
  test::TempDir dir("gw_dcp");
  auto write = [&](const std::string& text) { std::ofstream(dir.path + "/index.json") << text; };
  CHECK_THROWS_WITH(dcp::Reader(dir.path), Catch::Contains("no checkpoint in"));
  write("{not json");
  CHECK_THROWS_WITH(dcp::Reader(dir.path), Catch::Contains("not a valid index"));
  const std::string head =
      R"({"format": "gradwire-distributed-checkpoint-1", "generation": 1, "world_size": 1,
          "metadata": {}, "tensors": {"t": {"dtype": "float32", "shape": [4], "chunks": )";
  write(head + R"([{"file": "../x.safetensors", "key": "t", "offset": 0, "numel": 4}]}}})");
  CHECK_THROWS_WITH(dcp::Reader(dir.path), Catch::Contains("outside the checkpoint"));
  write(head + R"([{"file": "1-rank0.safetensors", "key": "t", "offset": 0, "numel": 3}]}}})");
  CHECK_THROWS_WITH(dcp::Reader(dir.path), Catch::Contains("hold 3 of its 4 elements"));
  write(head + R"([{"file": "1-rank0.safetensors", "key": "t", "offset": 0, "numel": 9}]}}})");
  CHECK_THROWS_WITH(dcp::Reader(dir.path), Catch::Contains("a chunk of 9 elements at 0"));
  write(head + R"([{"file": "1-rank0.safetensors", "key": "t", "offset": 0, "numel": 4}]}}})");
  CHECK_THROWS_AS(dcp::Reader(dir.path), IoError);  // the index is fine; its file is not there
  // Sizes whose product leaves int64 (here it would wrap to 2 elements).
  write(R"({"format": "gradwire-distributed-checkpoint-1", "generation": 1, "world_size": 1,
            "metadata": {}, "tensors": {"t": {"dtype": "float32",
            "shape": [3, 6148914691236517206], "chunks": [{"file": "f", "key": "t",
            "offset": 0, "numel": 2}]}}})");
  CHECK_THROWS_WITH(dcp::Reader(dir.path), Catch::Contains("has shape"));
}

TEST_CASE("a checkpoint whose bytes changed is refused, before a load changes anything",
          "[dist_checkpoint][errors]") {
  test::TempDir dir("gw_dcp");
  // Two ranks' halves of 3.5 MiB of floats: each chunk is two blocks of the checksums (1 MiB and
  // 0.75 MiB, 262144 and 196608 elements); and a replica of 2.3 MiB of int64 (3 blocks).
  constexpr int64_t kHalf = 458752, kBlock = 262144;
  const Tensor big = arange(0, 2 * kHalf, 1, kFloat32), ints = arange(0, 300000, 1, kInt64);
  run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    const int64_t begin = pg.rank() * kHalf;
    dcp::save(dir.path,
              {{"big", {big.narrow(0, begin, kHalf).clone(), big.sizes(), begin}},
               {"ints", {ints, ints.sizes(), 0}}},
              pg, {{"step", "3"}});
    EXPECT(c, dcp::Reader(dir.path).world_size() == 2);
  });
  auto range = [](const dcp::Reader& r, int64_t from, int64_t to) {
    Tensor out = empty({to - from});
    r.read("big", out, from);
    return out;
  };
  {
    const dcp::Reader ckpt(dir.path);
    CHECK(equal(ckpt.read("big"), big));
    // Ranges that start and end inside blocks, around blocks read in place whole.
    for (auto [from, to] : {std::pair<int64_t, int64_t>{300000, 700000},
                            {100000, 2 * kHalf - 1000},
                            {kHalf, 2 * kHalf},
                            {5, 6}})
      CHECK(equal(range(ckpt, from, to), big.narrow(0, from, to - from)));
    Tensor part = empty({170000}, kInt64);  // inside block 0 to inside block 2
    ckpt.read("ints", part, 100000);
    CHECK(equal(part, ints.narrow(0, 100000, 170000)));
  }
  auto file_of = [&](const std::string& ending) {
    for (const auto& f : std::filesystem::directory_iterator(dir.path))
      if (f.path().string().ends_with(ending)) return f.path().string();
    FAIL("no file ending in " << ending);
    return std::string();
  };
  auto read_text = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  auto write_text = [](const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  };
  // One bit of rank 1's second block flipped: reads that touch that block fail, naming the file
  // and its elements; the others still read.
  const std::string shard = file_of("-rank1.safetensors");
  const std::string good_shard = read_text(shard);
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = header << 8 | static_cast<uint8_t>(good_shard[i]);
  std::string bad = good_shard;
  bad[8 + header + 4 * (kBlock + 1000)] ^= 0x10;
  write_text(shard, bad);
  {
    const dcp::Reader ckpt(dir.path);
    CHECK(equal(range(ckpt, 0, kHalf + kBlock), big.narrow(0, 0, kHalf + kBlock)));
    for (auto [from, to] : {std::pair<int64_t, int64_t>{0, 2 * kHalf},
                            {kHalf + kBlock - 1, kHalf + kBlock + 1},
                            {2 * kHalf - 1, 2 * kHalf}})
      CHECK_THROWS_WITH(range(ckpt, from, to),
                        Catch::Contains("-rank1.safetensors is corrupt: elements [262144, 458752) "
                                        "of chunk \"big@458752\""));
  }
  // A load whose rank 1 range holds the flipped block, after sound ones it would read in place:
  // every rank raises, and no rank's live tensor changed (rank 0's range is sound). Rank 0's
  // range starts and ends inside blocks, rank 1's starts inside one.
  run_ranks(2, [&](dist::ProcessGroupGloo& pg, Checks& c) {
    const int64_t from = pg.rank() == 0 ? 5 : kHalf + 1000;
    Tensor live = full({kHalf - 1000}, -1.0f), whole_ints = zeros({300000}, kInt64);
    const dcp::ShardedState state{{"big", {live, big.sizes(), from}},
                                  {"ints", {whole_ints, ints.sizes(), 0}}};
    EXPECT_THROWS(c, IoError, dcp::load(dir.path, state, pg), "-rank1.safetensors is corrupt");
    EXPECT(c, equal(live, full({kHalf - 1000}, -1.0f)));
    EXPECT(c, equal(whole_ints, zeros({300000}, kInt64)));
  });
  write_text(shard, good_shard);
  // The index: a changed value, a format that reads 1 (which has no checksums to check).
  const std::string index = dir.path + "/index.json", good_index = read_text(index);
  auto edited = [&](const std::string& from, const std::string& to) {
    std::string text = good_index;
    const size_t at = text.find(from);
    REQUIRE(at != std::string::npos);
    write_text(index, text.replace(at, from.size(), to));
  };
  edited("\"step\": \"3\"", "\"step\": \"4\"");
  CHECK_THROWS_WITH(dcp::Reader(dir.path), Catch::Contains("index.json: is corrupt: its CRC-32C"));
  edited("checkpoint-2", "checkpoint-1");
  CHECK_THROWS_WITH(dcp::Reader(dir.path),
                    Catch::Contains("is corrupt: format 1 with the index's checksum"));
  write_text(index, good_index);
  CHECK(dcp::Reader(dir.path).metadata().at("step") == "3");
  // The same checkpoint as format 1 wrote it, without checksums: read unchecked, the flipped
  // block and all.
  nlohmann::json older = nlohmann::json::parse(good_index);
  older.erase("crc32c");
  older["format"] = "gradwire-distributed-checkpoint-1";
  for (auto& [name, t] : older["tensors"].items())
    for (auto& chunk : t["chunks"]) chunk.erase("crc32c");
  write_text(index, older.dump(1));
  write_text(shard, bad);
  const dcp::Reader unchecked(dir.path);
  CHECK(equal(range(unchecked, 0, kHalf + kBlock), big.narrow(0, 0, kHalf + kBlock)));
  CHECK_FALSE(equal(unchecked.read("big"), big));  // nothing checked the flipped bit
  CHECK(equal(unchecked.read("ints"), ints));
}

// --- RemoteModule ------------------------------------------------------------------------------

namespace {
// x -> a (remote) -> relu -> b (remote) -> head (here).
struct Pipeline {
  std::map<std::string, dist::RemoteModule> remote;
  std::shared_ptr<nn::Linear> head;
  Pipeline(const std::string& a_on, const std::string& b_on, int64_t seed) {
    remote.emplace("a.", dist::RemoteModule(a_on, "d_linear", int64_t{4}, int64_t{6}, seed));
    remote.emplace("b.", dist::RemoteModule(b_on, "d_linear", int64_t{6}, int64_t{5}, seed + 1));
    Generator gen(static_cast<uint64_t>(seed) + 2);
    head = std::make_shared<nn::Linear>(5, 3, true, gen);
  }
  Tensor forward(const Tensor& x) {
    return head->forward(remote.at("b.").forward(remote.at("a.").forward(x).relu()));
  }
  std::vector<rpc::RRef<Tensor>> parameters() {
    auto out = remote.at("a.").remote_parameters();
    for (auto& p : remote.at("b.").remote_parameters()) out.push_back(p);
    for (const Tensor& p : head->parameters()) out.emplace_back(p);
    return out;
  }
  void train(int from, int to) {
    dist::DistributedOptimizer opt(optim::SGD::options(0.2), parameters());
    for (int step = from; step < to; ++step) {
      Generator gen(40 + static_cast<uint64_t>(step));
      Tensor x = randn({8, 4}, gen);
      Tensor y = randint(0, 3, {8}, gen);
      dist::autograd::Context ctx;
      dist::autograd::backward(ctx.id(), {nn::functional::cross_entropy(forward(x), y)});
      opt.step(ctx.id());
    }
  }
  std::vector<Tensor> values() {
    std::vector<Tensor> out;
    for (auto& p : parameters()) out.push_back(p.to_here());
    return out;
  }
};
}  // namespace

TEST_CASE(
    "RemoteModules saved on one placement load on another; training goes on as if "
    "uninterrupted",
    "[dist_checkpoint][remote_module]") {
  test::TempDir dir("gw_dcp");
  std::vector<Tensor> uninterrupted;
  {
    dist::testing::DistGroup g(2);
    rpc::Agent::Use use(g[0]);
    Pipeline p("worker1/cpu", "worker1/cpu", 3);
    p.train(0, 6);
    uninterrupted = p.values();
  }
  {
    dist::testing::DistGroup g(2);  // both modules on worker1
    rpc::Agent::Use use(g[0]);
    Pipeline p("worker1/cpu", "worker1/cpu", 3);
    p.train(0, 3);
    dcp::save(dir.path, p.remote, dcp::whole(p.head->state_dict(), "head."), {{"step", "3"}});
  }
  const dcp::Reader ckpt(dir.path);
  CHECK(ckpt.world_size() == 3);  // two owners' files and this worker's
  CHECK(ckpt.contains("a.weight"));
  CHECK(ckpt.contains("b.bias"));
  CHECK(ckpt.contains("head.weight"));
  {
    dist::testing::DistGroup g(3);  // a on worker1, b on worker2 now, all from other weights
    rpc::Agent::Use use(g[0]);
    Pipeline p("worker1/cpu", "worker2/cpu", 50);
    dcp::load(dir.path, p.remote);
    p.head->load_state_dict(dcp::Reader(dir.path).read_all("head."));
    p.train(3, 6);
    const std::vector<Tensor> resumed = p.values();
    REQUIRE(resumed.size() == uninterrupted.size());
    for (size_t i = 0; i < resumed.size(); ++i) CHECK(allclose(resumed[i], uninterrupted[i]));

    // A module whose shapes differ: its owner refuses, and says why.
    std::map<std::string, dist::RemoteModule> other;
    other.emplace(
        "a.", dist::RemoteModule("worker2/cpu", "d_linear", int64_t{4}, int64_t{7}, int64_t{1}));
    CHECK_THROWS_WITH(dcp::load(dir.path, other), Catch::Contains("weight"));
    CHECK_THROWS_AS(dcp::load(dir.path, other), RemoteError);

    // Two modules, the second of other shapes: refused before any owner loads, so a, which
    // fits and comes first, keeps its own weights.
    std::map<std::string, dist::RemoteModule> mixed;
    mixed.emplace(
        "a.", dist::RemoteModule("worker1/cpu", "d_linear", int64_t{4}, int64_t{6}, int64_t{70}));
    mixed.emplace(
        "b.", dist::RemoteModule("worker2/cpu", "d_linear", int64_t{6}, int64_t{4}, int64_t{71}));
    std::vector<Tensor> a_before;
    for (auto& w : mixed.at("a.").remote_parameters()) a_before.push_back(w.to_here());
    CHECK_THROWS_WITH(dcp::load(dir.path, mixed), Catch::Contains("size mismatch for weight"));
    std::vector<Tensor> a_after;
    for (auto& w : mixed.at("a.").remote_parameters()) a_after.push_back(w.to_here());
    REQUIRE(a_after.size() == 2);
    for (size_t i = 0; i < a_after.size(); ++i) CHECK(equal(a_after[i], a_before[i]));

    // A flipped bit in b's file (its last tensor's last byte): refused before any owner loads,
    // so a, which comes first, keeps its own weights too.
    std::string b_file;
    for (const auto& f : std::filesystem::directory_iterator(dir.path))
      if (f.path().string().ends_with("-module1.safetensors")) b_file = f.path().string();
    REQUIRE(!b_file.empty());
    std::string bytes;
    {
      std::ifstream in(b_file, std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    bytes.back() ^= 0x01;
    std::ofstream(b_file, std::ios::binary | std::ios::trunc) << bytes;
    Pipeline fresh("worker1/cpu", "worker2/cpu", 60);
    const std::vector<Tensor> before = fresh.values();
    CHECK_THROWS_WITH(dcp::load(dir.path, fresh.remote),
                      Catch::Contains("-module1.safetensors is corrupt"));
    const std::vector<Tensor> after = fresh.values();
    REQUIRE(after.size() == before.size());
    for (size_t i = 0; i < after.size(); ++i) CHECK(equal(after[i], before[i]));
  }
}

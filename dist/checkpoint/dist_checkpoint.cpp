#include "dist/checkpoint/dist_checkpoint.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <mutex>
#include <optional>
#include <random>

#include <nlohmann/json.hpp>

#include "autograd/grad_mode.h"
#include "core/checkpoint.h"
#include "core/ops.h"
#include "dist/checkpoint/index_format.h"
#include "dist/process_group/c10d.h"
#include "dist/step_lock.h"
#include "rpc/api.h"

namespace gw::dist::checkpoint {

using nlohmann::json;
namespace fs = std::filesystem;

namespace detail {  // index_format.h

size_t checksum_digits(const std::string& text, const std::string& value) {
  const std::string field = "\"crc32c\": \"" + value + "\"";
  const size_t at = text.find(field);
  return at == std::string::npos ? at : at + field.size() - 1 - value.size();
}

std::string index_checksum(std::string text, size_t at) {
  text.replace(at, 8, 8, '0');
  return crc32c_hex(crc32c(0, text.data(), text.size()));
}

std::optional<int64_t> checked_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return std::nullopt;
  return n;
}
Shape shape_of(const json& j) { return Shape(j.get<std::vector<int64_t>>()); }

std::optional<DType> parse_dtype(std::string_view s) {
  for (int i = 0; i <= static_cast<int>(DType::Float64); ++i)
    if (dtype_name(static_cast<DType>(i)) == s) return static_cast<DType>(i);
  return std::nullopt;
}

int64_t index_generation(const std::string& dir) {
  try {
    std::ifstream in(dir + "/" + kIndex);
    if (!in) return 0;
    return json::parse(in).at("generation").get<int64_t>();
  } catch (const std::exception&) {
    return 0;
  }
}

}  // namespace detail

namespace {

using namespace detail;

// --- describing what a writer holds, and who writes what -----------------------------------

// One range of a logical tensor, as a writer holds it.
struct Piece {
  std::string name;
  DType dtype = kFloat32;
  Shape shape;  // the logical tensor's
  int64_t offset = 0, numel = 0;
  bool whole() const { return offset == 0 && numel == gw::numel(shape); }
  // Its tensor's name in a shard file: the logical name for a whole tensor, else with "@offset".
  std::string key() const { return whole() ? name : name + "@" + std::to_string(offset); }
};

json shape_json(const Shape& s) { return std::vector<int64_t>(s.begin(), s.end()); }

std::vector<Piece> describe(const ShardedState& state, const char* op) {
  std::vector<Piece> out;
  for (const auto& [name, s] : state) {
    GW_CHECK(s.local.defined(), InvalidArgumentError, op, " tensor \"", name, "\" is undefined");
    const auto total_or = checked_numel(s.global_shape);
    GW_CHECK(total_or.has_value(), InvalidArgumentError, op, " tensor \"", name,
             "\" has global shape ", shape_str(s.global_shape));
    const int64_t total = *total_or, n = s.local.numel();
    GW_CHECK(s.offset >= 0 && s.offset <= total && n <= total - s.offset, IndexError, op,
             " tensor \"", name, "\": elements [", s.offset, ", ", s.offset + n,
             ") are outside its global shape ", shape_str(s.global_shape), " (", total,
             " elements)");
    out.push_back({name, s.local.dtype(), s.global_shape, s.offset, n});
  }
  return out;
}

json to_json(const std::vector<Piece>& pieces) {
  json out = json::array();
  for (const Piece& p : pieces)
    out.push_back({{"name", p.name},
                   {"dtype", dtype_name(p.dtype)},
                   {"shape", shape_json(p.shape)},
                   {"offset", p.offset},
                   {"numel", p.numel}});
  return out;
}

std::vector<Piece> pieces_from_json(const json& j) {
  std::vector<Piece> out;
  for (const json& p : j)
    out.push_back({p.at("name").get<std::string>(), *parse_dtype(p.at("dtype").get<std::string>()),
                   shape_of(p.at("shape")), p.at("offset").get<int64_t>(),
                   p.at("numel").get<int64_t>()});
  return out;
}

// The layout of a save: every logical tensor, and for each of its ranges the writer (an index
// into the writers' lists) that writes it.
struct Layout {
  struct Entry {
    DType dtype;
    Shape shape;
    std::vector<std::pair<Piece, size_t>> chunks;  // in offset order, with their writer
  };
  std::map<std::string, Entry> tensors;
  std::vector<std::vector<Piece>> writes;  // by writer
};

// Checks that the writers agree on every tensor and that its distinct ranges cover it exactly,
// then gives each range to one of the writers that hold it: the one with the fewest bytes so
// far, largest ranges first, so that replicas spread over the writers. Every rank computes the
// same layout from the same descriptions. `writer_name(w)` names a writer in errors.
Layout plan(const std::vector<std::vector<Piece>>& held,
            const std::function<std::string(size_t)>& writer_name, const char* op) {
  struct Range {
    Piece piece;
    std::vector<size_t> holders;
  };
  std::map<std::string, std::map<std::pair<int64_t, int64_t>, Range>> ranges;
  std::map<std::string, size_t> first_holder;
  Layout layout;
  for (size_t w = 0; w < held.size(); ++w)
    for (const Piece& p : held[w]) {
      auto [it, fresh] = layout.tensors.try_emplace(p.name, Layout::Entry{p.dtype, p.shape, {}});
      if (fresh) first_holder[p.name] = w;
      const Layout::Entry& e = it->second;
      GW_CHECK(e.dtype == p.dtype && e.shape == p.shape, InvalidArgumentError, op, " tensor \"",
               p.name, "\" is ", dtype_name(e.dtype), " ", shape_str(e.shape), " on ",
               writer_name(first_holder[p.name]), " but ", dtype_name(p.dtype), " ",
               shape_str(p.shape), " on ", writer_name(w));
      auto& r = ranges[p.name][{p.offset, p.numel}];
      r.piece = p;
      r.holders.push_back(w);
    }
  std::vector<const Range*> order;
  for (auto& [name, by_offset] : ranges) {
    const int64_t total = gw::numel(layout.tensors.at(name).shape);
    int64_t covered = 0;
    const Range* previous = nullptr;
    for (const auto& [key, r] : by_offset) {
      const auto [offset, numel] = key;
      if (numel == 0 && total > 0) continue;  // an empty range adds nothing
      GW_CHECK(offset <= covered, InvalidArgumentError, op, " elements [", covered, ", ", offset,
               ") of tensor \"", name, "\" ", shape_str(layout.tensors.at(name).shape),
               " are held by no rank");
      GW_CHECK(offset == covered, InvalidArgumentError, op, " tensor \"", name, "\": elements [",
               previous->piece.offset, ", ", previous->piece.offset + previous->piece.numel,
               ") on ", writer_name(previous->holders[0]), " and [", offset, ", ", offset + numel,
               ") on ", writer_name(r.holders[0]), " overlap without being the same range");
      covered = offset + numel;
      previous = &r;
      order.push_back(&r);
    }
    GW_CHECK(covered == total, InvalidArgumentError, op, " elements [", covered, ", ", total,
             ") of tensor \"", name, "\" ", shape_str(layout.tensors.at(name).shape),
             " are held by no rank");
  }
  std::stable_sort(order.begin(), order.end(), [](const Range* a, const Range* b) {
    return a->piece.numel * static_cast<int64_t>(itemsize(a->piece.dtype)) >
           b->piece.numel * static_cast<int64_t>(itemsize(b->piece.dtype));
  });
  std::vector<int64_t> bytes(held.size(), 0);
  layout.writes.resize(held.size());
  for (const Range* r : order) {
    const size_t w = *std::min_element(r->holders.begin(), r->holders.end(),
                                       [&](size_t a, size_t b) { return bytes[a] < bytes[b]; });
    bytes[w] += r->piece.numel * static_cast<int64_t>(itemsize(r->piece.dtype));
    layout.writes[w].push_back(r->piece);
    layout.tensors.at(r->piece.name).chunks.emplace_back(r->piece, w);
  }
  for (auto& [name, e] : layout.tensors)
    std::sort(e.chunks.begin(), e.chunks.end(),
              [](const auto& a, const auto& b) { return a.first.offset < b.first.offset; });
  return layout;
}

// --- files -----------------------------------------------------------------------------------

// A save's name: its generation, one more than the directory's last, and a random nonce, so
// that its files are told apart from any other save's.
struct SaveId {
  int64_t generation = 0;
  std::string nonce;
  // "<generation>-<nonce>-<writer>.safetensors"
  std::string file(const std::string& writer) const {
    return std::to_string(generation) + "-" + nonce + "-" + writer + ".safetensors";
  }
};

std::string random_nonce() {
  std::random_device device;
  char out[9];
  std::snprintf(out, sizeof out, "%08x", static_cast<unsigned>(device()));
  return out;
}

// The generation a file of a save belongs to, or -1 for any other file.
int64_t generation_of(const std::string& file) {
  int64_t g = -1;
  const auto [end, ec] = std::from_chars(file.data(), file.data() + file.size(), g);
  if (ec != std::errc() || end == file.data() || *end != '-' ||
      file.find(".safetensors") == std::string::npos)
    return -1;
  return g;
}

// Calls f with the name of every entry of `dir` (none if it cannot be read).
void for_each_file(const std::string& dir, const std::function<void(const std::string&)>& f) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    f(it->path().filename().string());
}

// A new save's name: one more than any generation in `dir`, its index's or its files'.
SaveId next_save(const std::string& dir, const char* op) {
  int64_t last = index_generation(dir);
  for_each_file(dir, [&](const std::string& f) { last = std::max(last, generation_of(f)); });
  GW_CHECK(last < std::numeric_limits<int64_t>::max(), IoError, op, " '", dir,
           "' holds a checkpoint of generation ", last, ": no later one can be numbered");
  return {last + 1, random_nonce()};
}

void create_dir(const std::string& dir, const char* op) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  GW_CHECK(!ec, IoError, op, " cannot create directory '", dir, "': ", ec.message());
}

// Writes the pieces of `state` that `writes` lists into `dir`/`file`; returns each one's bytes'
// CRC-32C, kCrcBlock bytes at a time, by its key in the file.
json write_shard(const std::string& dir, const std::string& file, int64_t generation,
                 const ShardedState& state, const std::vector<Piece>& writes, const char* op) {
  if (writes.empty()) return json::object();
  NamedTensors tensors;
  for (const Piece& p : writes) {
    const Tensor& local = state.at(p.name).local;
    GW_CHECK(
        tensors.emplace(p.key(), p.whole() ? local.reshape(p.shape) : local.reshape({-1})).second,
        InvalidArgumentError, op, " tensor \"", p.name, "\" at ", p.offset,
        " and a whole tensor named \"", p.key(), "\" would share a key");
  }
  const std::vector<uint8_t> bytes =
      to_safetensors(tensors, {{"format", kFormat}, {"generation", std::to_string(generation)}});
  // The data section holds the tensors' bytes in key order, one after another.
  json sums = json::object();
  size_t at = 8 + safetensors_header_length(bytes);
  for (const auto& [key, t] : tensors) {
    const size_t n = t.nbytes();
    json blocks = json::array();
    for (size_t b = 0; b < n; b += kCrcBlock)
      blocks.push_back(crc32c(0, bytes.data() + at + b, std::min<size_t>(kCrcBlock, n - b)));
    sums[key] = std::move(blocks);
    at += n;
  }
  GW_CHECK(at == bytes.size(), InternalError, op, " ", file, ": its tensors' bytes end at ", at,
           " of ", bytes.size());
  write_file_atomically(dir + "/" + file, bytes.data(), bytes.size(), op);
  return sums;
}

// Writes the index that makes save `id` the checkpoint, then removes the files of older
// generations. `sums`: what each writer's write_shard returned. Refuses when a save of this
// generation or a later one got there first: two jobs saved into one directory at once.
void write_index(const std::string& dir, const SaveId& id, int world_size,
                 const std::map<std::string, std::string>& metadata, const Layout& layout,
                 const std::function<std::string(size_t)>& file_of, const std::vector<json>& sums,
                 const char* op) {
  json tensors = json::object();
  for (const auto& [name, e] : layout.tensors) {
    json chunks = json::array();
    for (const auto& [p, w] : e.chunks)
      chunks.push_back({{"file", file_of(w)},
                        {"key", p.key()},
                        {"offset", p.offset},
                        {"numel", p.numel},
                        {"crc32c", sums.at(w).at(p.key())}});
    tensors[name] = {
        {"dtype", dtype_name(e.dtype)}, {"shape", shape_json(e.shape)}, {"chunks", chunks}};
  }
  const std::string zeros(8, '0');
  std::string text =
      json{{"crc32c", zeros},          {"format", kFormat},    {"generation", id.generation},
           {"world_size", world_size}, {"metadata", metadata}, {"tensors", tensors}}
          .dump(1) +
      "\n";
  const size_t at = checksum_digits(text, zeros);
  GW_CHECK(at != std::string::npos, InternalError, op, " the index's checksum has no place");
  text.replace(at, 8, index_checksum(text, at));
  const int64_t found = index_generation(dir);
  GW_CHECK(found < id.generation, IoError, op, " '", dir, "' got a checkpoint of generation ",
           found, " while this save (generation ", id.generation,
           ") ran: one job at a time may save into a directory");
  write_file_atomically(dir + "/" + kIndex, text.data(), text.size(), op);
  for_each_file(dir, [&](const std::string& f) {
    const int64_t g = generation_of(f);
    std::error_code ignored;  // best effort: the index is in place
    if (g >= 0 && g < id.generation) fs::remove(dir + "/" + f, ignored);
  });
}

// --- agreeing across ranks -----------------------------------------------------------------

// Runs f on every rank and gathers its result; when f threw on any rank, every rank throws: the
// failing rank its own error, the others the first failing rank's, as a RemoteFailure naming it.
std::vector<json> gather_or_throw(ProcessGroup& group, const std::function<json()>& f) {
  std::exception_ptr mine;
  json message;
  try {
    message = {{"ok", f()}};
  } catch (const Error& e) {
    mine = std::current_exception();
    message = {{"code", static_cast<int>(e.code())}, {"error", e.what()}};
  } catch (const std::exception& e) {
    mine = std::current_exception();
    message = {{"code", static_cast<int>(ErrorCode::kRemote)}, {"error", e.what()}};
  } catch (...) {
    mine = std::current_exception();
    message = {{"code", static_cast<int>(ErrorCode::kRemote)}, {"error", "unknown error"}};
  }
  // A message may hold a path in any bytes: invalid UTF-8 is replaced, never thrown on.
  const std::string text = message.dump(-1, ' ', false, json::error_handler_t::replace);
  std::vector<json> out;
  for (const auto& bytes : all_gather_bytes(group, {text.begin(), text.end()}))
    out.push_back(json::parse(bytes.begin(), bytes.end()));
  if (mine) std::rethrow_exception(mine);
  for (size_t r = 0; r < out.size(); ++r)
    if (out[r].contains("error"))
      std::rethrow_exception(remote_failure(static_cast<ErrorCode>(out[r].at("code").get<int>()),
                                            "rank " + std::to_string(r),
                                            out[r].at("error").get<std::string>()));
  for (json& j : out) j = std::move(j.at("ok"));
  return out;
}

}  // namespace

ShardedState whole(const NamedTensors& tensors, const std::string& prefix) {
  ShardedState out;
  for (const auto& [name, t] : tensors)
    out.emplace(prefix + name, Shard{t, t.defined() ? t.sizes() : Shape{}, 0});
  return out;
}

void on_every_rank(ProcessGroup& group, const std::function<void()>& f) {
  gather_or_throw(group, [&] {
    f();
    return json();
  });
}

void save(const std::string& dir, const ShardedState& state, ProcessGroup& group,
          const std::map<std::string, std::string>& metadata) {
  constexpr const char* op = "[checkpoint::save]";
  const int me = group.rank();
  // 1. Every rank's description; rank 0 picks the generation.
  const std::vector<json> described = gather_or_throw(group, [&] {
    json j = {{"pieces", to_json(describe(state, op))}};
    if (me == 0) {
      create_dir(dir, op);
      const SaveId id = next_save(dir, op);
      j["generation"] = id.generation;
      j["nonce"] = id.nonce;
    }
    return j;
  });
  const SaveId id{described[0].at("generation").get<int64_t>(),
                  described[0].at("nonce").get<std::string>()};
  std::vector<std::vector<Piece>> held;
  for (const json& j : described) held.push_back(pieces_from_json(j.at("pieces")));
  auto rank_name = [](size_t r) { return "rank " + std::to_string(r); };
  auto file_of = [&id](size_t r) { return id.file("rank" + std::to_string(r)); };
  const Layout layout = plan(held, rank_name, op);  // the same verdict on every rank
  // 2. Every rank's file, and its checksums; 3. once all are on disk, the index.
  const std::vector<json> sums = gather_or_throw(group, [&] {
    return write_shard(dir, file_of(static_cast<size_t>(me)), id.generation, state,
                       layout.writes[static_cast<size_t>(me)], op);
  });
  gather_or_throw(group, [&] {
    if (me == 0) write_index(dir, id, group.size(), metadata, layout, file_of, sums, op);
    return json();
  });
}

// --- RemoteModule ----------------------------------------------------------------------------

namespace {
// Waits for every future, so that no owner is still at work when this returns; rethrows the
// first failure.
template <typename T>
void wait_all(std::vector<Future<T>>& futures) {
  std::exception_ptr failed;
  for (auto& f : futures) {
    try {
      f.wait();
    } catch (...) {
      if (!failed) failed = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);
}

// On a module's owner: writes its state_dict, whole, as `file` of `dir`; returns the pieces and
// their checksums.
std::string write_module(std::shared_ptr<nn::Module> module, std::string dir, std::string file,
                         std::string prefix, int64_t generation) {
  constexpr const char* op = "[checkpoint::save]";
  ShardedState state;
  {
    std::lock_guard lock(optimizer_step_lock());  // not mid-update
    for (auto& [name, t] : whole(module->state_dict(), prefix))
      state.emplace(name, Shard{t.local.clone(), t.global_shape, 0});
  }
  const std::vector<Piece> pieces = describe(state, op);
  const json sums = write_shard(dir, file, generation, state, pieces, op);
  return json{{"pieces", to_json(pieces)}, {"sums", sums}}.dump();
}

// On a module's owner: the checkpoint in `dir`, the one of `generation` that the caller checked
// (a save that landed since is refused).
Reader open_generation(const std::string& dir, int64_t generation) {
  Reader reader(dir);
  GW_CHECK(reader.generation() == generation, IoError, "[checkpoint::load] the checkpoint in '",
           dir, "' was replaced while it loaded (generation ", reader.generation(), ", not ",
           generation, ")");
  return reader;
}

// On a module's owner: refuses, as load_state_dict would, a checkpoint whose names or shapes
// under `prefix` do not fit the module; reads no tensor's bytes (so the values of a tied
// parameter saved under several names are compared by the read only).
void check_module(std::shared_ptr<nn::Module> module, std::string dir, std::string prefix,
                  int64_t generation) {
  const Reader reader = open_generation(dir, generation);
  // Stand-ins of the saved shapes: views of one element per dtype, which tied names then share
  // (load_state_dict compares the values of tied names in different memory).
  std::map<DType, Tensor> one;
  NamedTensors saved;
  for (auto it = reader.tensors().lower_bound(prefix);
       it != reader.tensors().end() && it->first.starts_with(prefix); ++it) {
    auto [element, fresh] = one.try_emplace(it->second.dtype);
    if (fresh) element->second = zeros({}, it->second.dtype);
    saved.emplace(it->first.substr(prefix.size()), element->second.expand(it->second.shape));
  }
  module->check_state_dict(saved, /*strict=*/true);
}

// On a module's owner: loads its state_dict from the checkpoint in `dir`.
void read_module(std::shared_ptr<nn::Module> module, std::string dir, std::string prefix,
                 int64_t generation) {
  NamedTensors state = open_generation(dir, generation).read_all(prefix);
  std::lock_guard lock(optimizer_step_lock());
  module->load_state_dict(state, /*strict=*/true);
}
}  // namespace

namespace detail {
void register_owner_functions() {
  static std::once_flag once;
  std::call_once(once, [] {
    rpc::functions().add("nn.Module.checkpoint_write", &write_module);
    rpc::functions().add("nn.Module.checkpoint_check", &check_module);
    rpc::functions().add("nn.Module.checkpoint_read", &read_module);
  });
}
}  // namespace detail

void save(const std::string& dir, const std::map<std::string, RemoteModule>& modules,
          const ShardedState& local, const std::map<std::string, std::string>& metadata) {
  constexpr const char* op = "[checkpoint::save]";
  create_dir(dir, op);
  const SaveId id = next_save(dir, op);
  // Writer k < modules.size() is the k-th module's owner; the last is this worker.
  std::vector<std::string> files;
  std::vector<Future<std::string>> written;
  for (const auto& [prefix, m] : modules) {
    files.push_back(id.file("module" + std::to_string(files.size())));
    written.push_back(m.get_module_rref().rpc_async<std::string>(
        "checkpoint_write", dir, files.back(), prefix, id.generation));
  }
  files.push_back(id.file("local"));
  std::vector<std::vector<Piece>> held;
  std::vector<json> sums;
  wait_all(written);
  for (auto& w : written) {
    json j = json::parse(w.wait());
    held.push_back(pieces_from_json(j.at("pieces")));
    sums.push_back(std::move(j.at("sums")));
  }
  held.push_back(describe(local, op));
  std::vector<std::string> names;
  for (const auto& [prefix, m] : modules) names.push_back("the module under \"" + prefix + "\"");
  names.push_back("this worker");
  const Layout layout = plan(
      held, [&](size_t w) { return names[w]; }, op);
  // The modules' files hold what they described; this worker's holds its share of `local`.
  sums.push_back(write_shard(dir, files.back(), id.generation, local, layout.writes.back(), op));
  write_index(
      dir, id, static_cast<int>(modules.size()) + 1, metadata, layout,
      [&](size_t w) { return files[w]; }, sums, op);
}

void load(const std::string& dir, const std::map<std::string, RemoteModule>& modules) {
  // A missing or damaged checkpoint fails here, before any owner loads: the index, and the bytes
  // of every module's tensors; then one that does not fit a module (its names or shapes).
  const Reader reader(dir);
  for (const auto& [prefix, m] : modules)
    for (auto it = reader.tensors().lower_bound(prefix);
         it != reader.tensors().end() && it->first.starts_with(prefix); ++it)
      reader.verify(it->first, 0, gw::numel(it->second.shape));
  std::vector<Future<void>> checked;
  for (const auto& [prefix, m] : modules)
    checked.push_back(
        m.get_module_rref().rpc_async<void>("checkpoint_check", dir, prefix, reader.generation()));
  wait_all(checked);
  std::vector<Future<void>> done;
  for (const auto& [prefix, m] : modules)
    done.push_back(
        m.get_module_rref().rpc_async<void>("checkpoint_read", dir, prefix, reader.generation()));
  wait_all(done);
}

}  // namespace gw::dist::checkpoint

#include "dist/checkpoint/dist_checkpoint.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>

#include <nlohmann/json.hpp>

#include "autograd/grad_mode.h"
#include "core/checkpoint.h"
#include "core/ops.h"
#include "dist/checkpoint/index_format.h"

// The reading half of dist_checkpoint.h: Reader, which opens an index and its files and reads
// ranges of logical tensors, checking their blocks; and load().
namespace gw::dist::checkpoint {

using nlohmann::json;
using namespace detail;
namespace fs = std::filesystem;

Reader::Reader(const std::string& dir) : dir_(dir) {
  // A save that lands between reading the index and opening its files removes those files; the
  // index has changed then, and is read again (twice more at most: saves take longer).
  for (int attempt = 0;; ++attempt) {
    try {
      open();
      return;
    } catch (const IoError&) {
      if (attempt == 2 || index_generation(dir_) == generation_) throw;
    }
  }
}

void Reader::open() {
  tensors_.clear();
  chunks_.clear();
  files_.clear();
  const std::string path = dir_ + "/" + kIndex;
  const std::string where = "[checkpoint::Reader] " + path + ": ";
  std::error_code ec;
  GW_CHECK(fs::exists(path, ec), IoError, "[checkpoint::Reader] no checkpoint in '", dir_, "' (no ",
           kIndex, ")");
  try {
    std::ifstream in(path);
    GW_CHECK(in, IoError, where, "cannot be opened");
    const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    const json index = json::parse(text);
    // First: an index that fails its checks is refused at once (the constructor reads again only
    // one whose generation changed meanwhile).
    generation_ = index.at("generation").get<int64_t>();
    const bool format1 = index.at("format") == kFormat1;
    GW_CHECK(format1 || index.at("format") == kFormat, IoError, where, "format ",
             index.at("format").dump(), " is neither ", kFormat1, " nor ", kFormat);
    // Format 2 carries its checksum; format 1 has none (one that does was format 2).
    GW_CHECK(format1 != index.contains("crc32c"), IoError, where, "is corrupt: format ",
             format1 ? 1 : 2, " with", format1 ? "" : "out", " the index's checksum");
    if (!format1) {
      const std::string recorded = index.at("crc32c").get<std::string>();
      const size_t at = checksum_digits(text, recorded);
      const std::string sum = at == std::string::npos ? "" : index_checksum(text, at);
      GW_CHECK(sum == recorded, IoError, where, "is corrupt: its CRC-32C is ",
               sum.empty() ? "not where the save writes it" : sum, ", the index recorded ",
               recorded);
    }
    world_size_ = index.at("world_size").get<int>();
    metadata_ = index.at("metadata").get<std::map<std::string, std::string>>();
    for (const auto& [name, t] : index.at("tensors").items()) {
      const std::string dtype = t.at("dtype").get<std::string>();
      const auto parsed = parse_dtype(dtype);
      GW_CHECK(parsed.has_value(), IoError, where, "tensor \"", name, "\" has dtype \"", dtype,
               "\"");
      const Shape shape = shape_of(t.at("shape"));
      const auto total = checked_numel(shape);
      GW_CHECK(total.has_value(), IoError, where, "tensor \"", name, "\" has shape ",
               shape_str(shape));
      std::vector<Chunk> chunks;
      int64_t covered = 0;
      for (const json& c : t.at("chunks")) {
        Chunk chunk{c.at("file").get<std::string>(),
                    c.at("key").get<std::string>(),
                    c.at("offset").get<int64_t>(),
                    c.at("numel").get<int64_t>(),
                    {}};
        for (const json& sum : format1 ? json::array() : c.at("crc32c")) {
          GW_CHECK(sum.is_number_unsigned() && sum.get<uint64_t>() <= 0xffffffffu, IoError, where,
                   "tensor \"", name, "\" has checksum ", sum.dump());
          chunk.sums.push_back(sum.get<uint32_t>());
        }
        GW_CHECK(!chunk.file.empty() && chunk.file.find('/') == std::string::npos &&
                     chunk.file != "." && chunk.file != "..",
                 IoError, where, "tensor \"", name, "\" names file \"", chunk.file,
                 "\" outside the checkpoint");
        GW_CHECK(chunk.offset == covered && chunk.numel >= 0 && chunk.numel <= *total - covered,
                 IoError, where, "tensor \"", name, "\" has a chunk of ", chunk.numel,
                 " elements at ", chunk.offset, " where elements from ", covered, " of ", *total,
                 " were expected");
        const int64_t bytes = chunk.numel * static_cast<int64_t>(itemsize(*parsed));
        GW_CHECK(format1 ||
                     static_cast<int64_t>(chunk.sums.size()) == (bytes + kCrcBlock - 1) / kCrcBlock,
                 IoError, where, "tensor \"", name, "\" has ", chunk.sums.size(),
                 " checksums for a chunk of ", bytes, " bytes");
        covered += chunk.numel;
        chunks.push_back(std::move(chunk));
      }
      GW_CHECK(covered == *total, IoError, where, "the chunks of tensor \"", name, "\" hold ",
               covered, " of its ", *total, " elements");
      tensors_.emplace(name, TensorInfo{*parsed, shape});
      chunks_.emplace(name, std::move(chunks));
    }
  } catch (const json::exception& e) {
    throw IoError(where + "not a valid index: " + e.what());
  }
  // Opened now: a later save removes these files, and an open file outlives its name.
  for (const auto& [name, chunks] : chunks_)
    for (const Chunk& c : chunks)
      if (!files_.contains(c.file))
        files_.emplace(c.file, std::make_unique<SafetensorsFile>(dir_ + "/" + c.file));
}

const SafetensorsFile& Reader::file(const std::string& name) const { return *files_.at(name); }

const Reader::TensorInfo& Reader::info(const std::string& name) const {
  auto it = tensors_.find(name);
  GW_CHECK(it != tensors_.end(), IndexError, "[checkpoint::Reader] the checkpoint in '", dir_,
           "' has no tensor \"", name, "\"");
  return it->second;
}

void Reader::check(const std::string& name, const Tensor& dst, int64_t offset) const {
  const TensorInfo& saved = info(name);
  GW_CHECK(dst.defined(), InvalidArgumentError, "[checkpoint::Reader] read \"", name,
           "\": the destination is undefined");
  GW_CHECK(dst.dtype() == saved.dtype, InvalidArgumentError, "[checkpoint::Reader] tensor \"", name,
           "\" is ", dtype_name(saved.dtype), " in the checkpoint but the destination is ",
           dtype_name(dst.dtype()));
  check_range(name, offset, dst.numel());
}

void Reader::check_range(const std::string& name, int64_t offset, int64_t n) const {
  const Shape& shape = info(name).shape;
  const int64_t total = gw::numel(shape);
  GW_CHECK(offset >= 0 && n >= 0 && offset <= total && n <= total - offset, IndexError,
           "[checkpoint::Reader] ", n, " elements from ", offset, " are outside tensor \"", name,
           "\" ", shape_str(shape), " (", total, " elements)");
}

void Reader::read(const std::string& name, const Tensor& dst, int64_t offset) const {
  check(name, dst, offset);
  const TensorInfo& info = tensors_.at(name);
  const int64_t n = dst.numel();
  const bool direct = dst.device() == kCPU && dst.is_contiguous();
  Tensor into = direct ? dst : empty({n}, info.dtype);
  // Written in place below, as copy_ would: its version moves (first, so that a read that fails
  // halfway counts as a write too; fully_shard regathers what it kept from it).
  if (direct) dst.bump_version();
  auto* out = static_cast<uint8_t*>(into.raw_data());
  const int64_t item = static_cast<int64_t>(itemsize(info.dtype));
  for (const Chunk& c : chunks_.at(name)) {
    const int64_t lo = std::max(offset, c.offset), hi = std::min(offset + n, c.offset + c.numel);
    if (lo >= hi) continue;
    read_chunk(name, c, lo - c.offset, hi - c.offset, out + (lo - offset) * item);
  }
  if (!direct) {
    gw::autograd::NoGradGuard no_grad;
    dst.detach().copy_(into.view(dst.sizes()));
  }
}

const SafetensorsFile& Reader::file_holding(const std::string& name, const Chunk& c) const {
  const DType dtype = tensors_.at(name).dtype;
  const SafetensorsFile& f = file(c.file);
  auto it = f.tensors().find(c.key);
  GW_CHECK(it != f.tensors().end() && it->second.dtype == dtype &&
               gw::numel(it->second.shape) == c.numel,
           IoError, "[checkpoint::Reader] ", f.path(), " does not hold chunk \"", c.key,
           "\" of tensor \"", name, "\" as the index says (", dtype_name(dtype), ", ", c.numel,
           " elements)");
  return f;
}

int64_t Reader::block_elements(const std::string& name) const {
  return kCrcBlock / static_cast<int64_t>(itemsize(tensors_.at(name).dtype));
}

void Reader::check_block(const std::string& name, const Chunk& c, int64_t b,
                         const uint8_t* bytes) const {
  const int64_t per = block_elements(name);
  const int64_t lo = b * per, hi = std::min((b + 1) * per, c.numel);
  const auto item = static_cast<int64_t>(itemsize(tensors_.at(name).dtype));
  const uint32_t sum = crc32c(0, bytes, static_cast<size_t>((hi - lo) * item));
  GW_CHECK(sum == c.sums[static_cast<size_t>(b)], IoError, "[checkpoint::Reader] ",
           file(c.file).path(), " is corrupt: elements [", lo, ", ", hi, ") of chunk \"", c.key,
           "\" of tensor \"", name, "\" have CRC-32C ", crc32c_hex(sum), ", the index recorded ",
           crc32c_hex(c.sums[static_cast<size_t>(b)]));
}

void Reader::read_chunk(const std::string& name, const Chunk& c, int64_t from, int64_t to,
                        uint8_t* out) const {
  const SafetensorsFile& f = file_holding(name, c);
  if (c.sums.empty()) {  // format 1: unchecked
    f.read(c.key, from, to - from, out);
    return;
  }
  const auto item = static_cast<int64_t>(itemsize(tensors_.at(name).dtype));
  const int64_t per = block_elements(name);
  auto end_of = [&](int64_t b) { return std::min((b + 1) * per, c.numel); };
  // A block the range starts or ends inside: read whole aside, checked, and its part copied.
  std::vector<uint8_t> aside;
  auto partly = [&](int64_t b) {
    const int64_t lo = b * per, hi = end_of(b);
    aside.resize(static_cast<size_t>((hi - lo) * item));
    f.read(c.key, lo, hi - lo, aside.data());
    check_block(name, c, b, aside.data());
    const int64_t a = std::max(lo, from), z = std::min(hi, to);
    std::memcpy(out + (a - from) * item, aside.data() + (a - lo) * item,
                static_cast<size_t>((z - a) * item));
  };
  int64_t b = from / per;
  if (b * per < from) partly(b++);
  // The blocks the range holds whole: read in place at once, then checked.
  const int64_t first = b;
  while (b * per < to && end_of(b) <= to) ++b;
  if (b > first) {
    f.read(c.key, first * per, end_of(b - 1) - first * per, out + (first * per - from) * item);
    for (int64_t k = first; k < b; ++k) check_block(name, c, k, out + (k * per - from) * item);
  }
  if (b * per < to) partly(b);
}

void Reader::verify(const std::string& name, int64_t offset, int64_t n) const {
  check_range(name, offset, n);
  const auto item = static_cast<int64_t>(itemsize(tensors_.at(name).dtype));
  const int64_t per = block_elements(name);
  std::vector<uint8_t> block;
  for (const Chunk& c : chunks_.at(name)) {
    const int64_t lo = std::max(offset, c.offset), hi = std::min(offset + n, c.offset + c.numel);
    if (lo >= hi) continue;
    const SafetensorsFile& f = file_holding(name, c);
    if (c.sums.empty()) continue;  // format 1: nothing to check against
    for (int64_t b = (lo - c.offset) / per; b * per < hi - c.offset; ++b) {
      const int64_t first = b * per, last = std::min((b + 1) * per, c.numel);
      block.resize(static_cast<size_t>((last - first) * item));
      f.read(c.key, first, last - first, block.data());
      check_block(name, c, b, block.data());
    }
  }
}

Tensor Reader::read(const std::string& name) const {
  const TensorInfo& saved = info(name);
  Tensor t = empty(saved.shape, saved.dtype);
  read(name, t);
  return t;
}

NamedTensors Reader::read_all(const std::string& prefix) const {
  NamedTensors out;
  for (auto it = tensors_.lower_bound(prefix);
       it != tensors_.end() && it->first.starts_with(prefix); ++it)
    out.emplace(it->first.substr(prefix.size()), read(it->first));
  return out;
}

void load(const Reader& checkpoint, const ShardedState& state, ProcessGroup& group) {
  // Everything is checked on every rank before anything is read into the live tensors.
  on_every_rank(group, [&] {
    for (const auto& [name, s] : state) {
      GW_CHECK(checkpoint.contains(name), IndexError, "[checkpoint::load] the checkpoint in '",
               checkpoint.dir(), "' has no tensor \"", name, "\"");
      const Shape& saved = checkpoint.tensors().at(name).shape;
      GW_CHECK(saved == s.global_shape, ShapeError, "[checkpoint::load] tensor \"", name, "\" is ",
               shape_str(saved), " in the checkpoint but ", shape_str(s.global_shape), " here");
      checkpoint.check(name, s.local, s.offset);  // dtype and range
    }
    // The bytes too, block by block: a damaged block then changes no rank's live tensors.
    for (const auto& [name, s] : state) checkpoint.verify(name, s.offset, s.local.numel());
  });
  on_every_rank(group, [&] {
    for (const auto& [name, s] : state) checkpoint.read(name, s.local, s.offset);
  });
}

void load(const std::string& dir, const ShardedState& state, ProcessGroup& group) {
  std::unique_ptr<Reader> reader;
  on_every_rank(group, [&] { reader = std::make_unique<Reader>(dir); });
  load(*reader, state, group);
}

}  // namespace gw::dist::checkpoint

#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>
#include <utility>

#include "common/errors.h"
#include "common/fnv1a.h"
#include "common/json_depth.h"
#include "common/json_type.h"

namespace torchtpu {
namespace {

using nlohmann::json;

// The Rust reader's MAX_HEADER_SIZE: a larger length is a corrupt file, not a real header.
constexpr uint64_t kMaxHeaderSize = 100'000'000;

struct DtypeInfo {
  Dtype dtype;
  const char* name;
  size_t size;
};

constexpr DtypeInfo kDtypes[] = {
    {Dtype::kBool, "BOOL", 1}, {Dtype::kU8, "U8", 1},   {Dtype::kI8, "I8", 1},
    {Dtype::kI16, "I16", 2},   {Dtype::kU16, "U16", 2}, {Dtype::kF16, "F16", 2},
    {Dtype::kBF16, "BF16", 2}, {Dtype::kI32, "I32", 4}, {Dtype::kU32, "U32", 4},
    {Dtype::kF32, "F32", 4},   {Dtype::kF64, "F64", 8}, {Dtype::kI64, "I64", 8},
    {Dtype::kU64, "U64", 8},
};

const DtypeInfo& info(Dtype d) {
  for (const auto& i : kDtypes) {
    if (i.dtype == d) return i;
  }
  throw ValueError("unknown Dtype value " + std::to_string(static_cast<int>(d)));
}

uint64_t read_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// numel x element size, or false on overflow.
bool tensor_nbytes(const std::vector<int64_t>& shape, size_t elem, uint64_t* out) {
  uint64_t n = elem;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  }
  *out = n;
  return true;
}

// Parses the header text, rejecting duplicate keys at any level (nlohmann keeps the last one
// silently; the Rust reader refuses them) and nesting deeper than kMaxJsonDepth (real headers nest
// two levels: an entry, its shape).
json parse_header_json(const char* begin, size_t size, const std::string& path) {
  std::vector<std::set<std::string>> keys_at_depth;
  std::string duplicate;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t event, json& parsed) {
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
        depth >= kMaxJsonDepth) {
      throw FormatError(path + ": invalid header JSON: arrays and objects nest deeper than " +
                        std::to_string(kMaxJsonDepth) + " levels");
    }
    if (event == json::parse_event_t::object_start) {
      if (keys_at_depth.size() <= static_cast<size_t>(depth)) keys_at_depth.resize(depth + 1);
      keys_at_depth[depth].clear();
    } else if (event == json::parse_event_t::key) {
      auto& keys = keys_at_depth[depth - 1];
      if (!keys.insert(parsed.get<std::string>()).second && duplicate.empty()) {
        duplicate = parsed.get<std::string>();
      }
    }
    return true;
  };
  json header;
  try {
    header = json::parse(begin, begin + size, cb);
  } catch (const json::exception& e) {
    throw FormatError(path + ": invalid header JSON: " + json_error_text(e));
  }
  if (!duplicate.empty()) {
    throw FormatError(path + ": invalid header JSON: duplicate key \"" + duplicate + "\"");
  }
  return header;
}

uint64_t unsigned_field(const json& v, const std::string& what) {
  if (!v.is_number_unsigned())
    throw FormatError(what + " must be a non-negative integer, got " + v.dump());
  return v.get<uint64_t>();
}

}  // namespace

Dtype parse_dtype(const std::string& s, const std::string& where) {
  for (const auto& i : kDtypes) {
    if (s == i.name) return i.dtype;
  }
  throw FormatError(where + ": unknown dtype \"" + s + "\"");
}

const char* dtype_name(Dtype d) { return info(d).name; }
size_t dtype_size(Dtype d) { return info(d).size; }

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

uint64_t fingerprint(const std::vector<const TensorView*>& views) {
  constexpr size_t kEdge = 64;
  uint64_t hash = kFnvOffset;
  auto mix = [&hash](const void* bytes, size_t n) {
    hash = fnv1a(hash, static_cast<const uint8_t*>(bytes), n);
  };
  for (const TensorView* view : views) {
    mix(view->name.data(), view->name.size() + 1);  // the NUL ends the name
    const auto dtype = static_cast<uint8_t>(view->dtype);
    mix(&dtype, 1);
    const uint64_t rank = view->shape.size();
    mix(&rank, sizeof rank);
    mix(view->shape.data(), rank * sizeof(int64_t));
    const size_t edge = std::min(kEdge, view->nbytes);
    mix(view->data, edge);
    mix(view->data + view->nbytes - edge, edge);
  }
  return hash;
}

void release_pages(const TensorView& view) {
  if (view.nbytes == 0) return;
  // Views only ever point into MappedFile's read-only MAP_SHARED mappings, where MADV_DONTNEED
  // discards nothing but page-table entries (on anonymous memory it would zero the data).
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(view.data) & ~(page - 1);
  const auto end = reinterpret_cast<uintptr_t>(view.data) + view.nbytes;
  ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw NotFoundError("cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    int err = errno;
    ::close(fd);
    throw NotFoundError("cannot map " + path + ": " +
                        (S_ISREG(st.st_mode) ? std::strerror(err) : "not a regular file"));
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      throw NotFoundError("cannot map " + path + ": " + std::strerror(err));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping keeps its own reference to the file
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

SafetensorsTable parse_safetensors(const uint8_t* data, size_t size, const std::string& path) {
  if (size < 8) {
    throw FormatError(path + ": truncated file: " + std::to_string(size) +
                      " bytes, shorter than the 8-byte header length");
  }
  const uint64_t header_len = read_le64(data);
  if (header_len > size - 8) {
    throw FormatError(path + ": header length " + std::to_string(header_len) +
                      " runs past the end of the file (" + std::to_string(size) + " bytes)");
  }
  if (header_len > kMaxHeaderSize) {
    throw FormatError(path + ": header length " + std::to_string(header_len) +
                      " exceeds the limit of " + std::to_string(kMaxHeaderSize) + " bytes");
  }
  const json header = parse_header_json(reinterpret_cast<const char*>(data) + 8, header_len, path);
  if (!header.is_object()) {
    throw FormatError(path + ": invalid header JSON: expected an object, got " +
                      std::string(header.type_name()));
  }
  const uint8_t* buffer = data + 8 + header_len;
  const uint64_t buffer_size = size - 8 - header_len;

  SafetensorsTable table;
  struct Extent {
    uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Extent> extents;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) {
        throw FormatError(path + ": __metadata__ must be an object of strings, got " +
                          entry.dump());
      }
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) {
          throw FormatError(path + ": __metadata__ value for \"" + k + "\" must be a string, got " +
                            v.dump());
        }
        table.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string where = path + ": tensor " + name;
    if (!entry.is_object())
      throw FormatError(where + ": entry must be an object, got " + entry.dump());
    for (const char* field : {"dtype", "shape", "data_offsets"}) {
      if (!entry.contains(field)) throw FormatError(where + ": missing field \"" + field + "\"");
    }
    TensorView t;
    t.name = name;
    t.file = path;
    if (!entry["dtype"].is_string()) {
      throw FormatError(where + ": dtype must be a string, got " + entry["dtype"].dump());
    }
    t.dtype = parse_dtype(entry["dtype"].get<std::string>(), where);
    const json& shape = entry["shape"];
    if (!shape.is_array())
      throw FormatError(where + ": shape must be an array, got " + shape.dump());
    for (const json& d : shape) {
      if (d.is_number_integer() && d.get<int64_t>() < 0 && !d.is_number_unsigned()) {
        throw FormatError(where + ": negative dimension " + d.dump() + " in shape " + shape.dump());
      }
      const uint64_t dim = unsigned_field(d, where + ": shape " + shape.dump() + " dimension");
      if (dim > static_cast<uint64_t>(INT64_MAX)) {
        throw FormatError(where + ": dimension " + d.dump() + " is too large");
      }
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    const json& offsets = entry["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2) {
      throw FormatError(where + ": data_offsets must be [begin, end], got " + offsets.dump());
    }
    const uint64_t begin = unsigned_field(offsets[0], where + ": data_offsets begin");
    const uint64_t end = unsigned_field(offsets[1], where + ": data_offsets end");
    if (begin > end) {
      throw FormatError(where + ": data_offsets begin " + std::to_string(begin) +
                        " is greater than end " + std::to_string(end));
    }
    if (end > buffer_size) {
      throw FormatError(where + ": data_offsets [" + std::to_string(begin) + ", " +
                        std::to_string(end) + "] out of range: the data buffer has " +
                        std::to_string(buffer_size) + " bytes (file truncated?)");
    }
    uint64_t expected = 0;
    if (!tensor_nbytes(t.shape, dtype_size(t.dtype), &expected)) {
      throw FormatError(where + ": shape " + shape.dump() + " overflows 64-bit byte counts");
    }
    if (expected != end - begin) {
      throw FormatError(where + ": data_offsets span " + std::to_string(end - begin) +
                        " bytes but dtype " + dtype_name(t.dtype) + " x shape " + shape.dump() +
                        " needs " + std::to_string(expected) + " bytes");
    }
    t.data = buffer + begin;
    t.nbytes = static_cast<size_t>(end - begin);
    auto [it, inserted] = table.tensors.emplace(name, std::move(t));
    extents.push_back({begin, end, &it->first});
  }

  // The buffer must be tiled exactly: sorted by offset, each tensor starts where the previous ends.
  std::sort(extents.begin(), extents.end(), [](const Extent& a, const Extent& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  uint64_t prev_end = 0;
  const std::string* prev_name = nullptr;
  for (const Extent& e : extents) {
    if (e.begin < prev_end) {
      throw FormatError(path + ": tensor " + *e.name + " [" + std::to_string(e.begin) + ", " +
                        std::to_string(e.end) + "] overlaps tensor " + *prev_name + " ending at " +
                        std::to_string(prev_end));
    }
    if (e.begin > prev_end) {
      throw FormatError(path + ": gap of " + std::to_string(e.begin - prev_end) +
                        " bytes before tensor " + *e.name + " at offset " +
                        std::to_string(e.begin) +
                        (prev_name ? " (after tensor " + *prev_name + ")" : std::string()));
    }
    prev_end = e.end;
    prev_name = e.name;
  }
  if (prev_end != buffer_size) {
    throw FormatError(path + ": " + std::to_string(buffer_size - prev_end) +
                      " trailing bytes after the last tensor (data buffer is " +
                      std::to_string(buffer_size) + " bytes, tensors end at " +
                      std::to_string(prev_end) + ")");
  }
  return table;
}

SafetensorsFile::SafetensorsFile(const std::string& path)
    : file_(path), table_(parse_safetensors(file_.data(), file_.size(), path)) {}

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // Same order as the Rust writer: larger elements first, then by name, so that every tensor
  // starts naturally aligned behind the 8-byte-padded header.
  std::vector<const TensorToWrite*> order;
  std::set<std::string> names;
  for (const auto& t : tensors) {
    if (t.name == "__metadata__") throw ValueError("tensor name __metadata__ is reserved");
    if (!names.insert(t.name).second) throw ValueError("duplicate tensor name " + t.name);
    uint64_t expected = 0;
    for (int64_t d : t.shape) {
      if (d < 0) throw ValueError("tensor " + t.name + ": negative dimension in shape");
    }
    if (!tensor_nbytes(t.shape, dtype_size(t.dtype), &expected) || expected != t.bytes.size()) {
      throw ValueError("tensor " + t.name + ": " + std::to_string(t.bytes.size()) +
                       " bytes given, dtype and shape need " + std::to_string(expected));
    }
    order.push_back(&t);
  }
  std::sort(order.begin(), order.end(), [](const TensorToWrite* a, const TensorToWrite* b) {
    const size_t sa = dtype_size(a->dtype), sb = dtype_size(b->dtype);
    return sa != sb ? sa > sb : a->name < b->name;
  });

  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorToWrite* t : order) {
    header[t->name] = {{"dtype", dtype_name(t->dtype)},
                       {"shape", t->shape},
                       {"data_offsets", {offset, offset + t->bytes.size()}}};
    offset += t->bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw NotFoundError("cannot write " + path + ": " + std::strerror(errno));
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(text.size() >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const TensorToWrite* t : order) {
    out.write(reinterpret_cast<const char*>(t->bytes.data()),
              static_cast<std::streamsize>(t->bytes.size()));
  }
  out.close();
  if (!out) throw NotFoundError("cannot write " + path + ": write failed");
}

}  // namespace torchtpu

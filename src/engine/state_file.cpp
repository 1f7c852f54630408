#include "engine/state_file.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <vector>

#include "common/errors.h"
#include "common/fnv1a.h"
#include "io/aten_view.h"
#include "io/safetensors.h"

namespace torchtpu {
namespace {

constexpr const char* kFormat = "torchtpu-cpp prefix state";
constexpr const char* kVersion = "2";

std::string ring_tensor(const char* kind, size_t ring, const char* part) {
  return std::string(kind) + "." + std::to_string(ring) + "." + part;
}

std::string shape_text(at::ScalarType dtype, at::IntArrayRef shape) {
  std::string out = std::string(dtype_name(file_dtype(dtype))) + " [";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// The digest of a file's tensors: each one's name and bytes, in the order of their names (the
// order SafetensorsFile::tensors() gives). A file whose bytes changed after it was written, on
// the disk or by another program, no longer matches the digest its metadata holds.
class ContentDigest {
 public:
  void add(const std::string& name, const uint8_t* bytes, size_t n) {
    hash_ = fnv1a(hash_, reinterpret_cast<const uint8_t*>(name.c_str()), name.size() + 1);
    hash_ = fnv1a_wide(hash_, bytes, n);
  }
  std::string hex() const { return digest_hex(hash_); }

 private:
  uint64_t hash_ = kFnvOffset;
};

}  // namespace

int64_t write_prefix_state(const std::string& path, const PrefixState& state,
                           const std::string& weights_id) {
  std::vector<TensorToWrite> tensors;
  tensors.push_back(to_write("tokens", at::tensor(state.tokens, at::kLong)));
  for (size_t j = 0; j < state.full_k.size(); ++j) {
    tensors.push_back(to_write(ring_tensor("full", j, "k"), state.full_k[j]));
    tensors.push_back(to_write(ring_tensor("full", j, "v"), state.full_v[j]));
  }
  for (size_t j = 0; j < state.sliding_k.size(); ++j) {
    tensors.push_back(to_write(ring_tensor("sliding", j, "k"), state.sliding_k[j]));
    tensors.push_back(to_write(ring_tensor("sliding", j, "v"), state.sliding_v[j]));
    tensors.push_back(to_write(ring_tensor("sliding", j, "kpos"), state.sliding_kpos[j]));
  }
  std::vector<const TensorToWrite*> by_name;
  for (const auto& t : tensors) by_name.push_back(&t);
  std::sort(by_name.begin(), by_name.end(), [](auto* a, auto* b) { return a->name < b->name; });
  ContentDigest digest;
  for (const auto* t : by_name) digest.add(t->name, t->bytes.data(), t->bytes.size());
  // Written beside it and renamed over it, so a reader finds the old file or the new one whole.
  // A file left where the partial one goes is removed first, a symbolic link as a link: the
  // write never goes through it to whatever it names.
  const std::string partial = path + ".partial";
  std::filesystem::remove(partial);
  write_safetensors(partial, tensors,
                    {{"format", kFormat},
                     {"version", kVersion},
                     {"weights", weights_id},
                     {"digest", digest.hex()}});
  std::filesystem::rename(partial, path);
  return static_cast<int64_t>(std::filesystem::file_size(path));
}

PrefixState read_prefix_state(const std::string& path, const std::string& weights_id,
                              Rings& rings) {
  const SafetensorsFile file(path);
  const auto meta = [&](const char* key) {
    const auto it = file.metadata().find(key);
    return it == file.metadata().end() ? std::string() : it->second;
  };
  if (meta("format") != kFormat) {
    throw FormatError(path + " is not a prefix state file: its metadata has no \"format\": \"" +
                      kFormat + "\"");
  }
  if (meta("version") != kVersion) {
    throw FormatError(path + " is a prefix state of version \"" + meta("version") +
                      "\"; this build reads version " + kVersion);
  }
  if (meta("weights") != weights_id) {
    throw FormatError(path + " holds a state computed with other weights (" + meta("weights") +
                      "); this engine's weights are " + weights_id);
  }
  const auto& tensors = file.tensors();
  ContentDigest digest;
  for (const auto& [name, view] : tensors) digest.add(name, view.data, view.nbytes);
  if (meta("digest") != digest.hex()) {
    throw FormatError(path + "'s bytes do not match the digest written with them (" +
                      meta("digest") + ", read " + digest.hex() +
                      "): the file changed after it was saved");
  }
  const auto& device = rings.all().front().k.device();
  // The tensor `name`, which must be `dtype` of `shape`, as a copy on the rings' device.
  const auto take = [&](const std::string& name, at::ScalarType dtype,
                        const std::vector<int64_t>& shape) {
    const auto it = tensors.find(name);
    if (it == tensors.end()) throw FormatError(path + " has no tensor " + name);
    const TensorView& view = it->second;
    if (scalar_type(view.dtype) != dtype || view.shape != shape) {
      // A sliding ring holds min(sliding_window, context) slots: only its slot count differs.
      const bool slots = name.starts_with("sliding.") && view.shape.size() == shape.size() &&
                         view.shape.size() > 1 && view.shape[1] != shape[1];
      throw FormatError(path + ": " + name + " is " +
                        shape_text(scalar_type(view.dtype), view.shape) + " where this engine's " +
                        "rings hold " + shape_text(dtype, shape) +
                        (slots ? " (a sliding ring holds the last min(sliding_window, context) "
                                 "positions: the state was saved with another context)"
                               : ""));
    }
    at::Tensor t = host_tensor(view).clone();
    // The digest holds against damage, not against a writer who recomputes it: values no decode
    // writes are refused here, rather than failing (or changing) a request that reuses them.
    if (at::isFloatingType(dtype) && !at::isfinite(t).all().item<bool>()) {
      throw FormatError(path + ": " + name + " holds a value that is not finite");
    }
    return t.to(device);
  };

  PrefixState state;
  const auto tokens = tensors.find("tokens");
  if (tokens == tensors.end() || tokens->second.dtype != Dtype::kI64 ||
      tokens->second.shape.size() != 1) {
    throw FormatError(path + " has no tensor \"tokens\" of I64 [tokens]");
  }
  const int64_t p = tokens->second.shape[0];
  if (p < 1 || p >= rings.context()) {
    throw FormatError(path + " holds a state of " + std::to_string(p) +
                      " tokens; this engine's context takes states of 1 to " +
                      std::to_string(rings.context() - 1));
  }
  const at::Tensor ids = host_tensor(tokens->second);
  state.tokens.assign(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + p);
  size_t expected = 1;
  for (const Ring& ring : rings.all()) {
    const auto dtype = ring.k.scalar_type();
    const int64_t heads = ring.k.size(1), dim = ring.k.size(3);
    if (ring.type == LayerType::kFull) {
      const size_t j = state.full_k.size();
      state.full_k.push_back(take(ring_tensor("full", j, "k"), dtype, {heads, p, dim}));
      state.full_v.push_back(take(ring_tensor("full", j, "v"), dtype, {heads, p, dim}));
      expected += 2;
    } else {
      const size_t j = state.sliding_k.size();
      const std::vector<int64_t> shape = {heads, ring.slots, dim};
      state.sliding_k.push_back(take(ring_tensor("sliding", j, "k"), dtype, shape));
      state.sliding_v.push_back(take(ring_tensor("sliding", j, "v"), dtype, shape));
      const std::string kpos = ring_tensor("sliding", j, "kpos");
      state.sliding_kpos.push_back(take(kpos, at::kLong, {ring.slots}));
      const auto& positions = state.sliding_kpos.back();
      if (positions.min().item<int64_t>() < -1 || positions.max().item<int64_t>() >= p) {
        throw FormatError(path + ": " + kpos + " holds a position outside -1 (an empty slot) to " +
                          std::to_string(p - 1) + ", the state's last");
      }
      expected += 3;
    }
  }
  if (tensors.size() != expected) {
    throw FormatError(path + " holds " + std::to_string(tensors.size()) + " tensors where this " +
                      "engine's " + std::to_string(rings.all().size()) + " rings take " +
                      std::to_string(expected));
  }
  return state;
}

}  // namespace torchtpu

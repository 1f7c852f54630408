#include "io/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/errors.h"
#include "common/json_depth.h"
#include "common/json_type.h"
#include "io/config.h"

namespace torchtpu {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr const char* kSingleFile = "model.safetensors";

bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw NotFoundError("cannot read " + path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Shard names come from a file we do not control: they must stay inside the checkpoint dir.
void check_shard_name(const std::string& shard, const std::string& index_path,
                      const std::string& tensor) {
  const fs::path p(shard);
  bool escapes = shard.empty() || p.is_absolute();
  for (const auto& part : p) escapes = escapes || part == "..";
  if (escapes) {
    throw FormatError(index_path + ": weight_map entry for " + tensor + " names shard \"" + shard +
                      "\", which is not a file name inside the checkpoint directory");
  }
}

}  // namespace

Checkpoint::Checkpoint(const std::string& dir) : dir_(dir) {
  check_checkpoint_dir(dir);

  const fs::path index_path = fs::path(dir) / kIndexFile;
  if (is_file(index_path)) {
    const std::string where = index_path.string();
    json index;
    try {
      index = parse_json_within_depth<json>(read_text(where), [&] {
        throw FormatError(where + ": invalid JSON: arrays and objects nest deeper than " +
                          std::to_string(kMaxJsonDepth) + " levels");
      });
    } catch (const json::exception& e) {
      throw FormatError(where + ": invalid JSON: " + json_error_text(e));
    }
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      throw FormatError(where + ": missing the \"weight_map\" object");
    }
    std::map<std::string, SafetensorsFile*> shards;
    std::map<std::string, std::string> shard_of;  // tensor -> shard, as the index says
    for (const auto& [tensor, shard_json] : index["weight_map"].items()) {
      if (!shard_json.is_string()) {
        throw FormatError(where + ": weight_map entry for " + tensor +
                          " must be a file name, got " + shard_json.dump());
      }
      const std::string shard = shard_json.get<std::string>();
      check_shard_name(shard, where, tensor);
      shard_of[tensor] = shard;
      if (shards.count(shard)) continue;
      const fs::path shard_path = fs::path(dir) / shard;
      if (!is_file(shard_path)) {
        throw FormatError(where + ": weight_map puts " + tensor + " in shard " + shard +
                          ", which does not exist in " + dir);
      }
      files_.push_back(std::make_unique<SafetensorsFile>(shard_path.string()));
      shards[shard] = files_.back().get();
    }
    for (const auto& [tensor, shard] : shard_of) {
      if (!shards[shard]->tensors().count(tensor)) {
        throw FormatError(where + ": lists tensor " + tensor + " in shard " + shard + ", but " +
                          shards[shard]->path() + " does not contain it");
      }
    }
    for (const auto& [shard, file] : shards) {
      for (const auto& [name, view] : file->tensors()) {
        auto it = shard_of.find(name);
        if (it == shard_of.end()) {
          throw FormatError(file->path() + ": holds tensor " + name + ", which " + where +
                            " does not list");
        }
        if (it->second != shard) {
          throw FormatError("tensor " + name + " is present in two shards: " +
                            shards[it->second]->path() + " and " + file->path());
        }
        index_[name] = &view;
      }
    }
  } else {
    std::vector<std::string> paths;
    if (is_file(fs::path(dir) / kSingleFile)) {
      paths.push_back((fs::path(dir) / kSingleFile).string());
    } else {
      for (const auto& entry : fs::directory_iterator(dir)) {
        if (entry.path().extension() == ".safetensors" && is_file(entry.path())) {
          paths.push_back(entry.path().string());
        }
      }
      std::sort(paths.begin(), paths.end());
    }
    if (paths.empty()) throw FormatError("no safetensors files in " + dir);
    for (const std::string& p : paths) {
      files_.push_back(std::make_unique<SafetensorsFile>(p));
      for (const auto& [name, view] : files_.back()->tensors()) {
        auto [it, inserted] = index_.emplace(name, &view);
        if (!inserted) {
          throw FormatError("tensor " + name + " is present in two shards: " + it->second->file +
                            " and " + p);
        }
      }
    }
  }

  const bool multimodal = std::any_of(index_.begin(), index_.end(), [](const auto& kv) {
    return kv.first.rfind("model.language_model.", 0) == 0;
  });
  prefix_ = multimodal ? "model.language_model." : "model.";
  // The table may be dense or pack-quantized (an emb4 twin holds only int4 tables).
  if (!index_.count(prefix_ + "embed_tokens.weight") &&
      !index_.count(prefix_ + "embed_tokens.weight_packed")) {
    throw FormatError("checkpoint " + dir + " has no " + prefix_ +
                      "embed_tokens.weight or .weight_packed (tensor names must start with "
                      "\"model.language_model.\" or \"model.\")");
  }
}

const TensorView* Checkpoint::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

const TensorView& Checkpoint::get(const std::string& name) const {
  const TensorView* t = find(name);
  if (t == nullptr) throw FormatError("checkpoint " + dir_ + " has no tensor " + name);
  return *t;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& kv : index_) out.push_back(kv.first);
  return out;
}

uint64_t Checkpoint::fingerprint() const {
  std::vector<const TensorView*> views;
  for (const auto& entry : index_) views.push_back(entry.second);  // by name, whatever the shards
  return torchtpu::fingerprint(views);
}

std::string Checkpoint::file_if_exists(const std::string& name) const {
  const fs::path p = fs::path(dir_) / name;
  return is_file(p) ? p.string() : std::string();
}

}  // namespace torchtpu

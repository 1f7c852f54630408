#include "hub/files.h"

#include <fnmatch.h>

#include <algorithm>
#include <array>

#include "common/errors.h"

namespace torchtpu::hub {
namespace {

bool all_hex(const std::string& s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

std::string string_field(const nlohmann::json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) {
    throw FormatError(where + ": field '" + key + "' is missing or not a string");
  }
  return it->get<std::string>();
}

int64_t size_field(const nlohmann::json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() < 0) {
    throw FormatError(where + ": field '" + key + "' is missing or not a size");
  }
  return it->get<int64_t>();
}

// The blob name becomes a file name in the cache: it must be a hash and nothing else.
void check_etag(const RepoFile& f, const std::string& where) {
  size_t want = f.lfs_sha256.empty() ? 40 : 64;
  if (f.etag().size() != want || !all_hex(f.etag())) {
    throw FormatError(where + ": file '" + f.path + "' has an invalid " +
                      (f.lfs_sha256.empty() ? "blob id" : "lfs sha256") + " '" + f.etag() + "'");
  }
}

}  // namespace

Listing parse_model_info(const nlohmann::json& info, const std::string& where, bool* complete) {
  if (!info.is_object()) throw FormatError(where + ": expected a JSON object");
  Listing listing;
  listing.commit = string_field(info, "sha", where);
  if (!is_commit_hash(listing.commit)) {
    throw FormatError(where + ": 'sha' is not a commit hash: '" + listing.commit + "'");
  }
  auto siblings = info.find("siblings");
  if (siblings == info.end() || !siblings->is_array()) {
    throw FormatError(where + ": field 'siblings' is missing or not a list");
  }
  *complete = true;
  for (const auto& s : *siblings) {
    RepoFile f;
    f.path = string_field(s, "rfilename", where);
    if (!s.contains("blobId") || !s.contains("size")) {
      *complete = false;
      listing.files.push_back(f);
      continue;
    }
    f.blob_id = string_field(s, "blobId", where);
    f.size = size_field(s, "size", where);
    auto lfs = s.find("lfs");
    if (lfs != s.end() && lfs->is_object()) {
      f.lfs_sha256 = string_field(*lfs, "sha256", where);
      f.size = size_field(*lfs, "size", where);
    }
    check_etag(f, where);
    listing.files.push_back(std::move(f));
  }
  return listing;
}

std::vector<RepoFile> parse_tree_page(const nlohmann::json& page, const std::string& where) {
  if (!page.is_array()) throw FormatError(where + ": expected a JSON list");
  std::vector<RepoFile> files;
  for (const auto& e : page) {
    if (string_field(e, "type", where) != "file") continue;
    RepoFile f;
    f.path = string_field(e, "path", where);
    f.blob_id = string_field(e, "oid", where);
    f.size = size_field(e, "size", where);
    auto lfs = e.find("lfs");
    if (lfs != e.end() && lfs->is_object()) {
      f.lfs_sha256 = string_field(*lfs, "oid", where);
      f.size = size_field(*lfs, "size", where);
    }
    check_etag(f, where);
    files.push_back(std::move(f));
  }
  return files;
}

bool is_engine_file(const std::string& path) {
  // adapter_config.json: a LoRA adapter's repo (PEFT's, beside adapter_model.safetensors).
  static const std::array<const char*, 9> kNames = {
      "config.json",       "generation_config.json", "chat_template.jinja",
      "chat_template.json", "tokenizer.json",         "tokenizer_config.json",
      "special_tokens_map.json", "added_tokens.json", "adapter_config.json"};
  if (path.find('/') != std::string::npos) return false;
  for (const char* n : kNames) {
    if (path == n) return true;
  }
  return glob_matches("*.safetensors", path) || glob_matches("*.safetensors.index.json", path);
}

bool glob_matches(const std::string& pattern, const std::string& path) {
  // Repo paths use '/', and huggingface_hub reads '\' as '/' rather than as an escape.
  std::string p = pattern;
  std::string s = path;
  std::replace(p.begin(), p.end(), '\\', '/');
  std::replace(s.begin(), s.end(), '\\', '/');
  if (!p.empty() && p.back() == '/') p += '*';
  return fnmatch(p.c_str(), s.c_str(), FNM_NOESCAPE) == 0;
}

std::vector<RepoFile> select_files(const std::vector<RepoFile>& files,
                                   const std::vector<std::string>& include) {
  std::vector<RepoFile> out;
  for (const auto& f : files) {
    if (!is_engine_file(f.path)) continue;
    if (!include.empty() && std::none_of(include.begin(), include.end(),
                                         [&](const auto& g) { return glob_matches(g, f.path); })) {
      continue;
    }
    out.push_back(f);
  }
  return out;
}

bool is_commit_hash(const std::string& s) { return s.size() == 40 && all_hex(s); }

}  // namespace torchtpu::hub

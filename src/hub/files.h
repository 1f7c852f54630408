// What a repo holds at one commit, as the Hub's API lists it, and which of those files the
// engine needs.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace torchtpu::hub {

struct RepoFile {
  std::string path;        // in the repo, '/'-separated
  int64_t size = 0;        // of the content (for LFS files, of the LFS object)
  std::string blob_id;     // git blob sha1 (of the LFS pointer, for LFS files)
  std::string lfs_sha256;  // empty for a file stored in git
  // The name of the blob in the cache: what the Hub sends as X-Linked-Etag or ETag.
  const std::string& etag() const { return lfs_sha256.empty() ? blob_id : lfs_sha256; }
};

struct Listing {
  std::string commit;
  std::vector<RepoFile> files;
};

// GET /api/models/{repo}/revision/{rev}?blobs=true: "sha" and "siblings". `complete` says
// whether every sibling came with its blob id (a server that ignores blobs=true sends names
// only). `where` names the reply in errors.
Listing parse_model_info(const nlohmann::json& info, const std::string& where, bool* complete);
// One page of GET /api/models/{repo}/tree/{commit}?recursive=true (folders are skipped).
std::vector<RepoFile> parse_tree_page(const nlohmann::json& page, const std::string& where);

// The files at the repo's top level that the engine reads: config, generation config, chat
// template, tokenizer, *.safetensors and their index.
bool is_engine_file(const std::string& path);
// Python's fnmatch.fnmatchcase as huggingface_hub applies it: '*' crosses '/', and a pattern
// ending in '/' matches everything below that folder.
bool glob_matches(const std::string& pattern, const std::string& path);
// The engine's files, restricted to those matching any `include` glob when there are any.
std::vector<RepoFile> select_files(const std::vector<RepoFile>& files,
                                   const std::vector<std::string>& include);

// 40 lower-case hex digits: a revision that names a commit and never moves.
bool is_commit_hash(const std::string& s);

}  // namespace torchtpu::hub

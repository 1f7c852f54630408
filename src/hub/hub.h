// Models by name from the Hugging Face Hub: download what the engine needs into the cache that
// huggingface_hub uses (models--org--name/{blobs,snapshots,refs}), so Python tools and this
// program share one copy. Native (libcurl), resumable, every file checked against its hash.
#pragma once

#include <string>
#include <vector>

namespace torchtpu::hub {

struct Options {
  std::string endpoint;   // HF_ENDPOINT, default https://huggingface.co (no trailing slash)
  std::string cache_dir;  // HF_HUB_CACHE > HUGGINGFACE_HUB_CACHE > $HF_HOME/hub > XDG > ~/.cache
  std::string token;      // HF_TOKEN > HUGGING_FACE_HUB_TOKEN > $HF_TOKEN_PATH or $HF_HOME/token
  bool offline = false;   // HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE): the cache only, no network
  bool progress = true;   // a bar on a terminal, plain lines otherwise; false: silent
  // The defaults above, read from the environment the way huggingface_hub reads it.
  static Options from_env();
};

// "org/name" or "org/name@rev" -> true; an existing local directory -> false.
bool looks_like_repo_id(const std::string& s);

// Returns the local snapshot directory holding the files the engine needs (config.json,
// tokenizer files, chat_template.jinja, generation_config.json, *.safetensors and the index).
// `include` globs (fnmatch, as huggingface_hub's allow_patterns) restrict further. Files already
// in the cache are not transferred again. Throws NotFoundError (repo, revision or file unknown,
// offline with nothing cached), ValueError (a malformed id or revision), FormatError (a download
// whose hash differs from the Hub's listing) or std::runtime_error (access refused, network,
// disk full, an interrupted transfer: the partial file is kept and the next call resumes it).
std::string download(const std::string& repo_id, const std::string& revision, const Options& opts,
                     const std::vector<std::string>& include = {});

// A local directory is returned unchanged; a repo id (with an optional @rev) is downloaded, or
// found in the cache.
std::string resolve_model(const std::string& dir_or_id, const Options& opts);

// resolve_model for what looks like a repo id; anything else (a directory, or a path that is none)
// unchanged, for the caller that reads it to say what is wrong with it. What every option taking
// a checkpoint or adapter directory accepts.
std::string resolve_if_repo_id(const std::string& path, const Options& opts);

}  // namespace torchtpu::hub

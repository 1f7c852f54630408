// The built-in demo checkpoint that `torchtpu-cpp serve` uses when no --model is given: a synthetic
// tiny Gemma 4 with random weights, the full 262,144-id vocabulary so the Gemma 4 test tokenizer
// fits, and Gemma 4's chat template. Generated once into the user's cache directory. Its output is
// meaningless text; it exists so the server, the API and the tools run anywhere.
#pragma once

#include <string>

namespace torchtpu::server {

// The model id the demo is served under, saying what it is wherever it shows.
inline constexpr const char* kDemoModelId = "torchtpu-demo-random-weights";

// $TORCHTPU_TEST_TOKENIZER, else the source tree's .cache/gemma4-test-tokenizer (written by
// scripts/make_test_tokenizer.py).
std::string test_tokenizer_dir();

// $XDG_CACHE_HOME/torchtpu-cpp/demo-v1, or ~/.cache/torchtpu-cpp/demo-v1.
std::string demo_checkpoint_dir();

// The demo directory, generated first if missing (written aside and renamed into place, so a
// half-written demo is never used). NotFoundError naming the fix if the test tokenizer is absent.
std::string ensure_demo_checkpoint();

// Gemma 4's chat template (google/gemma-4-E2B-it, 2026-07-09), embedded at build time for tokenizer
// directories that carry none.
std::string gemma4_chat_template();

}  // namespace torchtpu::server

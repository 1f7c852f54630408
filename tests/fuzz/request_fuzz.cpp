// libFuzzer harness: the server's request parsing, body text to validated request, as the routes
// do it. The first byte chooses the route: /v1/chat/completions, /v1/completions, /tokenize,
// /detokenize, Ollama's /api/chat, /api/generate or /api/pull. Every malformed body is an ApiError
// with a 4xx status; nothing else may escape.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "server/ollama.h"
#include "server/openai.h"

namespace server = torchtpu::server;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t route = data[0] % 7;
  try {
    const server::ojson body =
        server::parse_body(std::string(reinterpret_cast<const char*>(data + 1), size - 1));
    switch (route) {
      case 0: server::parse_chat_request(body); break;
      case 1: server::parse_completion_request(body); break;
      case 2: server::parse_tokenize_request(body); break;
      case 3: server::parse_detokenize_request(body); break;
      case 4: server::parse_ollama_chat(body); break;
      case 5: server::parse_ollama_generate(body); break;
      default: server::parse_ollama_pull(body);
    }
  } catch (const server::ApiError& e) {
    if (e.status < 400 || e.status > 499) std::abort();
  }
  return 0;
}

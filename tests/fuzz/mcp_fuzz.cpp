// libFuzzer harness: the MCP endpoint's JSON-RPC handling, fed the way `torchtpu-cpp mcp` reads
// stdio: each line of the input is one message, parsed and answered. The target server is
// loopback port 0, which refuses every connection at once, so tools/call validates its arguments
// and then fails as a tool error without reaching anything. Every line gets a JSON-RPC answer (or
// none, for a notification); no exception may escape.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include "server/mcp.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  std::ostringstream out;
  torchtpu::server::serve_mcp_stdio({"http://127.0.0.1:0", ""}, in, out);
  return 0;
}

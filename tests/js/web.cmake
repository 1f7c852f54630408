# The chat page (Playwright driving Debian's Chromium), the MCP tools (the official MCP SDK client
# over stdio and Streamable HTTP) and the proxy, against `torchtpu-cpp serve` on the demo checkpoint
# (js_mcp and the chat page's images and audio also on the tiny checkpoint with both towers that
# make_multimodal.py writes with the project's Python).
set(_artifacts "TORCHTPU_TEST_ARTIFACTS=${CMAKE_BINARY_DIR}/test-artifacts")
torchtpu_js_suite(js_mcp FILES mcp.test.mjs ENV ${_artifacts})
torchtpu_js_suite(js_proxy FILES proxy.test.mjs ENV ${_artifacts})
# Without Chromium the test still runs and fails: setup.sh installs it (apt-get install chromium).
find_program(CHROMIUM_EXECUTABLE NAMES chromium chromium-browser)
if(NOT CHROMIUM_EXECUTABLE)
  set(CHROMIUM_EXECUTABLE /usr/bin/chromium)
endif()
torchtpu_js_suite(js_web FILES web.test.mjs ENV ${_artifacts} "CHROMIUM=${CHROMIUM_EXECUTABLE}")

# The chat page (Playwright driving Debian's Chromium), the MCP tools (the official MCP SDK client
# over stdio and Streamable HTTP) and the proxy, against `torchtpu-cpp serve` on the demo checkpoint
# (js_mcp and the chat page's images and audio also on the tiny checkpoint with both towers that
# make_multimodal.py writes with the project's Python).
find_program(NODE_EXECUTABLE node)
find_program(CHROMIUM_EXECUTABLE NAMES chromium chromium-browser)
if(NODE_EXECUTABLE AND TARGET torchtpu-cpp AND TARGET torchtpu_server)
  set(_web_env
      "TORCHTPU_CLI=$<TARGET_FILE:torchtpu-cpp>;XDG_CACHE_HOME=${CMAKE_BINARY_DIR}/js-cache;TORCHTPU_TEST_ARTIFACTS=${CMAKE_BINARY_DIR}/test-artifacts;TORCHTPU_PYTHON=${Python3_EXECUTABLE}")
  add_test(NAME js_mcp
           COMMAND ${NODE_EXECUTABLE} --test --test-concurrency=1
                   ${CMAKE_CURRENT_LIST_DIR}/mcp.test.mjs
           WORKING_DIRECTORY ${CMAKE_CURRENT_LIST_DIR})
  add_test(NAME js_proxy
           COMMAND ${NODE_EXECUTABLE} --test --test-concurrency=1
                   ${CMAKE_CURRENT_LIST_DIR}/proxy.test.mjs
           WORKING_DIRECTORY ${CMAKE_CURRENT_LIST_DIR})
  set_tests_properties(js_mcp js_proxy PROPERTIES
    ENVIRONMENT "${_web_env}" TIMEOUT 600 LABELS server)
  # Without Chromium the test still runs and fails: setup.sh installs it (apt-get install chromium).
  if(NOT CHROMIUM_EXECUTABLE)
    set(CHROMIUM_EXECUTABLE /usr/bin/chromium)
  endif()
  add_test(NAME js_web
           COMMAND ${NODE_EXECUTABLE} --test --test-concurrency=1
                   ${CMAKE_CURRENT_LIST_DIR}/web.test.mjs
           WORKING_DIRECTORY ${CMAKE_CURRENT_LIST_DIR})
  # The media tests write a tiny multimodal checkpoint with the project's Python (transformers),
  # as js_media does (tests/js/wire.cmake).
  set_tests_properties(js_web PROPERTIES
    ENVIRONMENT "${_web_env};CHROMIUM=${CHROMIUM_EXECUTABLE};TORCHTPU_PYTHON=${Python3_EXECUTABLE}"
    TIMEOUT 600 LABELS server)
endif()

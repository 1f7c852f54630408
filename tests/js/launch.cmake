# `torchtpu-cpp launch claude|codex|opencode` against servers on the demo checkpoint: js_launch with
# stand-ins for the agents that ask the server through the official Anthropic and OpenAI SDKs,
# js_agents with the agents themselves (tests/agents: Claude Code, Codex and OpenCode, pinned;
# setup.sh installs them, and without them the test runs and fails).
find_program(NODE_EXECUTABLE node)
if(NODE_EXECUTABLE AND TARGET torchtpu-cpp AND TARGET torchtpu_server)
  foreach(_suite launch agents)
    add_test(NAME js_${_suite}
             COMMAND ${NODE_EXECUTABLE} --test --test-concurrency=1
                     ${CMAKE_CURRENT_LIST_DIR}/${_suite}.test.mjs
             WORKING_DIRECTORY ${CMAKE_CURRENT_LIST_DIR})
    set_tests_properties(js_${_suite} PROPERTIES
      ENVIRONMENT "TORCHTPU_CLI=$<TARGET_FILE:torchtpu-cpp>;XDG_CACHE_HOME=${CMAKE_BINARY_DIR}/js-cache"
      TIMEOUT 600 LABELS server)
  endforeach()
endif()

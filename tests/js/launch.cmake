# `torchtpu-cpp launch claude|codex` against two servers on the demo checkpoint, with stand-ins
# for the agents that ask the server through the official Anthropic and OpenAI SDKs.
find_program(NODE_EXECUTABLE node)
if(NODE_EXECUTABLE AND TARGET torchtpu-cpp AND TARGET torchtpu_server)
  add_test(NAME js_launch
           COMMAND ${NODE_EXECUTABLE} --test --test-concurrency=1
                   ${CMAKE_CURRENT_LIST_DIR}/launch.test.mjs
           WORKING_DIRECTORY ${CMAKE_CURRENT_LIST_DIR})
  set_tests_properties(js_launch PROPERTIES
    ENVIRONMENT "TORCHTPU_CLI=$<TARGET_FILE:torchtpu-cpp>;XDG_CACHE_HOME=${CMAKE_BINARY_DIR}/js-cache"
    TIMEOUT 300 LABELS server)
endif()

# The agents themselves (tests/agents: Claude Code, Codex and OpenCode, pinned) through launch.
# Without them (setup.sh installs them) the test runs and fails.
if(NODE_EXECUTABLE AND TARGET torchtpu-cpp AND TARGET torchtpu_server)
  add_test(NAME js_agents
           COMMAND ${NODE_EXECUTABLE} --test --test-concurrency=1
                   ${CMAKE_CURRENT_LIST_DIR}/agents.test.mjs
           WORKING_DIRECTORY ${CMAKE_CURRENT_LIST_DIR})
  set_tests_properties(js_agents PROPERTIES
    ENVIRONMENT "TORCHTPU_CLI=$<TARGET_FILE:torchtpu-cpp>;XDG_CACHE_HOME=${CMAKE_BINARY_DIR}/js-cache"
    TIMEOUT 600 LABELS server)
endif()

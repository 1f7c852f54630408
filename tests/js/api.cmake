# Sampling, logprobs, thinking and tool calls through the official `openai` SDK (issue #11), on the
# demo checkpoint with the server's forced-output test hook; speculative decoding too, with an
# assistant the project's Python writes for the demo checkpoint.
find_program(NODE_EXECUTABLE node)
if(NODE_EXECUTABLE AND TARGET torchtpu-cpp AND TARGET torchtpu_server)
  add_test(NAME js_api
           COMMAND ${NODE_EXECUTABLE} --test --test-concurrency=1
                   ${CMAKE_CURRENT_LIST_DIR}/api.test.mjs
           WORKING_DIRECTORY ${CMAKE_CURRENT_LIST_DIR})
  set_tests_properties(js_api PROPERTIES
    ENVIRONMENT "TORCHTPU_CLI=$<TARGET_FILE:torchtpu-cpp>;XDG_CACHE_HOME=${CMAKE_BINARY_DIR}/js-cache;TORCHTPU_PYTHON=${Python3_EXECUTABLE}"
    TIMEOUT 600 LABELS server)
endif()

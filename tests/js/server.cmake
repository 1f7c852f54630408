# The OpenAI-compatible server through clients other people wrote: the official `openai` npm SDK
# against `torchtpu-cpp serve` on the demo checkpoint (generated once into the build tree).
find_program(NODE_EXECUTABLE node)
if(NODE_EXECUTABLE AND TARGET torchtpu-cpp AND TARGET torchtpu_server)
  add_test(NAME js_server
           COMMAND ${NODE_EXECUTABLE} --test --test-concurrency=1
                   ${CMAKE_CURRENT_LIST_DIR}/server_api.test.mjs
                   ${CMAKE_CURRENT_LIST_DIR}/server_load.test.mjs
           WORKING_DIRECTORY ${CMAKE_CURRENT_LIST_DIR})
  set_tests_properties(js_server PROPERTIES
    ENVIRONMENT "TORCHTPU_CLI=$<TARGET_FILE:torchtpu-cpp>;XDG_CACHE_HOME=${CMAKE_BINARY_DIR}/js-cache"
    TIMEOUT 600 LABELS server)
endif()

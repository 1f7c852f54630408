# Structured output (issue #18) through the official `openai` SDK on the demo checkpoint: the
# validity proof (every constrained reply of 210 parses and validates with ajv), and
# chat.completions.parse with zod, forced tool calls, streaming and the 400s.
find_program(NODE_EXECUTABLE node)
if(NODE_EXECUTABLE AND TARGET torchtpu-cpp AND TARGET torchtpu_server)
  foreach(suite structured_valid structured)
    add_test(NAME js_${suite}
             COMMAND ${NODE_EXECUTABLE} --test --test-concurrency=1
                     ${CMAKE_CURRENT_LIST_DIR}/${suite}.test.mjs
             WORKING_DIRECTORY ${CMAKE_CURRENT_LIST_DIR})
    set_tests_properties(js_${suite} PROPERTIES
      ENVIRONMENT "TORCHTPU_CLI=$<TARGET_FILE:torchtpu-cpp>;XDG_CACHE_HOME=${CMAKE_BINARY_DIR}/js-cache"
      TIMEOUT 600 LABELS server)
  endforeach()
endif()

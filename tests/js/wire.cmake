# Issue #18's wire formats through their official clients on the demo checkpoint with the server's
# forced-output test hook: OpenAI's Responses API (`openai`) and Anthropic Messages
# (`@anthropic-ai/sdk`); Ollama's own API (`ollama`); and #19's images and audio in all of them
# (media, which writes a tiny multimodal checkpoint with the project's Python). One CTest entry
# each, so any can be run alone.
find_program(NODE_EXECUTABLE node)
if(NODE_EXECUTABLE AND TARGET torchtpu-cpp AND TARGET torchtpu_server)
  foreach(_suite responses messages ollama media)
    add_test(NAME js_${_suite}
             COMMAND ${NODE_EXECUTABLE} --test --test-concurrency=1
                     ${CMAKE_CURRENT_LIST_DIR}/${_suite}.test.mjs
             WORKING_DIRECTORY ${CMAKE_CURRENT_LIST_DIR})
    set_tests_properties(js_${_suite} PROPERTIES
      ENVIRONMENT "TORCHTPU_CLI=$<TARGET_FILE:torchtpu-cpp>;XDG_CACHE_HOME=${CMAKE_BINARY_DIR}/js-cache;TORCHTPU_PYTHON=${Python3_EXECUTABLE}"
      TIMEOUT 300 LABELS server)
  endforeach()
endif()

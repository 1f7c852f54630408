# LoRA adapters through the server: the tokens PEFT decodes with an adapter, chosen by model name
# or llama-server's per-request `lora`, side by side with other adapters in one batch; the
# scales of POST /lora-adapters; every malformed request's error.
find_program(NODE_EXECUTABLE node)
if(NODE_EXECUTABLE AND TARGET torchtpu-cpp AND TARGET torchtpu_server)
  add_test(NAME js_lora
           COMMAND ${NODE_EXECUTABLE} --test --test-concurrency=1
                   ${CMAKE_CURRENT_LIST_DIR}/lora.test.mjs
           WORKING_DIRECTORY ${CMAKE_CURRENT_LIST_DIR})
  set_tests_properties(js_lora PROPERTIES
    ENVIRONMENT "TORCHTPU_CLI=$<TARGET_FILE:torchtpu-cpp>;XDG_CACHE_HOME=${CMAKE_BINARY_DIR}/js-cache;TORCHTPU_PYTHON=${Python3_EXECUTABLE}"
    TIMEOUT 600 LABELS server)
endif()

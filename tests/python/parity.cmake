# Parity suites (issue #2 item 8, issue #3): the engine against transformers and against the own
# float64 reference in tests/reference. They drive the `torchtpu-cpp` command; without that target
# the engine cases fail loudly in the cli fixture instead of disappearing.
set(_parity_env "OPENBLAS_NUM_THREADS=1;OMP_NUM_THREADS=1")
if(TARGET torchtpu-cpp)
  list(APPEND _parity_env "TORCHTPU_CLI=$<TARGET_FILE:torchtpu-cpp>")
endif()

foreach(_suite reference transformers int4)
  add_test(NAME py_parity_${_suite}
           COMMAND ${Python3_EXECUTABLE} -m pytest -q -x -p no:cacheprovider -m "not slow"
                   ${CMAKE_CURRENT_LIST_DIR}/test_parity_${_suite}.py)
  set_tests_properties(py_parity_${_suite} PROPERTIES ENVIRONMENT "${_parity_env}" TIMEOUT 1500
                       LABELS parity)
endforeach()

# The synthetic full-size E2B checkpoint (about 10 GB at bf16): written once, loaded, one decode.
add_test(NAME py_parity_e2b
         COMMAND ${Python3_EXECUTABLE} -m pytest -q -x -p no:cacheprovider -m slow
                 ${CMAKE_CURRENT_LIST_DIR}/test_parity_reference.py)
set_tests_properties(py_parity_e2b PROPERTIES ENVIRONMENT "${_parity_env}" TIMEOUT 3600
                     LABELS "parity;slow" RESOURCE_LOCK scratch_disk)

# The prompt's own logprobs through the server (completions' echo, vLLM's prompt_logprobs)
# against transformers' (needs the Gemma 4 test tokenizer that scripts/setup.sh writes).
add_test(NAME py_prompt_logprobs
         COMMAND ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider
                 ${CMAKE_CURRENT_LIST_DIR}/test_prompt_logprobs.py)
set_tests_properties(py_prompt_logprobs PROPERTIES ENVIRONMENT "${_parity_env}" TIMEOUT 900
                     LABELS parity)

# Speculative decoding with a Gemma 4 assistant (multi-token prediction): the engine's drafts
# against transformers' Gemma4AssistantForCausalLM, and the tokens of decoding without drafts.
if(TARGET _torchtpu_cpp)
  add_test(NAME py_assistant
           COMMAND ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider
                   ${CMAKE_CURRENT_LIST_DIR}/test_assistant.py)
  set_tests_properties(py_assistant PROPERTIES
    ENVIRONMENT "PYTHONPATH=${CMAKE_BINARY_DIR}/python;OPENBLAS_NUM_THREADS=1;OMP_NUM_THREADS=1;TORCHTPU_CLI=$<TARGET_FILE:torchtpu-cpp>"
    TIMEOUT 900 LABELS "python;engine")
endif()

# Prompts with images and audio (issue #19): greedy decoding through `torchtpu-cpp generate` and
# the torchtpu_cpp module against transformers' Gemma4ForConditionalGeneration, and the errors.
if(TARGET _torchtpu_cpp AND TARGET torchtpu-cpp)
  add_test(NAME py_parity_media
           COMMAND ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider
                   ${CMAKE_CURRENT_LIST_DIR}/test_parity_media.py)
  set_tests_properties(py_parity_media PROPERTIES
                       ENVIRONMENT "PYTHONPATH=${CMAKE_BINARY_DIR}/python;OPENBLAS_NUM_THREADS=1;OMP_NUM_THREADS=1;TORCHTPU_CLI=$<TARGET_FILE:torchtpu-cpp>"
                       TIMEOUT 1500 LABELS "python;parity")
endif()

# Sampling statistics of the engine through the Python module (issue #11): seeded reproducibility
# and a chi-square test of the first sampled token against the filtered softmax of the logits.
if(TARGET _torchtpu_cpp)
  add_test(NAME py_sampling
           COMMAND ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider
                   ${CMAKE_CURRENT_LIST_DIR}/test_sampling.py)
  set_tests_properties(py_sampling PROPERTIES
    ENVIRONMENT "PYTHONPATH=${CMAKE_BINARY_DIR}/python;OPENBLAS_NUM_THREADS=1;OMP_NUM_THREADS=1;TORCHTPU_CLI=$<TARGET_FILE:torchtpu-cpp>"
    TIMEOUT 600 LABELS python)
endif()

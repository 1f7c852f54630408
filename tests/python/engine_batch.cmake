# Engine.batch from Python (issue #17): decode_many and submit/step against Engine.decode alone,
# the binding rules for the batch.
if(TARGET _torchtpu_cpp)
  add_test(NAME py_engine_batch
           COMMAND ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider
                   ${CMAKE_CURRENT_LIST_DIR}/test_batch.py)
  set_tests_properties(py_engine_batch PROPERTIES
    ENVIRONMENT "PYTHONPATH=${CMAKE_BINARY_DIR}/python;OPENBLAS_NUM_THREADS=1;OMP_NUM_THREADS=1;TORCHTPU_CLI=$<TARGET_FILE:torchtpu-cpp>"
    TIMEOUT 900 LABELS "python;engine")
endif()

# The torchtpu_cpp module (issue #5): binding rules, reference parity, torch-tpu beside it, and the
# C++ server hosted by Python. The tests import the package from this build tree and make their
# tiny checkpoints with the torchtpu-cpp command.
if(TARGET _torchtpu_cpp)
  set(_bindings_env "PYTHONPATH=${CMAKE_BINARY_DIR}/python;OPENBLAS_NUM_THREADS=1;OMP_NUM_THREADS=1"
                    "TORCHTPU_CLI=$<TARGET_FILE:torchtpu-cpp>")
  add_test(NAME py_bindings
           COMMAND ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider
                   ${CMAKE_CURRENT_LIST_DIR}/test_bindings.py)
  set_tests_properties(py_bindings PROPERTIES ENVIRONMENT "${_bindings_env}" TIMEOUT 900
                       LABELS python)
  # The C++ server hosted by Python answers like `torchtpu-cpp serve` (needs the Gemma 4 test
  # tokenizer that scripts/setup.sh writes to .cache/gemma4-test-tokenizer).
  add_test(NAME py_serve_python
           COMMAND ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider
                   ${CMAKE_CURRENT_LIST_DIR}/test_serve_python.py)
  set_tests_properties(py_serve_python PROPERTIES ENVIRONMENT "${_bindings_env}" TIMEOUT 900
                       LABELS python)
  # Downloads torch-tpu 0.2.0 and libtpu from PyPI once into .cache/torch-tpu-0.2.0.
  add_test(NAME py_torch_tpu
           COMMAND ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider
                   ${CMAKE_CURRENT_LIST_DIR}/test_torch_tpu.py)
  set_tests_properties(py_torch_tpu PROPERTIES ENVIRONMENT "${_bindings_env}" TIMEOUT 1500
                       LABELS "python;network")
endif()

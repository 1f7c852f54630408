# The engine on the stand-in device (issue #20) from the command line and from Python; the library
# and the C++ suite are in tests/cpp/device.cmake.
if(TARGET torchtpu_standin AND TARGET _torchtpu_cpp AND TARGET torchtpu-cpp)
  add_test(NAME py_standin_device
           COMMAND ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider
                   ${CMAKE_CURRENT_LIST_DIR}/test_standin_device.py)
  set_tests_properties(py_standin_device PROPERTIES
    LABELS "python;device" TIMEOUT 900
    ENVIRONMENT "PYTHONPATH=${CMAKE_BINARY_DIR}/python;OPENBLAS_NUM_THREADS=1;OMP_NUM_THREADS=1;TORCHTPU_CLI=$<TARGET_FILE:torchtpu-cpp>;TORCHTPU_STANDIN_LIBRARY=$<TARGET_FILE:torchtpu_standin>")
endif()

# Images (issue #19): decoding against Pillow, preprocessing against Gemma4ImageProcessor, the
# vision tower against transformers' get_image_features, through the torchtpu_cpp module.
if(TARGET _torchtpu_cpp)
  add_test(NAME py_vision
           COMMAND ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider
                   ${CMAKE_CURRENT_LIST_DIR}/test_vision.py)
  set_tests_properties(py_vision PROPERTIES
                       ENVIRONMENT "PYTHONPATH=${CMAKE_BINARY_DIR}/python;OPENBLAS_NUM_THREADS=1;OMP_NUM_THREADS=1"
                       TIMEOUT 900 LABELS "python;parity")
endif()

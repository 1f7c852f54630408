# Our safetensors reader and writer against the Python `safetensors` library.
add_test(NAME py_io_safetensors
         COMMAND ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider
                 ${CMAKE_CURRENT_SOURCE_DIR}/python/test_io_safetensors.py)
set_tests_properties(py_io_safetensors PROPERTIES
                     ENVIRONMENT "SAFETENSORS_DUMP=$<TARGET_FILE:safetensors_dump>")

# Our config.json reader against transformers' own Gemma4 configs (save_pretrained output).
add_test(NAME py_io_config
         COMMAND ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider
                 ${CMAKE_CURRENT_SOURCE_DIR}/python/test_io_config.py)
set_tests_properties(py_io_config PROPERTIES ENVIRONMENT "CONFIG_DUMP=$<TARGET_FILE:config_dump>")

# ChatTemplate against transformers' apply_chat_template on the Gemma 4 templates in data/gemma4.
set(TORCHTPU_GEMMA4_DATA ${CMAKE_SOURCE_DIR}/data/gemma4)
add_test(NAME py_chat_template
         COMMAND ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider
                 ${CMAKE_CURRENT_LIST_DIR}/test_chat_template.py)
set_tests_properties(py_chat_template PROPERTIES
                     ENVIRONMENT "CHAT_TEMPLATE_RENDER=$<TARGET_FILE:chat_template_render>;GEMMA4_DATA=${TORCHTPU_GEMMA4_DATA}")

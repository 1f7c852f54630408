# The chat template: ChatTemplate (C++) over the MiniJinja shim (Rust, cmake/Jinja.cmake).
include(${CMAKE_CURRENT_LIST_DIR}/../../cmake/Jinja.cmake)

add_library(torchtpu_chat STATIC ${CMAKE_CURRENT_LIST_DIR}/chat_template.cpp)
target_link_libraries(torchtpu_chat PUBLIC torchtpu_common nlohmann_json::nlohmann_json
                                    PRIVATE torchtpu_jinja)

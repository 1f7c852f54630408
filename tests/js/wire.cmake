# Issue #18's wire formats through their official clients on the demo checkpoint with the server's
# forced-output test hook: OpenAI's Responses API (`openai`) and Anthropic Messages
# (`@anthropic-ai/sdk`); Ollama's own API (`ollama`); and #19's images and audio in all of them
# (media, which writes a tiny multimodal checkpoint with the project's Python). One CTest entry
# each, so any can be run alone.
foreach(_suite responses messages ollama media)
  torchtpu_js_suite(js_${_suite} FILES ${_suite}.test.mjs TIMEOUT 300)
endforeach()

# `torchtpu-cpp launch claude|codex|opencode` against servers on the demo checkpoint: js_launch with
# stand-ins for the agents that ask the server through the official Anthropic and OpenAI SDKs,
# js_agents with the agents themselves (tests/agents: Claude Code, Codex and OpenCode, pinned;
# setup.sh installs them, and without them the test runs and fails).
foreach(_suite launch agents)
  torchtpu_js_suite(js_${_suite} FILES ${_suite}.test.mjs)
endforeach()

# The server's and the proxy's part of docs/RELIABILITY.md, "Security review": loopback by default,
# the API key on every route that generates or reveals anything, Host and Origin checks, the
# proxy's own key, the chat page's Content-Security-Policy.
torchtpu_js_suite(js_security FILES security.test.mjs)

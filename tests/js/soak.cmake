# Soak and faults (issue #16): `torchtpu-cpp serve` on the demo checkpoint under many concurrent
# clients, some leaving mid-answer; SIGTERM under load; slow and oversized requests. The short
# profile runs here (well under a minute); TORCHTPU_SOAK=long in the environment of ctest selects
# the long one (docs/RELIABILITY.md, "Soak and faults").
torchtpu_js_suite(js_soak FILES soak.test.mjs TIMEOUT 1800)

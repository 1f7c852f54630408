"""python -m torchtpu_cpp.serve: the OpenAI-compatible server of `torchtpu-cpp serve`, hosted by
Python. Python's part is what only Python can do: import torch_tpu (which registers the TPU with
libtorch) and name the device with a tensor on it. Everything else is the same C++ server: its
engine worker thread builds the engine and owns it, HTTP threads parse requests, and the GIL
stays released while it runs."""

import argparse
import os
import signal
import sys
import threading


def _parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m torchtpu_cpp.serve", description=__doc__
    )
    p.add_argument(
        "--model",
        default="",
        help="checkpoint dir or Hub id org/name[@rev] (default: built-in demo weights)",
    )
    p.add_argument(
        "--emb4", default="", help="dir or Hub id of the int4 vocabulary tables (emb4 twin)"
    )
    p.add_argument("--model-id", default="", help="name reported by /v1/models")
    p.add_argument("--host", default="127.0.0.1", help="address to bind")
    p.add_argument("--port", type=int, default=8000, help="port (0: any free port)")
    p.add_argument(
        "--context", type=int, default=32768, help="tokens the KV cache holds"
    )
    p.add_argument(
        "--device", default="cpu", help="cpu, cuda[:N], or tpu (imports torch_tpu)"
    )
    p.add_argument("--dtype", default="bfloat16", help="bfloat16, float32 or float16")
    p.add_argument(
        "--api-key",
        default=os.environ.get("TORCHTPU_API_KEY", ""),
        help="require 'Authorization: Bearer KEY' on everything but the probes (/health, "
        "/livez, /ping), /metrics without --metrics-auth, and the chat page, which asks "
        "for the key (default: $TORCHTPU_API_KEY)",
    )
    p.add_argument(
        "--parallel",
        type=int,
        default=4,
        help="requests decoded together, each with its own KV cache (more wait)",
    )
    p.add_argument("--max-queue", type=int, default=16, help="requests that may wait")
    p.add_argument(
        "--cache-mb",
        type=int,
        default=1024,
        help="prefix cache budget in MiB (0: off)",
    )
    p.add_argument(
        "--step-tokens",
        type=int,
        default=0,
        help="tokens one step may put through the model while requests decode "
        "(0: 128 + --parallel)",
    )
    p.add_argument(
        "--pass-rows",
        type=int,
        default=0,
        help="rows one forward pass may take when prompts are read together "
        "(1: each on its own; 0: 1 on the CPU, no limit on accelerators)",
    )
    p.add_argument(
        "--read-every",
        type=int,
        default=1,
        help="decode steps between host reads (above 1 needs --parallel 1)",
    )
    p.add_argument(
        "--max-body-bytes", type=int, default=8 << 20, help="largest request body"
    )
    p.add_argument(
        "--threads", type=int, default=0, help="intra-op threads (0: physical cores)"
    )
    p.add_argument(
        "--int4",
        default="auto",
        help="int4 weights: auto, packed, composite or dequantized",
    )
    p.add_argument(
        "--quantize", default="none", help="int4: quantize a dense checkpoint at load"
    )
    p.add_argument(
        "--int4-activation-bits",
        type=int,
        default=16,
        help="bits of the activations the CPU int4 kernel multiplies: 16 or 8 (half the work "
        "for several rows at once, llama.cpp's Q8_0 numerics)",
    )
    p.add_argument(
        "--constrain-tools",
        action="store_true",
        help="hold tool calls to the declared tools' schemas with tool_choice auto too",
    )
    p.add_argument(
        "--reasoning-budget",
        type=int,
        default=-1,
        help="tokens a reply may think before its thinking block is closed for it, unless the "
        "request sets thinking_token_budget or reasoning_budget_tokens (-1: no limit)",
    )
    p.add_argument(
        "--reasoning-budget-message",
        default="",
        help="text written into the thought when a budget closes it, just before <channel|> "
        "(default: none, the thought is closed straight away)",
    )
    p.add_argument(
        "--draft-max",
        type=int,
        default=None,
        help="speculative decoding: tokens drafted per step at most, from the assistant "
        "(--draft-model; 3 when not given) or else from what followed the last tokens earlier in "
        "the sequence (prompt lookup; 0, the default, off)",
    )
    p.add_argument(
        "--draft-model",
        default="",
        help="dir of the model's Gemma 4 assistant (gemma4_assistant): drafts come from it "
        "(multi-token prediction) instead of prompt lookup",
    )
    p.add_argument(
        "--lora",
        action="append",
        default=[],
        metavar="[NAME=]DIR",
        help="a LoRA adapter in PEFT's format, applied at scale 1 (repeat for several); NAME "
        "(DIR's last part when not given) is what requests call it",
    )
    p.add_argument(
        "--lora-init-without-apply",
        action="store_true",
        help="load the --lora adapters at scale 0: only requests that ask for one apply it",
    )
    p.add_argument(
        "--max-loras",
        type=int,
        default=8,
        help="the most LoRA adapters loaded at once, --lora's and those loaded at run time",
    )
    p.add_argument(
        "--runtime-lora",
        action="store_true",
        help="POST /v1/load_lora_adapter and /v1/unload_lora_adapter load and unload LoRA "
        "adapters from this machine's directories while serving; without it they answer 403",
    )
    p.add_argument(
        "--draft-ngram-min",
        type=int,
        default=2,
        help="shortest run of last tokens a draft is looked up by",
    )
    p.add_argument(
        "--draft-ngram-max", type=int, default=4, help="longest run, tried first"
    )
    p.add_argument(
        "--draft-always",
        action="store_true",
        help="check every draft found, even while drafts give tokens slower than plain steps",
    )
    p.add_argument(
        "--served-model-name",
        action="extend",
        nargs="+",
        default=[],
        help="more names requests may use for the model (repeatable)",
    )
    p.add_argument(
        "--metrics-auth", action="store_true", help="/metrics needs the API key too"
    )
    p.add_argument(
        "--no-slots",
        action="store_true",
        help="GET /slots answers 501: which requests run where stays unseen",
    )
    p.add_argument(
        "--slot-save-path",
        default="",
        help="folder of the prefix state files of POST /slots/{id}?action=save|restore "
        "(made if missing); without it slot actions answer 501",
    )
    p.add_argument(
        "--metrics-compat",
        default="none",
        help="none | vllm: also export the load gauges under vLLM's names",
    )
    p.add_argument(
        "--drain-grace",
        type=float,
        default=0.0,
        help="seconds after SIGTERM during which /health answers 503 while requests "
        "are still served",
    )
    p.add_argument(
        "--sleep-idle-seconds",
        type=float,
        default=-1.0,
        help="seconds without a request after which the engine frees its weights and caches "
        "until the next request reloads them (-1: never)",
    )
    p.add_argument(
        "--sleep-preserve-cache",
        action="store_true",
        help="keep the prefix cache while asleep (at most --cache-mb), so a conversation taken "
        "up again reads only its new turn",
    )
    # Images and audio in requests (#19): the names, defaults and checks of `torchtpu-cpp serve`
    # (the server checks the values and names the flag: error: --max-media must be ...).
    p.add_argument(
        "--max-media",
        type=int,
        default=8,
        help="images and audio clips a request may hold",
    )
    p.add_argument(
        "--max-image-bytes",
        type=int,
        default=8 << 20,
        help="largest image accepted, as encoded (a data: URL's base64 counts in "
        "--max-body-bytes too)",
    )
    p.add_argument(
        "--max-audio-bytes", type=int, default=8 << 20, help="largest WAV file accepted"
    )
    p.add_argument(
        "--image-tokens",
        type=int,
        default=280,
        help="an image's soft tokens when a request's detail is auto: 70, 140, 280, 560 "
        "or 1120",
    )
    p.add_argument(
        "--allow-media-urls",
        action="store_true",
        help="fetch http(s) image URLs that requests name (off: only data: URLs)",
    )
    p.add_argument(
        "--media-url-timeout",
        type=float,
        default=10.0,
        help="seconds one image URL fetch may take in all",
    )
    p.add_argument(
        "--no-vision",
        action="store_true",
        help="do not load the checkpoint's image tower (images are then a 400)",
    )
    p.add_argument(
        "--no-audio",
        action="store_true",
        help="do not load the checkpoint's audio tower (audio is then a 400)",
    )
    p.add_argument(
        "--mcp-media-dir",
        default="",
        help="a directory whose files the MCP tools at /mcp may read for their images and "
        "audio (only inside it; default: none, file paths refused)",
    )
    return p.parse_args(argv)


def main(argv=None):
    args = _parse_args(argv)
    import torch

    if args.device.split(":")[0] == "tpu":
        import torch_tpu  # noqa: F401  (registers the "tpu" device with libtorch)

    import torchtpu_cpp
    from torchtpu_cpp import _torchtpu_cpp

    # A tensor torch makes on the device names it the way the seeds do (`like`), and fails here,
    # with torch's own message, if the device is not usable.
    like = None if args.device == "cpu" else torch.zeros(1, device=args.device)
    print(
        f"torchtpu_cpp {torchtpu_cpp.__version__} (torch {torch.__version__}) hosting the server "
        f"on {like.device if like is not None else 'cpu'}",
        file=sys.stderr,
        flush=True,
    )
    outcome = {}

    def serve():
        try:
            outcome["code"] = _torchtpu_cpp.serve(
                model_dir=args.model,
                emb4_dir=args.emb4,
                model_id=args.model_id,
                host=args.host,
                port=args.port,
                context=args.context,
                device=args.device,
                dtype=args.dtype,
                api_key=args.api_key,
                max_queue=args.max_queue,
                read_every=args.read_every,
                max_body_bytes=args.max_body_bytes,
                like=like,
                threads=args.threads,
                int4=args.int4,
                quantize=args.quantize,
                int4_activation_bits=args.int4_activation_bits,
                constrain_tools=args.constrain_tools,
                reasoning_budget=args.reasoning_budget,
                reasoning_budget_message=args.reasoning_budget_message,
                draft_max=args.draft_max,
                draft_ngram_min=args.draft_ngram_min,
                draft_ngram_max=args.draft_ngram_max,
                draft_always=args.draft_always,
                draft_model=args.draft_model,
                lora=args.lora,
                lora_init_without_apply=args.lora_init_without_apply,
                max_loras=args.max_loras,
                runtime_lora=args.runtime_lora,
                served_model_names=args.served_model_name,
                metrics_auth=args.metrics_auth,
                no_slots=args.no_slots,
                slot_save_path=args.slot_save_path,
                metrics_compat=args.metrics_compat,
                drain_grace_s=args.drain_grace,
                sleep_idle_s=args.sleep_idle_seconds,
                sleep_preserve_cache=args.sleep_preserve_cache,
                parallel=args.parallel,
                cache_mb=args.cache_mb,
                step_tokens=args.step_tokens,
                pass_rows=args.pass_rows,
                max_media=args.max_media,
                max_image_bytes=args.max_image_bytes,
                max_audio_bytes=args.max_audio_bytes,
                image_tokens=args.image_tokens,
                allow_media_urls=args.allow_media_urls,
                media_url_timeout_s=args.media_url_timeout,
                no_vision=args.no_vision,
                no_audio=args.no_audio,
                mcp_media_dir=args.mcp_media_dir,
            )
        except BaseException as e:  # noqa: BLE001 (raised again on the main thread)
            outcome["error"] = e

    # The server runs on a thread of its own so that the main thread keeps Python's signal
    # handling: SIGINT/SIGTERM ask the server to stop, it answers the requests it has, returns.
    def stop(signum, frame):
        _torchtpu_cpp.request_stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server = threading.Thread(target=serve, name="torchtpu-cpp-server")
    server.start()
    while server.is_alive():
        server.join(0.5)
    if isinstance(outcome.get("error"), ValueError):
        # A bad option, named by the server's check: said as `torchtpu-cpp serve` says it.
        print(f"error: {outcome['error']}", file=sys.stderr, flush=True)
        return 2
    if "error" in outcome:
        raise outcome["error"]
    return outcome["code"]


if __name__ == "__main__":
    sys.exit(main())

"""What `serve --sleep-idle-seconds` gives back and what waking costs: a server on the checkpoint
answers a short completion awake, sleeps after the idle seconds, and answers the same request
again, which waits for the weights to load; per round the server's resident memory awake and
asleep, both requests' times and the engine's own load time for the wake. With --turn-prompt N,
each round also times a conversation taken up after a sleep: a first turn of about N prompt
tokens awake, a sleep, then a second turn that goes on from it, which reads only the new tokens
when the server keeps its prefix cache asleep (--preserve-cache: serve --sleep-preserve-cache).

    python bench/sleep_wake.py --model DIR [--emb4 DIR] [--rounds 3] [--idle 2]
        [--context 2048] [--turn-prompt 0] [--preserve-cache] [--cli build/torchtpu-cpp]

Prints one JSON object; docs/BENCHMARKS.md, "Sleeping when idle", has the figures.
"""

import argparse
import json
import pathlib
import re
import subprocess
import time
import urllib.request


def rss_bytes(pid):
    status = pathlib.Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024


def get(url):
    with urllib.request.urlopen(url, timeout=600) as r:
        return json.loads(r.read())


def timed_completion(url, prompt="Write about rain."):
    """Seconds for a 4-token completion, and its answer."""
    body = json.dumps({"prompt": prompt, "max_tokens": 4, "ignore_eos": True})
    req = urllib.request.Request(
        url + "/v1/completions", body.encode(), {"Content-Type": "application/json"}
    )
    start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        answer = json.loads(r.read())
    return time.perf_counter() - start, answer


def wait_asleep(url):
    while not get(url + "/props")["is_sleeping"]:
        time.sleep(0.2)


def taken_up_after_sleep(url, tokens, round_index):
    """A first turn of about `tokens` prompt tokens (its own text each round, so no round reads
    another's cache), a sleep, and a second turn going on from it."""
    first = f"Round {round_index}." + " The rain falls on the quiet town." * (tokens // 8)
    first_s, answer = timed_completion(url, first)
    wait_asleep(url)
    second_s, second = timed_completion(url, first + answer["choices"][0]["text"] + " Go on.")
    return {
        "first_turn_prompt_tokens": answer["usage"]["prompt_tokens"],
        "first_turn_s": round(first_s, 3),
        "second_turn_after_sleep_s": round(second_s, 3),
        "second_turn_prompt_tokens": second["usage"]["prompt_tokens"],
        "second_turn_cached_tokens": second["usage"]["prompt_tokens_details"]["cached_tokens"],
        "wake_load_s": round(get(url + "/v1/engine")["scheduler"]["last_wake_seconds"], 3),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--emb4", default="")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--idle", type=float, default=2.0)
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--turn-prompt", type=int, default=0,
                   help="tokens of a conversation's first turn, taken up after a sleep (0: none)")
    p.add_argument("--preserve-cache", action="store_true",
                   help="serve with --sleep-preserve-cache")
    p.add_argument("--cli", default="build/torchtpu-cpp")
    args = p.parse_args()
    cmd = [args.cli, "serve", "--port", "0", "--model", args.model, "--context",
           str(args.context), "--sleep-idle-seconds", str(args.idle)]
    if args.emb4:
        cmd += ["--emb4", args.emb4]
    if args.preserve_cache:
        cmd.append("--sleep-preserve-cache")
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        url = re.search(r"serving \S+ on (http://\S+)", server.stdout.readline()).group(1)
        while True:
            try:
                if urllib.request.urlopen(url + "/health", timeout=5).status == 200:
                    break
            except OSError:
                time.sleep(0.5)
        engine = get(url + "/v1/engine")
        rounds = []
        for index in range(args.rounds):
            awake_s, _ = timed_completion(url)
            awake_rss = rss_bytes(server.pid)
            wait_asleep(url)
            asleep_rss = rss_bytes(server.pid)
            woken_s, _ = timed_completion(url)
            rounds.append({
                "rss_awake_bytes": awake_rss,
                "rss_asleep_bytes": asleep_rss,
                "request_awake_s": round(awake_s, 3),
                "request_after_sleep_s": round(woken_s, 3),
                "wake_load_s": round(get(url + "/v1/engine")["scheduler"]["last_wake_seconds"], 3),
            })
            if args.turn_prompt > 0:
                rounds[-1]["conversation"] = taken_up_after_sleep(url, args.turn_prompt, index)
        print(json.dumps({"model": args.model, "first_load_s": round(engine["load_seconds"], 3),
                          "preserve_cache": args.preserve_cache, "rounds": rounds}, indent=1))
    finally:
        server.terminate()
        server.wait(timeout=120)


if __name__ == "__main__":
    main()

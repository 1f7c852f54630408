"""What `serve --sleep-idle-seconds` gives back and what waking costs: a server on the checkpoint
answers a short completion awake, sleeps after the idle seconds, and answers the same request
again, which waits for the weights to load; per round the server's resident memory awake and
asleep, both requests' times and the engine's own load time for the wake.

    python bench/sleep_wake.py --model DIR [--emb4 DIR] [--rounds 3] [--idle 2]
        [--context 2048] [--cli build/torchtpu-cpp]

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


def timed_completion(url):
    body = json.dumps({"prompt": "Write about rain.", "max_tokens": 4, "ignore_eos": True})
    req = urllib.request.Request(
        url + "/v1/completions", body.encode(), {"Content-Type": "application/json"}
    )
    start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        r.read()
    return time.perf_counter() - start


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--emb4", default="")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--idle", type=float, default=2.0)
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--cli", default="build/torchtpu-cpp")
    args = p.parse_args()
    cmd = [args.cli, "serve", "--port", "0", "--model", args.model, "--context",
           str(args.context), "--sleep-idle-seconds", str(args.idle)]
    if args.emb4:
        cmd += ["--emb4", args.emb4]
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
        for _ in range(args.rounds):
            awake_s = timed_completion(url)
            awake_rss = rss_bytes(server.pid)
            while not get(url + "/props")["is_sleeping"]:
                time.sleep(0.2)
            asleep_rss = rss_bytes(server.pid)
            woken_s = timed_completion(url)
            rounds.append({
                "rss_awake_bytes": awake_rss,
                "rss_asleep_bytes": asleep_rss,
                "request_awake_s": round(awake_s, 3),
                "request_after_sleep_s": round(woken_s, 3),
                "wake_load_s": round(get(url + "/v1/engine")["scheduler"]["last_wake_seconds"], 3),
            })
        print(json.dumps({"model": args.model, "first_load_s": round(engine["load_seconds"], 3),
                          "rounds": rounds}, indent=1))
    finally:
        server.terminate()
        server.wait(timeout=120)


if __name__ == "__main__":
    main()

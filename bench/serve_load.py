"""64 concurrent streaming clients against `swarmtune serve --clients` for a minute, on the default model.

Every client streams greedy (temperature 0) completions of a few prompts, over and over, through the
`openai` SDK with its default retries. Before the load, each prompt's text is taken once, alone; under
load every streamed text must equal it, so a lost, duplicated or reordered token shows. Prints the
statuses seen (200, the documented 503 with Retry-After, anything else), the texts that differed, and
whether the server's cache check (--check) held; the last line is `bad: N` (5xx other than 503, texts
that differ, a server error), which must be 0.

    python bench/serve_load.py [--clients 64] [--seconds 60] [--max-queue 32]
"""

import argparse
import collections
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["Name three sorting algorithms.", "What does a hash map do?", "Explain recursion in one sentence.",
           "Write a Python function that adds two numbers.", "What is a KV cache?", "Say hello in French."]


def start(a: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "swarmtune", "serve", "--clients", "--port", "0", "--check",
                             "--agents", str(a.agents), "--max-queue", str(a.max_queue)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    while True:
        line = proc.stderr.readline()
        if m := re.search(r"serving (http://\S+)", line):
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep its pipe drained
            return proc, m.group(1)
        if proc.poll() is not None:
            raise SystemExit(f"the server did not start: {line}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--agents", type=int, default=8)
    p.add_argument("--max-queue", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=24)
    a = p.parse_args()
    proc, url = start(a)
    try:
        c = openai.OpenAI(base_url=url + "/v1", api_key="x")
        want = {q: c.chat.completions.create(model="m", messages=[{"role": "user", "content": q}], temperature=0,
                                             max_tokens=a.max_tokens).choices[0].message.content for q in PROMPTS}
        statuses: collections.Counter[int | str] = collections.Counter()
        differed: list[tuple[str, str, str]] = []
        lock = threading.Lock()
        deadline = time.time() + a.seconds

        def client(i: int) -> None:
            k = openai.OpenAI(base_url=url + "/v1", api_key="x", timeout=120)
            n = i
            while time.time() < deadline:
                q = PROMPTS[n % len(PROMPTS)]
                n += 1
                try:
                    text = "".join(ch.choices[0].delta.content or "" for ch in k.chat.completions.create(
                        model="m", messages=[{"role": "user", "content": q}], temperature=0,
                        max_tokens=a.max_tokens, stream=True) if ch.choices)
                    with lock:
                        statuses[200] += 1
                        if text != want[q]:
                            differed.append((q, want[q], text))
                except openai.APIStatusError as e:
                    with lock:
                        statuses[e.status_code] += 1
                    time.sleep(float(e.response.headers.get("retry-after", "1")))
                except openai.APIConnectionError as e:
                    with lock:
                        statuses[type(e).__name__] += 1

        threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
        t0 = time.time()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.time() - t0
        error = httpx.get(url + "/v1/state").json()["error"]
    finally:
        proc.terminate()
        proc.wait(30)
    print(f"{a.clients} clients for {wall:.0f} s, {a.agents} agents, queue {a.max_queue}: statuses {dict(statuses)}")
    for q, w, g in differed[:5]:
        print(f"differed for {q!r}:\n  alone:     {w!r}\n  under load: {g!r}")
    print(f"texts that differed: {len(differed)} of {statuses[200]}; server error: {error}")
    bad = sum(v for s, v in statuses.items() if s not in (200, 503)) + len(differed) + (error is not None)
    print(f"bad: {bad}")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    os.environ.setdefault("SWARMTUNE_CHECK", "1")
    sys.exit(main())

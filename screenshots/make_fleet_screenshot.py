"""A screenshot of `swarmtune fleet` on three real nodes of the default model under the Debian Prometheus:
conversations served through each, one node switched to q8_0 from the view, one killed with kill -9.

    python screenshots/make_fleet_screenshot.py

Writes screenshots/fleet.svg and fleet.png (through rsvg-convert, where it is installed)."""

import asyncio
import shutil
import signal
import subprocess
import sys
import threading
from contextlib import ExitStack
from pathlib import Path

import openai

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from swarmtune.sources.fleet import PrometheusFleet  # noqa: E402
from swarmtune.tui.fleet_app import FleetApp  # noqa: E402
from tests.remote_helpers import prometheus_server, served  # noqa: E402


def talk(url: str, i: int, stop: threading.Event) -> None:
    c = openai.OpenAI(base_url=url + "/v1", api_key="x")
    msgs = [{"role": "system", "content": "You are a coding agent. Be brief."},
            {"role": "user", "content": f"Task {i}: fix the failing test in module_{i}.py."}]
    while not stop.is_set():
        r = c.chat.completions.create(model="m", messages=msgs, max_tokens=24)
        msgs += [{"role": "assistant", "content": r.choices[0].message.content},
                 {"role": "user", "content": f"$ pytest module_{i}.py\n" + "E   AssertionError\n" * 6}]
        if len(msgs) > 10:
            msgs = msgs[:2]


async def main() -> None:
    stop = threading.Event()
    with ExitStack() as stack:
        nodes = [stack.enter_context(served("--clients", "--agents", "3", "--ctx", "1024", "--threads", "1"))
                 for _ in range(3)]
        prom = stack.enter_context(prometheus_server({"swarmtune": [n.url for n in nodes]}, 1.0))
        for k, n in enumerate(nodes[:2]):
            for i in range(2):
                threading.Thread(target=talk, args=(n.url, 2 * k + i, stop), daemon=True).start()
        app = FleetApp(PrometheusFleet(prom), 1.0, {}, None)
        async with app.run_test(size=(170, 12)) as pilot:
            await pilot.pause(20)
            await pilot.press("down", "colon", *"kv", "space", *"q8_0", "enter")  # the second row's node
            await pilot.pause(8)
            switched = sorted(n.url for n in nodes)[1]
            next(n for n in nodes[::-1] if n.url != switched).stop(signal.SIGKILL)  # another one
            await pilot.pause(4)
            app.save_screenshot(str(HERE / "fleet.svg"))
        stop.set()
    if shutil.which("rsvg-convert"):
        subprocess.run(["rsvg-convert", "-w", "1700", str(HERE / "fleet.svg"), "-o", str(HERE / "fleet.png")],
                       check=True)
    else:
        print("rsvg-convert not found (apt-get install librsvg2-bin): wrote the SVG only", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main())

"""Screenshots of the dashboard during a real run on the default model.

    python screenshots/make_screenshots.py [SECONDS]            # the synthetic swarm: dashboard.svg/png
    python screenshots/make_screenshots.py --served [SECONDS]   # served clients: served.svg/png

Writes screenshots/NAME.svg (Textual's export) and NAME.png (through rsvg-convert, from Debian's
librsvg2-bin, where it is installed). --served runs `swarmtune run --clients` in process with eight
openai-SDK conversations talking to it over loopback."""

import asyncio
import shutil
import subprocess
import sys
import threading
from pathlib import Path

from swarmtune.factories import make_engine
from swarmtune.parsing import build_parser
from swarmtune.sources.live import LiveSource
from swarmtune.tui.app import SwarmApp

HERE = Path(__file__).resolve().parent


def conversations(url: str, stop: threading.Event) -> None:
    """Eight agents' worth of traffic: each conversation returns with a tool result after a short wait."""
    import openai

    def one(i: int) -> None:
        c = openai.OpenAI(base_url=url + "/v1", api_key="x")
        msgs = [{"role": "system", "content": "You are a coding agent. Be brief."},
                {"role": "user", "content": f"Task {i}: fix the failing test in module_{i}.py."}]
        while not stop.is_set():
            r = c.chat.completions.create(model="m", messages=msgs, max_tokens=48, user=f"agent-{i}")
            msgs += [{"role": "assistant", "content": r.choices[0].message.content},
                     {"role": "tool", "content": f"$ pytest module_{i}.py\n" + "E   AssertionError\n" * 12}]
            if len(msgs) > 14:
                msgs = msgs[:2]
            stop.wait(0.5 + i * 0.1)

    for i in range(8):
        threading.Thread(target=one, args=(i,), daemon=True).start()


async def main(seconds: float, served: bool) -> None:
    name = "served" if served else "dashboard"
    argv = ["run", "--agents", "8", "--ctx", "1024"] + (["--clients", "--port", "0"] if served else [])
    args = build_parser().parse_args(argv)
    engine = make_engine(args)
    stop = threading.Event()
    if served:
        from swarmtune.server.hosted import HostedSource
        from swarmtune.server.runner import EngineRunner

        source = HostedSource(EngineRunner(engine, served=engine.workload), engine.workload, "127.0.0.1", 0, None)
    else:
        source = LiveSource(engine)
    app = SwarmApp(source)
    async with app.run_test(size=(160, 50)) as pilot:
        if served:
            while not source.server.started:
                await pilot.pause(0.1)
            conversations(source.status.split()[1].removesuffix("/v1"), stop)
        await pilot.pause(seconds)
        app.save_screenshot(str(HERE / f"{name}.svg"))
        stop.set()
        app.stop_engine()
    source.close()
    if shutil.which("rsvg-convert"):
        subprocess.run(["rsvg-convert", "-w", "1600", str(HERE / f"{name}.svg"), "-o", str(HERE / f"{name}.png")],
                       check=True)
    else:
        print("rsvg-convert not found (apt-get install librsvg2-bin): wrote the SVG only", file=sys.stderr)


if __name__ == "__main__":
    rest = [a for a in sys.argv[1:] if a != "--served"]
    asyncio.run(main(float(rest[0]) if rest else 60.0, "--served" in sys.argv))

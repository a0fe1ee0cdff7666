"""Screenshots of the dashboard during a real run on the default model.

    python screenshots/make_screenshots.py [SECONDS]

Writes screenshots/dashboard.svg (Textual's export) and dashboard.png (through rsvg-convert, from
Debian's librsvg2-bin, where it is installed)."""

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

from swarmtune.engine.sources.live import LiveSource
from swarmtune.factories import make_engine
from swarmtune.parsing import build_parser
from swarmtune.tui.app import SwarmApp

HERE = Path(__file__).resolve().parent


async def main(seconds: float) -> None:
    args = build_parser().parse_args(["run", "--agents", "8", "--ctx", "1024"])
    engine = make_engine(args)
    app = SwarmApp(LiveSource(engine))
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause(seconds)
        app.save_screenshot(str(HERE / "dashboard.svg"))
        app.stop_engine()
    engine.close()
    if shutil.which("rsvg-convert"):
        subprocess.run(["rsvg-convert", "-w", "1600", str(HERE / "dashboard.svg"), "-o", str(HERE / "dashboard.png")],
                       check=True)
    else:
        print("rsvg-convert not found (apt-get install librsvg2-bin): wrote the SVG only", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main(float(sys.argv[1]) if len(sys.argv) > 1 else 60.0))

"""How soon the dashboard answers, timed as a user's terminal sees it: `swarmtune` runs in a pseudo-terminal
(160x50, xterm-256color) and every byte it writes is fed, as it arrives, to a terminal emulator (pyte); a
figure ends at the arrival of the bytes that made the screen show it.

(a) From launch (the command started, Python's imports on the way; the model loads while the screen is up,
and before this version loaded before it) to the first frame, and to
the first full screen: the status line, every agent's row, the speedup curve and the bytes panel drawn.
(b) A key's effect: from writing `-` (or `+`, the batch cap) to the pty to its first sign on the screen
(the note it raises, or the status line), and to the status line showing the cap the engine runs at, with
the engine decoding meanwhile. Several rounds, each a fresh process; median and worst of each.
Last lines `first screen: ...`, `key applied: ...` and `key: ...`.

    python bench/first_screen.py [--rounds 3] [--keys 6]
"""

import argparse
import os
import re
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import ptyprocess
import pyte

ROOT = Path(__file__).resolve().parent.parent
COLS, ROWS = 160, 50
AGENT_ROW = re.compile(r"^\s*\d+ [a-z]+\s+\S+\s+[\d,]+/[\d,]+\s")
BRAILLE = re.compile("[\u2801-\u28ff]")


class Terminal:
    """The app in a pty. A reader thread stamps each chunk as it arrives and does nothing else; the screen
    (pyte, pure Python and slower than a frame is written) is fed from those chunks, so a figure is the
    arrival of the chunk that completed it, however far behind the parsing runs."""

    def __init__(self, argv: list[str]) -> None:
        env = dict(os.environ, TERM="xterm-256color", COLUMNS=str(COLS), LINES=str(ROWS))
        self.screen = pyte.Screen(COLS, ROWS)
        self.stream = pyte.ByteStream(self.screen)
        self.chunks: list[tuple[float, bytes]] = []
        self.fed = 0
        self.started = time.perf_counter()
        self.proc = ptyprocess.PtyProcess.spawn(argv, cwd=str(ROOT), env=env, dimensions=(ROWS, COLS))
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.proc.fd, 1 << 16)
            except OSError:  # the app exited
                return
            if not data:
                return
            self.chunks.append((time.perf_counter(), data))

    def until(self, shown: Callable[[list[str]], bool], timeout_s: float, after: float = 0.0) -> float | None:
        """Arrival time of the chunk that made shown(screen) true; None at the timeout. A chunk that arrived
        before `after` (written before a key was) is fed, but is no answer."""
        end = time.perf_counter() + timeout_s
        while time.perf_counter() < end:
            if self.fed == len(self.chunks):
                if not self.reader.is_alive():
                    return None
                time.sleep(0.001)
                continue
            arrived, data = self.chunks[self.fed]
            self.fed += 1
            self.stream.feed(data)
            if arrived >= after and shown(self.screen.display):
                return arrived
        return None

    def catch_up(self) -> None:
        n = len(self.chunks)
        self.stream.feed(b"".join(d for _, d in self.chunks[self.fed : n]))
        self.fed = n

    def key(self, k: str) -> float:
        self.proc.write(k.encode())
        return time.perf_counter()

    def close(self) -> None:
        self.proc.write(b"q")
        self.reader.join(10)  # the reader drains the pty, so the app can exit
        if self.proc.isalive():
            self.proc.terminate(force=True)


def status_cap(lines: list[str]) -> int | None:
    m = re.search(r"\| cap (\d+) \|", lines[0])
    return int(m.group(1)) if m else None


def notes_saying(lines: list[str], cap: int) -> int:
    return sum(1 for ln in lines if f"batch cap {cap}," in ln)


def full_screen(agents: int) -> Callable[[list[str]], bool]:
    def shown(lines: list[str]) -> bool:
        text = "\n".join(lines)
        if status_cap(lines) is None or "weights/B shared" not in text:
            return False
        if sum(1 for ln in lines if AGENT_ROW.match(ln)) < agents:
            return False
        at = next((i for i, ln in enumerate(lines) if "speedup vs context per agent" in ln), None)
        return at is not None and any(BRAILLE.search(ln) for ln in lines[at + 1 :])
    return shown


def one_round(a: argparse.Namespace) -> tuple[float, float, list[tuple[float, float]]]:
    argv = [sys.executable, "-m", "swarmtune", "run", "--agents", str(a.agents), "--ctx", str(a.ctx)]
    if a.threads:
        argv += ["--threads", str(a.threads)]
    term = Terminal(argv)
    try:
        first = term.until(lambda lines: any(ln.strip() for ln in lines), 60)
        full = term.until(full_screen(a.agents), 60)
        if first is None or full is None:
            raise SystemExit("the dashboard did not draw its first screen within 60 s:\n"
                             + "\n".join(term.screen.display))
        keys = []
        for k in range(a.keys):
            term.until(lambda _: False, 0.3)  # the engine decoding meanwhile, as a user finds it
            term.catch_up()  # what came before the key is not its answer
            key, want = ("-", a.agents - 1) if k % 2 == 0 else ("+", a.agents)
            # a note stays 3 s: one from two keys ago may still say "batch cap N", so the sign is a new one
            notes = notes_saying(term.screen.display, want)
            pressed = term.key(key)
            # the first sign: the note the key raises ("batch cap N") or the status line with the new cap
            seen = term.until(lambda lines, want=want, notes=notes: status_cap(lines) == want or
                              notes_saying(lines, want) > notes, 5, after=pressed)
            applied = seen if seen is not None and status_cap(term.screen.display) == want else \
                term.until(lambda lines, want=want: status_cap(lines) == want, 5, after=pressed)
            if seen is None or applied is None:
                raise SystemExit(f"the cap did not show {want} within 5 s of the key {key!r}")
            keys.append((seen - pressed, applied - pressed))
        return first - term.started, full - term.started, keys
    finally:
        term.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=2048, help="per agent (the default limit of `swarmtune`)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="the engine's (default: its own default)")
    ap.add_argument("--keys", type=int, default=6, help="key presses per round")
    a = ap.parse_args()
    firsts, fulls, seen, applied = [], [], [], []
    for r in range(a.rounds):
        first, full, k = one_round(a)
        firsts.append(first)
        fulls.append(full)
        seen += [s for s, _ in k]
        applied += [x for _, x in k]
        print(f"round {r + 1}: first frame {first:.2f} s, full screen {full:.2f} s after launch; a key's first "
              "sign / status line applied: " + ", ".join(f"{s * 1000:.0f}/{x * 1000:.0f}" for s, x in k)
              + " ms (measured at the terminal)", flush=True)
    print(f"first frame: median {statistics.median(firsts):.2f} s after launch")
    print(f"first screen: median {statistics.median(fulls):.2f} s, worst {max(fulls):.2f} s after launch "
          f"({a.rounds} rounds, Python's imports included; the model loads behind the screen)")
    print(f"key applied: {max(applied) * 1000:.0f} ms (worst of {len(applied)}; median "
          f"{statistics.median(applied) * 1000:.0f} ms): the status line showing the cap the engine runs at")
    print(f"key: {max(seen) * 1000:.0f} ms (worst of {len(seen)}; median {statistics.median(seen) * 1000:.0f} ms; "
          "bar < 100 ms): the key's first sign on the screen")


if __name__ == "__main__":
    main()

"""A real `swarmtune serve` (or stand-in) process on an ephemeral loopback port, for the remote tests."""

import os
import re
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

from tests.conftest import ROOT


class Served:
    def __init__(self, proc: subprocess.Popen, url: str) -> None:
        self.proc, self.url = proc, url

    def stop(self, sig=signal.SIGTERM, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
        return self.proc.wait(timeout)


def start_server(*args: str, port: int = 0, timeout: float = 120) -> Served:
    proc = subprocess.Popen([sys.executable, "-m", "swarmtune", "serve", "--port", str(port), *args], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + timeout
    line = ""
    while time.time() < deadline:
        line = proc.stderr.readline()
        if m := re.search(r"serving (http://\S+)", line):
            return Served(proc, m.group(1))
        if proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError(f"server did not start: {line}{proc.stderr.read() if proc.stderr else ''}")


@contextmanager
def served(*args: str, port: int = 0):
    s = start_server(*args, port=port)
    try:
        yield s
    finally:
        if s.proc.poll() is None:
            s.stop(signal.SIGKILL)

"""A real `swarmtune serve` (or stand-in) process on an ephemeral loopback port, for the remote tests; and a
real Prometheus (the Debian package, which .ci/run installs) that scrapes them."""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def prometheus_server(jobs: dict[str, list[str]], scrape_s: float = 1.0, ready_s: float = 30):
    """The Debian `prometheus` on a free loopback port, scraping each job's host:port targets every
    `scrape_s`; its URL, once ready. Its data lives in a temporary folder that goes with it."""
    binary = shutil.which("prometheus")
    assert binary, "Prometheus is not installed: apt-get install prometheus (.ci/run does)"
    with tempfile.TemporaryDirectory(prefix="prometheus-") as tmp:
        d = Path(tmp)
        every = f"{round(scrape_s * 1000)}ms"  # Prometheus's durations are whole numbers of a unit
        lines = [f"global: {{scrape_interval: {every}, scrape_timeout: {every}}}", "scrape_configs:"]
        for job, targets in jobs.items():
            at = ", ".join(f"'{t.removeprefix('http://')}'" for t in targets)
            lines.append(f"  - {{job_name: {job}, static_configs: [{{targets: [{at}]}}]}}")
        (d / "prometheus.yml").write_text("\n".join(lines) + "\n")
        port = free_port()
        proc = subprocess.Popen([binary, f"--config.file={d / 'prometheus.yml'}", f"--storage.tsdb.path={d / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.time() + ready_s
            while True:
                try:
                    if httpx.get(url + "/-/ready", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert proc.poll() is None and time.time() < deadline, "Prometheus did not get ready"
                time.sleep(0.3)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

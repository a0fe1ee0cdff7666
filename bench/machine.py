"""What machine a bench ran on, for the line it prints first (bench/, next to the scripts)."""

import platform


def cpu_name() -> str:
    """The CPU's model name (platform.processor() is empty on Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()

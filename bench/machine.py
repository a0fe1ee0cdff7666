"""What machine a bench ran on, for the line it prints first (bench/, next to the scripts)."""

import platform


def cpu_name() -> str:
    """The CPU's model name (platform.processor() is empty on Linux) and its widest vector units: a
    virtual machine's model name is often only "AMD EPYC", and an AVX2-only EPYC and an AVX-512 one differ
    by 2x in tok/s and in what a KV type costs relative to another."""
    name, flags = "", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name") and not name:
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    units = [u for u, flag in (("AMX", "amx_tile"), ("AVX-512", "avx512f")) if flag in flags]
    units = units or (["AVX2 only"] if "avx2" in flags else [])
    name = name or platform.processor() or platform.machine()
    return f"{name} ({', '.join(units)})" if units else name

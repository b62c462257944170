"""What a measurement ran on, named the same way by every benchmark and notebook: the CPU's model or the GPU's.

    python -m rosellm_edu.benchmarks.machine    # prints notebooks/data/<this machine>, the folder for its figures
"""

import json
import os
import platform
import re
from datetime import date
from pathlib import Path

import torch


def device_name(device: torch.device = torch.device("cpu")) -> str:
    """The GPU's name for a CUDA device; otherwise the CPU's model name, from /proc/cpuinfo where there is one."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def describe(device: torch.device = torch.device("cpu")) -> str:
    """The device's name, torch's threads and torch's version, for a line printed beside a figure."""
    return f"{device_name(device)}, {torch.get_num_threads()} threads, torch {torch.__version__}"


def machine_line(device: torch.device = torch.device("cpu")) -> str:
    """The line a timing chapter prints above its numbers: machine, threads, torch and today's date."""
    return f"Machine: {describe(device)}, {date.today()}"


# The CPU features that decide which of this book's paths wins, strongest first (see chapters 02, 10 and 11).
DECIDING_FLAGS = {"amx_tile": "amx", "avx512_bf16": "avx512-bf16", "avx512_vnni": "avx512-vnni", "avx512f": "avx512",
                  "avx_vnni": "avx-vnni", "avx2": "avx2"}
DATA_DIR = Path(__file__).resolve().parents[2] / "notebooks" / "data"


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none)."""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    return set()


def machine_key(device: torch.device = torch.device("cpu")) -> str:
    """A folder name for this machine's figures: its model, and on a CPU the strongest deciding feature, e.g.
    'intel-xeon-processor-amx' or 'amd-epyc-avx512-bf16'."""
    name = re.sub(r"\(r\)|\(tm\)", "", device_name(device).lower())
    key = re.sub(r"[^a-z0-9]+", "-", name).strip("-")
    if device.type == "cpu":
        flags = cpu_flags()
        key += next((f"-{tag}" for flag, tag in DECIDING_FLAGS.items() if flag in flags), "")
    return key


def machine_record(device: torch.device = torch.device("cpu")) -> dict:
    """What README's column for this machine says about it."""
    flags = cpu_flags()
    return {"key": machine_key(device), "device": device_name(device), "cores": os.cpu_count(),
            "deciding_flags": [flag for flag in DECIDING_FLAGS if flag in flags],
            "threads": torch.get_num_threads(), "torch": torch.__version__}


def record_dir(device: torch.device = torch.device("cpu")) -> Path:
    """notebooks/data/<machine key>/, with its machine.json written: where this machine's benchmark JSON goes."""
    folder = DATA_DIR / machine_key(device)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "machine.json").write_text(json.dumps(machine_record(device), indent=1) + "\n")
    return folder


if __name__ == "__main__":
    print(record_dir().relative_to(DATA_DIR.parents[1]))

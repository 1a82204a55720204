"""Where a vLLM process tree spends its CPU: py-spy samples of every process in it (the API server or
run-batch front end, the engine core, the model worker), counted by process and by the innermost vLLM
function on the stack (time in torch or native code, a matmul say, counts for the vLLM function that
called it; a stack with no vLLM frame counts for its top function).

py-spy is a development tool, not a dependency: ``.venv/bin/pip install py-spy``. Only busy samples
are recorded (py-spy's default), so a process's samples / rate is its CPU time.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

RATE = 20  # samples per second and thread
PROCESS = re.compile(r'process \d+:"([^"]*)"')
LINE = re.compile(r":\d+\)$")


def py_spy() -> str:
    found = shutil.which(
        "py-spy", path=str(Path(sys.executable).parent)
    ) or shutil.which("py-spy")
    if found is None:
        raise SystemExit("--profile needs py-spy: .venv/bin/pip install py-spy")
    return found


class Profile:
    """py-spy attached to ``pid`` and its children until ``stop``; raw samples in ``out``."""

    def __init__(self, pid: int, out: Path) -> None:
        self.out = out
        command = [
            py_spy(),
            "record",
            "--pid",
            str(pid),
            "--subprocesses",
            "--format",
            "raw",
            "--rate",
            str(RATE),
            "--nonblocking",
            "--output",
            str(out),
        ]
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def stop(self) -> Path:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # py-spy writes its file on Ctrl-C
        self.process.wait(timeout=120)
        return self.out


def role(command: str) -> str:
    """A process's part in vLLM, from its command line (vLLM names its engine processes)."""
    if "EngineCore" in command:
        return "engine core"
    if "Worker" in command:
        return "model worker"
    return "front end" if "vllm" in command else command[:40]


def summarize(
    raw: Path, per: float, top: int = 5
) -> list[tuple[str, float, list[tuple[str, float]]]]:
    """(process role, CPU seconds per ``per`` unit of work, [(function, share of that process's samples)])
    for each process in a py-spy raw file, busiest first."""
    totals: Counter[str] = Counter()
    functions: dict[str, Counter[str]] = defaultdict(Counter)
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        processes = PROCESS.findall(stack)
        if not processes or not count.isdigit():
            continue
        name = role(processes[-1])
        frames = [
            LINE.sub(")", f) for f in stack.split(";") if not f.startswith("process ")
        ]
        ours = [f for f in frames if "vllm/" in f] or frames or ["(native)"]
        totals[name] += int(count)
        functions[name][ours[-1]] += int(count)
    return [
        (
            name,
            samples / RATE / per,
            [(f, n / samples) for f, n in functions[name].most_common(top)],
        )
        for name, samples in totals.most_common()
    ]


def table(
    title: str, rows: list[tuple[str, float, list[tuple[str, float]]]], unit: str
) -> str:
    lines = [
        f"{title}:",
        f"| process | CPU s per {unit} | where (share of the process's samples) |",
        "|---|---|---|",
    ]
    for name, seconds, top in rows:
        where = "; ".join(f"{share:.0%} {function}" for function, share in top)
        lines.append(f"| {name} | {seconds:.3f} | {where} |")
    return "\n".join(lines)

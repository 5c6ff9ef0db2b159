"""GPU checks through `nvidia-smi`: visible GPU count, uncorrected ECC errors and pending memory
repairs, NVLink links up.

Two commands, both stable, machine-readable interfaces of nvidia-smi:

    nvidia-smi --query-gpu=<QUERY_FIELDS> --format=csv,noheader,nounits   one CSV row per GPU
    nvidia-smi nvlink --status                                            "GPU i: ..." then
                                                                          "\\t Link j: 26.562 GB/s"
                                                                          or "Link j: <inactive>"

What fails a node (each with what to do):
- fewer (or more) GPUs than cluster.gpus_per_node;
- a GPU with uncorrected volatile ECC errors (since the driver loaded: the GPU hit an Xid 48/63/64
  class error), a page retirement pending (A100 and older: needs a GPU reset), a row remapping
  pending (A100/H100/H200: needs a GPU reset) or a row-remapping failure (needs an RMA);
- a value such as "[GPU is lost]" or "[Unknown Error]" (the GPU fell off the bus);
- with health_check.require_nvlink and more than one GPU: an inactive NVLink link, or no link at
  all (an 8-GPU NVLink node whose fabric is down shows every link inactive).
"[N/A]" / "[Not Supported]" mean the GPU does not have that counter (retired pages on H100/H200,
row remapping on V100, ECC on consumer cards): not a failure.

The binary is looked up on PATH (tests put a fake `nvidia-smi` first on PATH), or taken from
TRAINER_HEALTH_NVIDIA_SMI.
"""

from __future__ import annotations

import csv
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from trainer.health.checks import Check, one_line

QUERY_FIELDS = (
    "index",
    "name",
    "uuid",
    "pci.bus_id",
    "ecc.mode.current",
    "ecc.errors.uncorrected.volatile.total",
    "retired_pages.pending",
    "remapped_rows.pending",
    "remapped_rows.failure",
)
NOT_SUPPORTED = {"", "n/a", "[n/a]", "not supported", "[not supported]", "not available", "[not available]"}
BROKEN_MARKERS = ("gpu is lost", "unknown error", "gpu requires reset")
YES = {"yes", "true", "1", "enabled"}


def nvidia_smi_binary(env: Mapping[str, str]) -> str | None:
    override = env.get("TRAINER_HEALTH_NVIDIA_SMI")
    if override:
        return override
    return shutil.which("nvidia-smi", path=env.get("PATH"))


def run_nvidia_smi(binary: str, args: list[str], timeout: float) -> tuple[int, str]:
    """(exit code, stdout + stderr). A missing binary or a timeout is exit 127 / 124 with text."""
    try:
        proc = subprocess.run(
            [binary, *args], stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return 124, f"nvidia-smi {' '.join(args[:2])} did not answer within {timeout:.0f} s"
    except OSError as exc:
        return 127, f"cannot run {binary}: {exc.strerror}"
    text = (proc.stdout + proc.stderr).decode("utf-8", errors="replace")
    return proc.returncode, text


# -- parsing --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GpuRow:
    values: dict[str, str]

    @property
    def label(self) -> str:
        return f"GPU {self.values.get('index', '?')} ({self.values.get('pci.bus_id', '?')})"


def parse_query_gpu(text: str) -> list[GpuRow]:
    """The rows of `--query-gpu=QUERY_FIELDS --format=csv,noheader,nounits`; blank lines skipped.
    A row with the wrong number of columns raises ValueError (the output is not what we asked)."""
    rows = []
    for fields in csv.reader((line for line in text.splitlines() if line.strip()), skipinitialspace=True):
        if len(fields) != len(QUERY_FIELDS):
            raise ValueError(f"expected {len(QUERY_FIELDS)} columns, got {len(fields)}: {', '.join(fields)}")
        rows.append(GpuRow(dict(zip(QUERY_FIELDS, (f.strip() for f in fields), strict=True))))
    return rows


def supported(value: str) -> bool:
    return value.strip().lower() not in NOT_SUPPORTED


def gpu_problems(row: GpuRow) -> list[str]:
    """What is wrong with one GPU, one phrase each (empty: healthy)."""
    problems = []
    for field, value in row.values.items():
        if any(marker in value.lower() for marker in BROKEN_MARKERS):
            problems.append(
                f"{field} reads {value!r}: the GPU is in error, drain the node and reset or replace the GPU"
            )
            return problems
    errors = row.values["ecc.errors.uncorrected.volatile.total"]
    if supported(errors):
        if not errors.isdigit():
            problems.append(f"ecc.errors.uncorrected.volatile.total reads {errors!r}, not a count")
        elif int(errors) > 0:
            problems.append(
                f"{errors} uncorrected ECC error(s) since the driver loaded: drain the node, reset the GPU"
            )
    if supported(row.values["retired_pages.pending"]) and row.values["retired_pages.pending"].lower() in YES:
        problems.append("a page retirement is pending: reset the GPU (or reboot) before use")
    if supported(row.values["remapped_rows.pending"]) and row.values["remapped_rows.pending"].lower() in YES:
        problems.append("a row remapping is pending: reset the GPU (or reboot) before use")
    if supported(row.values["remapped_rows.failure"]) and row.values["remapped_rows.failure"].lower() in YES:
        problems.append("row remapping failed: the GPU needs replacing (RMA)")
    return problems


LINK_LINE = re.compile(r"^\s*Link\s+(\d+)\s*:\s*(.*?)\s*$")
GPU_LINE = re.compile(r"^\s*GPU\s+(\d+)\s*:")


def parse_nvlink_status(text: str) -> dict[int, dict[int, bool]]:
    """`nvidia-smi nvlink --status` -> {gpu index: {link: active}}. A link is active when it shows
    a speed ("26.562 GB/s"); "<inactive>" (or anything without a speed) is down."""
    links: dict[int, dict[int, bool]] = {}
    gpu = None
    for line in text.splitlines():
        if match := GPU_LINE.match(line):
            gpu = int(match.group(1))
            links.setdefault(gpu, {})
        elif (match := LINK_LINE.match(line)) and gpu is not None:
            status = match.group(2).lower()
            links[gpu][int(match.group(1))] = "inactive" not in status and bool(re.search(r"\d", status))
    return links


# -- checks ---------------------------------------------------------------------------------------
def _failed_command(name: str, rc: int, text: str) -> Check:
    return Check(
        name, False, f"nvidia-smi failed (exit {rc}): {one_line(text, 200)}: check the driver on this node"
    )


def check_gpus(expected: int, require_nvlink: bool, env: Mapping[str, str], timeout: float) -> list[Check]:
    """The GPU checks of one node: gpu_count, gpu_memory_errors, nvlink."""
    binary = nvidia_smi_binary(env)
    if binary is None:
        return [
            Check(
                "gpu_count",
                False,
                "nvidia-smi not found on PATH: install the NVIDIA driver utilities on this node",
            )
        ]
    rc, text = run_nvidia_smi(
        binary, [f"--query-gpu={','.join(QUERY_FIELDS)}", "--format=csv,noheader,nounits"], timeout
    )
    if rc != 0:
        return [_failed_command("gpu_count", rc, text)]
    try:
        rows = parse_query_gpu(text)
    except ValueError as exc:
        return [
            Check(
                "gpu_count",
                False,
                f"unexpected nvidia-smi --query-gpu output ({exc}): check the driver version",
            )
        ]
    checks = [gpu_count_check(rows, expected), memory_errors_check(rows)]
    if require_nvlink and expected > 1:
        rc, text = run_nvidia_smi(binary, ["nvlink", "--status"], timeout)
        checks.append(
            nvlink_check(parse_nvlink_status(text)) if rc == 0 else _failed_command("nvlink", rc, text)
        )
    return checks


def gpu_count_check(rows: list[GpuRow], expected: int) -> Check:
    names = sorted({row.values["name"] for row in rows})
    if len(rows) != expected:
        return Check(
            "gpu_count",
            False,
            f"{len(rows)} GPU(s) visible, cluster.gpus_per_node is {expected}: a GPU fell off the bus or "
            "is hidden; drain the node and check `nvidia-smi` / dmesg for Xid errors",
        )
    return Check("gpu_count", True, f"{len(rows)} x {', '.join(names)}")


def memory_errors_check(rows: list[GpuRow]) -> Check:
    bad = [f"{row.label}: {'; '.join(p)}" for row in rows if (p := gpu_problems(row))]
    if bad:
        return Check("gpu_memory_errors", False, " / ".join(bad))
    modes = sorted({row.values["ecc.mode.current"] for row in rows})
    return Check(
        "gpu_memory_errors",
        True,
        f"no uncorrected ECC error, no pending retirement or remapping (ECC mode {', '.join(modes)})",
    )


def nvlink_check(links: dict[int, dict[int, bool]]) -> Check:
    if not any(links.values()):
        return Check(
            "nvlink",
            False,
            "no NVLink link reported: on an NVLink node, check nvidia-fabricmanager and the driver; "
            "on a PCIe node set health_check.require_nvlink: false",
        )
    down = [
        f"GPU {gpu} link {link}"
        for gpu, per in sorted(links.items())
        for link, up in sorted(per.items())
        if not up
    ]
    total = sum(len(per) for per in links.values())
    if down:
        shown = ", ".join(down[:6]) + (f" and {len(down) - 6} more" if len(down) > 6 else "")
        return Check(
            "nvlink",
            False,
            f"{len(down)} of {total} NVLink links inactive ({shown}): drain the node, check "
            "nvidia-fabricmanager and the NVSwitch trays",
        )
    return Check("nvlink", True, f"{total} links active on {len(links)} GPUs")


def gpu_checks_apply(accelerator: str, env: Mapping[str, str]) -> bool:
    """GPU checks run for cluster.accelerator cuda, unless DS_ACCELERATOR=cpu forces a CPU run
    (the same override trainer.launch.use_gpu honours)."""
    return accelerator == "cuda" and env.get("DS_ACCELERATOR") != "cpu"

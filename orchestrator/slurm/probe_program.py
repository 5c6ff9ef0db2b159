"""What the probe job runs on a compute node, with the run's own interpreter: `python -c SOURCE`.

Stdlib only, and no import of this project at module level: it must report an interpreter that
cannot import the trainer, not die before it can say so. Each check prints one line,
`RUNCTL-PROBE {"check": ..., "ok": ..., "detail": ...}`, which env_probe.py reads back.

    python -c "$(cat probe_program.py)" --accelerator cuda --gpus 8 --write-dir D \
        --data PREFIX [--data PREFIX ...] --tokenizer FILE [--import MODULE ...] [--program NAME]

`--import`: the modules the ranks need (default: our trainer's, trainer, torch and deepspeed);
`--program`: the first word of `cluster.command`, found on the node's PATH or as given.
"""

import argparse
import json
import os
import sys
import time

MARK = "RUNCTL-PROBE "


def say(check, ok, detail):
    print(MARK + json.dumps({"check": check, "ok": bool(ok), "detail": str(detail)[:500]}), flush=True)


def last_line(exc):
    text = f"{type(exc).__name__}: {exc}".strip()
    return text.splitlines()[-1] if text else type(exc).__name__


def try_import(name):
    started = time.monotonic()
    try:
        module = __import__(name)
    except BaseException as exc:  # noqa: BLE001 - any failure to import is the answer
        say(f"import {name}", False, last_line(exc))
        return None
    where = getattr(module, "__file__", "") or ""
    version = getattr(module, "__version__", "")
    say(f"import {name}", True, f"{version} {where} ({time.monotonic() - started:.1f} s)".strip())
    return module


def check_gpus(torch, accelerator, gpus):
    if accelerator != "cuda":
        say("gpus", True, f"accelerator {accelerator}: no GPU needed ({os.cpu_count()} CPUs)")
        return
    if torch is None:
        say("gpus", False, "cannot count GPUs without torch")
        return
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    say("gpus", count >= gpus, f"{count} visible CUDA device(s), the job needs {gpus} per node")


def check_writable(directory):
    probe = os.path.join(directory, f".probe-{os.uname().nodename}-{os.getpid()}")
    try:
        with open(probe, "w") as handle:
            handle.write("probe\n")
        os.unlink(probe)
        say("run dir writable", True, directory)
    except OSError as exc:
        say("run dir writable", False, f"{directory}: {exc.strerror or exc}")


def check_program(name):
    import shutil

    found = shutil.which(name)
    say("program", found is not None, found or f"{name}: not found on the node's PATH, or not executable")


def check_readable(check, path):
    try:
        with open(path, "rb") as handle:
            handle.read(1)
        say(check, True, path)
    except OSError as exc:
        say(check, False, f"{path}: {exc.strerror or exc}")


def main(argv):
    parser = argparse.ArgumentParser(prog="runctl-probe")
    parser.add_argument("--accelerator", default="cuda")
    parser.add_argument("--gpus", type=int, default=0)
    parser.add_argument("--write-dir", required=True)
    parser.add_argument("--data", action="append", default=[])
    parser.add_argument("--tokenizer")
    parser.add_argument("--import", dest="imports", action="append", default=[])
    parser.add_argument("--program")
    args = parser.parse_args(argv)
    say("interpreter", True, f"{sys.executable} (Python {sys.version.split()[0]}, prefix {sys.prefix})")
    modules = {name: try_import(name) for name in args.imports or ["trainer", "torch", "deepspeed"]}
    if args.program:
        check_program(args.program)
    check_gpus(modules.get("torch"), args.accelerator, args.gpus)
    check_writable(args.write_dir)
    for prefix in args.data:
        for suffix in (".bin", ".idx"):
            check_readable("data readable", prefix + suffix)
    if args.tokenizer:
        check_readable("tokenizer readable", args.tokenizer)
    say("done", True, "every check ran")


if __name__ == "__main__":
    main(sys.argv[1:])

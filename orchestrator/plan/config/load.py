"""Read a run config from YAML, validate it, and report every problem with its key path.

`load_config` is the only entry point; every caller (CLI, trainer, tests) goes through it, so a
config that would fail in the trainer fails on the login node first.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from .rules import cross_field_problems
from .schema import RunConfig


class ConfigError(ValueError):
    """A config that must not reach sbatch. `problems` holds one message per problem."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{source}: invalid run config ({len(problems)} problem(s)):\n{lines}")


# Keys that no longer exist, with what replaces them. Every run directory written before a key
# was retired holds it in its frozen run.yaml, which `runctl status` and the controller read: such
# a key is dropped with a warning that names its replacement, never refused (an upgrade must not
# lock on-call out of a running run). Only keys that priced the plan may retire this way.
RETIRED_KEYS = {
    ("checkpoint", "async_stall_fraction"): (
        "replaced by checkpoint.snapshot_gb_per_second: an async save's stall is priced as the snapshot "
        "bytes per rank / that bandwidth, not as a fraction of the save; its value is ignored. Remove "
        "async_stall_fraction and set snapshot_gb_per_second to your GPUs' measured device-to-host copy "
        "rate in GB/s (default 5.7, bench/results/async_checkpoint_gpu.json)"
    ),
}


class RetiredKeyWarning(UserWarning):
    """A config key that no longer exists was dropped (RETIRED_KEYS)."""


def _drop_retired(data: dict[str, Any], source: str) -> dict[str, Any]:
    """`data` without the retired keys it sets (a shallow copy when it sets any), each warned of."""
    for section, key in RETIRED_KEYS:
        part = data.get(section)
        if isinstance(part, dict) and key in part:
            data = {**data, section: {k: v for k, v in part.items() if k != key}}
            warnings.warn(
                f"{source}: {section}.{key} is {RETIRED_KEYS[(section, key)]}",
                RetiredKeyWarning,
                stacklevel=3,
            )
    return data


def _key_path(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or "(top level)"


def _describe(error: dict[str, Any]) -> str:
    """One line: the key path, the offending value and what is allowed."""
    loc = tuple(x for x in error.get("loc", ()) if not (isinstance(x, str) and x.startswith("function-")))
    # pydantic adds the union member / constraint name to loc for some errors; keep real keys only.
    loc = tuple(x for x in loc if not (isinstance(x, str) and ("[" in x or x in {"constrained-str"})))
    path = _key_path(loc)
    kind = error.get("type", "")
    value = error.get("input")
    if kind == "extra_forbidden":
        return f"{path}: unknown key (check the spelling; see configs/bloom-176b.yaml for every key)"
    if kind == "missing":
        return f"{path}: required key is missing"
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    message = error.get("msg", "invalid value")
    if kind == "string_pattern_mismatch":
        pattern = (error.get("ctx") or {}).get("pattern", "")
        message = f"contains characters that are not allowed (allowed: {pattern})"
    return f"{path} = {shown}: {message}"


def parse_config(data: Any, source: str = "<config>") -> RunConfig:
    if not isinstance(data, dict):
        raise ConfigError(source, [f"the top level must be a mapping of sections, got {type(data).__name__}"])
    for key in data:
        if not isinstance(key, str):
            raise ConfigError(source, [f"top-level key {key!r} is not a string"])
    data = _drop_retired(data, source)
    try:
        cfg = RunConfig.model_validate(data)
    except ValidationError as exc:
        problems = sorted({_describe(e) for e in exc.errors(include_url=False)})
        raise ConfigError(source, problems) from None
    problems = cross_field_problems(cfg)
    if problems:
        raise ConfigError(source, problems)
    return cfg


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load, except that a key given twice in one mapping is an error (PyYAML keeps the
    last one silently: a second `poll_seconds:` further down would win without a word)."""


def _construct_unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # keys merged in with `<<` may be overridden on purpose
        key = loader.construct_object(key_node, deep=deep)
        try:
            first = seen.get(key)
        except TypeError:
            continue  # an unhashable key: the mapping constructor reports it
        line = key_node.start_mark.line + 1
        if first is not None:
            raise DuplicateKeyError(f"key {key!r} is given twice (lines {first} and {line}): keep one")
        seen[key] = line
    return loader.construct_mapping(node, deep=deep)


class DuplicateKeyError(yaml.YAMLError):
    pass


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)


def safe_load_unique(text: str) -> Any:
    """yaml.safe_load that refuses duplicate keys (DuplicateKeyError, a yaml.YAMLError)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def load_yaml(path: str | Path) -> Any:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            str(path), ["file not found: give the path of a run config (see configs/)"]
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), [f"cannot read the file: {exc}"]) from None
    try:
        return safe_load_unique(text)
    except DuplicateKeyError as exc:
        raise ConfigError(str(path), [str(exc)]) from None
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), [f"not valid YAML: {exc}"]) from None


def load_config(path: str | Path) -> RunConfig:
    """Load and validate; relative data and tokenizer paths are made absolute against the config
    file's folder, so that the frozen run.yaml works from any directory on any node."""
    cfg = parse_config(load_yaml(path), source=str(path))
    return resolve_paths(cfg, Path(path).resolve().parent)


def resolve_paths(cfg: RunConfig, base_dir: Path) -> RunConfig:
    # Absolute, but symlinks are kept: a venv's bin/python is a symlink to the base interpreter,
    # and only the link's own path makes Python find the venv's packages (pyvenv.cfg beside it).
    def absolute(value: str) -> str:
        candidate = Path(value).expanduser()
        return os.path.normpath(candidate if candidate.is_absolute() else base_dir / candidate)

    datasets = [d.model_copy(update={"path": absolute(d.path)}) for d in cfg.data.datasets]
    data = cfg.data.model_copy(update={"datasets": datasets, "tokenizer": absolute(cfg.data.tokenizer)})
    cluster = cfg.cluster
    # `python: python3` is looked up on PATH on the compute node; a relative path with a slash
    # (e.g. the checkout's ../.venv/bin/python) is a file next to the config.
    if "/" in cluster.python:
        cluster = cluster.model_copy(update={"python": absolute(cluster.python)})
    return cfg.model_copy(update={"data": data, "cluster": cluster})


def dump_config(cfg: RunConfig) -> str:
    """The frozen form written to <run_dir>/run.yaml; load_config reads it back unchanged."""
    return yaml.safe_dump(cfg.model_dump(mode="json", exclude_none=False), sort_keys=False)

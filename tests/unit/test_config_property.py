"""Random YAML documents and random field values never produce a traceback, only a ConfigError."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.plan.config import ConfigError, load_config, parse_config

BLOOM = yaml.safe_load((Path(__file__).resolve().parents[2] / "configs" / "bloom-176b.yaml").read_text())

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
)
yaml_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)


def _paths(node, prefix=()):
    if isinstance(node, dict):
        for key, value in node.items():
            yield prefix + (key,)
            yield from _paths(value, prefix + (key,))


PATHS = sorted(set(_paths(BLOOM)), key=str)


def _parse_or_config_error(data) -> None:
    try:
        parse_config(data)
    except ConfigError as exc:
        assert exc.problems and all(isinstance(p, str) and p for p in exc.problems)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(yaml_values)
def test_random_documents_give_config_errors(document) -> None:
    _parse_or_config_error(document)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(PATHS), yaml_values)
def test_random_field_values_give_config_errors(path, value) -> None:
    data = copy.deepcopy(BLOOM)
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    _parse_or_config_error(data)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=200))
def test_random_yaml_text(text) -> None:
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError:
        return
    _parse_or_config_error(document)


# -- the other direction: a value that breaks a rule is never accepted ----------------------------
# Every float of the config, by key path (found in the real config, so a new float field is
# covered without editing this list), and the minimums the schema documents.
FLOAT_PATHS = [p for p in PATHS if len(p) == 2 and isinstance(BLOOM[p[0]][p[1]], float)] + [
    ("watchdog", k) for k in ("heartbeat_seconds", "poll_seconds", "dead_after_seconds", "step_timeout_seconds")
] + [("optimizer", "lr"), ("checkpoint", "interval_hours")]
MINIMUMS = {("watchdog", "poll_seconds"): 0.1, ("watchdog", "heartbeat_seconds"): 0.1,
            ("watchdog", "dead_after_seconds"): 1.0, ("watchdog", "init_timeout_seconds"): 1.0,
            ("watchdog", "step_timeout_seconds"): 1.0, ("watchdog", "checkpoint_timeout_seconds"): 1.0,
            ("watchdog", "eval_timeout_seconds"): 1.0}  # fmt: skip
SEED_PATHS = [("seed",), ("data", "seed")]


def _with(path: tuple[str, ...], value) -> dict:
    data = copy.deepcopy(BLOOM)
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return data


def _refused_naming(data, path: tuple[str, ...]) -> None:
    dotted = ".".join(path)
    try:
        parse_config(data)
    except ConfigError as exc:
        assert any(p.startswith(f"{dotted} = ") for p in exc.problems), (dotted, exc.problems)
        return
    raise AssertionError(f"{dotted} = {node_value(data, path)!r} was accepted")


def node_value(data, path):
    for key in path:
        data = data[key]
    return data


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(FLOAT_PATHS), st.sampled_from([float("inf"), float("-inf"), float("nan")]))
def test_non_finite_numbers_are_refused_naming_the_key(path, value) -> None:
    _refused_naming(_with(path, value), path)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(MINIMUMS)), st.floats(min_value=-1e6, max_value=1.0, allow_nan=False))
def test_values_below_the_minimum_are_refused_naming_the_key(path, value) -> None:
    if value >= MINIMUMS[path]:
        return
    _refused_naming(_with(path, value), path)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(SEED_PATHS), st.one_of(st.integers(max_value=-1), st.integers(min_value=2**32)))
def test_seeds_outside_numpys_range_are_refused_naming_the_key(path, value) -> None:
    _refused_naming(_with(path, value), path)


SCALAR_KEYS = [(s, k) for s, k in (p for p in PATHS if len(p) == 2) if not isinstance(BLOOM[s][k], (dict, list))]


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(SCALAR_KEYS), st.integers(min_value=0, max_value=10**6))
def test_duplicate_keys_are_refused_naming_key_and_lines(tmp_path_factory, section_key, value) -> None:
    section, key = section_key
    text = yaml.safe_dump(BLOOM, sort_keys=False)
    header = f"\n{section}:\n"
    assert header in text
    text = text.replace(header, f"{header}  {key}: {value}\n", 1)  # the original line stays below
    path = tmp_path_factory.mktemp("dup") / "dup.yaml"
    path.write_text(text)
    try:
        load_config(path)
    except ConfigError as exc:
        assert any(f"key {key!r} is given twice (lines " in p for p in exc.problems), exc.problems
        return
    raise AssertionError(f"{section}.{key} given twice was accepted")

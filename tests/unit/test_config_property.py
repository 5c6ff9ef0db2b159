"""Random YAML documents and random field values never produce a traceback, only a ConfigError."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.config import ConfigError, parse_config

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

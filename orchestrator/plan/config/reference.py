"""docs/config.md, generated from the schema: every key of a run config, its type and default.

    python -m orchestrator.plan.config.reference > docs/config.md

tests/unit/test_config_reference.py checks that the file is what this prints, so a key added to
the schema is in the reference the same day.
"""

from __future__ import annotations

import json
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from .schema import RunConfig

HEADER = """# Run config reference

Every key of a run config, generated from `orchestrator/plan/config/schema.py` by
`python -m orchestrator.plan.config.reference > docs/config.md` (a test keeps this file equal to what
it prints). `configs/bloom-176b.yaml` is the real run; the comments in the schema say why each
key exists. Unknown keys are errors; cross-field rules are in `orchestrator/plan/config/rules.py`.
"""


def _section_of(annotation: Any) -> type[BaseModel] | None:
    """The config section a field holds (also through `X | None`), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _section_of(arg)
            if found is not None:
                return found
    return None


def _type_name(annotation: Any) -> str:
    """`str`, `int`, `'cuda' | 'cpu'`, `list[str]`, ... (constraints are the schema's to say)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is typing.Literal:
        return " | ".join("true" if a is True else repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in args)}]"
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: Any) -> str:
    if field.is_required():
        return "required"
    value = field.default if field.default is not PydanticUndefined else field.default_factory()
    if isinstance(value, BaseModel):
        return "(section)"
    try:
        return f"`{json.dumps(value)}`"  # YAML's spelling of these: null, true, "text", [..]
    except TypeError:
        return f"`{value!r}`"


def rows(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str, str]]:
    out = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        section = _section_of(field.annotation)
        if section is not None:
            optional = "" if field.is_required() or field.default is not None else " (optional section)"
            out.append((key, f"section{optional}", _default(field) if field.is_required() else "-"))
            out += rows(section, key + ".")
        else:
            out.append((key, _type_name(field.annotation).replace("|", "\\|"), _default(field)))
    return out


def reference() -> str:
    lines = [HEADER, "| key | type | default |", "| --- | --- | --- |"]
    lines += [
        f"| `{key}` | {kind} | {default.replace('|', chr(92) + '|')} |"
        for key, kind, default in rows(RunConfig)
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(reference(), end="")

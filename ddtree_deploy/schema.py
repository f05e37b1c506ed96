"""A tiny declarative validator for YAML documents, so every error names the file, the field and what was expected.

We keep this instead of a schema library because the messages are the product: "hosts/gpu1.yaml: field
'port': expected an integer between 1 and 65535, got 'ssh'" is what a user needs, and nothing else. Every problem
of a document is reported at once (one line each), so a file is fixed in one pass.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Callable

from .errors import InputError


@dataclass(frozen=True)
class Field:
    """One field of a mapping: its type check, whether it is required, and its default."""

    kind: str  # str | int | bool | float | mapping | list | str-map | any
    required: bool = False
    default: Any = None
    help: str = ""
    check: Callable[[Any], str | None] | None = None  # returns an error text or None
    fields: dict[str, "Field"] | None = None  # for kind == "mapping": nested schema
    items: "Field | None" = None  # for kind == "list": schema of each item
    choices: tuple[Any, ...] = field(default=())


_EXPECT = {
    "str": "a string",
    "int": "an integer",
    "bool": "true or false",
    "float": "a number",
    "mapping": "a mapping",
    "list": "a list",
    "str-map": "a mapping of strings to strings",
}


def _type_ok(kind: str, value: Any) -> bool:
    if kind == "any":
        return True
    if kind == "str":
        return isinstance(value, str)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "mapping":
        return isinstance(value, dict)
    if kind == "list":
        return isinstance(value, list)
    if kind == "str-map":
        return isinstance(value, dict) and all(
            isinstance(k, str) and isinstance(v, (str, int, float)) and not isinstance(v, bool) for k, v in value.items()
        )
    raise ValueError(f"unknown schema kind {kind}")


def validate(doc: Any, schema: dict[str, Field], *, source: str, prefix: str = "") -> dict[str, Any]:
    """Check ``doc`` against ``schema``; return a dict with defaults filled in, or raise one InputError that lists
    every problem of the document (a user fixes a file once, not once per error)."""
    data, problems = collect(doc, schema, prefix=prefix)
    raise_problems(source, problems)
    return data


def collect(doc: Any, schema: dict[str, Field], *, prefix: str = "") -> tuple[dict[str, Any], list[str]]:
    """Like :func:`validate`, but return the problems (each naming its field) instead of raising.

    Fields with a problem are left out of the returned data, so a caller can go on checking the rest.
    """
    problems: list[str] = []
    return _collect(doc, schema, prefix, problems), problems


def raise_problems(source: str, problems: list[str]) -> None:
    """One problem: ``<file>: <problem>``; several: a count, then one line each."""
    if not problems:
        return
    where = f"{source}: " if source else ""
    if len(problems) == 1:
        raise InputError(f"{where}{problems[0]}")
    listed = "\n".join(f"  - {p}" for p in problems)
    raise InputError(f"{where}{len(problems)} problems:\n{listed}")


def _collect(doc: Any, schema: dict[str, Field], prefix: str, problems: list[str]) -> dict[str, Any]:
    if not isinstance(doc, dict):
        name = f"section '{prefix.rstrip('.')}'" if prefix else "document"
        problems.append(f"{name}: expected a mapping, got {type(doc).__name__}")
        return {}
    known = ", ".join(sorted(schema))
    for name in sorted(set(doc) - set(schema), key=str):
        close = difflib.get_close_matches(str(name), list(schema), n=1, cutoff=0.6)
        mean = f"did you mean '{prefix}{close[0]}'? " if close else ""
        problems.append(f"unknown field '{prefix}{name}' ({mean}known fields here: {known})")
    out: dict[str, Any] = {}
    for name, spec in schema.items():
        path = f"{prefix}{name}"
        if name not in doc or doc[name] is None:
            if spec.required:
                what = f" ({spec.help})" if spec.help else ""
                problems.append(f"missing required field '{path}': expected {_EXPECT.get(spec.kind, spec.kind)}{what}")
                continue
            default = spec.default() if callable(spec.default) else spec.default
            if spec.kind == "mapping" and spec.fields is not None and default is None:
                default = _collect({}, spec.fields, f"{path}.", problems)
            out[name] = default
            continue
        before = len(problems)
        value = _collect_value(doc[name], spec, path, problems)
        if len(problems) == before:
            out[name] = value
    return out


def _collect_value(value: Any, spec: Field, path: str, problems: list[str]) -> Any:
    if not _type_ok(spec.kind, value):
        problems.append(f"field '{path}': expected {_EXPECT.get(spec.kind, spec.kind)}, got {value!r} ({type(value).__name__})")
        return None
    if spec.choices and value not in spec.choices:
        allowed = ", ".join(repr(c) for c in spec.choices)
        problems.append(f"field '{path}': expected one of {allowed}, got {value!r}")
        return None
    if spec.check is not None:
        problem = spec.check(value)
        if problem:
            problems.append(f"field '{path}': {problem}, got {value!r}")
            return None
    if spec.kind == "mapping" and spec.fields is not None:
        return _collect(value, spec.fields, f"{path}.", problems)
    if spec.kind == "list" and spec.items is not None:
        return [_collect_value(v, spec.items, f"{path}[{i}]", problems) for i, v in enumerate(value)]
    return value


def port_range(value: int) -> str | None:
    return None if 1 <= value <= 65535 else "expected an integer between 1 and 65535"


def positive(value: float) -> str | None:
    return None if value > 0 else "expected a positive number"


def non_negative(value: float) -> str | None:
    return None if value >= 0 else "expected 0 or a positive number"


def become_command(value: str) -> str | None:
    return None if value in ("", "sudo", "doas") or value.startswith("/") else "expected sudo, doas or an absolute command"


def absolute_path(value: str) -> str | None:
    return None if value.startswith("/") else "expected an absolute path on the host"

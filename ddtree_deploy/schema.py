"""Validation of the YAML documents we read (host files, patchset.yaml) with pydantic v2 models, so every error
names the file, the field and what was expected.

The models are declared with :func:`setting` (a type, a default, help, an optional check returning an error text)
and validated strictly (``"22"`` is not a port, ``yes`` is not a string); pydantic's errors are translated here
into our one-line messages: "hosts/gpu1.yaml: field 'port': expected an integer between 1 and 65535, got 'ssh'"
is what a user needs, and nothing else. Every problem of a document is reported at once (one line each), so a file
is fixed in one pass. The same models give the JSON Schema editors complete host files with (``hosts schema``).
A ``null`` value means "not given" (the default applies), as YAML users expect of an empty ``key:``.
"""

from __future__ import annotations

import difflib
import math
import types
import typing
from typing import Annotated, Any, Callable, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError, model_validator
from pydantic import Field as _PydanticField
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

from .errors import InputError

_EXPECT = {
    str: "a string",
    int: "an integer",
    bool: "true or false",
    float: "a number",
    dict: "a mapping",
    list: "a list",
}
STR_MAP = "a mapping of strings to strings"


class Strict(BaseModel):
    """A section of a document: strict types, no unknown fields, ``null`` taken as "not given"."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=False, validate_default=False)

    @model_validator(mode="before")
    @classmethod
    def _null_is_not_given(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data


class Expect(str):
    """Annotation metadata: what a field expects, in words, where its type alone does not say it."""


def checked(kind: Any, check: Callable[[Any], str | None], expect: str | None = None,
            json: dict[str, Any] | None = None) -> Any:
    """``kind`` with a check that returns an error text (or None): the text becomes "field 'x': <text>, got <value>".
    ``json``: what the check means in JSON Schema terms (``{"minimum": 1}``), for editors; the check decides."""
    def run(value: Any) -> Any:
        problem = check(value)
        if problem:
            raise PydanticCustomError("ddtree_check", "{problem}", {"problem": problem})
        return value
    marks: list[Any] = [AfterValidator(run)]
    if expect:
        marks.append(Expect(expect))
    if json:
        marks.append(_PydanticField(json_schema_extra=json))
    return Annotated[(kind, *marks)]  # type: ignore[return-value]


def _str_map(value: dict[Any, Any]) -> str | None:
    ok = all(isinstance(k, str) and isinstance(v, (str, int, float)) and not isinstance(v, bool) for k, v in value.items())
    return None if ok else f"expected {STR_MAP}"


#: ``env:``-like sections: string keys, scalar values (numbers are written as strings where they are used).
StrMap = checked(dict[Any, Any], _str_map, STR_MAP)


def setting(default: Any = ..., *, help: str = "", factory: Callable[[], Any] | None = None) -> Any:
    """A model field: required when no default is given; ``help`` is the field's description (messages, schema)."""
    if factory is not None:
        return _PydanticField(default_factory=factory, description=help or None)
    return _PydanticField(default, description=help or None)


# -- pydantic errors -> our messages ------------------------------------------------------------------------------------
def _unwrap(annotation: Any) -> Any:
    """The plain type of a field: Annotated and Optional removed."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            annotation = args[0] if len(args) == 1 else annotation
            if len(args) != 1:
                return annotation
        else:
            return annotation


def _info_at(model: type[BaseModel], loc: tuple[Any, ...]) -> tuple[FieldInfo | None, type[BaseModel] | None, Any]:
    """The FieldInfo at ``loc``, the model that holds it, and its plain type (for a list item, the item type)."""
    info, owner, kind = None, model, model
    for part in loc:
        if isinstance(part, int):
            args = typing.get_args(_unwrap(kind))
            kind = args[0] if args else Any
            continue
        plain = _unwrap(kind)
        if not (isinstance(plain, type) and issubclass(plain, BaseModel)) or part not in plain.model_fields:
            return None, plain if isinstance(plain, type) and issubclass(plain, BaseModel) else None, Any
        owner, info = plain, plain.model_fields[part]
        kind = info.annotation
    return info, owner, kind


def expected(kind: Any, info: FieldInfo | None = None) -> str:
    """What a person is told a field expects ("an integer", "one of 'ssh', 'local'", "a mapping")."""
    marks = list(info.metadata if info is not None else [])
    if typing.get_origin(kind) is Annotated:
        marks += list(typing.get_args(kind)[1:])
    for mark in marks:
        if isinstance(mark, Expect):
            return str(mark)
    plain = _unwrap(kind)
    if typing.get_origin(plain) is Literal:
        return "one of " + ", ".join(repr(c) for c in typing.get_args(plain))
    if isinstance(plain, type) and issubclass(plain, BaseModel):
        return "a mapping"
    base = typing.get_origin(plain) or plain
    return _EXPECT.get(base, str(plain))


def _path(loc: tuple[Any, ...], prefix: str) -> str:
    text = prefix
    for part in loc:
        text = f"{text}[{part}]" if isinstance(part, int) else (f"{text}.{part}" if text else str(part))
    return text


def _known(model: type[BaseModel] | None) -> str:
    return ", ".join(sorted(model.model_fields)) if model else ""


def problems_of(model: type[BaseModel], exc: ValidationError, doc: Any, prefix: str = "") -> list[str]:
    """One line per error of ``exc``: unknown fields first (sorted), then the rest in the order of the fields."""
    unknown, rest = [], []
    for e in exc.errors(include_url=False):
        loc = tuple(e["loc"])
        path = _path(loc, prefix.rstrip("."))
        info, owner, kind = _info_at(model, loc)
        if e["type"] == "extra_forbidden":
            parent_model = _unwrap(_info_at(model, loc[:-1])[2]) if loc[:-1] else model
            if not (isinstance(parent_model, type) and issubclass(parent_model, BaseModel)):
                parent_model = owner
            names = list(parent_model.model_fields) if parent_model else []
            close = difflib.get_close_matches(str(loc[-1]), names, n=1, cutoff=0.6)
            parent = path.rpartition(".")[0]
            mean = f"did you mean '{parent + '.' if parent else ''}{close[0]}'? " if close else ""
            unknown.append((str(loc[-1]), f"unknown field '{path}' ({mean}known fields here: {_known(parent_model)})"))
            continue
        if e["type"] == "missing":
            what = f" ({info.description})" if info is not None and info.description else ""
            rest.append(f"missing required field '{path}': expected {expected(kind, info)}{what}")
            continue
        value = e.get("input")
        if e["type"] == "ddtree_check":
            rest.append(f"field '{path}': {e['ctx']['problem']}, got {value!r}")
        elif e["type"] == "literal_error":
            rest.append(f"field '{path}': expected {expected(kind, info)}, got {value!r}")
        elif not loc:
            name = f"section '{prefix.rstrip('.')}'" if prefix else "document"
            rest.append(f"{name}: expected a mapping, got {type(doc).__name__}")
        else:
            rest.append(f"field '{path}': expected {expected(kind, info)}, got {value!r} ({type(value).__name__})")
    return [m for _, m in sorted(unknown)] + list(dict.fromkeys(rest))


def _partial(model: type[BaseModel], doc: Any, bad: set[str]) -> dict[str, Any]:
    """The fields of ``doc`` without a problem (given, or their defaults), so cross-field checks can go on."""
    out: dict[str, Any] = {}
    if not isinstance(doc, dict):
        return out
    for name, info in model.model_fields.items():
        if name in bad:
            continue
        if doc.get(name) is not None:
            out[name] = doc[name]
        elif not info.is_required():
            out[name] = info.get_default(call_default_factory=True)
            if isinstance(out[name], BaseModel):
                out[name] = out[name].model_dump()
    return out


def collect(model: type[BaseModel], doc: Any, *, prefix: str = "") -> tuple[dict[str, Any], list[str]]:
    """Validate ``doc`` against ``model``; (data with defaults filled in, problems, each naming its field).

    Fields with a problem are left out of the returned data, so a caller can go on checking the rest.
    """
    try:
        return model.model_validate(doc).model_dump(), []
    except ValidationError as exc:
        problems = problems_of(model, exc, doc, prefix)
        bad = {str(e["loc"][0]) for e in exc.errors() if e["loc"]}
        return _partial(model, doc, bad), problems


def validate(doc: Any, model: type[BaseModel], *, source: str, prefix: str = "") -> dict[str, Any]:
    """Check ``doc`` against ``model``; return a dict with defaults filled in, or raise one InputError that lists
    every problem of the document (a user fixes a file once, not once per error)."""
    data, problems = collect(model, doc, prefix=prefix)
    raise_problems(source, problems)
    return data


def raise_problems(source: str, problems: list[str]) -> None:
    """One problem: ``<file>: <problem>``; several: a count, then one line each."""
    if not problems:
        return
    where = f"{source}: " if source else ""
    if len(problems) == 1:
        raise InputError(f"{where}{problems[0]}")
    listed = "\n".join(f"  - {p}" for p in problems)
    raise InputError(f"{where}{len(problems)} problems:\n{listed}")


class DuplicateKeyError(yaml.YAMLError):
    """A key given twice in one YAML mapping (the message names the key and both lines)."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, but a key given twice in one mapping is an error (PyYAML keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                first = seen.get(key)
            except TypeError:
                continue  # an unhashable key: the base constructor reports it
            if first is not None:
                raise DuplicateKeyError(f"key {key!r} is given twice (lines {first.start_mark.line + 1} and "
                                        f"{key_node.start_mark.line + 1}); YAML would keep only the last: write it once")
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """YAML the tool reads (host files, patchset.yaml): safe, and a duplicate key in any mapping is a
    yaml.YAMLError naming the key and both lines, which the caller reports with its file name."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)


def port_range(value: int) -> str | None:
    return None if 1 <= value <= 65535 else "expected an integer between 1 and 65535"


def positive(value: float) -> str | None:
    return None if value > 0 else "expected a positive number"


def non_negative(value: float) -> str | None:
    return None if value >= 0 else "expected 0 or a positive number"


#: The longest wait a host file may ask for: a week (an hour-long model load is common, `.inf` never meant).
MAX_SECONDS = 7 * 24 * 3600.0


def seconds(*, zero_ok: bool = False, most: float = MAX_SECONDS) -> Callable[[float], str | None]:
    """A timeout in seconds: finite and within (0, most] (or [0, most] when 0 means "off"); ``.inf``, ``.nan`` and
    absurd values are refused with the range (they would overflow a deadline later)."""
    low = "0 <=" if zero_ok else "0 <"

    def check(value: float) -> str | None:
        if math.isfinite(value) and (value >= 0 if zero_ok else value > 0) and value <= most:
            return None
        return f"expected a finite number of seconds, {low} x <= {most:g}"
    return check


def become_command(value: str) -> str | None:
    return None if value in ("", "sudo", "doas") or value.startswith("/") else "expected sudo, doas or an absolute command"


def absolute_path(value: str) -> str | None:
    return None if value.startswith("/") else "expected an absolute path on the host"

"""What a host may answer: the reply of a remote helper program, parsed against a schema and a size cap.

A host is not trusted to answer well: its Python may be wrapped, its files edited, its disk corrupt. Every reply
line (``RESULT_MARKER`` + JSON, see ``remote/_frame.py``) is read from at most ``REPLY_MAX`` bytes, parsed as the
envelope ``{"ok": bool, "result": ..., "error": str, "kind": str}`` and, for the ops whose results the control side
reads field by field, the result against that op's schema (``RESULTS``). Anything else is a ``RemoteError`` of kind
``reply`` naming the host and the op (exit 1), never a traceback or an "internal error".

The transport imports this module on the first reply, so pydantic is not loaded at CLI start-up.
"""

from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr, TypeAdapter, ValidationError
from typing_extensions import TypedDict

from .errors import RemoteError

#: Largest reply line accepted (the biggest real one, a package manifest of some 6,000 files, is about 1 MiB).
REPLY_MAX = 8 << 20


class Envelope(BaseModel):
    """Every reply line: success with a result, or a failure with its message and kind."""

    model_config = ConfigDict(extra="forbid")
    ok: StrictBool
    result: Any = None
    error: StrictStr = ""
    kind: StrictStr = "error"


class Paths(TypedDict):
    release_root: StrictStr
    site_packages: StrictStr
    package: StrictStr
    python: StrictStr
    executable: StrictStr
    links: dict[StrictStr, StrictStr]


class HostCheckPaths(TypedDict, total=False):
    paths: Paths


class HostCheck(HostCheckPaths):
    hostname: StrictStr
    python: StrictStr
    executable: StrictStr
    site_packages_exists: StrictBool
    sglang_dir_exists: StrictBool
    sglang: Optional[StrictStr]


class ManifestFiles(TypedDict):
    files: dict[StrictStr, tuple[StrictStr, StrictInt, StrictInt]]


class Manifest(ManifestFiles, total=False):
    links: dict[StrictStr, StrictStr]
    dist_info: Optional[StrictStr]
    zstd: StrictBool
    hashed: StrictInt


class Snapshot(TypedDict):
    manifest: Manifest
    facts: Optional[dict[StrictStr, Any]]


class State(TypedDict):
    active: Optional[StrictStr]
    releases: list[dict[StrictStr, Any]]


class ShowState(TypedDict):
    state: State


class Show(ShowState, total=False):
    current: Optional[StrictStr]
    lock: Optional[dict[StrictStr, Any]]
    journal: list[dict[StrictStr, Any]]


#: The ops whose results the control side reads field by field, and their schemas.
_RESULT_TYPES: dict[str, Any] = {
    "hostinfo.check": HostCheck,
    "hostinfo.paths": Paths,
    "facts.facts": dict[StrictStr, Any],
    "manifest.manifest": Manifest,
    "manifest.snapshot": Snapshot,
    "manifest.package_manifest": dict[StrictStr, list[Any]],
    "release.show": Show,
}
RESULTS = {op: TypeAdapter(t) for op, t in _RESULT_TYPES.items()}


def malformed(host: str, what: str, detail: str) -> RemoteError:
    return RemoteError(host, what, f"malformed reply from the host's helper: {detail}", kind="reply")


def parse(host: str, what: str, line: bytes) -> Any:
    """The result of one reply line, or RemoteError: kind ``reply`` for a malformed one, the reply's own kind for a
    failure it reports."""
    if len(line) > REPLY_MAX:
        raise malformed(host, what, f"{len(line)} bytes, over the {REPLY_MAX >> 20} MiB cap")
    try:
        reply = Envelope.model_validate_json(line)
    except ValidationError as exc:
        raise malformed(host, what, _first_error(exc, "the reply")) from None
    if not reply.ok:
        raise RemoteError(host, what, reply.error or "unknown error", kind=reply.kind or "error")
    schema = RESULTS.get(what)
    if schema is None:
        return reply.result
    try:
        schema.validate_python(reply.result)
    except ValidationError as exc:
        raise malformed(host, what, _first_error(exc, "the result", "result.")) from None
    return reply.result


def _first_error(exc: ValidationError, whole: str, prefix: str = "") -> str:
    """pydantic's first complaint, in one line: where (a dotted path), what, and what came instead."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    loc = ".".join(str(p) for p in first.get("loc", ()))
    where = prefix + loc if loc else whole
    got = repr(first.get("input"))
    got = got if len(got) <= 80 else got[:77] + "..."
    more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    return f"{where}: {first.get('msg', 'invalid')}, got {got}{more}"

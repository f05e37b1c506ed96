"""The ops a host runs under its own Python (stdlib only, Python >= 3.8): each public module's ``OPS``. The modules
import each other relatively and nothing else of the tool; a call ships the ones its op needs as a zip
(``transport.bundle``). See docs/design.md, the `remote` row."""
from ._frame import RESULT_MARKER

__all__ = ["RESULT_MARKER"]

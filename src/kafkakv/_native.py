"""Which of kafkakv's C modules this process uses.

Every C module (``setup.py`` lists them) has a twin in Python with the same behaviour, which its
tests hold it to. The C one is used where it was built, an install with a C compiler, unless
``KAFKAKV_PURE_PYTHON=1`` is set in the environment: then the whole process runs the twins
(the tests run both ways). Each module that has a twin asks :func:`compiled` once, at import,
and says which one it took in its ``COMPILED``.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

__all__ = ["PURE_PYTHON", "compiled"]

PURE_PYTHON = os.environ.get("KAFKAKV_PURE_PYTHON", "") not in ("", "0")


def compiled(name: str) -> ModuleType | None:
    """The C module ``name``; None where it is not built or the Python twins are asked for."""
    if PURE_PYTHON:
        return None
    try:
        return importlib.import_module(name)
    except ImportError:  # not built: no C compiler (or a header it needs) at install time
        return None

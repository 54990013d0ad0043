"""A griffe extension for the API reference (mkdocs.yml): the docstrings cross-reference
with Sphinx roles (:class:`~kafkakv.errors.ClosedError`, :meth:`close`), which Markdown would
show as typed. Each role becomes inline code, linked when it names a ``kafkakv`` object by its
full path and that object is on a page of the reference. A role naming an error of
``kafkakv.errors`` must resolve (the strict build fails otherwise); other roles may name
objects the reference leaves out, and then stay plain code.
Development tooling only: the package never imports it.
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension, Object

# Every public error is on the errors page, so a role naming one that does not exist is a
# mistake: those references are required, and the strict build fails on a broken one.
CHECKED = "kafkakv.errors."
ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|mod|exc|data|obj|const):`(~?)([^`<>]+)`")


def _replace(match: re.Match[str]) -> str:
    short, target = match.group(1), match.group(2).strip()
    shown = target.rsplit(".", 1)[-1] if short else target
    if target.startswith(CHECKED):
        return f'<autoref identifier="{target}"><code>{shown}</code></autoref>'
    if target.startswith("kafkakv."):
        return f'<autoref optional identifier="{target}"><code>{shown}</code></autoref>'
    return f"``{shown}``"


def convert(text: str) -> str:
    """Sphinx roles to inline code.

    >>> convert("raises :class:`~kafkakv.errors.ClosedError`; see :meth:`close`.")
    'raises <autoref identifier="kafkakv.errors.ClosedError"><code>ClosedError</code></autoref>; see ``close``.'
    """
    return ROLE.sub(_replace, text)


class SphinxRoles(Extension):
    def on_object(self, *, obj: Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = convert(obj.docstring.value)

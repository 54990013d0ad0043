"""A griffe extension for the API reference (mkdocs.yml): the docstrings cross-reference
with Sphinx roles (:class:`~kafkakv.errors.ClosedError`, :meth:`close`), which Markdown would
show as typed, and draw tables in reStructuredText's simple form (rows between lines of
``=====  ====``), which Markdown would run together into one paragraph. Each table becomes a
preformatted block, as it reads in the source. Each role becomes inline code, linked when it names a ``kafkakv`` object by its
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


def _plain(match: re.Match[str]) -> str:
    """A role as the name it shows, for a table kept as preformatted text."""
    target = match.group(2).strip()
    shown = target.rsplit(".", 1)[-1] if match.group(1) else target
    return shown.ljust(len(match.group(0)))  # the columns after it stay where they were


def _replace(match: re.Match[str]) -> str:
    short, target = match.group(1), match.group(2).strip()
    shown = target.rsplit(".", 1)[-1] if short else target
    if target.startswith(CHECKED):
        return f'<autoref identifier="{target}"><code>{shown}</code></autoref>'
    if target.startswith("kafkakv."):
        return f'<autoref optional identifier="{target}"><code>{shown}</code></autoref>'
    return f"``{shown}``"


RULE = re.compile(r"^\s*=+( +=+)+\s*$")


def _tables(text: str) -> str:
    r"""Simple reStructuredText tables (a rule, rows and a closing rule, with or without a
    header) as fenced blocks.

    >>> print(_tables("a\n\n==  ==\nx   y\n==  ==\n1   2\n==  ==\nb"))
    a
    <BLANKLINE>
    ```text
    ==  ==
    x   y
    ==  ==
    1   2
    ==  ==
    ```
    b
    """
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        end = i + 1
        while RULE.match(lines[i]) and end < len(lines) and lines[end].strip():
            end += 1
        last = max((k for k in range(i + 2, end) if RULE.match(lines[k])), default=None)
        if last is not None:  # a rule, rows, a closing rule
            table = [ROLE.sub(_plain, line) for line in lines[i : last + 1]]
            out += ["```text", *table, "```"]
            i = last + 1
        else:
            out.append(lines[i])
            i += 1
    return "\n".join(out)


def convert(text: str) -> str:
    """Sphinx roles to inline code, simple tables to fenced blocks.

    >>> convert("raises :class:`~kafkakv.errors.ClosedError`; see :meth:`close`.")
    'raises <autoref identifier="kafkakv.errors.ClosedError"><code>ClosedError</code></autoref>; see ``close``.'
    """
    return ROLE.sub(_replace, _tables(text))


class SphinxRoles(Extension):
    def on_object(self, *, obj: Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = convert(obj.docstring.value)

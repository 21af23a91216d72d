"""A griffe extension (mkdocs.yml, mkdocstrings' ``extensions``) that reads the
package's docstrings, written in reStructuredText's habits, as the Markdown the API
page renders: a paragraph's closing ``::`` before an example becomes ``:``, and a role
becomes code::

    "Example, testing a handler::"             ->  "Example, testing a handler:"
    ":class:`~mldserver.base.positions.Position`"  ->  "`Position`"
    ":mod:`mldserver.api.handler`"               ->  "`mldserver.api.handler`"

``double backquotes`` and the indented examples are Markdown as they are. The source
is not changed: only what mkdocstrings renders.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_LITERAL = re.compile(r"(?<=[^:\s])::[ \t]*$", re.M)  # "text::" at a line's end
_ROLE = re.compile(r":[a-z]+:`(~?)([^`]+)`")  # ~: only the last name


def markdown(text: str) -> str:
    """``text`` with its ``::`` and roles rewritten (see the module)."""
    text = _LITERAL.sub(":", text)
    return _ROLE.sub(lambda m: f"`{m[2].rsplit('.', 1)[-1] if m[1] else m[2]}`", text)


class RestToMarkdown(griffe.Extension):
    def on_object(self, *, obj: Any, **kwargs: Any) -> None:  # every object, once the tree is built
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)

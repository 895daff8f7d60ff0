"""What a setting means: the comment on its line in its settings model.

The comment next to a default is the one place a setting is documented; the launchers' forms (Airflow Params,
posttrain.orchestration.schema) show it as the setting's help. Read from the source of the settings classes, so a
recipe's or plugin's section is described the same way as the core's.
"""

from __future__ import annotations

import functools
import inspect
import re

from pydantic import BaseModel


def field_comments(model: type[BaseModel]) -> dict[str, str]:
    """`field -> its description` for a settings class (and the classes it inherits from): the comment on the
    field's line, continued by comment lines aligned with it; a field's `description=` wins. The comment next to
    a default is the one place a setting is documented; the launchers' forms and `posttrain settings` show it."""
    found: dict[str, str] = {}
    for klass in reversed(model.__mro__):
        if klass is BaseModel or not (isinstance(klass, type) and issubclass(klass, BaseModel)) or klass.__module__.startswith("pydantic"):
            continue
        found.update(_comments_in(klass))
    for name, field in model.model_fields.items():
        if field.description:
            found[name] = field.description
    return {name: text for name, text in found.items() if name in model.model_fields}


@functools.cache
def _comments_in(klass: type) -> dict[str, str]:
    try:
        lines, _ = inspect.getsourcelines(klass)
    except (OSError, TypeError):
        return {}
    found: dict[str, str] = {}
    last, column, above = None, -1, []  # above: the comment lines right above a field (used when its line has none)
    body_indent = None
    for line in lines[1:]:
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if stripped.startswith("#"):
            if last is not None and indent == column:
                found[last] += " " + stripped.lstrip("#").strip()
            else:
                last = None
                above.append(stripped.lstrip("#").strip())
            continue
        match = _FIELD_LINE.match(line)
        if match and (body_indent is None or indent == body_indent):
            body_indent = indent
            column, comment = _trailing_comment(line)
            last = match["name"] if comment else None
            if comment or above:
                found[match["name"]] = comment or " ".join(above)
        elif stripped:
            last = None
        above = []
    return found


_FIELD_LINE = re.compile(r"^\s+(?P<name>[a-z_][a-z0-9_]*)\s*:\s*[A-Za-z(\[]")


def _trailing_comment(line: str) -> tuple[int, str]:
    """(column, text) of the `# ...` comment at the end of a code line (a `#` inside a string is not one)."""
    quote = None
    for i, char in enumerate(line):
        if char in "'\"" and quote in (None, char):
            quote = None if quote else char
        elif char == "#" and quote is None:
            return i, line[i + 1 :].strip()
    return -1, ""

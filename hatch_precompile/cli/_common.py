"""What every command shares: exit statuses, the one-line error, plain-text output."""

from __future__ import annotations

import json
from typing import Any

OK, FAILED, ERROR = 0, 1, 2  # exit statuses


class CommandError(Exception):
    """The command could not run at all (no such file, not a wheel, ...): one line, exit 2."""


def table(header: list[str], rows: list[list[str]]) -> str:
    """Plain text columns, left-aligned, two spaces apart."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in [header, *rows])


def field_lines(fields: dict[str, str]) -> str:
    width = max(map(len, fields)) + 1
    return "\n".join(f"  {(key + ':').ljust(width)} {value}" for key, value in fields.items())


def print_json(document: dict[str, Any]) -> None:
    print(json.dumps(document, indent=2, sort_keys=False))

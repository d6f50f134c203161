"""One rule for the files the tooling keeps its slow work in between runs (DROP's trained aligner and alignments,
`metrics.drop`; guided alignment's eflomal links, `training.guided_links`): a file named by everything its value
depends on is read back if it holds a sound value, and otherwise computed and written whole.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from .output_files import write_text

logger = logging.getLogger(__name__)

Value = TypeVar("Value")


def _json_text(value) -> str:
    return json.dumps(value, ensure_ascii=False)


def cached(path: Path | None, compute: Callable[[], Value], *, valid: Callable[[Value], bool] = lambda value: True,
           parse: Callable[[str], Value] = json.loads, text: Callable[[Value], str] = _json_text,
           what: str = "cache entry", log: logging.Logger = logger) -> tuple[Value, bool]:
    """(the value stored at `path`, True), or (compute(), False) after storing it there (`output_files.write_text`:
    whole or not at all, so that a concurrent or interrupted run never leaves half a file); no cache if `path` is
    None. The file is JSON unless `parse` (text -> value, raising ValueError on what it cannot read) and `text`
    (value -> text) say otherwise. A file that is not UTF-8, that `parse` refuses or whose value fails `valid` (a
    damaged or edited file) is computed again, with a warning on the caller's `log` naming the file and `what` it
    held."""
    if path is not None and path.is_file():
        try:
            value = parse(path.read_text(encoding="utf-8"))
        except ValueError as error:  # UnicodeDecodeError and json.JSONDecodeError are ValueErrors
            log.warning(f"{path}: damaged {what}; computing it again ({error})")
        else:
            if valid(value):
                return value, True
            log.warning(f"{path}: damaged {what}; computing it again")
    value = compute()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text(path, text(value))
    return value, False

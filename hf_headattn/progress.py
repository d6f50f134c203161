"""One progress rule for every command: a bar where standard error is a terminal, plain lines with the rate and the
time left where it is not (a log file, a pipe, a CI job), in the manner of fairseq's `--log-format simple`:

    translating test.de: 2,300/5,000 sentences (46%) | 410 sentences/s | elapsed 00:05 | ETA 00:06

A line every `PLAIN_INTERVAL` seconds and one at the end, never cursor escapes or carriage returns. The commands
make their bars (translation, evaluation, the tokenizer's training, Trainer's steps and validation) as `Progress`,
a tqdm whose display follows the stream.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import os
import sys

from tqdm.auto import tqdm

# seconds between two plain lines: often enough to follow a run in its log, seldom enough to keep the log short
PLAIN_INTERVAL = 30.0

PLAIN_FORMAT = "{desc}: {n_fmt}/{total_fmt}{unit} ({percentage:.0f}%) | {rate_text} | elapsed {elapsed} | ETA {remaining}"
PLAIN_FORMAT_UNKNOWN_TOTAL = "{desc}: {n_fmt}{unit} | {rate_text} | elapsed {elapsed}"


def rate_text(rate: float | None, units: str) -> str:
    """"410 sentences/s", or below one a second "4.23 s/step" (tqdm's own inversion reads "4.23s/ steps")."""
    if not rate:
        return f"? {units or 'it'}/s"
    if rate >= 1:
        return f"{rate:.2f} {units or 'it'}/s"
    plural_es = units.endswith("es") and units[:-2].endswith(("ch", "sh", "x"))
    return f"{1 / rate:.2f} s/{units[:-2] if plural_es else units.removesuffix('s') or 'it'}"


def is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no such method, or a closed stream
        return False


class Progress(tqdm):
    """tqdm on a terminal; elsewhere a plain line every `PLAIN_INTERVAL` seconds (the `mininterval` given) and a last
    one when it closes, each a whole line. Takes tqdm's arguments; `unit` is shown after the counts (" sentences").
    `TQDM_DISABLE=1` in the environment disables it when the bar is made (tqdm reads it once, at its import: a
    command's --quiet sets it after)."""

    def __init__(self, *args, **kwargs):
        if os.environ.get("TQDM_DISABLE", "").lower() in ("1", "true", "yes"):
            kwargs["disable"] = True
        stream = kwargs.get("file") or sys.stderr
        self._plain = not is_terminal(stream)
        self._shown_n = 0  # the count of the last plain line: nothing to say before any progress
        if self._plain:
            kwargs.setdefault("mininterval", PLAIN_INTERVAL)
            kwargs["maxinterval"] = max(kwargs.get("maxinterval", 0), kwargs["mininterval"])
            kwargs.update(dynamic_ncols=False, ascii=True)
        super().__init__(*args, **kwargs)

    def display(self, msg=None, pos=None):
        if not self._plain:
            return super().display(msg, pos)
        if msg == "" or self.n == self._shown_n:  # a clear, or nothing new (a redraw after another line was written)
            return False
        self._shown_n = self.n
        unit = self.unit.strip()
        if unit and not unit.endswith("s"):  # the counts' unit: "50/50 sentences", beside the rate's "sentence/s"
            unit += "es" if unit.endswith(("ch", "sh", "x")) else "s"
        units = unit if unit not in ("its", "") else ""
        details = {**self.format_dict, "unit": f" {units}" if units else ""}
        elapsed, counted = details["elapsed"], self.n - details.get("initial", 0)
        details["rate_text"] = rate_text(details["rate"] or (counted / elapsed if elapsed else None), units)
        details["bar_format"] = PLAIN_FORMAT if self.total else PLAIN_FORMAT_UNKNOWN_TOTAL
        self.fp.write(self.format_meter(**details) + "\n")
        self.fp.flush()
        return True

    def clear(self, nolock=False):
        if not self._plain:
            super().clear(nolock)

    def close(self):
        if self._plain and not self.disable:
            with self._lock:
                self.display()  # the last count, once
            self.leave = False  # tqdm would end the bar's line, which the plain lines do not leave open
        super().close()

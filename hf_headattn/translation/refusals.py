"""What a translator cannot honour, said once: :class:`OptionRefused` (a ValueError) holds one :class:`Refusal` per
option (its name as the library takes it, the value given, and why), and words them with a :class:`Spelling`: the
library's (``fast=False``, ``num_beams``) by default, a command's (``--decoding generate``, ``--num_beams``) where the
command asks for it (:meth:`OptionRefused.spelled`), so that no command-line spelling lives in the library.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["LIBRARY_SPELLING", "OptionRefused", "Refusal", "Spelling"]


class Spelling:
    """How options are named in a message: :meth:`name` alone, and :meth:`with_value` (the library's: ``name``
    and ``name=value``)."""

    def name(self, option: str) -> str:
        return option

    def with_value(self, option: str, value) -> str:
        return f"{option}={value!r}"


LIBRARY_SPELLING = Spelling()


class _Names(dict):
    """The names a refusal's words may cite (``{num_beams}``), spelled as asked."""

    def __init__(self, spelling: Spelling, **given):
        super().__init__(given)
        self.spelling = spelling

    def __missing__(self, option: str) -> str:
        return self.spelling.name(option)


@dataclass(frozen=True)
class Refusal:
    """One option a translator cannot honour: `option` (the keyword of :func:`~.translator.load_translator` or
    ``translate``), the `value` given, and the `reason`. `shape` words it, with ``{option}`` (the option and its
    value), ``{name}`` (the option alone), ``{reason}``, and any other option's name in braces (``{num_beams}``),
    each spelled as the message asks; the reason may cite other options alike."""

    option: str
    value: object
    reason: str
    shape: str = field(default="{option} ({reason})", compare=False)

    def said(self, spelling: Spelling = LIBRARY_SPELLING) -> str:
        names = _Names(spelling, option=spelling.with_value(self.option, self.value), name=spelling.name(self.option))
        return self.shape.format_map(_Names(spelling, **names, reason=self.reason.format_map(names)))


class OptionRefused(ValueError):
    """Options a translator cannot honour, raised before anything is translated: `lead` (what refuses, e.g.
    ``"runs/de-en-ct2 is a CTranslate2 export, which cannot take "``) and its `refusals`, worded in `spelling`."""

    def __init__(self, lead: str, refusals: list[Refusal] | tuple[Refusal, ...],
                 spelling: Spelling = LIBRARY_SPELLING):
        self.lead, self.refusals, self.spelling = lead, tuple(refusals), spelling
        super().__init__(self.lead + "; ".join(refusal.said(spelling) for refusal in self.refusals))

    @property
    def options(self) -> list[str]:
        """The refused options' names, as the library takes them."""
        return [refusal.option for refusal in self.refusals]

    def spelled(self, spelling: Spelling) -> "OptionRefused":
        """The same refusal, worded in another spelling (a command's flags)."""
        return OptionRefused(self.lead, self.refusals, spelling)


def refuse(lead: str, refusals: list[Refusal]) -> None:
    """Raise :class:`OptionRefused` when there are `refusals`."""
    if refusals:
        raise OptionRefused(lead, refusals)

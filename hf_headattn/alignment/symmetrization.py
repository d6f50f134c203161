"""Symmetrisation: two directional word alignments (eflomal's forward and reverse) combined into one.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence

SYMMETRIZATIONS = ("grow-diag-final-and", "intersection", "union")

# Grid neighbours in the order of Koehn's pseudo-code: the four direct ones first, then the diagonals.
_NEIGHBOURS = ((-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1))

Links = list[tuple[int, int]]


def grow_diag_final_and(
    forward: Sequence[tuple[int, int]],
    reverse: Sequence[tuple[int, int]],
    source_length: int,
    target_length: int,
) -> Links:
    """Symmetrize two directional alignments with grow-diag-final-and (Koehn et al., 2003; Moses' default).

    Both inputs are lists of ``(source index, target index)`` links. The algorithm:

    1. Start from the intersection of the two alignments (high precision).
    2. GROW-DIAG: repeat until nothing changes: for every current link, in (source, target) order, look at its
       8 neighbours (left/right/up/down, then the diagonals); add a neighbour that lies in the *union* if its
       source token or its target token is still unaligned.
    3. FINAL-AND, first for ``forward`` then for ``reverse``: add a link of that direction if *both* its source
       and its target token are still unaligned.

    One deterministic detail differs between implementations: links added during a GROW-DIAG pass are expanded
    in the next pass (passes repeat until none adds a link), rather than later in the same pass.

    Returns:
        The symmetrized links, sorted.
    """
    forward_set, reverse_set = _check_links(forward, source_length, target_length), _check_links(
        reverse, source_length, target_length
    )
    union = forward_set | reverse_set
    alignment = forward_set & reverse_set
    aligned_sources = {i for i, _ in alignment}
    aligned_targets = {j for _, j in alignment}

    def add(i: int, j: int) -> None:
        alignment.add((i, j))
        aligned_sources.add(i)
        aligned_targets.add(j)

    grew = True
    while grew:
        grew = False
        for i, j in sorted(alignment):
            for di, dj in _NEIGHBOURS:
                point = (i + di, j + dj)
                if point in union and point not in alignment and (
                    point[0] not in aligned_sources or point[1] not in aligned_targets
                ):
                    add(*point)
                    grew = True

    for direction in (forward_set, reverse_set):
        for i, j in sorted(direction):
            if i not in aligned_sources and j not in aligned_targets:
                add(i, j)
    return sorted(alignment)


def symmetrize(
    forward: Sequence[tuple[int, int]],
    reverse: Sequence[tuple[int, int]],
    source_length: int,
    target_length: int,
    method: str = "grow-diag-final-and",
) -> Links:
    """Combine two directional alignments: ``"grow-diag-final-and"`` (default), ``"intersection"`` or ``"union"``.

    Intersection is precise but drops every many-to-one link, so it caps fertilities at 1; union keeps every
    link of both directions, including their errors. grow-diag-final-and sits in between; it is the default of
    eflomal's own symmetrizing script and the usual ``atools -c`` choice with fast_align.
    """
    if method == "grow-diag-final-and":
        return grow_diag_final_and(forward, reverse, source_length, target_length)
    forward_set = _check_links(forward, source_length, target_length)
    reverse_set = _check_links(reverse, source_length, target_length)
    if method == "intersection":
        return sorted(forward_set & reverse_set)
    if method == "union":
        return sorted(forward_set | reverse_set)
    raise ValueError(f"Unknown symmetrization {method!r}; accepted: {', '.join(SYMMETRIZATIONS)}")


def _check_links(links: Sequence[tuple[int, int]], source_length: int, target_length: int) -> set[tuple[int, int]]:
    checked = set()
    for link in links:
        i, j = (int(x) for x in link)
        if not (0 <= i < source_length and 0 <= j < target_length):
            raise ValueError(
                f"Alignment link {tuple(link)} out of range for a {source_length}-token source and "
                f"{target_length}-token target"
            )
        checked.add((i, j))
    return checked

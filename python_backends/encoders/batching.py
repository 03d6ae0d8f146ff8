"""An encoder step's clips cut into forwards of a bounded size (so a long request, or many at once, never
holds more activations than the budget)."""
from __future__ import annotations


def forward_groups(sizes: list[int], budget: int) -> list[list[int]]:
    """Indices of `sizes` in consecutive groups whose sizes add up to at most `budget` (a larger one alone)."""
    groups: list[list[int]] = []
    total = 0
    for i, n in enumerate(sizes):
        if not groups or total + n > budget:
            groups.append([])
            total = 0
        groups[-1].append(i)
        total += n
    return groups

"""How error messages name the ranks of a process group (by their rank in it and, on a
subgroup, by their global rank too: the rank a process was launched as), and how a
checkpoint keeps each rank's own state."""

from __future__ import annotations


def this_rank(rank: int, global_ranks: list[int] | None) -> str:
    """'rank 0', or on a subgroup 'rank 0, global rank 2'."""
    if global_ranks is None or global_ranks[rank] == rank:
        return f"rank {rank}"
    return f"rank {rank}, global rank {global_ranks[rank]}"


def name_ranks(ranks: list[int], global_ranks: list[int] | None) -> str:
    """'rank 1', 'ranks 1, 2', or on a subgroup 'rank 1 (global rank 3)'."""
    several = len(ranks) > 1
    named = ("ranks " if several else "rank ") + ", ".join(map(str, ranks))
    if global_ranks is None or all(global_ranks[r] == r for r in ranks):
        return named
    world = ", ".join(str(global_ranks[r]) for r in ranks)
    return f"{named} (global {'ranks' if several else 'rank'} {world})"


def by_rank(values: list, global_ranks: list[int] | None = None) -> str:
    """'rank 0: a; ranks 1, 2: b' for the values of ranks 0, 1, 2, a None left out (on a
    subgroup with its ``global_ranks``: 'rank 0 (global rank 3): a')."""
    ranks_of: dict = {}
    for rank, value in enumerate(values):
        if value is not None:
            ranks_of.setdefault(value, []).append(rank)
    return "; ".join(f"{name_ranks(ranks, global_ranks)}: {v}" for v, ranks in ranks_of.items())


def check_saved_here(state: dict, rank: int, world_size: int, why_world: str) -> None:
    """A per-rank checkpoint ``state`` (its ``"rank"`` and ``"world_size"``) is loaded by the
    rank that saved it, in a world of the size it was saved in; else a ``ValueError`` naming
    ``state``, saying ``why_world`` the size matters."""
    if state["world_size"] != world_size:
        raise ValueError(
            f"state was saved by a rank of {state['world_size']} processes, this is one of "
            f"{world_size}: {why_world}"
        )
    if state["rank"] != rank:
        raise ValueError(
            f"state was saved by rank {state['rank']}, this is rank {rank}: each rank loads "
            "the state it saved (one file per rank)"
        )


#: The key under which a per-rank checkpoint state (:func:`keyed_by_rank`) holds its entries.
RANKS_KEY = "of_rank"


def keyed_by_rank(entry: dict, rank: int) -> dict:
    """``entry``, one rank's own state, under the rank's key, in a tuple: plain for
    ``torch.save`` (one file per rank), and for ``torch.distributed.checkpoint``, which
    saves each rank's entry and loads it whole; what every rank held under one key, DCP
    would keep one copy of."""
    return {RANKS_KEY: {str(rank): (entry,)}}


def own_entry(state: object, rank: int, what: str) -> dict:
    """``rank``'s entry of ``state``, a :func:`keyed_by_rank` dict that ``what`` (a name,
    such as ``Compression.state_dict()``) returned; a ``TypeError`` or ``ValueError``
    naming ``state`` where it is not one, or holds no entry of ``rank``."""
    if not isinstance(state, dict):
        raise TypeError(f"state must be the dict of {what}, got {type(state).__name__}")
    if not isinstance(state.get(RANKS_KEY), dict):
        raise ValueError(f"state is not a {what}: it lacks {[RANKS_KEY]}")
    saved = state[RANKS_KEY]
    if str(rank) not in saved:
        ranks = ", ".join(sorted(saved))
        raise ValueError(
            f"state was saved by rank {ranks}, this is rank {rank}: each rank loads the state "
            "it saved (one file per rank, or one torch.distributed.checkpoint of every rank)"
        )
    entry = saved[str(rank)]
    if not (isinstance(entry, tuple) and len(entry) == 1 and isinstance(entry[0], dict)):
        raise ValueError(f"state[{RANKS_KEY!r}][{str(rank)!r}] must be a tuple of one dict")
    return entry[0]

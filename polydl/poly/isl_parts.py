"""The parts of isl's union and piecewise objects as Python lists (isl hands them out one
callback at a time), and the width of a schedule map."""

from __future__ import annotations

import islpy as isl


def maps_of(union: isl.UnionMap) -> list[isl.Map]:
    out: list[isl.Map] = []
    union.foreach_map(out.append)
    return out


def sets_of(union: isl.UnionSet) -> list[isl.Set]:
    out: list[isl.Set] = []
    union.foreach_set(out.append)
    return out


def pw_affs_of(union: isl.UnionPwAff) -> list[isl.PwAff]:
    out: list[isl.PwAff] = []
    union.foreach_pw_aff(out.append)
    return out


def affs_of(value: isl.PwAff) -> list[isl.Aff]:
    """The affine function of each piece of `value`."""
    out: list[isl.Aff] = []
    value.foreach_piece(lambda _, aff: out.append(aff))
    return out


def out_width(union: isl.UnionMap) -> int:
    """How many output dimensions the maps of `union` have (a schedule's time dimensions)."""
    return max((m.dim(isl.dim_type.out) for m in maps_of(union)), default=0)


def single_set(union: isl.UnionSet) -> isl.Set | None:
    """The one set of `union`; None where it has several spaces (or none)."""
    sets = sets_of(union)
    return sets[0] if len(sets) == 1 else None


def middle_point(points: isl.Set) -> isl.Set:
    """A point of `points` near the middle of its bounding box, dimension by dimension."""
    point = points
    for d in range(points.dim(isl.dim_type.set)):
        low, high = point.dim_min_val(d).to_python(), point.dim_max_val(d).to_python()
        point = point.fix_val(isl.dim_type.set, d, isl.Val.int_from_si(points.get_ctx(),
                                                                          (low + high) // 2))
        if point.is_empty():
            return points.lexmin()
    return point


def iterators_of(aff: isl.Aff) -> list[int]:
    """The input dimensions (a statement's iterators) `aff` has a nonzero coefficient on."""
    return [i for i in range(aff.dim(isl.dim_type.in_))
            if not aff.get_coefficient_val(isl.dim_type.in_, i).is_zero()]


def depends_on(value: isl.PwAff, iterator: int) -> bool:
    """Whether some piece of `value` moves with input dimension `iterator`."""
    return any(iterator in iterators_of(aff) for aff in affs_of(value))


def statement_names(domain: isl.UnionSet) -> tuple[str, ...]:
    """The statements of `domain`, S2 before S10."""
    names = [s.get_tuple_name() for s in sets_of(domain)]
    return tuple(sorted(names, key=lambda n: (len(n), n)))


def member_text(band: isl.ScheduleNode, member: int) -> str:
    """A band loop as a readable affine function of one statement's iterators (the longest
    piece: the most telling)."""
    pieces = pw_affs_of(band.band_get_partial_schedule().get_union_pw_aff(member))
    text = max((str(p) for p in pieces), key=lambda t: (len(t), t))
    return text[text.index("[(") + 2: text.rindex(")]")] if "[(" in text else text

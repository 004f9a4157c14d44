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

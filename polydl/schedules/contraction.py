"""Where the code keeps each local array once the schedule is chosen: the smallest storage the
chosen order allows.

Takes a `ScheduledNest`; returns a `LocalStorage` per local array of the nest. The C frontend
expands a C local scalar `float t` into one cell per iteration of the loops around it, so the
model stays affine and every schedule may reorder those iterations freely. Once the order is
fixed, most of those cells are dead the moment they are read: the local is contracted to a
register scalar whose lifetime is one iteration of the outer `level` time dimensions of its nest
where both hold, in the scheduled order:

- every value-based flow dependence on the array stays inside one iteration of those
  dimensions (no read sees a value written in an earlier iteration of them), and every read
  has a source in the nest (nothing reads the array's zero fill);
- all accesses in one iteration of those dimensions touch one cell (the map from the
  dimensions to the cells touched is single-valued).

Then, merging every cell into one, no write comes between a write and a read of its value: the
writes of one iteration all precede its reads of them, and no other iteration runs in between.
The deepest such level is taken (the shortest lifetime). Where no level holds (the schedule
carries a value of the array from one iteration to the next, or one iteration touches several
cells) the array stays whole; `describe()` says which. Whether a parallel loop needs its own copy
of a scalar is the code generator's question (a `private` clause where its body writes it).
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import islpy as isl

from polydl.dtypes import DTYPES
from polydl.poly.counting import count_points
from polydl.poly.dependences import carries
from polydl.poly.isl_parts import maps_of, out_width
from polydl.poly.model import PolyModel, StatementModel
from polydl.schedules.apply import GroupPlan, ScheduledNest

# A contracted array lives on each thread's stack (a `private` copy per thread): far below any
# OpenMP runtime's default thread stack, and within a core's L2.
MAX_CONTRACTED_BYTES = 64 * 1024


@dataclass(frozen=True)
class LocalStorage:
    """Where the code keeps the local array `array`: the whole array (`whole`), else storage
    that lives one iteration of the loops `loops` (schedule dimensions `0 .. level - 1` of its
    nest; none: the whole call): a register scalar, or where one iteration touches several
    cells, an array over the dimensions `kept` only (each `(dimension of the array, cells
    along it)`, a power of two its index is wrapped to). `reason` says why."""

    array: str
    whole: bool
    level: int | None
    loops: tuple[str, ...]
    kept: tuple[tuple[int, int], ...]
    reason: str

    @property
    def scalar(self) -> bool:
        return not self.whole and not self.kept

    @property
    def cells(self) -> int:
        """How many cells the contracted storage has (the whole array's: 0)."""
        return 0 if self.whole else math.prod(extent for _, extent in self.kept)

    def describe(self) -> str:
        where = f"per iteration of ({', '.join(self.loops)})" if self.loops else "for the whole call"
        if self.whole:
            return f"the whole array: {self.reason}"
        if self.scalar:
            return f"a register scalar {where}: {self.reason}"
        dims = " x ".join(str(extent) for _, extent in self.kept)
        return f"an array of {dims} cells {where}: {self.reason}"


def local_storage(scheduled: ScheduledNest) -> dict[str, LocalStorage]:
    """The storage of each local array of `scheduled`, by name (cached per scheduled nest)."""
    found = _CACHE.get(scheduled)
    if found is None:
        found = _CACHE[scheduled] = {
            a.name: _storage(scheduled, a.name) for a in scheduled.model.nest.locals}
    return found


def scalar_locals(scheduled: ScheduledNest) -> frozenset[str]:
    """The local arrays of `scheduled` that the code holds as register scalars."""
    return frozenset(name for name, s in local_storage(scheduled).items() if s.scalar)


_CACHE: weakref.WeakKeyDictionary[ScheduledNest, dict[str, LocalStorage]] = weakref.WeakKeyDictionary()


def _whole(array: str, reason: str) -> LocalStorage:
    return LocalStorage(array, True, None, (), (), reason)


def _storage(scheduled: ScheduledNest, array: str) -> LocalStorage:
    model = scheduled.model
    users = [s for s in model.statements if any(a.access.array == array for a in s.accesses)]
    if not users:
        return _whole(array, "no statement touches it")
    if any(a.is_may for s in users for a in s.accesses if a.access.array == array):
        return _whole(array, "a subscript read from an index array may touch any of its cells")
    names = {s.name for s in users}
    plans = [p for p in scheduled.groups if names & {s.name for s in p.printed_statements}]
    if any(names & set(p.calls) or names & {s.name for s in p.feeds} for p in plans):
        return _whole(array, "a microkernel call or a copy in the nest reads its cells directly")
    domains = _union(isl.UnionMap.from_domain(s.domain) for s in users).domain()
    reads = model.reads.intersect_domain(domains).intersect_range(_cells(model, array))
    writes = model.writes.intersect_domain(domains).intersect_range(_cells(model, array))
    info = isl.UnionAccessInfo.from_sink(reads).set_must_source(writes)
    flow = info.set_schedule_map(model.original_schedule).compute_flow()
    if not flow.get_may_no_source().is_empty():
        return _whole(array, "some cells are read before anything writes them (its zero fill)")
    accesses = reads.union(writes)
    if len(plans) != 1:
        # nests run one after the other: one value for the whole call, where it has one cell
        if count_points(accesses.range()) == 1:
            return LocalStorage(array, False, 0, (), (), f"the {len(plans)} nests that use it "
                                "run one after the other and touch its one cell")
        return _whole(array, f"{len(plans)} nests use it, one after the other")
    plan = plans[0]
    smap = plan.schedule_map.intersect_domain(domains)
    if smap.is_empty() or not domains.is_subset(smap.domain()):
        return _whole(array, "the schedule does not run every statement that uses it")
    width = out_width(smap)
    deps = flow.get_may_dependence()
    level = next((d for d in range(width) if carries(deps, smap, d)), width)
    loops = _loop_names(plan, users, level)
    if level < width and deps.is_empty():
        reason = "nothing reads it"
    elif level < width and _is_loop(smap, level):
        reason = "each value is read in the iteration that writes it, carried along the loop inside"
    else:
        reason = "each value is read in the iteration that writes it"
    if _one_cell_per_iteration(smap, accesses, level):
        return LocalStorage(array, False, level, loops, (), reason)
    if level == 0:
        return _whole(array, "the schedule writes it in one sweep over the nest and reads it in a later one"
                      if not _is_loop(smap, 0) else "the outermost loop carries its values")
    spans = _spans(isl.Map.from_union_map(_prefix(smap, level).reverse().apply_range(accesses)))
    kept = tuple((k, 1 << (span - 1).bit_length()) for k, span in spans)
    dtype = model.nest.array(array).dtype
    cells = math.prod(extent for _, extent in kept)
    whole = math.prod(model.nest.array(array).concrete_shape(model.params))
    touched = (f"one iteration of ({', '.join(loops)}) touches up to "
               f"{math.prod(span for _, span in spans)} of its {whole} cells")
    if cells >= whole:
        return _whole(array, f"{touched}, and wrapped storage would be no smaller")
    if cells * DTYPES[dtype].bytes > MAX_CONTRACTED_BYTES:
        return _whole(array, f"{touched}, more than a thread's stack holds")
    return LocalStorage(array, False, level, loops, kept, f"{touched}; {reason}")


def _spans(cells: isl.Map) -> tuple[tuple[int, int], ...]:
    """For a map from one iteration to the cells it touches: each array dimension along which
    the cells of one iteration differ, with their widest span (an index wrapped to a power of
    two no smaller tells apart the cells of one iteration)."""
    out = []
    n = cells.dim(isl.dim_type.out)
    for k in range(n):
        along = cells.project_out(isl.dim_type.out, k + 1, n - k - 1).project_out(isl.dim_type.out, 0, k)
        if along.is_single_valued():
            continue  # one cell along k per iteration: the dimension goes
        spread = along.reverse().apply_range(along).deltas()
        out.append((k, int(spread.dim_max_val(0).to_python()) + 1))
    return tuple(out)


def _cells(model: PolyModel, array: str) -> isl.UnionSet:
    return isl.UnionSet.from_set(model.extents[array])


def _union(maps) -> isl.UnionMap:
    out = isl.UnionMap("{ }")
    for m in maps:
        out = out.union(m)
    return out


def _prefix(smap: isl.UnionMap, level: int) -> isl.UnionMap:
    """Each statement instance -> its time's first `level` dimensions."""
    return _union(isl.UnionMap.from_map(
        m.project_out(isl.dim_type.out, min(level, m.dim(isl.dim_type.out)),
                      max(m.dim(isl.dim_type.out) - level, 0)))
        for m in maps_of(smap))


def _one_cell_per_iteration(smap: isl.UnionMap, accesses: isl.UnionMap, level: int) -> bool:
    """True if, in one iteration of the first `level` time dimensions, every access touches
    the same cell."""
    return bool(_prefix(smap, level).reverse().apply_range(accesses).is_single_valued())


def _is_loop(smap: isl.UnionMap, dim: int) -> bool:
    """True if some statement takes more than one value at time dimension `dim` (a loop there,
    not only the order of the statements)."""
    for m in maps_of(smap):
        if dim >= m.dim(isl.dim_type.out):
            continue
        values = m.range().project_out(isl.dim_type.set, dim + 1, m.dim(isl.dim_type.out) - dim - 1)
        if not _fixed(values, dim):
            return True
    return False


def _fixed(values: isl.Set, dim: int) -> bool:
    """True if `values`' last dimension (`dim`) is a function of the ones before it."""
    as_map = isl.Map.from_range(values).move_dims(isl.dim_type.in_, 0, isl.dim_type.out, 0, dim)
    return bool(as_map.is_single_valued())


def _loop_names(plan: GroupPlan, users: list[StatementModel], level: int) -> tuple[str, ...]:
    """The names of the loops among the first `level` time dimensions of the statements in
    `users`: a statement's iterator where a dimension is one, else `t<d>` (a tile's loop)."""
    maps = {m.get_tuple_name(isl.dim_type.in_): m for m in maps_of(plan.schedule_map)}
    out: list[str] = []
    for d in range(level):
        name = None
        loop = False
        for s in users:
            m = maps.get(s.name)
            if m is None or d >= m.dim(isl.dim_type.out):
                continue
            values = m.range().project_out(isl.dim_type.set, d + 1, m.dim(isl.dim_type.out) - d - 1)
            if _fixed(values, d):
                continue
            loop = True
            for k, var in enumerate(s.iterators):
                if _function_of(m, k, d):
                    # a tile's loop where the iterator is not yet known at this dimension
                    name = var if _determined(m, k, d) else var * 2
                    break
            if name is not None:
                break
        if loop:
            out.append(name or f"t{d}")
    return tuple(out)


def _function_of(m: isl.Map, k: int, d: int) -> bool:
    """True if time dimension `d` of `m` is a function of its input dimension `k` alone."""
    n_in, n_out = m.dim(isl.dim_type.in_), m.dim(isl.dim_type.out)
    part = m.project_out(isl.dim_type.out, d + 1, n_out - d - 1).project_out(isl.dim_type.out, 0, d)
    part = part.project_out(isl.dim_type.in_, k + 1, n_in - k - 1).project_out(isl.dim_type.in_, 0, k)
    return bool(part.is_single_valued()) and not bool(_fixed(m.range().project_out(
        isl.dim_type.set, d + 1, n_out - d - 1), d))


def _determined(m: isl.Map, k: int, d: int) -> bool:
    """True if the time dimensions `0 .. d` of `m` determine its input dimension `k`."""
    n_in, n_out = m.dim(isl.dim_type.in_), m.dim(isl.dim_type.out)
    part = m.project_out(isl.dim_type.out, d + 1, n_out - d - 1)
    part = part.project_out(isl.dim_type.in_, k + 1, n_in - k - 1).project_out(isl.dim_type.in_, 0, k)
    return bool(part.reverse().is_single_valued())

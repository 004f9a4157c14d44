"""The general scheduler: isl's affine scheduler for loop nests the DL schedules do not fit.

Takes a `PolyModel` (one loop nest, or all of them) and a `CpuTarget`; returns an
`AffineSchedule`: an isl schedule tree and one `BandDecision` per band. isl computes the
schedule from the dependences (validity: every dependence; proximity: the same, so that
producers and consumers fuse; coincidence: the same, so that bands start with loops that carry
nothing): fusion or distribution, skewing where dependences need it (stencils), and permutable
bands. Then, per band, outermost first:

- **Tiling.** A permutable band of two or more loops is tiled, with the largest tile size
  (the same along every loop) whose footprint (the cells one tile touches, counted with
  barvinok) fits half the target's L2.
- **Parallelism.** The outermost loop that carries no dependence runs on the threads, where
  the threads' saving pays for its forks (`forks.py`: each start of the loop counted exactly,
  against the instances under it). Where a tiled band has none (a time-skewed stencil), its
  tiles run as a wavefront: the first tile loop becomes the sum of the first two, and the
  second one is then parallel, priced the same way (one fork per tile diagonal).
- **Parallel regions.** Where sequential loops hold nothing but parallel loops (a wavefront's
  diagonals, a time loop around parallel rows), the threads fork once around the outermost of
  them (a `parallel region` mark: `#pragma omp parallel`, each parallel loop an `omp for`
  whose end is a barrier), and a start of a parallel loop inside costs a barrier, not a fork.
- **Recurrences across lanes.** Before all this, `lanes.py` strip-mines a loop that carries
  nothing into vector lanes below an innermost loop that carries a recurrence, where it pays.
- **Separate loops.** A band loop at one value of which a statement runs is generated as
  separate loops (`_separated`): no guard on its value inside the loops below.
- **Together or not at all.** A parallel loop beside sequential code over the same cells moves
  them between cores (`forks.moved_bytes`). Where loops inside a loop stay sequential because
  none pays alone, the tree with every one of them parallel is priced too (one region); and a
  tree whose threads cost more than they save runs on one thread (`bands_of`).

Every parallel loop is checked exactly against the dependences before it is marked (the
`parallel` mark the code generator reads); the tree itself is legal by construction (isl keeps
every validity constraint, and tiling and wavefronts of a permutable band keep them too).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, replace

import islpy as isl

from polydl.dtypes import DTYPES
from polydl.errors import ScheduleError
from polydl.poly.counting import count_points
from polydl.poly.dependences import carries, dependences_of
from polydl.poly.isl_parts import (
    affs_of,
    depends_on,
    iterators_of,
    maps_of,
    member_text,
    middle_point,
    out_width,
    pw_affs_of,
    sets_of,
    single_set,
    statement_names,
)
from polydl.poly.model import PolyModel
from polydl.schedules.cpu.forks import ParallelLoop, instance_cycles, price_loop, tree_cycles
from polydl.schedules.cpu.isl_time_limit import ScheduleTimeout, compute_schedule
from polydl.schedules.cpu.lanes import LaneStrip, lane_strips, read_lanes_mark
from polydl.schedules.cpu.written_tree import written_order_tree
from polydl.target.cpu import CpuTarget

PARALLEL_MARK = "parallel"
# the loop below and the next one run as one parallel loop (OpenMP collapse(2)): both carry
# no dependence, and one alone may have fewer iterations than the machine has cores
PARALLEL_COLLAPSE_MARK = "parallel collapse"
# A parallel loop with fewer iterations than this per core takes the next loop with it
# (collapse(2)).
COLLAPSE_BELOW_ITERATIONS = 4
ISL_ORIGIN = "affine scheduler"  # `AffineSchedule.origin` of a schedule isl computed


def parallel_mark_name(depth: int, collapse: bool = False) -> str:
    """The name of a parallel mark over the band whose first loop is schedule dimension
    `depth`. isl's AST leaves a dimension out of a part of the domain where it has one value
    there; the mark then marks no loop of that part, never the next one (which may carry a
    dependence), so the code generator needs the dimension."""
    return f"{PARALLEL_COLLAPSE_MARK if collapse else PARALLEL_MARK}@{depth}"


def read_parallel_mark(name: str) -> tuple[int, int] | None:
    """(how many loops run as one parallel loop, the schedule dimension of the first) of a
    parallel mark's name; None for any other mark."""
    kind, _, depth = name.partition("@")
    if kind not in (PARALLEL_MARK, PARALLEL_COLLAPSE_MARK) or not depth.isdigit():
        return None
    return (2 if kind == PARALLEL_COLLAPSE_MARK else 1), int(depth)
# Seconds isl's scheduler may take for one nest before the written order is kept.
SCHEDULE_SECONDS = 20.0
TILE_SIZES = (128, 64, 32, 16, 8)
# A tile's footprint may take this share of L2: the rest holds what the next tiles reuse.
L2_SHARE = 0.5
# the sequential loop below runs inside one parallel region (OpenMP `parallel`): every
# instance under it runs in a parallel loop (an `omp for`), so the threads fork once
PARALLEL_REGION_MARK = "parallel region"


@dataclass(frozen=True)
class BandDecision:
    """What happened to one band of the schedule tree."""

    statements: tuple[str, ...]
    members: tuple[str, ...]  # each loop's affine function, as isl prints it for one statement
    tiles: tuple[int, ...]  # () if the band is not tiled
    # "loop N" (0-based member), "loops N, N+1" (the next loop, maybe the next band's, with it:
    # collapsed), "wavefront", or "" (sequential)
    parallel: str
    footprint_bytes: int = 0  # what one tile touches (tiled bands)
    skewed: bool = False  # a loop combines several of a statement's iterators
    innermost: str = ""  # the member moved innermost in each tile (for unit-stride accesses)

    @property
    def parallel_from_first(self) -> bool:
        """Whether the band's first loop runs parallel (alone or collapsed with the next)."""
        return self.parallel in ("loop 0", "loops 0, 1")

    def describe(self) -> str:
        parts = [f"band ({', '.join(self.members)}) of {', '.join(self.statements)}"]
        if self.skewed:
            parts.append("skewed")
        if self.tiles:
            kib = self.footprint_bytes / 1024
            parts.append(f"tiles {'x'.join(map(str, self.tiles))} ({kib:.0f} KiB per tile)")
        if self.innermost:
            parts.append(f"{self.innermost} innermost in a tile")
        if self.parallel == "wavefront":
            parts.append("parallel: wavefront of tiles")
        elif self.parallel:
            parts.append(f"parallel {self.parallel}")
        else:
            parts.append("sequential")
        return "; ".join(parts)


@dataclass(frozen=True, eq=False)
class AffineSchedule:
    tree: isl.Schedule
    bands: tuple[BandDecision, ...]
    origin: str = ISL_ORIGIN  # or "written order (why)"
    # the model's cycles on the target's cores and on one thread (`forks.tree_cycles`)
    cycles: float = 0.0
    sequential_cycles: float = 0.0
    lanes: tuple[LaneStrip, ...] = ()  # recurrences run across vector lanes (`lanes.py`)

    @property
    def parallel(self) -> bool:
        return any(b.parallel for b in self.bands)

    def describe(self) -> str:
        return describe_bands(self.origin, [b.describe() for b in self.bands]
                              + [s.describe() for s in self.lanes])


def describe_bands(origin: str, bands: Sequence[str]) -> str:
    """One line: who made a schedule tree and each of its bands, as `BandDecision.describe()`
    says it (a plan keeps those words: `GroupPlan.how` and `GroupPlan.bands`)."""
    return f"{origin}: " + (" | ".join(bands) or "no loops")


_SCHEDULES: weakref.WeakKeyDictionary[PolyModel, dict[str, AffineSchedule]] = (
    weakref.WeakKeyDictionary()
)


def affine_schedule(model: PolyModel, target: CpuTarget) -> AffineSchedule:
    """The tiled, parallel schedule tree of every statement of `model` (cached per target)."""
    per_model = _SCHEDULES.setdefault(model, {})
    key = target.key()
    if key not in per_model:
        per_model[key] = _Scheduler(model, target).run()
    return per_model[key]


def written_order_schedule(model: PolyModel, target: CpuTarget, why: str) -> AffineSchedule:
    """The written order, with the outermost loop of each nest that carries nothing (and has
    the work) parallel."""
    return _Scheduler(model, target).written_order(why)


class _Scheduler:
    def __init__(self, model: PolyModel, target: CpuTarget) -> None:
        self.model = model
        self.target = target
        self.deps = dependences_of(model).all
        self.bands: list[BandDecision] = []
        self.accesses = model.reads.union(model.writes)
        # `fill`: the visit marks every loop inside a loop that can run parallel, paying alone
        # or not; `fillable`: the visit left such a loop sequential
        self.fill = False
        self.fillable = False

    def run(self) -> AffineSchedule:
        """First with isl asked for a parallel outermost loop of each band (which it gets by
        distributing a time loop, or by a point-level wavefront); where no parallel loop pays
        its forks that way, or the threads save less than half of what they could, again
        without, for permutable bands whose tiles run as a wavefront (the cheaper of the two
        by the model)."""
        try:
            first = self._try(outer_coincidence=True, seconds=SCHEDULE_SECONDS)
        except ScheduleTimeout as exc:
            return self.written_order(str(exc))
        if first is not None and first.parallel and _saves_half(first, self.target.cores):
            return first
        try:
            # a second opinion only: half the time
            second = self._try(outer_coincidence=False, seconds=SCHEDULE_SECONDS / 2)
        except ScheduleTimeout:
            second = None
        if second is not None and (first is None or (
                second.parallel and (not first.parallel or second.cycles < first.cycles))):
            return second
        if first is None:
            raise ScheduleError("isl's scheduler found no schedule for this nest")
        return first

    def _try(self, outer_coincidence: bool, seconds: float) -> AffineSchedule | None:
        """The schedule, or None where isl gives up (it cannot carry some dependences with
        the coefficients it allows, or a bound it needs is not affine)."""
        try:
            return self._schedule(outer_coincidence, seconds)
        except isl.Error:
            return None

    def _schedule(self, outer_coincidence: bool, seconds: float) -> AffineSchedule | None:
        ctx = self.deps.get_ctx()
        before = ctx.get_schedule_outer_coincidence()
        ctx.set_schedule_outer_coincidence(int(outer_coincidence))
        try:
            tree = compute_schedule(
                isl.ScheduleConstraints.on_domain(self.model.domains)
                .set_validity(self.deps)
                .set_proximity(self.deps)
                .set_coincidence(self.deps),
                seconds,
            )
        finally:
            ctx.set_schedule_outer_coincidence(before)
        return None if tree is None else self.bands_of(tree, ISL_ORIGIN)

    def written_order(self, why: str) -> AffineSchedule:
        return self.bands_of(written_order_tree(self.model), f"written order ({why})")

    def bands_of(self, tree: isl.Schedule, origin: str) -> AffineSchedule:
        """`tree` with its bands tiled and parallelised: each loop parallel where it pays
        alone; or, where that leaves parallel loops inside a loop that do not pay alone,
        every such loop parallel too (they may then share one region, and the cells they
        share stay on their threads' cores); or nothing parallel; whichever the model
        (`tree_cycles`) prices lowest. Recurrences that pay run across vector lanes first
        (`lanes.py`)."""
        tree, strips = lane_strips(self.model, self.target, self.deps, tree)
        chosen = self._variant(tree, origin, fill=False)
        if self.fillable:
            filled = self._variant(tree, origin, fill=True)
            if filled.cycles < chosen.cycles:
                chosen = filled
        if chosen.parallel and chosen.cycles > chosen.sequential_cycles:
            bands = tuple(replace(b, parallel="") for b in chosen.bands)
            plain = _without_parallel(chosen.tree.get_root()).get_schedule()
            chosen = AffineSchedule(plain, bands, origin, chosen.sequential_cycles,
                                    chosen.sequential_cycles)
        return replace(chosen, lanes=strips)

    def _variant(self, tree: isl.Schedule, origin: str, fill: bool) -> AffineSchedule:
        self.bands = []
        self.fill, self.fillable = fill, False
        root = _with_regions(_separated(self._visit(tree.get_root(), False)))
        scheduled = root.get_schedule()
        marks = (PARALLEL_MARK, PARALLEL_COLLAPSE_MARK)

        def cycles(cores: int) -> float:
            return tree_cycles(self.model, self.target, scheduled, self.deps, marks,
                               PARALLEL_REGION_MARK, cores)

        return AffineSchedule(scheduled, tuple(self.bands), origin, cycles(self.target.cores),
                              cycles(1))

    def _visit(self, node: isl.ScheduleNode, parallel_above: bool) -> isl.ScheduleNode:
        """Transform the subtree at `node`; returns the node at the same position."""
        if (node.get_type() == isl.schedule_node_type.mark
                and read_lanes_mark(node.mark_get_id().get_name()) is not None):
            return node  # a lane loop, and the statements its lanes run
        if node.get_type() != isl.schedule_node_type.band:
            for i in range(node.n_children()):
                node = self._visit(node.child(i), parallel_above).parent()
            return node
        node, depth, parallel = self._band(node, parallel_above)
        inner = node
        for _ in range(depth):
            inner = inner.child(0)
        for i in range(inner.n_children()):
            inner = self._visit(inner.child(i), parallel_above or parallel).parent()
        for _ in range(depth):
            inner = inner.parent()
        return inner

    def _band(
        self, node: isl.ScheduleNode, parallel_above: bool
    ) -> tuple[isl.ScheduleNode, int, bool]:
        """Tile and parallelise one band. Returns the node now at its position, how many
        levels below it the innermost band of the result is, and whether it runs parallel."""
        n = node.band_n_member()
        statements = statement_names(node.get_domain())
        members = _members(node)
        skewed = _is_skewed(node)
        coincident = [bool(node.band_member_get_coincident(i)) for i in range(n)]
        tiles: tuple[int, ...] = ()
        footprint = 0
        depth = 0
        innermost = ""
        if n >= 2 and node.band_get_permutable():
            size, footprint = self._tile_size(node)
            if size:
                order = _unit_stride_last(node, self.accesses)
                tiles = (size,) * n
                node = node.band_tile(_multi_val(node, tiles))
                depth = 1  # the point band under the tile band
                if order is not None:  # any order of a permutable band's loops is legal
                    node = _permuted(node.child(0), order).parent()
                    innermost = members[order[-1]]
        parallel = ""
        if not parallel_above:
            first = next((i for i in range(n) if coincident[i]), None)
            priced = None if first is None else self._pays(node, first)
            if priced is None and first is not None and _inside_a_loop(node):
                # alone it does not pay; beside other parallel loops it may (`bands_of`)
                self.fillable = True
                if self.fill:
                    priced = self._price(node, first)
            if first is not None and priced is not None:
                # a second loop joins only where the first leaves cores idle or unevenly
                # loaded: collapsing them stops gcc vectorising the inner one
                few = priced.units < COLLAPSE_BELOW_ITERATIONS * self.target.cores * priced.entries
                pair = few and first + 1 < n and coincident[first + 1]
                if few and not pair and first == n - 1 and not tiles:
                    # the next loop is the next band's (the written order has a band per loop)
                    child = node.child(0)
                    pair = (child.get_type() == isl.schedule_node_type.band
                            and self._can_run_in_parallel(child))
                marked = self._mark_parallel(node, first, pair)
                if marked is not None:
                    node, extra = marked
                    depth += extra
                    parallel = f"loops {first}, {first + 1}" if pair else f"loop {first}"
            elif first is None and tiles:
                marked = self._wavefront(node)
                if marked is not None:
                    node, extra = marked
                    depth += extra
                    parallel = "wavefront"
        self.bands.append(
            BandDecision(statements, members, tiles, parallel, footprint, skewed, innermost))
        return node, depth, bool(parallel)

    def _pays(self, band: isl.ScheduleNode, member: int) -> ParallelLoop | None:
        """Whether running member `member` of the band in parallel saves more than its starts
        cost: a fork and join each, or a barrier where the band alone fills a loop around it
        (the threads then fork once around that loop, `_with_regions`)."""
        priced = self._price(band, member)
        start = (self.target.barrier_cycles if _fills_a_loop_around(band)
                 else self.target.fork_join_cycles)
        return priced if priced is not None and priced.pays(start) else None

    def _price(self, band: isl.ScheduleNode, member: int) -> ParallelLoop | None:
        """Member `member` of the band as its threads would run it (None on one core)."""
        if self.target.cores <= 1:
            return None
        domain = band.get_domain()
        outer = band.get_prefix_schedule_union_map()
        partial = band.band_get_partial_schedule()
        for d in range(member):
            outer = outer.flat_range_product(
                isl.UnionMap.from_union_pw_aff(partial.get_union_pw_aff(d)))
        loop = isl.UnionMap.from_union_pw_aff(partial.get_union_pw_aff(member))
        return price_loop(domain, outer, loop, self.target.cores, self._instance_cycles)

    def _instance_cycles(self, statement: str) -> float:
        """An instance's cycles as if vectorised: the least work a fork may count on."""
        return instance_cycles(self.model, self.target, statement)

    def _mark_parallel(
        self, band: isl.ScheduleNode, member: int, pair: bool = False
    ) -> tuple[isl.ScheduleNode, int] | None:
        """Mark `member` of the band parallel (splitting the band before it), with the next
        member where `pair` (isl found both coincident: the code generator collapses the two
        where they nest perfectly); None if it is no loop in the code or the exact check finds
        a dependence it carries."""
        extra = 0
        if member > 0:
            band = band.band_split(member).child(0)
            extra = 1
        if not self._can_run_in_parallel(band):
            return None
        mark = parallel_mark_name(band.get_schedule_depth(), collapse=pair)
        marked = band.insert_mark(isl.Id(mark, context=band.get_ctx()))
        top = marked
        for _ in range(extra):
            top = top.parent()
        return top, extra + 1

    def _wavefront(self, band: isl.ScheduleNode) -> tuple[isl.ScheduleNode, int] | None:
        """Turn a tile loop into the sum of it and the next one; that next one then carries no
        dependence (every distance along the band is >= 0), which the check confirms. The
        first pair whose second loop is still a loop (a time dimension shorter than one tile
        leaves its tile loop out of the code) and passes the check is taken."""
        schedule = band.band_get_partial_schedule()
        for k in range(band.band_n_member() - 1):
            front = schedule.get_union_pw_aff(k).add(schedule.get_union_pw_aff(k + 1))
            skewed = band.delete().insert_partial_schedule(schedule.set_union_pw_aff(k, front))
            skewed = skewed.band_set_permutable(1)
            inner = skewed.band_split(k + 1).child(0)
            if self._can_run_in_parallel(inner) and self._pays(inner, 0) is not None:
                name = parallel_mark_name(inner.get_schedule_depth())
                marked = inner.insert_mark(isl.Id(name, context=band.get_ctx()))
                return marked.parent(), 2
        return None

    def _can_run_in_parallel(self, band: isl.ScheduleNode) -> bool:
        """Whether the band's first loop is a loop in the code and carries no dependence among
        the instances under it. A loop with one value for each iteration of the loops outside
        it (a tile loop over a dimension shorter than one tile) is left out of the code, and a
        parallel mark above it would fall on the next loop, which may carry one."""
        domain = band.get_domain()
        prefix = band.get_prefix_schedule_union_map().intersect_domain(domain)
        first = isl.UnionMap.from_union_pw_aff(band.band_get_partial_schedule().get_union_pw_aff(0))
        if prefix.reverse().apply_range(first.intersect_domain(domain)).is_single_valued():
            return False
        relation = self.deps.intersect_domain(domain).intersect_range(domain)
        return not carries(relation, prefix.flat_range_product(first), out_width(prefix))

    def _tile_size(self, band: isl.ScheduleNode) -> tuple[int, int]:
        """The largest tile size whose footprint fits the L2 share, and that footprint; (0, 0)
        when the band's loops are all shorter than the smallest tile."""
        partial = band.band_get_partial_schedule_union_map()
        points = partial.intersect_domain(band.get_domain())
        times = single_set(points.range())
        if times is None:
            return 0, 0
        n = times.dim(isl.dim_type.set)
        low = [times.dim_min_val(d).to_python() for d in range(n)]
        high = [times.dim_max_val(d).to_python() for d in range(n)]
        if all(hi - lo + 1 <= TILE_SIZES[-1] for lo, hi in zip(low, high, strict=True)):
            return 0, 0
        prefix = band.get_prefix_schedule_union_map().intersect_domain(band.get_domain())
        outer = single_set(prefix.range())
        if outer is not None and outer.dim(isl.dim_type.set) > 0:
            # one iteration of the loops outside the band (a middle one: a corner of a skewed
            # space is nearly empty); the tiles rerun for each
            points = points.intersect_domain(prefix.intersect_range(
                isl.UnionSet.from_set(middle_point(outer))).domain())
        budget = self.target.l2_bytes * L2_SHARE
        best = (TILE_SIZES[-1], 0)
        for size in TILE_SIZES:
            middle = [lo + max((hi - lo + 1 - size) // 2, 0) for lo, hi in zip(low, high, strict=True)]
            box = " and ".join(f"{m} <= x{d} < {m + size}" for d, m in enumerate(middle))
            names = ", ".join(f"x{d}" for d in range(n))
            tile = isl.Set(f"{{ [{names}] : {box} }}")
            instances = points.intersect_range(isl.UnionSet.from_set(tile)).domain()
            footprint = self._footprint(instances)
            if footprint <= budget:
                return size, footprint
            best = (size, footprint)
        return best

    def _footprint(self, instances: isl.UnionSet) -> int:
        cells = self.accesses.intersect_domain(instances).range()
        total = 0
        for cell_set in sets_of(cells):
            dtype = self.model.nest.array(cell_set.get_tuple_name()).dtype
            total += count_points(cell_set) * DTYPES[dtype].bytes
        return total


def _separated(node: isl.ScheduleNode) -> isl.ScheduleNode:
    """The tree at `node` with every band loop at one value of which a statement runs (an
    initialisation fused into the band that sums into what it sets: `sum[p] = 0` at s = 0 of
    the loops (s, p)) generated as separate loops, the iterations that run it apart from the
    others. isl otherwise prints one loop with a guard on each of its iterations, inside the
    loops below (a compare in the innermost loop, which then stays scalar). Returns the node
    at `node`'s position."""
    if node.get_type() == isl.schedule_node_type.band:
        schedule = node.band_get_partial_schedule()
        for d in range(node.band_n_member()):
            constant = moving = False
            for piece in pw_affs_of(schedule.get_union_pw_aff(d)):
                for aff in affs_of(piece):
                    if iterators_of(aff):
                        moving = True
                    else:
                        constant = True
            if constant and moving:
                node = node.band_member_set_ast_loop_type(d, isl.ast_loop_type.separate)
    for i in range(node.n_children()):
        node = _separated(node.child(i)).parent()
    return node


def _fills_a_loop_around(band: isl.ScheduleNode) -> bool:
    """Whether a band above `band` runs exactly its instances (nothing else runs in that
    loop, so a parallel region can hold it)."""
    domain = band.get_domain()
    node = band
    while node.has_parent():
        node = node.parent()
        if node.get_type() == isl.schedule_node_type.band:
            if node.get_domain().is_equal(domain):
                return True
            return False
    return False


def _saves_half(schedule: AffineSchedule, cores: int) -> bool:
    """Whether the threads save at least half of what `cores` threads could (the work over
    the cores, against one thread)."""
    could = schedule.sequential_cycles * (1.0 - 1.0 / cores)
    return schedule.sequential_cycles - schedule.cycles >= could / 2


def _inside_a_loop(node: isl.ScheduleNode) -> bool:
    """Whether a band is above `node`."""
    while node.has_parent():
        node = node.parent()
        if node.get_type() == isl.schedule_node_type.band:
            return True
    return False


def _without_parallel(node: isl.ScheduleNode) -> isl.ScheduleNode:
    """The tree at `node` with its parallel and region marks deleted; returns the node at
    `node`'s position."""
    if node.get_type() == isl.schedule_node_type.mark:
        name = node.mark_get_id().get_name()
        if name == PARALLEL_REGION_MARK or read_parallel_mark(name) is not None:
            return _without_parallel(node.delete())
    for i in range(node.n_children()):
        node = _without_parallel(node.child(i)).parent()
    return node


def _with_regions(node: isl.ScheduleNode) -> isl.ScheduleNode:
    """Mark the outermost sequential bands that hold only parallel loops as parallel regions
    (see `PARALLEL_REGION_MARK`); returns the node at `node`'s position."""
    kind = node.get_type()
    if kind == isl.schedule_node_type.mark:
        return node  # a parallel loop and what runs inside it
    if kind == isl.schedule_node_type.band:
        marked = _parallel_domains(node)
        if marked is not None and marked.is_equal(node.get_domain()):
            return node.insert_mark(isl.Id(PARALLEL_REGION_MARK, context=node.get_ctx()))
    for i in range(node.n_children()):
        node = _with_regions(node.child(i)).parent()
    return node


def _parallel_domains(node: isl.ScheduleNode) -> isl.UnionSet | None:
    """The instances under the outermost parallel marks below `node`; None if there is none."""
    found: isl.UnionSet | None = None
    for i in range(node.n_children()):
        child = node.child(i)
        if (child.get_type() == isl.schedule_node_type.mark
                and read_parallel_mark(child.mark_get_id().get_name()) is not None):
            part: isl.UnionSet | None = child.get_domain()
        else:
            part = _parallel_domains(child)
        if part is not None:
            found = part if found is None else found.union(part)
    return found


def _multi_val(band: isl.ScheduleNode, sizes: tuple[int, ...]) -> isl.MultiVal:
    values = isl.MultiVal.zero(band.band_get_space())
    for d, size in enumerate(sizes):
        values = values.set_val(d, isl.Val.int_from_si(values.get_ctx(), size))
    return values


def _unit_stride_last(band: isl.ScheduleNode, accesses: isl.UnionMap) -> tuple[int, ...] | None:
    """A member order with the loop that walks the most accesses at unit stride last; None
    where the written one is as good, or a member is a combination of iterators (a skewed
    band); a statement the member holds at a constant is left out of its count. An access
    counts for a loop where only its last subscript moves with it or none does (it stays in
    a register), and against it where an earlier one does (a stride of a whole row)."""
    n = band.band_n_member()
    schedule = band.band_get_partial_schedule()
    iterator: list[dict[str, int]] = [{} for _ in range(n)]
    for d in range(n):
        for piece in pw_affs_of(schedule.get_union_pw_aff(d)):
            used = {i for aff in affs_of(piece) for i in iterators_of(aff)}
            if not used:  # a statement placed at one value of this loop (an initialisation)
                continue
            if len(used) != 1:
                return None
            iterator[d][piece.get_domain_space().get_tuple_name(isl.dim_type.set)] = used.pop()
    single: list[isl.BasicMap] = []  # one per reference (a map holds all of a statement's
    for union_of_refs in maps_of(accesses.intersect_domain(band.get_domain())):  # to an array)
        union_of_refs.foreach_basic_map(single.append)
    score = [0] * n
    for ref in single:
        access = isl.Map.from_basic_map(ref)
        statement = access.get_tuple_name(isl.dim_type.in_)
        if not access.is_single_valued():
            continue
        subscripts = isl.PwMultiAff.from_map(access)
        rank = subscripts.dim(isl.dim_type.out)
        if rank == 0:
            continue
        for d in range(n):
            v = iterator[d].get(statement)
            if v is None:
                continue
            moves = [depends_on(subscripts.get_pw_aff(k), v) for k in range(rank)]
            if any(moves[:-1]):
                score[d] -= 1
            else:  # unit stride, or invariant along the loop (a register): both stream well
                score[d] += 1
    best = max(range(n), key=lambda d: (score[d], d))
    if best == n - 1 or score[best] <= score[n - 1]:
        return None
    return tuple(d for d in range(n) if d != best) + (best,)


def _permuted(band: isl.ScheduleNode, order: tuple[int, ...]) -> isl.ScheduleNode:
    """The band with its members in `order` (a permutable band only)."""
    schedule = band.band_get_partial_schedule()
    coincident = [band.band_member_get_coincident(d) for d in order]
    permuted = schedule
    for k, d in enumerate(order):
        permuted = permuted.set_union_pw_aff(k, schedule.get_union_pw_aff(d))
    node = band.delete().insert_partial_schedule(permuted).band_set_permutable(1)
    for k, flag in enumerate(coincident):
        node = node.band_member_set_coincident(k, flag)
    return node


def _members(band: isl.ScheduleNode) -> tuple[str, ...]:
    """Each band loop as a readable affine function of a statement's iterators."""
    return tuple(member_text(band, d) for d in range(band.band_n_member()))


def _is_skewed(band: isl.ScheduleNode) -> bool:
    """Whether some band loop is a combination of two or more iterators of a statement."""
    schedule = band.band_get_partial_schedule()
    return any(
        len(iterators_of(aff)) > 1
        for d in range(band.band_n_member())
        for piece in pw_affs_of(schedule.get_union_pw_aff(d))
        for aff in affs_of(piece)
    )

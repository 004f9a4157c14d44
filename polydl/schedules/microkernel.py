"""Recognise batch-reduce GEMMs in a statement and bind its innermost loops to one call.

Takes a `StatementModel` (and, for binding, the schedule's loop order and tiles); returns the
candidate bindings `C[m][n] += sum_batch A[m][k] * B[k][n]` (any access order, constant
strides) and, for a chosen binding, a `MicrokernelCall`: the element strides of A, B and C per
loop, the extents, and which loop stays outside. A binding is refused (ScheduleError) unless the
statement is a pure multiply-accumulate over a box of those loops whose only dependences inside
the call are the accumulation into C.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import permutations

import islpy as isl

from polydl.errors import ScheduleError
from polydl.ir import Access, Binary, Load
from polydl.poly.model import PolyModel, StatementModel
from polydl.schedules.pack_a import PackedA, plan_pack_a
from polydl.schedules.schedule import MicrokernelBinding, is_tile_loop, loop_var, tile_loop
from polydl.schedules.strides import LoopRange, distinct_blocks, element_stride


@dataclass(frozen=True)
class GemmOperands:
    """The three accesses of a multiply-accumulate statement."""

    c: Access
    a: Access  # the load that varies with m
    b: Access  # the load that varies with n


def multiply_accumulate(s: StatementModel) -> tuple[Access, Access, Access] | None:
    """(C, X, Y) if the statement is `C += X * Y` (or `C = C + X * Y`) with X, Y loads. A
    gather or scatter through an index array is no GEMM operand: its rows are not strided."""
    stmt = s.statement
    value = stmt.value
    if stmt.op != "+=" or stmt.is_indirect:
        return None
    if not (isinstance(value, Binary) and value.op == "*"):
        return None
    if not (isinstance(value.left, Load) and isinstance(value.right, Load)):
        return None
    return stmt.target, value.left.access, value.right.access


def bound_statement(model: PolyModel, mk: MicrokernelBinding) -> StatementModel:
    return next(st for st in model.statements if st.name == mk.statement)


def gemm_operands(model: PolyModel, mk: MicrokernelBinding) -> tuple[Access, Access, Access] | None:
    """(C, A, B) of the bound statement: A varies along the call's m, B does not."""
    mac = multiply_accumulate(bound_statement(model, mk))
    if mac is None:
        return None
    c, x, y = mac
    a = x if element_stride(model, x, mk.m) != 0 else y
    b = y if element_stride(model, y, mk.m) == 0 else x
    return c, a, b


def candidate_bindings(model: PolyModel, s: StatementModel, band_vars: tuple[str, ...]) -> list[MicrokernelBinding]:
    """Every assignment of band loops to (batch..., m, n, k) that forms a batch-reduce GEMM,
    best first: unit stride of C along n (the vector dimension), then larger extents."""
    mac = multiply_accumulate(s)
    if mac is None:
        return []
    c, x, y = mac
    extents = _box_extents(s)
    if extents is None:
        return []
    found = {
        (acc_name, v): element_stride(model, acc, v)
        for acc_name, acc in (("c", c), ("x", x), ("y", y))
        for v in band_vars
    }
    stride = {key: value for key, value in found.items() if value is not None}
    if len(stride) < len(found):
        return []
    out: list[tuple[tuple[int, ...], MicrokernelBinding]] = []
    reduction = [v for v in band_vars if stride[("c", v)] == 0]
    spatial = [v for v in band_vars if stride[("c", v)] != 0]
    for m, n in permutations(spatial, 2):
        for k in reduction:
            # Orientation: A varies with m and k, not n; B with k and n, not m.
            for a_name, b_name in (("x", "y"), ("y", "x")):
                if stride[(a_name, n)] != 0 or stride[(b_name, m)] != 0:
                    continue
                if stride[(a_name, m)] == 0 or stride[(b_name, n)] == 0:
                    continue
                if stride[(a_name, k)] == 0 or stride[(b_name, k)] == 0:
                    continue
                # Spatial loops other than m, n stay outside; the other reductions form the batch.
                batch = tuple(v for v in band_vars if v in reduction and v != k)
                binding = MicrokernelBinding(s.name, m=m, n=n, k=k, batch=batch)
                b_array = (x if b_name == "x" else y).array
                # a B strided along n can be copied into unit stride (see PackedB)
                b_unit = stride[(b_name, n)] == 1 or not _written(model, s, b_array)
                score = (
                    int(stride[("c", n)] == 1 and b_unit),
                    int(stride[("c", n)] == 1 and stride[(b_name, n)] == 1),
                    int(stride[(a_name, k)] == 1 or stride[(b_name, k)] == 1),
                    # k innermost of the reductions keeps their written order: an accumulation
                    # that is not permutable stays legal inside the call
                    int(k == reduction[-1]),
                    extents.get(n, 0),
                    extents.get(k, 0),
                    # rows of C close together: the call's output block stays in few pages
                    -abs(stride[("c", m)]),
                    extents.get(m, 0),
                )
                out.append((score, binding))
    out.sort(key=lambda item: item[0], reverse=True)
    seen: set[MicrokernelBinding] = set()
    unique = []
    for _, b in out:
        if b not in seen:
            seen.add(b)
            unique.append(b)
    return unique


def _written(model: PolyModel, s: StatementModel, array: str) -> bool:
    """Whether a statement of `s`'s loop nest writes `array`."""
    return any(
        acc.is_write and acc.access.array == array
        for st in model.statements
        if st.group == s.group
        for acc in st.accesses
    )


def _box_extents(s: StatementModel) -> dict[str, int] | None:
    """Constant extents of every loop if the domain is a box, else None."""
    dom = s.domain
    out: dict[str, int] = {}
    box = isl.Set.universe(dom.get_space())
    for d, var in enumerate(s.iterators):
        lo = dom.dim_min_val(d).to_python()
        hi = dom.dim_max_val(d).to_python()
        out[var] = hi - lo + 1
        box = box.intersect(dim_range(dom.get_space(), d, lo, hi))
    return out if box.is_equal(dom) else None


def dim_range(space: isl.Space, d: int, lo: int, hi: int) -> isl.Set:
    """The points of `space` whose dimension d lies in [lo, hi]."""
    s = isl.Set.universe(space)
    s = s.lower_bound_val(isl.dim_type.set, d, isl.Val.int_from_si(space.get_ctx(), lo))
    return s.upper_bound_val(isl.dim_type.set, d, isl.Val.int_from_si(space.get_ctx(), hi))


@dataclass(frozen=True)
class PackedB:
    """B copied into a local array blocked by the n tile:
    `name[outer...][n/block][batch...][k][block]`, zero beyond the n extent, where `outer` are
    the loops outside the call that B depends on (an im2col-like copy for a convolution).
    The copy of one (outer..., n block) slot runs just before the first call that reads it,
    inside the first `level` of the call's outer loops; at level 0 all of B is copied before
    the nest."""

    name: str
    block: int  # the n tile (the whole n extent if n is not tiled)
    blocks: int
    k_extent: int
    batch_extents: tuple[int, ...]
    level: int
    outer: tuple[LoopRange, ...] = ()  # loops outside the call that B depends on
    outer_strides: tuple[int, ...] = ()  # B's element stride along each of them
    # The k tile loop is among the first `level` loops: each copy fills only the rows of one
    # k tile, just before the calls that read them (the slot part stays in L2 until read).
    k_blocked: bool = False
    parallel_copy: bool = False  # no parallel loop encloses the copy: it runs on the threads
    # B is an input the caller keeps between calls (`Array.kept`): all of it is copied before
    # the nest (level 0) into a copy the library keeps, at the first call only
    kept: bool = False

    @property
    def k_stride(self) -> int:
        return self.block

    @property
    def batch_strides(self) -> tuple[int, ...]:
        strides, step = [], self.k_extent * self.block
        for extent in reversed(self.batch_extents):
            strides.append(step)
            step *= extent
        return tuple(reversed(strides))

    @property
    def block_elements(self) -> int:
        size = self.k_extent * self.block
        for extent in self.batch_extents:
            size *= extent
        return size

    @property
    def slot_strides(self) -> tuple[int, ...]:
        """Elements between consecutive values of each `outer` loop in the copy."""
        strides, step = [], self.blocks * self.block_elements
        for r in reversed(self.outer):
            strides.append(step)
            step *= r.extent
        return tuple(reversed(strides))

    @property
    def elements(self) -> int:
        size = self.blocks * self.block_elements
        for r in self.outer:
            size *= r.extent
        return size


@dataclass(frozen=True)
class MicrokernelCall:
    """Everything codegen needs to emit the call in place of the bound loops."""

    binding: MicrokernelBinding
    statement: StatementModel
    c: Access
    a: Access
    b: Access
    outer: tuple[str, ...]  # loop names (schedule order) that stay as loops around the call
    ranges: dict[str, LoopRange]  # for m, n, k and batch loops
    strides: dict[tuple[str, str], int]  # (operand "a"|"b"|"c", var) -> element stride
    pack: PackedB | None = None
    pack_a: PackedA | None = None

    @property
    def pack_statement(self) -> str:
        return f"_pd_pack_{self.statement.name}"

    @property
    def pack_a_statement(self) -> str:
        return f"_pd_pack_a_{self.statement.name}"

    def extent_variants(self, var: str) -> tuple[int, ...]:
        """Full tile, and the remainder tile if the extent is not a multiple of the tile."""
        r = self.ranges[var]
        if r.tile is None or r.tile >= r.extent:
            return (r.extent,)
        rem = r.extent % r.tile
        return (r.tile,) if rem == 0 else (r.tile, rem)


def bind_microkernel(
    model: PolyModel,
    s: StatementModel,
    binding: MicrokernelBinding,
    order: tuple[str, ...],
    tiles: dict[str, int],
    parallel_dims: tuple[int, ...] = (),
) -> MicrokernelCall:
    """`parallel_dims`: positions in `order` of the loops run in parallel; a packed B is
    copied outside all of them (whole, before the nest) if one sits outside n's tile loop."""
    mac = multiply_accumulate(s)
    if mac is None:
        raise ScheduleError(f"statement {s.name} is not a multiply-accumulate `C += A * B`")
    c, x, y = mac
    loops = binding.loops
    if len(set(loops)) != len(loops) or not set(loops) <= set(s.iterators):
        raise ScheduleError(f"microkernel loops {loops} must be distinct loops of {s.name}")
    extents = _box_extents(s)
    if extents is None:
        raise ScheduleError(
            f"the domain of {s.name} is not a box; a microkernel needs constant loop extents"
        )
    # The bound loops must be the innermost loops of the order, untiled except m, n, blocks.
    inner = [name for name in order if loop_var(name) in loops and not is_tile_loop(name)]
    if tuple(order[len(order) - len(loops):]) != tuple(inner) or len(inner) != len(loops):
        raise ScheduleError(
            f"the microkernel loops {loops} must be the innermost loops of the order {order}"
        )
    for var in binding.batch:
        # a tiled batch loop: each call reduces one tile of it (its tile loop outside, such
        # as a convolution's input-channel blocks outside the output rows); whole tiles only
        if var in tiles and (binding.pack_b or binding.pack_a or extents[var] % tiles[var]):
            raise ScheduleError(
                f"batch loop '{var}' of the microkernel is tiled by {tiles[var]}: a tile must "
                f"divide its extent {extents[var]}, and a call over tiles of it packs no operand")
    # Inside one call, only the accumulation into C may depend on another instance.
    if not only_accumulation(s, loops):
        raise ScheduleError(
            f"statement {s.name} has dependences inside the microkernel loops {loops}"
        )

    strides: dict[tuple[str, str], int] = {}
    for var in loops:
        for name, acc in (("c", c), ("x", x), ("y", y)):
            value = element_stride(model, acc, var)
            if value is None:
                raise ScheduleError(f"the stride of {acc.array} along '{var}' is not constant")
            strides[(name, var)] = value
    a_name, b_name = "x", "y"
    if strides[("x", binding.n)] != 0 or strides[("y", binding.m)] != 0:
        a_name, b_name = "y", "x"
    if strides[(a_name, binding.n)] != 0 or strides[(b_name, binding.m)] != 0:
        raise ScheduleError(
            f"binding m={binding.m}, n={binding.n} does not split the operands into A(m,k), B(k,n)"
        )
    if any(strides[("c", v)] != 0 for v in (binding.k, *binding.batch)):
        raise ScheduleError("C must not vary with the reduction loops k and batch")
    if binding.blocks is not None:
        blocks = binding.blocks
        if strides[(a_name, blocks)] != 0 or strides[("c", blocks)] == 0 or strides[(b_name, blocks)] == 0:
            raise ScheduleError(
                f"the microkernel's blocks loop '{blocks}' must move C and B and not A")
        full = {v: tiles.get(v, extents[v]) for v in (binding.m, binding.n, blocks)}
        if not distinct_blocks(full[binding.m], strides[("c", binding.m)], full[binding.n],
                               strides[("c", binding.n)], full[blocks], strides[("c", blocks)]):
            raise ScheduleError(
                f"the microkernel's blocks along '{blocks}' would sum into the same cells of C")
        if binding.pack_a or binding.pack_b:
            raise ScheduleError(f"a microkernel over blocks of '{blocks}' packs neither A nor B")
    renamed = {("a" if n == a_name else "b" if n == b_name else "c", v): st for (n, v), st in strides.items()}
    ranges = {}
    for var in loops:
        d = s.iterators.index(var)
        lo = s.domain.dim_min_val(d).to_python()
        ranges[var] = LoopRange(var, lo, extents[var], tiles.get(var))
    outer = tuple(name for name in order if name not in inner)
    b_access = y if b_name == "y" else x
    pack = None
    if binding.pack_b:
        pack = _pack_b(model, s, binding, b_access, ranges, outer, parallel_dims)
    a_access = x if a_name == "x" else y
    pack_a = None
    if binding.pack_a:
        pack_a = plan_pack_a(model, s, binding, a_access, ranges, outer, parallel_dims,
                             _written(model, s, a_access.array))
    return MicrokernelCall(
        binding=binding,
        statement=s,
        c=c,
        a=a_access,
        b=y if b_name == "y" else x,
        outer=outer,
        ranges=ranges,
        strides=renamed,
        pack=pack,
        pack_a=pack_a,
    )


def _pack_b(
    model: PolyModel,
    s: StatementModel,
    binding: MicrokernelBinding,
    b: Access,
    ranges: dict[str, LoopRange],
    outer: tuple[str, ...],
    parallel_dims: tuple[int, ...],
) -> PackedB:
    """The packed copy of B, if copying is legal: no statement of the nest writes B (a
    statement of an earlier nest, such as a zero-padding copy, has finished before)."""
    if _written(model, s, b.array):
        raise ScheduleError(f"cannot pack {b.array}: the nest writes it")
    for var in (binding.n, binding.k):
        if ranges[var].lower != 0:
            raise ScheduleError(f"cannot pack {b.array}: loop '{var}' does not start at 0")
    deps, dep_strides = [], []
    for var in s.iterators:
        stride = element_stride(model, b, var)
        if var not in binding.loops and stride != 0:
            if stride is None or var not in outer:
                raise ScheduleError(f"cannot pack {b.array}: its stride along '{var}' is not constant")
            d = s.iterators.index(var)
            lo = s.domain.dim_min_val(d).to_python()
            hi = s.domain.dim_max_val(d).to_python()
            deps.append(LoopRange(var, lo, hi - lo + 1, None))
            dep_strides.append(stride)
    order = sorted(range(len(deps)), key=lambda i: outer.index(deps[i].var))
    deps = [deps[i] for i in order]
    dep_strides = [dep_strides[i] for i in order]
    n = ranges[binding.n]
    # One block of all of n is padded to whole cache lines, so every row of it is aligned.
    block = n.tile if n.tile is not None and n.tile < n.extent else -(-n.extent // 16) * 16
    slot_loops = [r.var for r in deps] + [tile_loop(binding.n)] * (tile_loop(binding.n) in outer)
    level = max((outer.index(name) + 1 for name in slot_loops), default=0)
    k_blocked = False
    k_tile = tile_loop(binding.k)
    if k_tile in outer:
        # Copy per k tile where that repeats no copy: every loop outside it picks the slot.
        # With a loop that would repeat it between k's and n's tile loops (BLIS's m blocks),
        # copy the k tile of every n block right inside k's tile loop instead.
        with_k = max(level, outer.index(k_tile) + 1)
        dep_vars = {r.var for r in deps}
        if all(outer[d] in slot_loops or outer[d] == k_tile for d in range(with_k)):
            level, k_blocked = with_k, True
        elif all(outer[d] in dep_vars or outer[d] == k_tile
                 for d in range(outer.index(k_tile) + 1)):
            level, k_blocked = outer.index(k_tile) + 1, True
    # Loops outside the copy that do not choose its slot repeat it; run in parallel, two
    # threads would write one slot at once: then copy all of B before the nest.
    if any(d < level and outer[d] not in slot_loops and loop_var(outer[d]) not in
           [r.var for r in deps] and not (k_blocked and outer[d] == k_tile)
           for d in parallel_dims):
        level, k_blocked = 0, False
    kept = b.array in model.nest.kept
    if kept:  # copied once for many calls: where it runs in a call does not matter
        level, k_blocked = 0, False
    # outside every parallel loop, the copy's own loop over slots runs on the threads
    parallel_copy = not any(d < level for d in parallel_dims)
    return PackedB(
        name=f"_pd_packed_{b.array}",
        block=block,
        blocks=-(-n.extent // block),
        k_extent=ranges[binding.k].extent,
        batch_extents=tuple(ranges[v].extent for v in binding.batch),
        level=level,
        outer=tuple(deps),
        outer_strides=tuple(dep_strides),
        k_blocked=k_blocked,
        parallel_copy=parallel_copy,
        kept=kept,
    )


def only_accumulation(s: StatementModel, loops: tuple[str, ...]) -> bool:
    """True if instances that differ only in `loops` conflict only by accumulating into C."""
    fixed = [d for d, v in enumerate(s.iterators) if v not in loops]
    space = isl.Space.map_from_set(s.domain.get_space())
    distinct = isl.Map.identity(space).complement()
    for d in fixed:
        distinct = distinct.equate(isl.dim_type.in_, d, isl.dim_type.out, d)
    distinct = distinct.intersect_domain(s.domain).intersect_range(s.domain)
    write = s.write.relation
    target = s.statement.target
    for acc in s.accesses[1:]:
        if acc.access.array == target.array and acc.access is not target:
            if not write.apply_range(acc.relation.reverse()).intersect(distinct).is_empty():
                return False
    return True

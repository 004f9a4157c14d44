"""Statements fused into a GPU GEMM kernel: the C cell's initial value and its epilogue.

Takes the model and the GPU kernel plans (one per statement, in launch order); returns the
plans with each GEMM's `epilogue` filled in and the fused statements' own launches gone. The
statement just before a GEMM that sets exactly the GEMM's cells from values the nest does not
write (`C = 0`, `C = bias[k]`) becomes the accumulators' starting value, so C is stored, not
read back; the element-wise updates right after it (bias, ReLU, a residual add, scale and
shift) are applied to the accumulators before the store (as the CPU post-ops are). One launch
then does conv + bias + ReLU.

Legality is that of the CPU post-ops (`schedules.postops.elementwise_step`): a fused statement
writes exactly the GEMM's cells, each once, and reads no array the nest writes except its own
cell of C; statements launch in source order, so nothing runs between the GEMM and the
statements next to it. A GEMM whose K reduction is split over blocks (partial sums meeting in
C through atomics) has no single place where a cell is final, and keeps its neighbours.
"""

from __future__ import annotations

from dataclasses import replace

import islpy as isl

from polydl.poly.model import PolyModel, StatementModel
from polydl.schedules.gpu.plans import EpilogueOperand, GemmEpilogue, GpuKernelPlan
from polydl.schedules.microkernel import multiply_accumulate
from polydl.schedules.postops import (
    PostExpr,
    coefficient,
    elementwise_step,
    flat_offset,
    reads_acc,
    write_relation,
)


def _operand(model: PolyModel, producer: StatementModel, array: str,
             relation: isl.Map) -> EpilogueOperand | None:
    """The operand's offset as a base and per-loop strides of the GEMM statement's loops."""
    aff = flat_offset(model, array, relation)
    if aff is None:
        return None
    base = int(aff.get_constant_val().to_python())
    strides = []
    for d, var in enumerate(producer.iterators):
        c = coefficient(aff, d)
        base += c * producer.domain.dim_min_val(d).to_python()
        if c:
            strides.append((var, c))
    return EpilogueOperand(array, base, tuple(strides))


def fuse_neighbours(model: PolyModel, statements: list[StatementModel], gemm_index: int,
                    reduction_loops: set[str]) -> tuple[GemmEpilogue | None, set[str]]:
    """The epilogue of the GEMM statement `statements[gemm_index]` and the names of the
    statements it absorbs (the one before it and a run of those after it)."""
    producer = statements[gemm_index]
    mac = multiply_accumulate(producer)
    assert mac is not None
    c_array = mac[0].array
    if c_array in (mac[1].array, mac[2].array):
        return None, set()  # C is also an operand of the product
    written = {acc.access.array for s in model.statements for acc in s.accesses if acc.is_write}
    cell_of = write_relation(producer, c_array)
    relations: list[tuple[str, isl.Map]] = []
    initial: PostExpr | None = None
    initializer = None
    if gemm_index > 0:
        before = statements[gemm_index - 1]
        mark = len(relations)
        found = (elementwise_step(model, before, producer, cell_of, c_array, written, relations)
                 if before.statement.op == "=" else "not an assignment")
        if not isinstance(found, str) and not reads_acc(found):
            initial, initializer = found, before.name
        else:
            del relations[mark:]
    steps: list[PostExpr] = []
    fused: list[str] = []
    for after in statements[gemm_index + 1:]:
        mark = len(relations)
        found = elementwise_step(model, after, producer, cell_of, c_array, written, relations)
        if isinstance(found, str):
            del relations[mark:]
            break
        steps.append(found)
        fused.append(after.name)
    operands = []
    for array, relation in relations:
        operand = _operand(model, producer, array, relation)
        if operand is None or any(operand.stride(v) for v in reduction_loops):
            return None, set()
        operands.append(operand)
    if initial is None and not steps:
        return None, set()
    epilogue = GemmEpilogue(initial, tuple(steps), tuple(operands), initializer, tuple(fused))
    return epilogue, set(fused) | ({initializer} if initializer else set())


def with_epilogues(model: PolyModel, kernels: list[GpuKernelPlan]) -> list[GpuKernelPlan]:
    """`kernels` (GpuKernelPlans in statement order) with neighbours fused into the GEMMs
    whose every output cell is final in one block."""
    statements = [k.statement for k in kernels]
    absorbed: set[str] = set()
    out = list(kernels)
    for i, plan in enumerate(kernels):
        g = plan.gemm
        if g is None or g.tiling.splits > 1 or plan.name in absorbed:
            continue
        epilogue, names = fuse_neighbours(model, statements, i, {d.var for d in g.k})
        if epilogue is None or names & absorbed:
            continue
        out[i] = replace(plan, gemm=replace(g, epilogue=epilogue))
        absorbed |= names
    return [k for k in out if k.name not in absorbed]

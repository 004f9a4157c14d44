"""Decisions are records: a compilation keeps what chose its schedule, and `explain` prints it."""

from __future__ import annotations

from polydl.api import lower
from polydl.codegen.artifact import code_from_dict, code_to_dict
from polydl.driver.explain import explain
from polydl.frontends import builders, layers
from polydl.schedules.schedule import Schedule


def test_the_automatic_schedule_keeps_its_ranking_and_fusion_decisions() -> None:
    nest, params = builders.conv2d(N=1, C=16, K=16, H=6, W=6, R=3, S=3, padding=1,
                                   fuse=("bias", "relu"))
    c = lower(nest, params, machine="x86-64-v3")
    assert c.decision.source == "auto" and "x86-64-v3" in c.decision.reason
    assert c.decision.ranking and c.decision.ranking[0].schedule.tiles == c.schedule.tiles
    assert c.decision.fusion  # each consumer nest: fused or not, and why
    text = explain(c, ranking=1)
    assert "decided by auto" in text and "#1 cost" in text and "target: x86-64-v3" in text
    if c.code.placements:
        placement = c.code.placements[0]
        assert placement.epilogues == ("S2", "S3")
        assert placement.describe() in text


def test_placements_survive_the_stored_lowering() -> None:
    nest, params = layers.linear(N=8, C=16, K=32, fuse=("bias", "relu"))
    code = lower(nest, params).code
    assert code_from_dict(code_to_dict(code)) == code


def test_a_given_schedule_says_so() -> None:
    nest, params = builders.matmul(16, 16, 16)
    c = lower(nest, params, schedule=Schedule(order=("i", "j", "k")))
    assert c.decision.source == "given" and not c.decision.ranking
    assert "decided by given" in explain(c)

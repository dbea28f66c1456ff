"""Tier 1: LR scaling and warmup as pure functions of the world size and step."""
import math

import pytest

from hvdtrain.train.lr_schedule import lr_at, scaled_lr


@pytest.mark.parametrize("policy, size, expected", [
    ("none", 4, 0.1), ("linear", 4, 0.4), ("sqrt", 4, 0.2), ("linear", 1, 0.1), ("sqrt", 2, 0.1 * math.sqrt(2))])
def test_scaled_lr(policy, size, expected):
    assert scaled_lr(0.1, size, policy) == pytest.approx(expected)


def test_warmup_ramps_linearly_from_base_to_target_then_holds():
    lrs = [lr_at(step, 0.1, 0.4, warmup_steps=3) for step in range(6)]
    assert lrs == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.4, 0.4])
    assert lr_at(0, 0.1, 0.4, warmup_steps=0) == 0.4


def test_cosine_decay_after_warmup_ends_at_zero():
    lrs = [lr_at(step, 0.1, 0.4, warmup_steps=2, total_steps=6, decay="cosine") for step in range(7)]
    assert lrs[:3] == pytest.approx([0.1, 0.25, 0.4])
    assert lrs[4] == pytest.approx(0.2) and lrs[6] == pytest.approx(0.0)


def test_step_decay_divides_by_ten_at_half_and_three_quarters():
    lrs = [lr_at(step, 1.0, 1.0, warmup_steps=0, total_steps=8, decay="step") for step in range(8)]
    assert lrs == pytest.approx([1, 1, 1, 1, 0.1, 0.1, 0.01, 0.01])

"""What to train with: the learning-rate rules the recommendation scales a rate by
(catsdogs.recommendation). The choice of the size itself is tests/shared/test_goodput.py's and, end to
end, tests/measure/test_find_batch_size.py's."""

from __future__ import annotations

import pytest

from catsdogs import lr_rules, optimizers, recommendation, schema
from catsdogs.recommendation import linear_scaled_lr


@pytest.mark.parametrize("optimizer, b_noise, rule, expected", [
    ("sgd", 100.0, "paper", 0.01 * (1 + 100 / 32) / (1 + 100 / 128)),
    ("sgd", None, "linear", 0.01 * 4),
    ("adam", 100.0, "sqrt", 0.001 * 2),
    ("adam", None, "sqrt", 0.001 * 2),
    ("adamw", 100.0, "sqrt", 0.001 * 2),
])
def test_the_learning_rate_follows_the_optimizers_rule(optimizer, b_noise, rule, expected):
    base = {"sgd": 0.01, "adam": 0.001, "adamw": 0.001}[optimizer]
    lr, name = recommendation.learning_rate(optimizer, 128, base, 32, b_noise)
    assert name == rule and lr == pytest.approx(expected) and rule in lr_rules.RULES


@pytest.mark.parametrize("low, batch, rule, expected", [
    (0.0, 256, "paper-low", 0.1),  # the interval [0, unbounded): no rise at all above the anchor
    (20.0, 256, "paper-low", 0.1 * (1 + 20 / 32) / (1 + 20 / 256)),
    (20.0, 16, "linear", 0.1 * 16 / 32),  # below the anchor the linear rule is the lesser rate
])
def test_sgds_rate_where_the_noise_scales_interval_is_open_is_the_least_the_interval_allows(low, batch, rule, expected):
    # given SGD anchored at 0.1 at batch 32, and B_noise's interval open above from `low`
    lr, name = recommendation.learning_rate("sgd", batch, 0.1, 32, None, open_low=low)
    # then the rate is the paper's rule at the low end above the anchor (0.8 at 256 by the linear rule before)
    assert name == rule and lr == pytest.approx(expected) and rule in lr_rules.RULES


def test_every_optimizer_names_a_rule_of_the_table_and_keras_has_its_class():
    keras = pytest.importorskip("keras")
    # given the optimizers' table
    for name, opt in optimizers.OPTIMIZERS.items():
        # then its rule is one the recommendation can apply, its class is Keras's, and its Keras
        # default rate is the one the table says (a trial with no --lr trains with it)
        assert opt.rule in lr_rules.RULES and opt.note and opt.label
        made = getattr(keras.optimizers, opt.keras_class)()
        assert float(made.learning_rate) == pytest.approx(opt.default_lr), name
    # and the schema's allowed values are the table's, a sweep's default the article's two
    assert schema.OPTIMIZERS == tuple(optimizers.OPTIMIZERS) and "adamw" in schema.OPTIMIZERS
    assert schema.ARTICLE_OPTIMIZERS == ("sgd", "adam")


@pytest.mark.parametrize("scaling, expected", [("none", 0.001), ("linear", 0.001 * 8 / 32),
                                               ("sqrt", 0.001 * (8 / 32) ** 0.5)])
def test_a_trials_scaling_and_the_recommendation_read_one_table_of_rules(scaling, expected):
    # given a trial of batch 4 accumulating 2 (an effective 8) scaled from 32
    cfg = schema.TrialConfig("adam", 4, "standard", 0, lr_scaling=scaling, accumulate=2)
    # then its rate is the rule's, and the rules a trial may name are those that need no noise scale
    assert schema.learning_rate(cfg) == pytest.approx(expected)
    assert lr_rules.RULES[scaling].rate(0.001, 32, 8, None) == schema.learning_rate(cfg)
    assert schema.LR_SCALINGS == ("none", "linear", "sqrt") and not lr_rules.RULES["paper"].trial
    assert not lr_rules.RULES["paper-low"].trial



def test_linear_scaling_rule_from_keras_defaults_at_32():
    assert linear_scaled_lr("adam", 32) == pytest.approx(0.001)
    assert linear_scaled_lr("adam", 64) == pytest.approx(0.002)
    assert linear_scaled_lr("sgd", 8) == pytest.approx(0.0025)
    assert linear_scaled_lr("sgd", 256) == pytest.approx(0.08)


def test_the_fastest_is_none_of_the_sizes_above_the_answer():
    from catsdogs.messages import ProbeRecord

    # given a search bounded by 5 training images, and a user's model's memory probe at 136 (above
    # the data: its batches repeat the images), the fastest per image
    probes = [ProbeRecord(batch_size=1, status="done", images_per_second=80.0),
              ProbeRecord(batch_size=136, status="done", images_per_second=760.0),
              ProbeRecord(batch_size=5, status="done", images_per_second=280.0)]
    # then the fastest that fits is the fastest up to the answer, 5, a size these data can train
    assert recommendation.fastest(probes, 5) == {"batch_size": 5, "images_per_second": 280.0}
    assert recommendation.fastest(probes)["batch_size"] == 136  # (unbounded: every size that passed)


@pytest.mark.parametrize("effective, safe, plan", [
    (128, 128, (128, 1)),  # fits: one batch a step
    (512, 128, (128, 4)),  # four micro-batches of the margin's size
    (300, 128, (100, 3)),  # the fewest micro-batches that fit and divide it: 3 x 100, not 3 x 128
    (256, 96, (64, 4)),  # 3 does not divide 256: the next that does
    (131, 64, (1, 131)),  # a prime above what fits: micro-batches of 1, said as such
])
def test_an_effective_batch_is_kept_exactly_by_micro_batches_that_fit(effective, safe, plan):
    # when a user keeps an effective batch and the margin's size is `safe`
    got = recommendation.hand_off(24, safe + 8, safe, effective)
    # then micro-batch x steps is the effective batch, the micro-batch fits, and the fewest steps do it
    a = got["accumulation"]
    assert (a["micro_batch_size"], a["steps"]) == plan
    assert a["micro_batch_size"] * a["steps"] == a["effective_batch_size"] == effective
    assert a["micro_batch_size"] <= safe
    # and training's own batch and the evaluation's are the answer's
    assert (got["batch_size"], got["eval_batch_size"]) == (24, safe + 8)


def test_no_effective_batch_no_accumulation_plan():
    assert recommendation.hand_off(24, 64, 56) == {"batch_size": 24, "eval_batch_size": 64, "accumulation": None}

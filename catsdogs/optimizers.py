"""The optimizers catsdogs trains with: one row each, everything the package knows of one (its
Keras name, label, default rate, state, learning-rate rule and the note find-batch-size prints of
its default rate). A new optimizer is one row here; every other module reads this table."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Optimizer:
    name: str  # Keras's name: what `optimizer="adam"` gives, and --opt's value
    label: str  # as figures and tables name it
    keras_class: str  # its class in keras.optimizers, built with the trial's rate and Keras's other defaults
    default_lr: float  # Keras's default rate: a trial's rate when none is given
    slots: int  # float32 state tensors of the weights' shape (the memory model counts them)
    rule: str  # the learning-rate rule find-batch-size scales it by (catsdogs.lr_rules.RULES)
    note: str  # said where find-batch-size anchors its rate at Keras's default
    article: bool = False  # the article trained it: a sweep's default optimizers are the article's


_ANCHOR = "--from-store STORE anchors it at a sweep's tuned rates."
# Why an anchor at Keras's default is said, never silent (docs/results.md, "The learning rate tuned
# per batch size", and the critical plan's chosen rates): on the article's model the tuned plans
# chose SGD rates 5 to 10 times Keras's 0.01, and Adam 0.01.
OPTIMIZERS = {o.name: o for o in (
    Optimizer("sgd", "SGD", "SGD", 0.01, 0, "paper",
              "Keras's default is not a tuned rate: on the article's model catsdogs's tuned plans chose SGD rates "
              "5 to 10 times it (0.05 to 0.1 at batch 16 to 32), so this one is likely too small; " + _ANCHOR,
              article=True),
    Optimizer("adam", "Adam", "Adam", 0.001, 2, "sqrt",
              "Keras's default is not a tuned rate: on the article's model catsdogs's tuned plan chose Adam 0.01, "
              "ten times it, at batch 16 to 128; " + _ANCHOR, article=True),
    Optimizer("adamw", "AdamW", "AdamW", 0.001, 2, "sqrt",
              "Keras's default is not a tuned rate, and catsdogs has not tuned AdamW on the article's model; "
              + _ANCHOR),
)}


ARTICLE = tuple(name for name, o in OPTIMIZERS.items() if o.article)  # sgd, adam: a sweep's default


def label(name: str) -> str:
    """The optimizer's label, or its name where it is none of the table's (an old store's)."""
    return OPTIMIZERS[name].label if name in OPTIMIZERS else name

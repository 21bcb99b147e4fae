"""The input pipeline: which images each batch holds, epoch after epoch, and that it serves them."""

from __future__ import annotations

import numpy as np
import pytest

from catsdogs.data.loading import Split, batch_schedule, epoch_order
from catsdogs.runtime.backends.tensorflow import train_batches


def test_given_the_articles_protocol_when_scheduling_then_each_epoch_is_a_fresh_permutation_cut_into_full_batches():
    # given 50 images, batches of 8, 3 epochs: 50 // 8 = 6 batches per epoch, 2 images dropped each
    n, bs, seed = 50, 8, 4

    # when
    schedule = batch_schedule(n, bs, seed, n_batches=18)

    # then: 18 batches; each epoch's 48 indices are distinct, and are its permutation's first 48
    assert schedule.shape == (18, 8)
    epochs = schedule.reshape(3, 48)
    for e, indices in enumerate(epochs):
        assert len(set(indices.tolist())) == 48
        assert indices.tolist() == epoch_order(n, seed, e)[:48].tolist()
    # the epochs are shuffled differently from each other
    assert epochs[0].tolist() != epochs[1].tolist() != epochs[2].tolist()


def test_given_a_seed_when_scheduling_twice_then_the_same_batches_and_another_seed_gives_others():
    # when
    a, b = batch_schedule(40, 4, 1, n_batches=30), batch_schedule(40, 4, 1, n_batches=30)
    c = batch_schedule(40, 4, 2, n_batches=30)

    # then
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    # and fewer batches are a prefix of more: where fit stops does not change what came before
    assert np.array_equal(batch_schedule(40, 4, 1, n_batches=7), a[:7])


def test_given_the_step_budget_when_scheduling_across_epochs_then_batches_span_epoch_boundaries():
    # given 10 images in batches of 4, 6 batches: 24 indices from 3 permutations of the 10
    n, bs, seed = 10, 4, 0

    # when
    schedule = batch_schedule(n, bs, seed, n_batches=6, cross_epochs=True)

    # then: the permutations joined end to end, nothing dropped at the epoch boundaries
    joined = np.concatenate([epoch_order(n, seed, e) for e in range(3)])
    assert schedule.ravel().tolist() == joined[:24].tolist()
    assert sorted(schedule.ravel()[:10].tolist()) == list(range(10))  # epoch 0 whole, in batches 0-2
    assert schedule[2].tolist() == [*epoch_order(n, seed, 0)[8:], *epoch_order(n, seed, 1)[:2]]


def test_given_a_split_when_reading_the_training_batches_then_each_holds_its_scheduled_images_and_labels():
    pytest.importorskip("tensorflow")
    # given: 20 tiny images whose first pixel names them
    images = np.zeros((20, 4, 4, 3), dtype=np.uint8)
    images[:, 0, 0, 0] = np.arange(20)
    split = Split(images, (np.arange(20) % 2).astype(np.float32), [f"{i}.jpg" for i in range(20)])

    # when: two epochs of 20 // 6 = 3 batches
    batches = [(np.asarray(x), np.asarray(y)) for x, y in train_batches(split, 6, seed=7, n_batches=6)]

    # then: exactly the scheduled batches, pixels and labels from the same images, as uint8
    schedule = batch_schedule(20, 6, 7, n_batches=6)
    assert len(batches) == 6
    for (x, y), idx in zip(batches, schedule, strict=True):
        assert x.dtype == np.uint8 and x.shape == (6, 4, 4, 3)
        assert x[:, 0, 0, 0].tolist() == idx.tolist()
        assert y.tolist() == (idx % 2).astype(np.float32).tolist()


def test_given_a_batch_larger_than_the_split_when_scheduling_then_across_epochs_it_repeats_images_and_per_epoch_it_refuses():
    # given 10 images and batches of 25 (a memory probe's batch can exceed the split)
    # when the epochs are joined: every batch holds every image
    schedule = batch_schedule(10, 25, 0, n_batches=2, cross_epochs=True)
    assert schedule.shape == (2, 25)
    assert all(set(row.tolist()) == set(range(10)) for row in schedule)
    # when each epoch must hold whole batches: a clear error, not a division by zero
    with pytest.raises(ValueError, match="larger than the 10 images"):
        batch_schedule(10, 25, 0, n_batches=2)


def test_given_a_split_when_jax_serves_the_batches_then_they_are_the_tensorflow_pipelines():
    pytest.importorskip("tensorflow")
    pytest.importorskip("jax")
    from catsdogs.runtime.backends import jax as jax_backend

    # given: 20 tiny images whose first pixel names them, and the TensorFlow pipeline's batches
    images = np.zeros((20, 4, 4, 3), dtype=np.uint8)
    images[:, 0, 0, 0] = np.arange(20)
    split = Split(images, (np.arange(20) % 2).astype(np.float32), [f"{i}.jpg" for i in range(20)])
    expected = [(np.asarray(x), np.asarray(y)) for x, y in train_batches(split, 6, seed=7, n_batches=6)]

    # when: JAX's pipeline gathers them on the device, one jitted op a batch
    served = jax_backend.train_batches(split, 6, seed=7, n_batches=6)
    batches = [tuple(np.asarray(a) for a in served[i]) for i in range(len(served))]

    # then: the same images and labels, batch for batch, as uint8
    assert len(batches) == len(expected) == 6
    for (x, y), (ex, ey) in zip(batches, expected, strict=True):
        assert x.dtype == np.uint8 and np.array_equal(x, ex) and np.array_equal(y, ey)
    # and the evaluation batches are every image once, in order, the last one partial
    evaluated = jax_backend.eval_batches(split, 8)
    assert [len(np.asarray(evaluated[i][0])) for i in range(len(evaluated))] == [8, 8, 4]
    assert np.concatenate([np.asarray(evaluated[i][0]) for i in range(3)])[:, 0, 0, 0].tolist() == list(range(20))

"""Loader passes paired across ranks by their role and order, not their raw numbers."""

from __future__ import annotations

from builders import ddp_wrap, loader_pass, make_evidence, merge, on_all

from ddpdoctor.analysis.facts import loaders
from ddpdoctor.analysis.passes import pair


def test_a_peek_on_one_rank_does_not_shift_the_pairing():
    # rank 0: peek (0), peek (1), training (2); rank 1: peek (0), training (1)
    numbers = pair([(0, "L", 0, "partial", 0), (0, "L", 1, "partial", 0), (0, "L", 2, "train", 0),
                    (1, "L", 0, "partial", 0), (1, "L", 1, "train", 0)])
    assert numbers[(0, "L", 2)] == numbers[(1, "L", 1)]
    assert numbers[(0, "L", 0)] == numbers[(1, "L", 0)]
    assert numbers[(0, "L", 1)] not in (numbers[(1, "L", 0)], numbers[(1, "L", 1)])


def test_loaders_are_paired_separately_and_numbered_in_order():
    numbers = pair([(0, "A", 0, "train", None), (0, "A", 1, "train", None), (0, "B", 0, "eval", None),
                    (1, "A", 0, "train", None), (1, "A", 1, "train", None), (1, "B", 0, "eval", None)])
    assert [numbers[(0, "A", n)] for n in (0, 1)] == [0, 1] == [numbers[(1, "A", n)] for n in (0, 1)]
    assert numbers[(0, "B", 0)] == numbers[(1, "B", 0)] == 0


def test_facts_pair_training_passes_after_a_rank_only_peek():
    peek = loader_pass([0], num_batches=1, steps=0, ddp_forwards=0, complete=False)
    evidence = make_evidence(2, merge(on_all(2, ddp_wrap()), {
        0: [peek, loader_pass(list(range(0, 8, 2)), number=1)],
        1: [loader_pass(list(range(1, 8, 2)), number=0)],
    }))
    training = [per_rank for per_rank in loaders.passes(evidence).values() if len(per_rank) == 2]
    (per_rank,) = training
    assert per_rank[0].number == 1 and per_rank[1].number == 0


def test_a_rank_only_peek_pairs_with_nothing_of_another_epoch():
    # rank 0 peeks twice per epoch, rank 1 once
    numbers = pair([(0, "L", 0, "partial", 0), (0, "L", 1, "partial", 0), (0, "L", 2, "train", 0),
                    (0, "L", 3, "partial", 1), (0, "L", 4, "partial", 1), (0, "L", 5, "train", 1),
                    (1, "L", 0, "partial", 0), (1, "L", 1, "train", 0), (1, "L", 2, "partial", 1),
                    (1, "L", 3, "train", 1)])
    assert numbers[(1, "L", 2)] == numbers[(0, "L", 3)]
    assert numbers[(0, "L", 1)] not in {numbers[(1, "L", n)] for n in range(4)}
    assert numbers[(0, "L", 5)] == numbers[(1, "L", 3)]

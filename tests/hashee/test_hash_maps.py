"""HashEE's token -> layer maps (`elasticbert.hash_maps`) on cases small enough to work out by hand, following the
official utils.py's rules: buckets of len(ids) // num_buckets ids stepping (max_layer - 1) // num_buckets layers,
ties by first occurrence, the overshoot of the last step, special and unseen ids at the top. Their equality with
the official functions on real data is checked from outside (docs/hashee.md)."""

import math

import numpy as np
import pytest
import torch

from elasticbert.hash_maps import (
    DRAWN,
    Buckets,
    cluster_map,
    frequency_map,
    map_digest,
    mi_map,
    mutual_information,
    occurrence_depths,
    official_inconsistent_depths,
    random_consistent_map,
    random_inconsistent_map,
)

SPECIAL = [0, 1]  # [PAD], [CLS] stand-ins


def test_buckets_follow_the_official_steps():
    assert Buckets(6, 6).depths == [1, 2, 3, 4, 5, 6]  # run_token.sh: max_layer 7, 6 buckets
    assert Buckets(12, 6).depths == [1, 3, 5, 7, 9, 11]  # train_token.py's defaults: max_layer 13, 6 buckets
    assert Buckets(12, 6).last_step == 6  # its loop can step once more: bucket id 14 > max_layer 13
    assert Buckets(6, 4).depths == [1, 2, 3, 4] and Buckets(6, 4).last_step == 5
    with pytest.raises(ValueError, match="within 1..4"):
        Buckets(4, 6)  # the official step would be 0: every token at layer 1


def test_frequency_by_hand():
    """Counts (special ids left out): 5 x4, 6 x3, 7 x3 (7 first seen after 6), 8 x2, 9 x1, 10 x1 -> six ids, two
    buckets of three, layers stepped by 4 // 2: {5, 6, 7} run one layer, {8, 9, 10} three; [CLS], [PAD] and
    never-seen ids run all four."""
    sequences = [[1, 5, 6, 5, 0], [1, 6, 7, 5, 8], [1, 7, 7, 6, 5, 8, 9, 10]]
    depth = frequency_map(sequences, 12, Buckets(4, 2), SPECIAL)
    assert depth.tolist() == [4, 4, 4, 4, 4, 1, 1, 1, 3, 3, 3, 4]


def test_frequency_ties_go_by_first_occurrence_and_the_last_step_overshoots():
    """Five ids seen once each, in the order 9, 3, 7, 4, 8; Buckets(5, 2): step 2, buckets of two. The loop steps
    after every second id while its bucket id is below max_layer: 9, 3 -> 1 layer; 7, 4 -> 3; 8 -> 5 (bucket id 6 =
    max_layer: the top). At the official defaults (12 layers, 6 buckets) the last step overshoots to bucket id 14."""
    depth = frequency_map([[9, 3, 7, 4, 8]], 10, Buckets(5, 2), SPECIAL)
    assert depth[[9, 3, 7, 4, 8]].tolist() == [1, 1, 3, 3, 5]


def test_fewer_ids_than_buckets_step_after_every_id():
    depth = frequency_map([[4, 4, 3]], 6, Buckets(4, 4), SPECIAL)  # bucket size 2 // 4 = 0: the loop steps each time
    assert depth[[4, 3]].tolist() == [1, 2]


def test_mutual_information_by_hand_with_the_official_first_occurrence_rule():
    """Two sentences: [5, 5, 6] labelled 1, [6, 7] labelled 0; 5 tokens, p(y) = 1/2 each. p(x, y) skips each id's
    first occurrence (the official counting): 5 -> (0, 1/5), 6 -> (1/5, 0) (its second occurrence is in the label-0
    sentence), 7 -> (0, 0)."""
    distinct, scores = mutual_information([[1, 5, 5, 6], [1, 6, 7]], [1, 0], SPECIAL)
    assert distinct.tolist() == [5, 6, 7]
    mi_5 = math.log(0 / (0.4 * 0.5) + 1e-6) * 0 + math.log(0.2 / (0.4 * 0.5) + 1e-6) * 0.2
    mi_6 = math.log(0.2 / (0.4 * 0.5) + 1e-6) * 0.2 + math.log(0 / (0.4 * 0.5) + 1e-6) * 0
    assert scores == [mi_5, mi_6, 0.0]
    depth = mi_map([[1, 5, 5, 6], [1, 6, 7]], [1, 0], 9, Buckets(3, 3), SPECIAL)
    assert depth[[5, 6, 7]].tolist() == [1, 2, 3]  # equal MI: the first seen goes shallower


def test_random_consistent_is_one_seeded_draw_per_id_in_order():
    depth = random_consistent_map(12, 10, Buckets(6, 3), SPECIAL, seed=6)
    np.random.seed(6)  # the official code draws from numpy's global stream, one randint per non-special id
    expected = [np.random.randint(0, 3) * 2 + 1 for _ in range(2, 10)]
    assert depth[2:10].tolist() == expected
    assert depth[[0, 1, 10, 11]].tolist() == [6, 6, 6, 6]  # special ids; ids beyond the tokenizer's vocabulary


def test_official_inconsistent_draws_one_randint_per_sequence():
    sequences = [[1, 2, 3], [4, 5], [6]]
    drawn = official_inconsistent_depths(sequences, Buckets(4, 2), seed=3)
    np.random.seed(3)
    expected = [np.random.randint(0, 2, size=len(s)) * 2 + 1 for s in sequences]
    assert all(np.array_equal(a, b) for a, b in zip(drawn, expected))
    assert random_inconsistent_map(4, 4, SPECIAL).tolist() == [4, 4, DRAWN, DRAWN]


def test_occurrence_draws_are_fixed_per_input_and_differ_between_occurrences():
    buckets = Buckets(6, 3)
    ids = torch.tensor([[1] + [9] * 29, [1, 8, 9, 7] + [0] * 26])
    mask = (ids > 0).long()
    mask[:, 0] = 1
    drawn = occurrence_depths(ids, mask, buckets, seed=1)
    assert set(drawn[0, 1:].tolist()) == set(buckets.depths)  # one id, every bucket over its occurrences
    assert drawn[1, 4:].eq(0).all()
    alone = occurrence_depths(ids[1:, :4], mask[1:, :4], buckets, seed=1)
    assert torch.equal(alone[0], drawn[1, :4])  # a row's draw does not depend on its batch or padding
    assert not torch.equal(occurrence_depths(ids, mask, buckets, seed=2), drawn)


def test_cluster_orders_clusters_by_their_members_norm_sums():
    """Three tight groups of embeddings: norms about 1 (4 ids), 5 (3 ids) and 2 (5 ids): sums 4, 15, 10 -> the
    norm-1 group is shallowest, then the norm-2 group, then the norm-5 group."""
    rng = np.random.RandomState(0)
    centres = {1.0: 4, 5.0: 3, 2.0: 5}
    rows = [np.array([c, 0.0]) + rng.normal(0, 0.01, 2) for c, n in centres.items() for _ in range(n)]
    depth = cluster_map(np.stack(rows), Buckets(6, 3), [], seed=0, starts=4)
    assert depth.tolist() == [1] * 4 + [5] * 3 + [3] * 5


def test_the_digest_names_the_map():
    a = frequency_map([[5, 6]], 8, Buckets(2, 2), SPECIAL)
    b = a.copy()
    b[6] = 1
    assert map_digest(a) == map_digest(torch.as_tensor(a)) != map_digest(b)

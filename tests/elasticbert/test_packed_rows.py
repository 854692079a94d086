"""Packed rows in the model: several texts per row kept apart by `sample_ids` (positions, attention, [CLS]).

The training-level equality (packed step = padded step, losses and gradients) is tests/pretrain/test_packing.py;
here, with random texts: each text of a packed row gets exactly the hidden states it gets alone in a padded row,
under BERT and RoBERTa position ids, and the packed inputs are checked.
"""

from __future__ import annotations

import pytest
import torch

from elasticbert import ElasticBertForPreTraining, ElasticBertModel
from elasticbert.masks import packed_attention_mask

LENGTHS = [7, 3, 12, 5, 9]  # two rows of 20: [12, 5, 3] and [9, 7]
ROWS = [[2, 3, 1], [4, 0]]
WIDTH = 24


def _texts(vocab: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(5, vocab, (n,), generator=g) for n in LENGTHS]


def _padded(texts, pad):
    ids = torch.full((len(texts), max(LENGTHS)), pad)
    mask = torch.zeros_like(ids)
    for i, t in enumerate(texts):
        ids[i, : len(t)], mask[i, : len(t)] = t, 1
    return ids, mask


def _packed(texts, pad):
    ids = torch.full((len(ROWS), WIDTH), pad)
    sample_ids = torch.zeros_like(ids)
    cls = torch.zeros(len(texts), dtype=torch.long)
    for r, row in enumerate(ROWS):
        at = 0
        for i in row:
            ids[r, at : at + len(texts[i])] = texts[i]
            sample_ids[r, at : at + len(texts[i])] = i + 1
            cls[i] = r * WIDTH + at
            at += len(texts[i])
    return ids, sample_ids, cls


@pytest.mark.parametrize("style", ["bert", "roberta"])
def test_each_packed_text_has_its_padded_hidden_states(tiny_config, style):
    config = tiny_config(position_ids_style=style, pad_token_id=1)
    model = ElasticBertModel(config).eval()
    texts = _texts(config.vocab_size)
    ids, mask = _padded(texts, config.pad_token_id)
    packed_ids, sample_ids, _ = _packed(texts, config.pad_token_id)
    with torch.no_grad():
        alone = model(ids, attention_mask=mask, output_hidden_states=True).hidden_states
        packed = model(
            packed_ids, attention_mask=(sample_ids > 0).long(), sample_ids=sample_ids, output_hidden_states=True
        )
    for layer, (a, p) in enumerate(zip(alone, packed.hidden_states)):
        for i, n in enumerate(LENGTHS):
            got = p[sample_ids == i + 1]
            torch.testing.assert_close(got, a[i, :n], rtol=1e-5, atol=1e-5, msg=f"layer {layer}, text {i}")


def test_positions_restart_at_every_text(tiny_config):
    for style, first in (("bert", 0), ("roberta", 2)):
        model = ElasticBertModel(tiny_config(position_ids_style=style, pad_token_id=1))
        sample_ids = torch.tensor([[3, 3, 3, 1, 1, 2, 0, 0]])
        pad = 0 if style == "bert" else 1
        expected = [first, first + 1, first + 2, first, first + 1, first]
        got = model.embeddings.packed_position_ids(sample_ids)[0].tolist()
        assert got[:6] == expected and (style == "bert" or got[6:] == [pad, pad])


def test_the_mask_is_block_diagonal_and_no_row_is_empty():
    mask = packed_attention_mask(torch.tensor([[1, 1, 2, 0]]))[0, 0]
    assert mask.tolist() == [
        [True, True, False, False],
        [True, True, False, False],
        [False, False, True, False],
        [False, False, False, True],
    ]


def test_sop_reads_each_texts_own_cls(tiny_config):
    config = tiny_config()
    model = ElasticBertForPreTraining(config).eval()
    texts = _texts(config.vocab_size)
    ids, mask = _padded(texts, 0)
    packed_ids, sample_ids, cls = _packed(texts, 0)
    with torch.no_grad():
        alone = model(ids, attention_mask=mask).sop_logits
        packed = model(packed_ids, attention_mask=(sample_ids > 0).long(), sample_ids=sample_ids, cls_positions=cls)
    assert packed.sop_logits.shape == (len(texts), 2)
    torch.testing.assert_close(packed.sop_logits, alone, rtol=1e-5, atol=1e-5)
    assert packed.prediction_logits.shape[:2] == packed_ids.shape


def test_packed_inputs_are_checked(tiny_config):
    model = ElasticBertForPreTraining(tiny_config())
    ids = torch.ones(2, 8, dtype=torch.long)
    with pytest.raises(ValueError, match="need both sample_ids and cls_positions"):
        model(ids, sample_ids=torch.ones_like(ids))
    with pytest.raises(ValueError, match="need both sample_ids and cls_positions"):
        model(ids, cls_positions=torch.tensor([0, 8]))
    with pytest.raises(ValueError, match="must have the shape of input_ids"):
        model(ids, sample_ids=torch.ones(2, 7, dtype=torch.long), cls_positions=torch.tensor([0, 8]))

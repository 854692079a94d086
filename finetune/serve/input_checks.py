"""The input judging of a served classifier, beside each input's own verdict (`verdicts.py`): what refuses a whole
request — a tokenizer of another vocabulary (checked once, at start), more [UNK] than `max_unk_fraction` over the
inputs so far (data_prep's guard, once `UNK_MIN_TOKENS` text tokens are in), a text pair for a single-text task or the
reverse (a mistake the model cannot notice)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from common.errors import ConfigError
from common.vocab import DEFAULT_MAX_UNK_FRACTION

from ..data import UNK_MIN_TOKENS, check_vocabulary_fits, text_id_table, unk_counts, unk_refusal
from ..tasks import DataError, TaskSpec
from .inputs import TextInput
from .verdicts import DEFAULT_MIN_READABLE_SHARE, VocabularyJudge


class InputChecks:
    """One classifier's checks of its inputs: the [UNK] count over everything it was asked, and its vocabulary's
    per-input judge (`judge`, the `unknown-text` verdict)."""

    def __init__(
        self,
        tokenizer: object,
        vocab_size: int,
        max_unk_fraction: float = DEFAULT_MAX_UNK_FRACTION,
        min_readable_share: float = DEFAULT_MIN_READABLE_SHARE,
    ) -> None:
        if not 0.0 <= max_unk_fraction <= 1.0:
            raise ConfigError(f"--max-unk-fraction must be within [0, 1] (1 never refuses), got {max_unk_fraction}")
        if not 0.0 <= min_readable_share < 1.0:
            raise ConfigError(
                f"--min-readable-share must be within [0, 1) (0: any input with one readable character), got "
                f"{min_readable_share}"
            )
        check_vocabulary_fits(tokenizer, vocab_size, getattr(tokenizer, "name_or_path", "of the model"))
        self.judge = VocabularyJudge(tokenizer, min_readable_share)
        self.tokenizer = tokenizer
        self.max_unk_fraction, self.unk_seen = max_unk_fraction, [0, 0]  # [UNK] and text tokens of all inputs
        self.is_text = text_id_table(tokenizer)

    def check_unk(self, input_ids: torch.Tensor) -> None:
        """Refuse inputs this model's vocabulary does not fit (data_prep's guard), once `UNK_MIN_TOKENS` are in."""
        unk, tokens = unk_counts(self.tokenizer, input_ids, self.is_text)
        self.unk_seen = [self.unk_seen[0] + unk, self.unk_seen[1] + tokens]
        if self.unk_seen[1] >= UNK_MIN_TOKENS:
            what = f"the {self.unk_seen[1]:,} text tokens of the inputs so far"
            refusal = unk_refusal(*self.unk_seen, self.max_unk_fraction, what, "of the model")
            if refusal is not None:
                raise refusal


def check_kinds(inputs: Sequence[TextInput], task: TaskSpec | None) -> None:
    """A pair for a single-text task (or the reverse) is a mistake the model cannot notice: refused."""
    if task is None:
        return
    wrong = next((i for i in inputs if (i.text_b is not None) != task.is_pair and not _blank(i)), None)
    if wrong is not None:
        given, wanted = ("a text pair", "single texts") if wrong.text_b is not None else ("a single text", "pairs")
        raise DataError(f"{wrong.where}: {given}, but the model was fine-tuned on {task.name} ({wanted})")


def _blank(item: TextInput) -> bool:
    """An input with no text at all (a blank line of a stream): its verdict (`empty`) answers it, whatever kind."""
    return not item.text_a.strip() and not (item.text_b or "").strip()

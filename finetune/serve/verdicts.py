"""Each input's own verdict: whether the model can read it at all, judged where the inputs are encoded.

A classifier answers every input with a confident-looking label, whatever it is given: a line of emoji, Chinese
text for an English vocabulary, a row of punctuation. A rate over a whole file (`data.unk_refusal`, once 2,000
tokens are in) misses a short input and one such line among normal ones. So every input is judged on its own, and
one that is not meaningful to the model is not classified: its record carries `flag` (why, in one word) and
`reason` (in words) instead of a prediction. The flags:

- ``empty``: nothing the tokenizer keeps (only white space, invisible or control characters): the model would see
  [CLS] [SEP] alone;
- ``no-words``: no letter or digit of any script (Unicode categories L* and N*): punctuation, symbols (`$`, `+`,
  `^`, emoji) and white space only, e.g. `!@#$%^&*()_+{}|:<>?`: there is nothing to classify;
- ``unknown-text``: no more than `min_readable_share` (default 0.5: half) of its characters are readable to the
  model's vocabulary; the others became [UNK], or the vocabulary knows their words only letter by letter (Cyrillic,
  kana or Hangul in an English WordPiece vocabulary: every word spelled as single-character pieces). Characters
  are letters, digits and symbols (emoji included: a text of words and emoji is judged on both); punctuation and
  marks do not count. 0 classifies every input with one readable character.

A pair is judged text by text (the reason says which). The checks that need the vocabulary run only on rows whose
ids hold an [UNK] or a run of single-character pieces (a tensor test over the batch), so inputs the vocabulary
reads cost a few vectorised operations, not a second tokenisation.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

import numpy as np
import torch

DEFAULT_MIN_READABLE_SHARE = 0.5
FLAGS = ("empty", "no-words", "unknown-text")


@dataclass(frozen=True)
class Verdict:
    """Why an input is not classified: `flag` (one of `FLAGS`) and `reason` (one line)."""

    flag: str
    reason: str

    def record(self) -> dict:
        return {"flag": self.flag, "reason": self.reason}


def _kind(char: str) -> str:
    """'word' (a letter or digit of any script), 'symbol', 'punct', or '' (white space, marks, control and format
    characters)."""
    major = unicodedata.category(char)[0]
    return "word" if major in "LN" else "symbol" if major == "S" else "punct" if major == "P" else ""


def character_verdict(text: str, which: str = "") -> Verdict | None:
    """`empty` or `no-words` from the characters alone (no tokenizer needed), else None."""
    visible = False
    for char in text:  # the first letter or digit settles it (most texts: their first character)
        kind = _kind(char)
        if kind == "word":
            return None
        visible = visible or kind in ("symbol", "punct")
    if visible:
        return Verdict(
            "no-words", f"{which}no letter or digit of any script (punctuation and symbols only): nothing to classify"
        )
    return Verdict("empty", f"{which}no visible text (white space, invisible or control characters only)")


def _word_characters(text: str) -> int:
    """Letters, digits and symbols: the characters whose share a vocabulary is judged on."""
    return sum(_kind(char) in ("word", "symbol") for char in text)


class VocabularyJudge:
    """The vocabulary side of the verdict (`unknown-text`) for one tokenizer."""

    def __init__(self, tokenizer: object, min_readable_share: float = DEFAULT_MIN_READABLE_SHARE) -> None:
        if not 0.0 <= min_readable_share < 1.0:
            raise ValueError(
                f"--min-readable-share must be within [0, 1) (0: one readable character), got {min_readable_share}"
            )
        self.tokenizer, self.limit = tokenizer, min_readable_share
        self.unk = getattr(tokenizer, "unk_token", None)
        self.unk_id = getattr(tokenizer, "unk_token_id", None)
        pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        specials = set(getattr(tokenizer, "all_special_ids", ()))
        self.wordpiece = any(str(piece).startswith("##") for piece in pieces)
        # single[i]: id i is one letter alone (a word start or a `##` continuation); continued[i]: a `##` piece
        # (numpy: a request of one input is a few dozen ids, where a torch op costs several times a numpy one)
        self.single = np.array(
            [i not in specials and _one_letter(str(p).removeprefix("##")) for i, p in enumerate(pieces)], dtype=bool
        )
        self.continued = np.array([str(p).startswith("##") for p in pieces], dtype=bool)

    def suspects(self, input_ids: torch.Tensor) -> list[int]:
        """The rows whose ids hold an [UNK] or (WordPiece) two single-letter pieces of one word in a row."""
        ids = input_ids.numpy()
        found = (ids == self.unk_id).any(1) if self.unk_id is not None else np.zeros(len(ids), dtype=bool)
        if self.wordpiece and ids.shape[1] > 1:
            ids = ids.clip(0, len(self.single) - 1)
            single, continued = self.single[ids], self.continued[ids]
            found |= (single[:, 1:] & continued[:, 1:] & single[:, :-1]).any(1)
        return found.nonzero()[0].tolist()

    def verdict(self, text: str, which: str = "") -> Verdict | None:
        """`unknown-text` unless more than the limit of `text`'s characters are readable to the vocabulary."""
        unreadable, total = self.unreadable_characters(text)
        if total == 0 or (total - unreadable) / total > self.limit:
            return None
        return Verdict(
            "unknown-text",
            f"{which}{unreadable} of its {total} characters are unreadable to the model's vocabulary ([UNK], or "
            f"words it knows only letter by letter): no more than --min-readable-share {self.limit:g} of them read",
        )

    def unreadable_characters(self, text: str) -> tuple[int, int]:
        """(unreadable, all) word characters of `text`: those hidden in [UNK] pieces, plus those of words spelled
        as single-character pieces only."""
        tokens = self.tokenizer.tokenize(text)
        known = spelled = 0
        for word in _words(tokens, self.wordpiece):
            if word == [self.unk]:
                continue
            chars = sum(_word_characters(piece.removeprefix("##") if self.wordpiece else piece) for piece in word)
            known += chars
            if len(word) >= 2 and all(_one_letter(piece.removeprefix("##")) for piece in word):
                spelled += chars
        hidden = max(0, _word_characters(text) - known) if self.unk in tokens else 0
        return spelled + hidden, known + hidden


def _one_letter(piece: str) -> bool:
    return len(piece) == 1 and unicodedata.category(piece)[0] == "L"


def _words(tokens: list[str], wordpiece: bool) -> list[list[str]]:
    """Tokens grouped into words (WordPiece: a piece and the `##` pieces that continue it; else one token each)."""
    words: list[list[str]] = []
    for token in tokens:
        if wordpiece and token.startswith("##") and words:
            words[-1].append(token)
        else:
            words.append([token])
    return words

"""Random numbers as pure functions of their keys: no generator state, so any rank can compute the draw of any
sample or the image of any position in O(1) memory, in any order, vectorised over a batch of keys.

- `mix(*keys)`: splitmix64 over the keys (uint64 arrays, broadcast): a well-mixed 64-bit hash per element;
- `uniform(h)`: the top 53 bits of a hash as a float in [0, 1);
- `Permutation(n, seed)`: a seeded bijection of [0, n) (a 4-round Feistel network over the smallest even power of
  two ≥ n, with cycle walking), applied to any array of positions without materialising the n-element table — the
  epoch shuffle of a corpus of a billion samples costs nothing per rank.
"""

from __future__ import annotations

import numpy as np

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
M1 = np.uint64(0xBF58476D1CE4E5B9)
M2 = np.uint64(0x94D049BB133111EB)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser on a uint64 array (wrapping arithmetic)."""
    z = np.asarray(x, dtype=np.uint64) + GOLDEN
    z = (z ^ (z >> np.uint64(30))) * M1
    z = (z ^ (z >> np.uint64(27))) * M2
    return z ^ (z >> np.uint64(31))


def mix(*keys: int | np.ndarray) -> np.ndarray:
    """One 64-bit hash per element of the broadcast keys (order matters: mix(a, b) != mix(b, a))."""
    with np.errstate(over="ignore"):
        h = np.zeros((), dtype=np.uint64)
        for key in keys:
            h = splitmix64(h ^ np.asarray(key).astype(np.uint64))
        return h


def uniform(h: np.ndarray) -> np.ndarray:
    """Floats in [0, 1) from 64-bit hashes."""
    return (np.asarray(h, dtype=np.uint64) >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


class Permutation:
    """A seeded bijection of [0, n); `perm(positions)` maps an int array of positions (each < n) to their images."""

    ROUNDS = 4

    def __init__(self, n: int, seed: int | np.ndarray) -> None:
        if n <= 0:
            raise ValueError(f"a permutation needs n >= 1, got {n}")
        self.n = int(n)
        bits = max(2, int(np.ceil(np.log2(self.n))) if self.n > 1 else 2)
        bits += bits % 2
        self.half = np.uint64(bits // 2)
        self.mask = np.uint64((1 << (bits // 2)) - 1)
        self.keys = [mix(seed, r) for r in range(self.ROUNDS)]

    def _feistel(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self.half, x & self.mask
        with np.errstate(over="ignore"):
            for key in self.keys:
                left, right = right, left ^ (splitmix64(right ^ key) & self.mask)
        return (left << self.half) | right

    def __call__(self, positions: np.ndarray | int) -> np.ndarray:
        x = np.asarray(positions, dtype=np.uint64).copy()
        if x.size and int(x.max()) >= self.n:
            raise IndexError(f"position {int(x.max())} outside the permutation's range [0, {self.n})")
        out = self._feistel(x)
        outside = out >= np.uint64(self.n)
        while outside.any():  # cycle walking: the domain is < 4n, so a few rounds at most on average
            out[outside] = self._feistel(out[outside])
            outside = out >= np.uint64(self.n)
        return out.astype(np.int64)

"""The one integer hash used across recsync (category hashing, embedding row initialisation)."""

from __future__ import annotations

import numpy as np

SPLITMIX_GAMMA = 0x9E3779B97F4A7C15


def splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 output for state ``x`` (uint64 array in, new uint64 array out)::

        z = x + 0x9E3779B97F4A7C15            (mod 2**64)
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
        z = (z ^ (z >> 27)) * 0x94D049BB133111EB
        return z ^ (z >> 31)

    A fast, well-mixing bijection on uint64; numpy's uint64 arithmetic wraps as required.
    """
    z = x + np.uint64(SPLITMIX_GAMMA)
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return z

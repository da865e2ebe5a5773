"""A small data set whose tables are dynamic (ids = the values' full 64-bit hashes), for the
dynamic-table runs of the harness and the integration tests (the ``dyn_data`` fixture,
tests/conftest.py)."""

from pathlib import Path

import numpy as np

from recsync.data.convert import convert

SCHEMA = """
[label]
column = "y"
[[dense]]
name = "x"
[[categorical]]
name = "a"
[[categorical]]
name = "b"
[[multi_hot]]
name = "m"
table = "b"
separator = "|"
max_len = 3
[defaults]
table_kind = "dynamic"
[split]
eval_fraction = 0.2
"""


def write(root: Path) -> Path:
    """3,000 rows whose click depends on a (800 Zipf values) and b (300 values), as
    ``root/rows.csv`` and converted into ``root/data`` (returned)."""
    rng = np.random.default_rng(0)
    n = 3000
    a = rng.zipf(1.3, n) % 800
    b = rng.integers(0, 300, n)
    logit = np.where(a % 3 == 0, 1.5, -1.0) + np.where(b % 2 == 0, 0.8, -0.8)
    y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(int)
    lines = [f"{y[i]},{rng.random():.3f},a{a[i]},b{b[i]},b{b[i]}|b{(b[i] + 1) % 300}"
             for i in range(n)]
    (root / "rows.csv").write_text("y,x,a,b,m\n" + "\n".join(lines) + "\n")
    (root / "schema.toml").write_text(SCHEMA)
    convert([root / "rows.csv"], root / "schema.toml", root / "data", progress=False)
    return root / "data"

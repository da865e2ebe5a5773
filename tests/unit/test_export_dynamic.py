"""`recsync export` of a model with dynamic tables (issue 33): the file holds each dynamic
table's trained ids, sorted, and rows, looks ids up itself and scores what `recsync.load_model`
scores (both formats, without recsync), an id training gave no row reading zeros, ids at the
ends of int64 included; --max-bytes counts the ids. Run:
    PYTHONPATH=. python -m pytest -q -p no:xdist tests/unit/test_export_dynamic.py
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import recsync
from recsync.cli import main
from recsync.data.convert import convert
from recsync.data.reader import Chunk, Dataset
from recsync.model_dir.export import (ID_SENTINEL, ServingModel, check_size, dynamic_index,
                                      export_model)
from test_export import train_model_dir
from test_model_dir import score_elsewhere

LO, HI = -2**63, 2**63 - 1
SCHEMA = """
[label]
column = "y"
[[dense]]
name = "x"
[[categorical]]
name = "a"
[[categorical]]
name = "b"
[[categorical]]
name = "c"
[[multi_hot]]
name = "m"
table = "b"
separator = "|"
max_len = 3
[[multi_hot]]
name = "n"
table = "a"
separator = "|"
max_len = 2
pooling = "sum"
[defaults]
table_kind = "dynamic"
[tables.c]
kind = "fixed"
rows = 20
[split]
eval_fraction = 0.25
"""


@pytest.fixture(scope="module")
def dynamic_model(tmp_path_factory):
    """Tables a and b dynamic (b shared by a single- and a mean-pooled multi-hot feature, a by a
    sum-pooled one), c fixed; ids are admitted after 2 sightings, so values seen once in
    training (and every value first seen in eval) have no row."""
    root = tmp_path_factory.mktemp("dyn")
    rng = np.random.default_rng(5)
    lines = []
    for i in range(400):
        a, b = rng.zipf(1.5) % 300, rng.integers(0, 60)
        m = "|".join(f"b{v}" for v in rng.integers(0, 60, rng.integers(0, 4)))
        n = "|".join(f"a{v}" for v in rng.zipf(1.5, rng.integers(0, 3)) % 300)
        y = int(rng.random() < (0.7 if a % 2 else 0.3))
        lines.append(f"{y},{rng.random():.3f},a{a},b{b},c{i % 7},{m},{n}")
    (root / "rows.csv").write_text("y,x,a,b,c,m,n\n" + "\n".join(lines) + "\n")
    (root / "schema.toml").write_text(SCHEMA)
    convert([root / "rows.csv"], root / "schema.toml", root / "data", progress=False)
    model_dir = train_model_dir(root / "data", root / "run", "model.dynamic.capacity=1000",
                                "model.dynamic.admit_after=2")
    return model_dir, root / "data"


def eval_inputs(data, rows: int = 100) -> tuple[torch.Tensor, ...]:
    batch = Dataset(data).read(Chunk("eval", 0, 0, rows))
    return (batch.dense, batch.sparse, *[t for pair in batch.multi for t in pair])


def extreme_inputs(model) -> tuple[torch.Tensor, ...]:
    """Rows whose dynamic ids are trained ones, untrained ones and the ends of int64, single-
    and multi-hot: per row one id of each kind in columns a and b, lists of them in m and n."""
    trained_a, trained_b = model.ids_0.tolist(), model.ids_1.tolist()
    odd = [LO, HI, 0, -1, 1, LO + 1, HI - 1]
    a = trained_a[:3] + [i for i in odd if i not in trained_a]
    b = trained_b[-3:] + [i for i in odd if i not in trained_b]
    k = min(len(a), len(b))
    sparse = torch.tensor([[a[i], b[(i + 1) % k], i % 20] for i in range(k)])
    m_values = torch.tensor(b[:k] + b[:2])  # row i: b[i]; the last row: two more
    m_offsets = torch.tensor(list(range(k)) + [k + 2])
    n_values = torch.tensor(a[::-1][:k])
    n_offsets = torch.tensor([0] + [min(2 * (i + 1), k) for i in range(k - 1)] + [k])
    return torch.linspace(0, 1, k)[:, None], sparse, m_values, m_offsets, n_values, n_offsets


def test_the_files_score_what_load_model_scores_without_recsync(dynamic_model, tmp_path):
    model_dir, data = dynamic_model
    loaded = recsync.load_model(model_dir)
    assert [s.dynamic is not None for s in loaded.specs] == [True, True, False]
    files = [tmp_path / "m.pt", tmp_path / "m.pt2"]
    for file, fmt in zip(files, ["torchscript", "torch-export"]):
        result = CliRunner().invoke(main, ["export", "--model", str(model_dir), "--format", fmt,
                                           "--out", str(file)])
        assert result.exit_code == 0, result.output
    real, odd = eval_inputs(data), extreme_inputs(loaded)
    known = loaded.ids_0
    seen = real[1][:, 0]
    assert bool(torch.isin(seen, known).any()) and not bool(torch.isin(seen, known).all())
    for args in (real, odd):
        want = loaded(*args).numpy()
        for got in score_elsewhere(files, args, tmp_path):
            assert got.shape == want.shape and np.abs(got.numpy() - want).max() <= 1e-6
    exported = torch.export.load(str(files[1]))
    for state in (torch.jit.load(str(files[0])).state_dict(), exported.state_dict):
        assert state["ids_0"].dtype == torch.int64 and state["ids_0"][-1] == ID_SENTINEL
        assert torch.equal(state["ids_0"][:-1], loaded.ids_0)  # the docs' layout of the file
        assert state["table_1"].shape == (len(loaded.ids_1) + 1, loaded.specs[1].dim)
    program = exported.module()
    for rows in (1, 7):  # other batch sizes and list lengths than the traced ones
        args = eval_inputs(data, rows)
        assert np.abs(program(*args).numpy() - loaded(*args).numpy()).max() <= 1e-6


def test_an_id_without_a_row_reads_zeros_and_a_trained_one_its_row(dynamic_model):
    model_dir, _ = dynamic_model
    loaded = recsync.load_model(model_dir)
    serving = ServingModel(loaded)
    known = loaded.ids_1
    ids = torch.tensor([LO, HI, 0, -1, *known[:2].tolist(), known[-1].item() + 1])
    rows = serving.table_1.index_select(0, dynamic_index(serving.ids_1, ids))
    torch.testing.assert_close(rows, loaded.table_rows(1, ids), rtol=0, atol=0)
    fresh = ~torch.isin(ids, known)
    assert int(fresh.sum()) >= 4 and not bool(rows[fresh].any())
    assert bool(rows[~fresh].abs().sum(1).gt(0).all())
    assert serving.ids_1.dtype == torch.int64 and serving.ids_1[-1] == ID_SENTINEL
    assert bool((serving.ids_1[1:] > serving.ids_1[:-1]).all())


def test_a_dynamic_table_has_no_full_form_to_materialise(dynamic_model):
    loaded = recsync.load_model(dynamic_model[0])
    with pytest.raises(ValueError, match="table a is dynamic"):
        loaded.materialise(0)
    assert loaded.materialise(2).shape[1] == loaded.specs[2].dim  # c, fixed


@pytest.mark.parametrize("trained", [[], [LO], [HI], [LO, 5, HI]])
def test_the_lookup_needs_no_other_case_at_the_ends_of_int64(trained):
    """The sentinel 2^63 - 1 ends the ids: a table with no trained row, or one whose trained ids
    include either end of int64, looks up every id right."""
    known = torch.tensor(trained + [ID_SENTINEL], dtype=torch.int64)
    ids = torch.tensor([LO, LO + 1, -1, 0, 5, 6, HI - 1, HI])
    got = dynamic_index(known, ids)
    want = [trained.index(i) if i in trained else len(trained) for i in ids.tolist()]
    assert got.tolist() == want


def test_max_bytes_counts_the_ids(dynamic_model, tmp_path):
    model_dir, _ = dynamic_model
    loaded = recsync.load_model(model_dir)
    n = [len(loaded.ids_0), len(loaded.ids_1)]
    dims = [s.dim for s in loaded.specs]
    fixed = loaded.specs[2].rows * dims[2] * 4
    total = sum((k + 1) * (d * 4 + 8) for k, d in zip(n, dims)) + fixed
    assert check_size(loaded, total) == total
    with pytest.raises(ValueError, match=r"the largest is table b \([\d,]+ trained rows and "
                                         r"their ids"):
        check_size(loaded, total - 1)
    assert export_model(model_dir, tmp_path / "m.pt", max_bytes=total)["tables_bytes"] == total

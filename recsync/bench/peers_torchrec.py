"""The TorchRec arm of scenario `peers`: the same DLRM trained by TorchRec in this process.

TorchRec is an optional extra of the benchmarks (scripts/install_peers.sh), never a dependency of
training: it is imported here only, and only when the arm runs. ``missing()`` says why it
cannot run (None when it can).

The arm is what a TorchRec user writes for recsync's DLRM on one CPU:
``torchrec.models.dlrm.DLRM`` (bottom MLP ``model.bottom_mlp`` + [dim], dot interaction, top MLP
``model.top_mlp`` + [1]) over an ``EmbeddingBagCollection`` of one table per feature, fused with
row-wise Adagrad by ``fuse_embedding_optimizer`` (FBGEMM's CPU kernels apply the row update
inside backward), and ``torch.optim`` on the dense parameters. Hyper-parameters come from the
same RunConfig as recsync's arms: embedding lr, eps 1e-8, the dense optimizer with
``train.dense_warmup_steps``' linear warm-up, and the rows' L2 weight decay, asked of FBGEMM as
WeightDecayMode.L2, which the CPU kernel of fbgemm-gpu-cpu 1.8.0 ignores (``row_decay_applied``
measures it; the report says so). It starts from the model recsync's local run starts from with
the same seed (``copy_initial_model``: recsync's dense weights, the top MLP's inputs permuted to
TorchRec's order of the dot products, every row's initial value), so that the arms differ only
in how they compute (and in that decay). It reads the batches recsync's local run reads, in the
same order (converted to KeyedJaggedTensors before timing, which favours this arm), with
``train.threads`` intra-op threads.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from recsync.bench.memory import RssSampler
from recsync.config import RunConfig
from recsync.data.reader import Dataset, chunk_order
from recsync.embedding.row_optim import ROW_OPTIMIZERS
from recsync.embedding.store import initial_rows
from recsync.metrics.core import auc_logloss, write_json
from recsync.model.optim import make_dense_optimizer, warmup_factor
from recsync.model.setup import model_for
from recsync.run.local_run import CHUNK_BATCHES

INSTALL_HINT = "bash scripts/install_peers.sh (README, 'Benchmarks')"


def missing() -> str | None:
    """Why the TorchRec arm cannot run here (its import's error), or None when it can."""
    try:
        import torchrec  # noqa: F401
        import fbgemm_gpu  # noqa: F401  (the CPU build: fbgemm-gpu-cpu)
        from torchrec.modules.fused_embedding_modules import fuse_embedding_optimizer  # noqa: F401
    except Exception as e:  # ImportError, or an fbgemm built for another torch (OSError)
        return f"{type(e).__name__}: {e}"
    return None


def versions() -> dict:
    """TorchRec's and FBGEMM's versions (the arm must be able to run)."""
    import fbgemm_gpu
    import torchrec
    return {"torchrec": getattr(torchrec, "__version__", "unknown"),
            "fbgemm_gpu": getattr(fbgemm_gpu, "__version__", "unknown")}


def build(cfg: RunConfig, ds: Dataset) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """TorchRec's DLRM for ``ds`` with the fused row-wise Adagrad, and its dense optimizer."""
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import WeightDecayMode
    from torchrec import optim as trec_optim
    from torchrec.models.dlrm import DLRM
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.modules.fused_embedding_modules import fuse_embedding_optimizer

    m, t = cfg.model, cfg.train
    if m.name != "dlrm" or t.embedding_optimizer != "adagrad":
        raise ValueError(f"the TorchRec arm mirrors model.name = \"dlrm\" with row-wise "
                         f"Adagrad, got model.name = {m.name!r}, train.embedding_optimizer = "
                         f"{t.embedding_optimizer!r}")
    torch.manual_seed(t.seed)  # as run/local_run.py's build_local_model: the same dense init
    built = model_for(m, ds)  # recsync's model for this data set: module, tables, base rate
    tables = [EmbeddingBagConfig(name=s.name, embedding_dim=s.dim, num_embeddings=s.rows,
                                 feature_names=[feature_name(i)])
              for i, s in enumerate(built.tables)]
    dim = tables[0].embedding_dim
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    model = DLRM(embedding_bag_collection=ebc, dense_in_features=ds.meta["num_dense"],
                 dense_arch_layer_sizes=[*m.bottom_mlp, dim],
                 over_arch_layer_sizes=[*m.top_mlp, 1])
    rule = ROW_OPTIMIZERS["adagrad"](lr=t.embedding_lr, weight_decay=t.embedding_weight_decay)
    model = fuse_embedding_optimizer(
        model, optimizer_type=trec_optim.RowWiseAdagrad,
        optimizer_kwargs={"lr": rule.lr, "eps": rule.eps, "weight_decay": rule.weight_decay,
                          "weight_decay_mode": WeightDecayMode.L2},
        device=torch.device("cpu"))
    copy_initial_model(built.module, model, t.seed, m.embedding_init_scale)
    dense = [p for name, p in model.named_parameters() if not name.startswith("sparse_arch.")]
    return model, make_dense_optimizer(t.dense_optimizer, dense, t.dense_lr,
                                       t.dense_weight_decay)


@torch.no_grad()
def copy_initial_model(recsync_dlrm: torch.nn.Module, trec_dlrm: torch.nn.Module, seed: int,
                       init_scale: float) -> None:
    """Give TorchRec's DLRM the initial model of recsync's: the MLPs' weights (recsync's output
    bias at the logit of the base rate included) and every row's initial value
    (embedding/store.py's ``initial_rows`` for ``seed``)."""
    def linears(module):
        return [x for x in module.modules() if isinstance(x, torch.nn.Linear)]
    pairs = list(zip(linears(recsync_dlrm.bottom), linears(trec_dlrm.dense_arch)))
    pairs += list(zip(linears(recsync_dlrm.top), linears(trec_dlrm.over_arch)))
    vectors = len(trec_dlrm.sparse_arch.sparse_feature_names) + 1
    dim = recsync_dlrm.top[0].in_features - len(recsync_dlrm.tri_rows)
    order = torch.cat([torch.arange(dim), dim + pair_order(vectors)])
    for i, (ours, theirs) in enumerate(pairs):
        assert ours.weight.shape == theirs.weight.shape, (ours, theirs)
        weight = ours.weight[:, order] if i == len(linears(recsync_dlrm.bottom)) else ours.weight
        theirs.weight.copy_(weight)
        theirs.bias.copy_(ours.bias)
    bags = trec_dlrm.sparse_arch.embedding_bag_collection.embedding_bags
    for t, bag in enumerate(bags.values()):
        rows, width = bag.weight.shape
        bag.weight.copy_(initial_rows(seed, t, torch.arange(rows), width, init_scale))


def pair_order(vectors: int) -> torch.Tensor:
    """For each of TorchRec's dot products (the strict upper triangle, row by row), its
    position among recsync's (the strict lower triangle, row by row) of ``vectors`` vectors."""
    rows, cols = torch.tril_indices(vectors, vectors, offset=-1)
    position = {(int(c), int(r)): k for k, (r, c) in enumerate(zip(rows, cols))}
    upper = torch.triu_indices(vectors, vectors, offset=1)
    return torch.tensor([position[(int(i), int(j))] for i, j in zip(*upper)])


def row_decay_applied(weight_decay: float = 1e-2) -> bool:
    """Whether FBGEMM's fused row-wise Adagrad applies L2 weight decay here: one update of a
    tiny table with and without it, compared (its CPU kernel ignores it in 1.8.0)."""
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import WeightDecayMode
    from torchrec import optim as trec_optim
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection

    def one_update(decay: float) -> torch.Tensor:
        ebc = FusedEmbeddingBagCollection(
            [EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=4,
                                feature_names=["f"])],
            optimizer_type=trec_optim.RowWiseAdagrad,
            optimizer_kwargs={"lr": 0.1, "weight_decay": decay,
                              "weight_decay_mode": WeightDecayMode.L2})
        with torch.no_grad():
            ebc.embedding_bags["t"].weight.fill_(1.0)
        ebc(to_kjt(torch.tensor([[1]]), ["f"])).values().sum().backward()
        return ebc.embedding_bags["t"].weight.detach().clone()
    return not torch.allclose(one_update(weight_decay), one_update(0.0), rtol=0, atol=1e-6)


def feature_name(i: int) -> str:
    return f"f{i}"


def train_batches(cfg: RunConfig, ds: Dataset) -> list[tuple]:
    """The batches recsync's local run reads (run/local_run.py's loop: chunk order, in-chunk
    shuffle, ``train.max_steps``), each as (dense, KeyedJaggedTensor, label)."""
    t = cfg.train
    seed = t.seed if cfg.data.shuffle else None
    chunks = ds.chunks("train", cfg.data.chunk_rows or CHUNK_BATCHES * t.batch_size)
    out = []
    for epoch in range(t.epochs):
        for chunk in chunk_order(chunks, epoch=epoch, shuffle_seed=seed):
            for b in ds.batches(chunk, t.batch_size, shuffle_seed=seed, epoch=epoch):
                out.append((b.dense, to_kjt(b.sparse), b.label))
                if t.max_steps and len(out) >= t.max_steps:
                    return out
    return out


def to_kjt(sparse: torch.Tensor, keys: list[str] | None = None):
    """[B, F] int64 ids, one per feature, as TorchRec's KeyedJaggedTensor (feature-major)."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
    rows, features = sparse.shape
    return KeyedJaggedTensor.from_lengths_sync(
        keys=keys or [feature_name(i) for i in range(features)],
        values=sparse.t().contiguous().view(-1),
        lengths=torch.ones(rows * features, dtype=torch.int32))


def run_arm(cfg: RunConfig, ds: Dataset, out_dir: Path, warmup_steps: int) -> dict:
    """Train and evaluate the arm; a summary in the shape of ``overhead.run_arm``'s (also
    written to ``out_dir``/summary.json). samples/s counts the steps after ``warmup_steps``."""
    begin = time.perf_counter()
    torch.set_num_threads(cfg.train.threads)
    with RssSampler() as sampler:
        model, dense_optimizer = build(cfg, ds)
        batches = train_batches(cfg, ds)
        warmup = cfg.train.warmup_for(ds.rows("train"), 1)
        if len(batches) <= warmup_steps + 1:
            raise RuntimeError(f"{len(batches)} steps leave too few after the warm-up of "
                               f"{warmup_steps}; run more steps (--scale)")
        model.train()
        step_ends = []
        started = time.perf_counter()
        for k, (dense, kjt, label) in enumerate(batches):
            logits = model(dense, kjt).squeeze(1)
            loss = F.binary_cross_entropy_with_logits(logits, label)
            dense_optimizer.zero_grad(set_to_none=True)
            loss.backward()  # the fused row-wise Adagrad updates the rows here
            for g in dense_optimizer.param_groups:  # train.dense_warmup_steps, as recsync's
                g["lr"] = cfg.train.dense_lr * warmup_factor(k, warmup)
            dense_optimizer.step()
            loss.item()  # recsync's step reads its loss too
            step_ends.append(time.perf_counter())
        evaluation = evaluate(model, ds, cfg.train.eval_batch_size)
    samples = sum(len(b[2]) for b in batches)
    window = sum(len(b[2]) for b in batches[warmup_steps + 1:])
    window_s = step_ends[-1] - step_ends[warmup_steps]
    summary = {
        "mode": "torchrec", "status": "completed", "steps": len(batches), "samples": samples,
        "samples_per_s": window / window_s, "window_s": window_s, "window_samples": window,
        "summary_samples_per_s": samples / (step_ends[-1] - started),
        "train_s": step_ends[-1] - started, "wall_s": time.perf_counter() - begin,
        "threads": torch.get_num_threads(), "dense_warmup_steps": warmup,
        "row_weight_decay_applied": row_decay_applied(),
        "eval": evaluation, "versions": versions(), "out_dir": str(out_dir),
        "memory": sampler.result()}
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    write_json(Path(out_dir) / "summary.json", summary)
    print(f"  torchrec: {summary['samples_per_s']:,.0f} samples/s after warm-up; "
          f"{samples:,} samples, wall {summary['wall_s']:.1f} s", flush=True)
    return summary


@torch.no_grad()
def evaluate(model: torch.nn.Module, ds: Dataset, batch_size: int) -> dict:
    """AUC and log loss on the whole eval split (recsync's metrics, as every arm's)."""
    model.eval()
    labels, probs = [], []
    for chunk in ds.chunks("eval", batch_size):
        for b in ds.batches(chunk, batch_size):
            probs.append(torch.sigmoid(model(b.dense, to_kjt(b.sparse)).squeeze(1)).numpy())
            labels.append(b.label.numpy())
    synthetic = ds.synthetic or {}  # as run/summary.py reports it
    return {**auc_logloss(np.concatenate(labels), np.concatenate(probs)),
            "rows": ds.rows("eval"), "bayes_auc": synthetic.get("bayes_auc"),
            "bayes_logloss": synthetic.get("bayes_logloss")}

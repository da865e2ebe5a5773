"""The config sections every run has (data, training, output, cluster; the model's in
config_model.py) and what can go wrong and what a run does about it (the emulated network,
recovery from failed PS shards, injected faults). The modes' sections and RunConfig are in
config.py."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from recsync.data.meta_checks import MAX_DIM

DEFAULT_WARMUP_STEPS = 100  # train.dense_warmup_steps = -1: this, at most a tenth of the run
# Bounds of model.* sizes (a model directory's model.json is checked against them too): generous,
# but a mistyped or crafted width cannot ask for terabytes.
MAX_WIDTH = MAX_DIM  # an MLP layer's width, model.embedding_dim: a schema's largest dim
MAX_LAYERS = 64  # layers of one MLP, model.cross_layers
Width = Annotated[int, Field(ge=1, le=MAX_WIDTH)]


class ConfigError(ValueError):
    """A config file or override is malformed or holds bad values; the message says where."""


class Section(BaseModel):
    """Strict: a boolean is true or false (not 1), an integer is not 2.0 or true, a number is
    finite (inf and nan are refused); every key is known."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True,
                              strict=True, allow_inf_nan=False)


class DataConfig(Section):
    path: str = "runs/data/synth"
    """directory of a converted data set (`recsync data synth` / `recsync data criteo`)"""
    shuffle: bool = True
    """visit chunks, and rows within a chunk, in a seeded random order each epoch"""
    chunk_rows: int = Field(0, ge=0)
    """rows per unit of work (0: 16 batches); a chunk is a contiguous row range of one part"""


class TrainConfig(Section):
    batch_size: int = Field(4096, ge=1)
    """samples per step (per worker in distributed modes)"""
    epochs: int = Field(1, ge=1)
    """passes over the training split (CTR models are usually trained for one); with
    ``patience`` a maximum"""
    validation: float = Field(0.0, ge=0, lt=1)
    """hold out this fraction of the training split for model selection (0: none): its last
    rows in time order (as the eval split is cut), never trained on. The evaluations during
    training then score it (the first eval_sample_rows of it) instead of the eval split, the
    run keeps the model of the evaluation with the lowest validation log loss (OUT/model and
    the final evaluation on the eval split are that model's), and summary.json's ``stopped``
    says which it was (docs/design.md)"""
    patience: int = Field(0, ge=0)
    """early stopping (needs ``validation``): stop after this many evaluations in a row
    without a lower validation log loss than the best so far (0: never stop early; epochs
    and max_steps still end the run)"""
    max_steps: int = Field(0, ge=0)
    """stop after this many steps (0: no limit)"""
    embedding_optimizer: Literal["adagrad", "sgd"] = "adagrad"
    """row-wise optimizer of embedding rows"""
    embedding_lr: float = Field(0.05, gt=0)
    """learning rate of the embedding rows (0.05: measured best of 0.02-0.2 for every built-in
    model on the Avazu sample and as good as 0.2 for DLRM on synthetic data; docs/models.md)"""
    dense_optimizer: Literal["adagrad", "adam", "sgd"] = "adagrad"
    """optimizer of the dense (MLP) parameters"""
    dense_lr: float = Field(0.01, gt=0)
    dense_warmup_steps: int = Field(-1, ge=-1)
    """linear warm-up of the dense learning rate: the k-th dense update (k = 0, 1, ...) uses
    dense_lr x min(1, (k+1)/W); counted per dense optimizer (a sync/hybrid worker's: one a
    step; PS shard 0's in async/gba/eager: one a push or a global batch; a shadow/foreground
    trainer's: one a Hogwild iteration), carried by its state across switches and resumes;
    0: none. -1 (default): 100, but at most a tenth of the steps a worker takes in the run
    (``warmup_for``), resolved when the run starts (config.toml has the value used). 100:
    measured to remove the first steps' loss spike of Adagrad at 0.01 in local, sync, async
    and eager runs, and eager's collapse, with no AUC lost (docs/sync_modes.md); the tenth
    keeps a short run from spending itself warming up (measured on the Avazu sample: 28
    steps, docs/models.md)"""
    dense_weight_decay: float = Field(0.0, ge=0)
    """L2 on the dense parameters (the dense optimizer's weight_decay: grad += wd * param)"""
    embedding_weight_decay: float = Field(1e-5, ge=0)
    """L2 on the embedding rows a step touches (grad += wd * row before the row optimizer, as
    parameter servers apply it): rows no batch touches do not decay; 1e-5 measured not to
    hurt in one pass and to help when a sample is seen again (docs/models.md)"""
    seed: int = Field(0, ge=0)
    """seeds model init, embedding init and data order"""
    threads: int = Field(1, ge=1)
    """torch intra-op threads per training process"""
    dense_precision: Literal["auto", "float32", "bfloat16"] = "auto"
    """precision of the dense model's training forward and backward (bfloat16 autocast: the
    parameters, embedding rows, row gradients, optimizer state and the loss stay float32;
    evaluation and predict always run float32). "auto": bfloat16 where the process's CPU (or
    GPU) has native bfloat16 (AVX512-BF16 or AMX), float32 elsewhere; "bfloat16" on a CPU
    without it falls back to float32 with a warning. Measured with DLRM at batch 4,096:
    model/compute.py, docs/models.md "Dense compute" """
    compile: bool = False
    """torch.compile the dense model's training forward (compiled at start-up, before the
    training clock starts; needs a C++ compiler on a CPU). Off by default: measured no faster
    than eager for the built-in models (docs/models.md "Dense compute")"""
    eval_every_samples: int = Field(0, ge=0)
    """evaluate (AUC, log loss, NE, calibration) on eval_sample_rows every this many training
    samples (0: 8 times per run); local training waits for each, distributed workers never do
    (a thread of the driver evaluates a copy of the dense parameters as training goes on)"""
    eval_sample_rows: int = Field(50_000, ge=1)
    """rows of the eval split (of the validation slice, with ``validation``) used by the
    evaluations during training"""
    eval_batch_size: int = Field(65_536, ge=1)
    init_from: str = ""
    """a model directory (an earlier run's OUT/model) to start from: its dense parameters,
    trained rows and, if it saved them, their optimizer state (daily incremental training:
    yesterday's model, today's data; the model config must be the same, docs/recovery.md)"""

    @model_validator(mode="after")
    def _check_patience(self):
        if self.patience and not self.validation:
            raise ValueError(f"train.patience = {self.patience} needs a validation slice to "
                             f"stop on: set train.validation (e.g. 0.05); the eval split is "
                             f"kept for the final figures")
        return self

    def warmup_for(self, train_rows: int, workers: int) -> int:
        """dense_warmup_steps as the run uses it: -1 is DEFAULT_WARMUP_STEPS, at most a tenth
        of the steps one worker takes over ``train_rows`` (a sync worker's updates; modes that
        update more often warm up over a smaller part of the run)."""
        if self.dense_warmup_steps >= 0:
            return self.dense_warmup_steps
        steps = self.epochs * train_rows // (self.batch_size * max(1, workers))
        if self.max_steps:
            steps = min(steps, self.max_steps)
        return min(DEFAULT_WARMUP_STEPS, steps // 10)


class OutputConfig(Section):
    log_every_steps: int = Field(20, ge=1)
    """steps per metrics.jsonl record"""
    progress: bool = True
    """show a progress bar on a terminal"""
    plot: bool = True
    """write training.png beside summary.json at the end"""
    save_predictions: bool = False
    """write predictions.parquet beside summary.json: the final evaluation's scores (column
    `score`, float32, the ones its AUC was computed from) in eval-split order, with `label`
    (and `weight` where the data has weights); also after Ctrl-C in a local run"""
    tensorboard: bool = False
    """also write metrics.jsonl's records as TensorBoard event files in OUT/tb/ (loss, AUC,
    log loss, NE, calibration, samples/s, staleness, mode, checkpoints and recoveries): needs
    the optional extra, `pip install 'recsync[tensorboard]'`"""
    save_model: bool = True
    """write the trained model to OUT/model/ at the end of a completed run (docs/serving.md)"""
    save_optimizer_state: bool = False
    """OUT/model/ also keeps the rows' and the dense optimizer's state (to train on from it)"""
    upload_every_s: float = Field(60.0, gt=0)
    """with `--out` at a URL: how often metrics.jsonl goes up while the run lasts (checkpoints
    go up as they are written, the other outputs when the run ends)"""


class NetworkConfig(Section):
    """EMULATED network delay on every call to a PS shard (pull, push), for experiments; every
    report of a run with it says so."""

    latency_ms: float = Field(0.0, ge=0)
    """added to each call, half on the way there and half on the way back"""
    ms_per_mb: float = Field(0.0, ge=0)
    """added per MB a call carries (request and answer), e.g. 8 for 1 Gbit/s"""

    @property
    def enabled(self) -> bool:
        return self.latency_ms > 0 or self.ms_per_mb > 0


class EmulationConfig(Section):
    """An EMULATED cluster on one machine: each worker and PS shard paces itself so that its
    wall time per step (per request, for a shard) is at least the CPU time it used divided by
    its cores, as a separate machine with that many cores would take, whatever the other
    processes on this machine do. An emulated straggler then slows only itself. Every report
    of a run with it says so. 0 = off (processes share the machine's cores)."""

    cores_per_worker: float = Field(0.0, ge=0)
    """cores of each emulated worker machine (e.g. 0.25); its Hogwild threads share them"""
    cores_per_shard: float = Field(0.0, ge=0)
    """cores of each emulated PS shard machine"""
    cores_per_shadow: float = Field(0.0, ge=0)
    """mode shadow: cores of each trainer's shadow thread, paced on a machine of their own
    (a trainer with a core to spare for its background rounds, as the ShadowSync paper's
    have); 0 = the rounds share the trainer's cores_per_worker"""
    reserve_cores: float = Field(0.5, ge=0)
    """cores left for Ray, the driver and the work queue: a run whose emulated cores exceed
    the machine's cores minus this is refused"""

    @property
    def enabled(self) -> bool:
        return self.cores_per_worker > 0 or self.cores_per_shard > 0


class RecoveryConfig(Section):
    kind: Literal["none", "full", "partial", "auto"] = "none"
    """what a PS shard's death does: "none" stops the run with an error; "full" rolls every
    shard, the workers and the data position back to the last checkpoint of the job (the
    classic recovery: the work since is done again); "partial" restarts the shard alone from
    its own last checkpoint while the other shards and the workers go on (the updates it
    applied since are lost, counted in summary recovery.pls; not with the modes whose shards
    move in lock-step, sync and hybrid); "auto" chooses between the two at run time from
    mtbf_s and the first checkpoint's measured cost (partial only if its expected overhead is
    lower; logged). All need checkpoint_every_s or mtbf_s"""
    rows: Literal["all", "mfu", "ssu"] = "all"
    """what a partial-recovery checkpoint saves (CPR): "all" every row touched; "mfu" the
    mfu_fraction most used rows since their last save, with a full save every full_every
    checkpoints; "ssu" the rows touched by a sub-sample (ssu_rate) of the training samples,
    at most ssu_max_rows per shard between saves, with a full save every full_every"""
    mfu_fraction: float = Field(0.1, gt=0, le=1)
    """rows = "mfu": the share of the rows used since their last save that a checkpoint saves"""
    ssu_rate: float = Field(0.02, gt=0, le=1)
    """rows = "ssu": the share of training samples whose rows are recorded"""
    ssu_max_rows: int = Field(100_000, ge=1)
    """rows = "ssu": at most this many rows recorded per shard between saves (bounded memory;
    further rows wait for the next full save)"""
    full_every: int = Field(4, ge=1)
    """rows = "mfu" or "ssu": every this many checkpoints is a full one (the base the
    partial ones after it apply to)"""
    checkpoint_every_s: float = Field(0.0, ge=0)
    """write a checkpoint of every PS shard this often, in seconds of training (0: never, or
    chosen from mtbf_s). A shard blocks only while it copies its state; a thread of its own
    writes it"""
    mtbf_s: float = Field(0.0, ge=0)
    """mean time between failures, for choosing the interval when checkpoint_every_s is 0:
    the first checkpoint measures the save cost; full recovery then uses Young's interval
    sqrt(2 x cost x MTBF), partial recovery the longest interval whose expected portion of
    lost samples stays under pls_target (recsync/checkpoint/interval.py); the inputs and the
    decision are logged"""
    pls_target: float = Field(0.01, gt=0, lt=1)
    """partial recovery: the expected portion of lost samples the interval may cost"""
    keep: int = Field(2, ge=1)
    """checkpoints kept per shard (older ones are deleted once a newer one is complete)"""
    standby_shards: int = Field(-1, ge=-1)
    """warm standby PS shards: processes started with the run (torch and recsync imported, no
    state) of which one takes over a dead shard, its place for every client and its last
    checkpoint, so that pulls wait only for the load; a new standby then starts in the
    background. -1: 1 when kind is not "none", else 0; 0: Ray restarts the dead shard's
    process instead (seconds: a new process imports torch and recsync)"""

    @property
    def standbys(self) -> int:
        """standby_shards resolved (-1: 1 with recovery on)."""
        if self.standby_shards >= 0:
            return self.standby_shards
        return 1 if self.kind != "none" else 0
    dir: str = ""
    """where checkpoints go (empty: the run's --out directory/checkpoints); on a cluster, a
    directory every node can write to"""


class StragglerConfig(Section):
    worker: int = Field(ge=0)
    factor: float = Field(ge=1.0)
    """the worker runs this many times slower: between computing a step's gradients and sending
    them it sleeps (factor - 1) x the compute time, so its gradients arrive late and stale"""
    start_s: float = Field(0.0, ge=0)
    end_s: float = Field(float("inf"), allow_inf_nan=True)

    @model_validator(mode="after")
    def _check_window(self):
        if self.end_s <= self.start_s:
            raise ValueError(f"end_s ({self.end_s}) must be after start_s ({self.start_s})")
        return self


class AtPoint:
    """A schedule entry due at a time or at a step (switching.schedule, faults.kills): its
    section has ``at_s`` (seconds after training starts) and ``at_step`` (steps the most
    advanced worker has done), exactly one of them >= 0."""

    def reached(self, elapsed_s: float, step: int) -> bool:
        """Whether the entry is due ``elapsed_s`` seconds into training, with the most advanced
        worker at ``step`` steps."""
        return 0 <= self.at_s <= elapsed_s or 0 <= self.at_step <= step

    @property
    def when(self) -> str:
        """"at_s = 12.5" or "at_step = 40", as the config gives it."""
        return f"at_s = {self.at_s:g}" if self.at_s >= 0 else f"at_step = {self.at_step}"

    def check_one_point(self, what: str):
        if (self.at_s >= 0) == (self.at_step >= 0):
            raise ValueError(f"{what} needs exactly one of at_s and at_step (>= 0), got "
                             f"at_s = {self.at_s}, at_step = {self.at_step}")
        return self


class KillConfig(Section, AtPoint):
    target: Literal["worker", "ps", "standby"]
    """a worker, a PS shard, or a waiting standby shard (recovery.standby_shards)"""
    index: int = Field(ge=0)
    at_s: float = Field(-1.0)
    """seconds after training starts (set this or at_step)"""
    at_step: int = Field(-1)
    """when the most advanced worker has done this many steps (set this or at_s)"""
    during: Literal["", "checkpoint_write"] = ""
    """"checkpoint_write" (a PS shard, recovery on): the kill is armed at at_s (or at_step) and
    the shard exits in the middle of its next checkpoint write, its data file written and its
    manifest not (a crash while writing)"""

    @model_validator(mode="after")
    def _check_when(self):
        return self.check_one_point(f"a kill of {self.target} {self.index}")


class FaultsConfig(Section):
    stragglers: list[StragglerConfig] = []
    """emulated slow workers"""
    kills: list[KillConfig] = []
    """processes killed (os._exit) at given times or steps, e.g.
    [{ target = "ps", index = 1, at_s = 20.0 }, { target = "worker", index = 0, at_step = 40 }]"""
    kill_mean_s: float = Field(0.0, ge=0)
    """if > 0, also kill random processes of kill_target with this mean time between kills
    (seconds; exponential inter-arrival times)"""
    kill_target: Literal["worker", "ps", "any"] = "worker"
    """whose processes kill_mean_s kills: "worker", "ps" (a shard), or "any" (each kill picks
    one of the workers and shards, all equally likely)"""
    seed: int = Field(0, ge=0)
    """seed of the kill_mean_s schedule: the same seed, the same kills"""

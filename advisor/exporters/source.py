"""What every exporter reads: the plan, where it came from, and the facts a stack needs that a
plan does not hold in one field (the schedule's length, the node count, the repeated block).

Nothing here imports torch at module level; the block class is resolved lazily (building the
model on ``meta``) and only by the exporters that need it.
"""

from __future__ import annotations

import functools
import json
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from advisor.errors import UsageProblem
from profilers.metrics_record import read_metrics
from profilers.rundir import PLAN, TUNED_PLAN, RunDir
from strategies.config import DEFAULT_STEPS, TrainConfig
from strategies.plan_records import Plan

# The rendezvous placeholder of a multi-node launch line: the user fills in node 0's address.
# torchrun's c10d rendezvous numbers the nodes itself (its --node-rank is for the static
# rendezvous only: torchrun ignores it under c10d, with a warning), so every node runs the same
# line. Accelerate's static rendezvous and DeepSpeed's ssh-less launch do take each node's rank:
# their lines read it from $NODE_RANK (written unquoted so that a shell expands it).
MASTER_ENDPOINT = "MASTER_HOST:29500"
NODE_RANK = "${NODE_RANK}"
TRAIN_SCRIPT = "train.py"  # stands for the user's own training script in launch lines


@dataclass(frozen=True, kw_only=True)
class Source:
    """A plan and the facts around it that an export states.

    ``steps``: optimizer steps the lr schedule spans (``steps_source`` says where that number
    came from); ``nodes``: machines the ranks are spread over (the plan's what-if request, else
    1); ``device_kind``: ``cuda`` or ``cpu``, the machine the plan was made for; ``trained``:
    what training this plan in the run directory measured, if it did; ``notes``: header lines
    about which plan file of a run directory was taken (its tuned plan or not, and why).
    """

    plan: Plan
    origin: str
    steps: int
    steps_source: str
    nodes: int
    device_kind: str
    trained: Trained | None = None
    notes: tuple[str, ...] = ()

    @property
    def config(self) -> TrainConfig:
        return self.plan.config

    @property
    def procs_per_node(self) -> int:
        return max(1, self.config.world_size // self.nodes)

    @property
    def on_gpu(self) -> bool:
        return self.device_kind == "cuda"


def plan_file(path: str | Path) -> Path:
    """A plan.json given as the file or as the run directory that holds it."""
    path = Path(path)
    return RunDir(path).plan if path.is_dir() else path


def load_plan(path: str | Path) -> Plan:
    """Read a plan.json (or RUN/plan.json); a missing or unreadable plan is a UsageProblem."""
    file = plan_file(path)
    # a tuned plan comes from 'advisor tune', every other from 'advisor recommend'
    maker = "advisor tune" if file.name == TUNED_PLAN else "advisor recommend"
    if not file.is_file():
        raise UsageProblem(
            f"no plan at {file}: pass a run directory holding {PLAN} or the plan.json that "
            "'advisor recommend' wrote"
        )
    try:
        data = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageProblem(
            f"plan file {file} is not readable JSON ({' '.join(str(exc).split())}): "
            f"regenerate it with '{maker}'"
        ) from None
    if not isinstance(data, dict) or "config" not in data or "predicted" not in data:
        raise UsageProblem(
            f"{file} is not a plan (no 'config' and 'predicted'): pass the plan that "
            f"'{maker}' wrote"
        )
    try:
        return Plan.from_dict(data)
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageProblem(
            f"plan file {file} cannot be read ({' '.join(str(exc).split())}): regenerate it "
            f"with '{maker}'"
        ) from None


def export_plan_file(path: str | Path) -> tuple[Path, tuple[str, ...]]:
    """The plan file an export of ``path`` reads, and the header notes that say why.

    A file is itself. A run directory gives its tuned plan (``RUN/tuned_plan.json``, advisor
    tune's lr / warm-up / weight decay at ``RUN/plan.json``'s config, the plan ``advisor run
    --tune-trials`` trains) when it has one tuned at the config ``RUN/plan.json`` holds now,
    else ``RUN/plan.json``; the notes say which was taken and how to export the other.
    (:func:`plan_file`, for ``advisor tune``, always means ``RUN/plan.json``.)"""
    path = Path(path)
    if not path.is_dir():
        return path, ()
    run = RunDir(path)
    if not run.tuned_plan.is_file():
        return run.plan, ()
    try:
        tuned = load_plan(run.tuned_plan)
    except UsageProblem as exc:
        raise UsageProblem(
            f"{exc}; or export {run.plan}, the untuned plan" if run.plan.is_file() else str(exc)
        ) from None
    if not run.plan.is_file():
        return run.tuned_plan, (
            f"{TUNED_PLAN}: advisor tune's hyper-parameters (this directory has no {PLAN})",
        )
    from strategies.tuning import speed_changes

    changed = speed_changes(load_plan(run.plan).config, tuned.config)
    if changed:
        return run.plan, (
            f"{run.tuned_plan} not used: it was tuned at another config than {PLAN}'s "
            f"({', '.join(changed)} differ); re-run 'advisor tune --plan {run.plan}', or export "
            f"{run.tuned_plan} itself",
        )
    return run.tuned_plan, (
        f"{TUNED_PLAN}: {PLAN}'s config with advisor tune's hyper-parameters (the plan 'advisor "
        f"run --tune-trials' trains); export {run.plan} for the untuned values",
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Trained:
    """What RUN/train measured while training the plan: medians over its steps, the first
    tenth (warm-up: allocator, caches, compilation) left out."""

    total_steps: int
    num_steps: int
    step_time_s: float | None
    tokens_per_s: float | None


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _trained(run_root: Path, config: TrainConfig) -> Trained | None:
    """RUN/train's length and speed when it trained this very config, else None."""
    train = RunDir(run_root).train
    try:
        data = json.loads(train.train_config.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict) or data.get("config") != config.to_dict():
        return None
    total = data.get("total_steps")
    if not isinstance(total, int) or isinstance(total, bool) or total < 1:
        return None
    try:
        steps = read_metrics(train.metrics).train
    except (OSError, UnicodeDecodeError):
        steps = []
    kept = steps[max(1, len(steps) // 10) :] if len(steps) > 1 else steps
    return Trained(
        total_steps=total,
        num_steps=len(kept),
        step_time_s=_median([r.step_time_s for r in kept if r.step_time_s is not None]),
        tokens_per_s=_median([r.tokens_per_s for r in kept if r.tokens_per_s is not None]),
    )


def make_source(plan: Plan | str | Path, *, steps: int | None = None) -> Source:
    """The Source of a Plan record, a plan.json or a run directory."""
    notes: tuple[str, ...] = ()
    if isinstance(plan, Plan):
        record, origin, trained = plan, "a plan given in memory", None
    else:
        file, notes = export_plan_file(plan)
        record = load_plan(file)
        origin = str(file)
        # RUN or RUN/plan.json alike: the run's training is beside its plan either way
        trained = _trained(file.parent, record.config)
    if steps is not None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise UsageProblem(f"--steps must be a positive integer, got {steps!r}")
        steps_source = "as asked (--steps)"
    elif trained is not None:
        steps, steps_source = trained.total_steps, "the length of this run's training (RUN/train)"
    else:
        steps = DEFAULT_STEPS
        steps_source = "advisor train's default; pass --steps for your run's length"
    request = record.profile.get("request") if isinstance(record.profile, Mapping) else None
    nodes = request.get("nodes") if isinstance(request, Mapping) else None
    nodes = nodes if isinstance(nodes, int) and nodes >= 1 else 1
    if record.config.world_size % nodes:
        nodes = 1
    kind = str(record.machine.get("kind") or "cpu")
    return Source(
        plan=record,
        origin=origin,
        steps=steps,
        steps_source=steps_source,
        nodes=nodes,
        device_kind="cuda" if kind == "cuda" else "cpu",
        trained=trained,
        notes=notes,
    )


def adam_hyperparameters() -> tuple[float, float, float]:
    """(beta1, beta2, eps) of the trainer's AdamW (advisor.trainer.step.build_optimizer)."""
    from advisor.trainer.step import ADAM_BETAS, ADAM_EPS

    return ADAM_BETAS[0], ADAM_BETAS[1], ADAM_EPS


@functools.lru_cache(maxsize=32)
def _block_class(model: str, model_args: str) -> tuple[tuple[str, str], ...] | str:
    from advisor.models.registry import build_model

    try:
        adapter = build_model(model, json.loads(model_args), meta=True)
        blocks = adapter.blocks()
    except Exception as exc:  # a user's factory may raise anything: the header says why
        return " ".join(str(exc).split()) or type(exc).__name__
    if not len(blocks):
        return "the model has no repeated blocks"
    classes = dict.fromkeys(type(block) for block in blocks)  # in order, each once
    return tuple((cls.__module__, cls.__qualname__) for cls in classes)


@functools.lru_cache(maxsize=32)
def _num_layers(model: str, model_args: str) -> int | None:
    try:
        from advisor.workload import AdvisorWorkload

        return AdvisorWorkload(model=model, model_args=json.loads(model_args)).facts().num_layers
    except Exception:  # an unavailable model (a missing extra or file): the caller says so
        return None


def num_layers(config: TrainConfig) -> int | None:
    """The model's number of repeated blocks (built on ``meta``), None if it cannot be built."""
    return _num_layers(config.model, json.dumps(dict(config.model_args), sort_keys=True))


def block_class(config: TrainConfig) -> tuple[tuple[str, str], ...] | str:
    """(module, class name) of each class of the model's repeated blocks, which FSDP wraps and
    checkpointing recomputes (one for a Transformer; Jamba's attention and Mamba layers are
    two), or why they could not be found (the model is built on ``meta``: no memory)."""
    return _block_class(config.model, json.dumps(dict(config.model_args), sort_keys=True))


# What an export writes for the block class when the plan's model is one of advisor's own
# presets, which the user's model is not: FSDP's auto-wrap and checkpointing policies match
# blocks by class, and a class the user's model lacks makes Accelerate and the HF Trainer raise
# but Lightning's FSDPStrategy wrap and checkpoint nothing, silently (audit 41, D5).
PLACEHOLDER_MODULE = "your_model"
PLACEHOLDER_BLOCK = "YourBlock"
# The transformers class that plays the part of each advisor preset family's block.
_TRANSFORMERS_COUNTERPART = {
    "advisor.models.gpt": "GPT2Block (GPT2LMHeadModel)",
    "advisor.models.llama": "LlamaDecoderLayer (LlamaForCausalLM)",
    "advisor.models.bert": "BertLayer (BertForMaskedLM)",
}


@dataclass(frozen=True, kw_only=True, slots=True)
class StackBlocks:
    """The block classes an export's FSDP wrap / checkpointing policy names, as (module,
    name): the model's own when the user's stack can have them (an ``hf:`` model's transformers
    layer, a user's factory's class), else the placeholder ``your_model.YourBlock``. ``note``:
    the header line (after "parallelism fsdp: ") that says what to write there; None when the
    classes are the model's own. ``unknown``: why the blocks could not be found (then
    ``classes`` is empty)."""

    classes: tuple[tuple[str, str], ...]
    note: str | None = None
    unknown: str | None = None

    @property
    def names(self) -> list[str]:
        return [name for _, name in self.classes]

    @property
    def paths(self) -> list[str]:
        return [".".join(cls) for cls in self.classes]


def stack_blocks(config: TrainConfig) -> StackBlocks:
    """What an export names as the repeated block (see :class:`StackBlocks`)."""
    found = block_class(config)
    if isinstance(found, str):
        return StackBlocks(classes=(), unknown=found)
    ours = [cls for cls in found if cls[0] == "advisor" or cls[0].startswith("advisor.")]
    if not ours:
        return StackBlocks(classes=found)
    module, name = ours[0]
    counterpart = _TRANSFORMERS_COUNTERPART.get(module)
    example = f" (e.g. transformers' {counterpart})" if counterpart else ""
    return StackBlocks(
        classes=((PLACEHOLDER_MODULE, PLACEHOLDER_BLOCK),),
        note=(
            f"the repeated block of model {config.model} is {module}.{name}, advisor's own "
            f"class, which your model does not have: replace the placeholder "
            f"{PLACEHOLDER_BLOCK} with your model's block class{example}"
        ),
    )


def torchrun_line(source: Source, *program: str) -> str:
    """``torchrun ... PROGRAM``: standalone on one node, else a c10d rendezvous at node 0, the
    same line on every node (strategies.commands.torchrun_args writes the options; its
    ``--node-rank``, which c10d ignores, is left out)."""
    from strategies.commands import torchrun_args

    if source.nodes > 1:
        options = torchrun_args(
            source.procs_per_node,
            nnodes=source.nodes,
            node_rank=None,
            rdzv_endpoint=MASTER_ENDPOINT,
        )
    else:
        options = torchrun_args(source.procs_per_node)
    return " ".join(["torchrun", *options, *program])


def multinode_line(source: Source, how: str) -> list[str]:
    """The header line of a plan over several nodes: ``how`` says what to run on each."""
    if source.nodes <= 1:
        return []
    c = source.config
    return [
        f"world_size {c.world_size} over {source.nodes} nodes ({source.procs_per_node} ranks "
        f"each): {how}"
    ]


TORCHRUN_NODES = (
    "run the launch line on each node, with MASTER_HOST replaced by node 0's address (torchrun's "
    f"c10d rendezvous at port {MASTER_ENDPOINT.split(':')[1]} there numbers the nodes itself)"
)


def torchrun_world_size(launch: str) -> int:
    """The ranks a torchrun line starts (nproc per node × nodes), read by torchrun's own parser."""
    import shlex

    from torch.distributed.run import get_args_parser

    # The line is a template: each node puts its own rank where NODE_RANK stands (node 0 here).
    words = [w.replace(NODE_RANK, "0") for w in shlex.split(launch)]
    while words and "=" in words[0] and not words[0].startswith("-"):  # VAR=value prefixes
        words = words[1:]
    if not words or words[0] != "torchrun":
        raise ValueError(f"not a torchrun line: {launch!r}")
    try:
        args = get_args_parser().parse_args(words[1:])
    except SystemExit:  # argparse has printed why
        raise ValueError(f"torchrun does not accept {launch!r}") from None
    nnodes = str(args.nnodes).split(":")[-1]
    return int(args.nproc_per_node) * int(nnodes)

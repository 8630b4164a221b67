"""--against-one-rank: does the N-rank job compute what one process computes on the same global batch?

Two roles, one per launch (``Recorder.one_rank``):

- **record**, in every rank of the N-rank run, for its first K optimizer steps: each DataLoader batch
  as yielded (and the sample indices it was drawn from), the value each backward started from, the
  rows each DDP training forward took, the DDP modules' BatchNorm and dropout layers, and on rank 0
  the optimizers' parameters and DDP's buffers at the first batch of every step, and the averaged
  gradients each optimizer step sees. Kept in memory, written once (``rank{r}.pt``) after step K or
  at exit. Nothing is sent between ranks and nothing the script computes changes.
- **replay**, in one process running the same script afterwards (world size 1, ``--max-steps K``):
  every loader of the recorded run yields the global batch instead of drawing its own (the ranks'
  batches joined, or the union of their indices collated, batch_union.py); at the first batch of step k
  the optimizers' parameters get rank 0's from before step k (matched through the optimizers, in the
  order the script built them: one process may build no DDP), so each step is compared from the same
  point and floating-point drift cannot accumulate; at each optimizer step the gradients are compared
  with the N ranks' averaged ones. What makes an exact comparison impossible (dropout, a step that
  draws random numbers, BatchNorm's per-rank statistics, batches that cannot be joined) is listed as a
  limit. The measurements go to ``one-rank.json``; the global-batch check judges them.
"""

from __future__ import annotations

import collections
import json
import os
import weakref
from typing import Any, Callable, Optional

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils.data.dataloader import _BaseDataLoaderIter

from ddpdoctor.rank import batch_union
from ddpdoctor.rank.bounds import RunCut
from ddpdoctor.rank.probes import data as data_probe
from ddpdoctor.rank.probes import ddp as ddp_probe
from ddpdoctor.rank.probes.content import first_tensor
from ddpdoctor.rank.probes.optimizer import params_of
from ddpdoctor.rank.probes.patching import patch
from ddpdoctor.rank.recorder import Recorder
from ddpdoctor.schema.settings import ONE_RANK_RESULT

PROBE = "one_rank"
RECORD, REPLAY = "record", "replay"
_BATCHNORM_TYPES = (torch.nn.modules.batchnorm._BatchNorm,)
_DROPOUT_TYPES = (torch.nn.modules.dropout._DropoutNd,)


def rank_file(directory: str, rank: int) -> str:
    return os.path.join(directory, f"rank{rank}.pt")


def _merge(into: dict[str, list[str]], found: dict[str, list[str]]) -> None:
    """Add ``found``'s names to ``into``, kind by kind, each name once."""
    for kind, names in found.items():
        known = into.setdefault(kind, [])
        known.extend(n for n in names if n not in known)


class _Common:
    """What both roles follow: DDP modules, loader passes, optimizer steps, backward roots."""

    def __init__(self, rec: Recorder, directory: str, steps: int) -> None:
        self.rec = rec
        self.directory = directory
        self.steps = steps
        self.modules: list[weakref.ref] = []  # DDP wrappers, in the order they were built
        self.loader_of: "weakref.WeakKeyDictionary[Any, tuple[str, int]]" = weakref.WeakKeyDictionary()
        self.pass_counts: dict[str, int] = collections.Counter()
        self.drawn: "weakref.WeakKeyDictionary[Any, collections.deque]" = weakref.WeakKeyDictionary()
        self.step_counts: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()
        self.built: list[weakref.ref] = []  # optimizers in the order the script built them
        self.running: Optional[Any] = None  # the optimizer whose step runs (a nested one's is ignored)
        self.losses: dict[int, list[Optional[float]]] = {}  # step -> the values backward started from
        self.inputs: dict[int, list[torch.Tensor]] = {}  # step -> the rows its DDP training forwards took
        self.step_started: set[int] = set()

    @property
    def active(self) -> bool:
        return self.rec.num_steps < self.steps

    # -- DDP modules ----------------------------------------------------------------------------
    def attached(self, ddp: DistributedDataParallel, state: Any) -> None:
        self.modules.append(weakref.ref(ddp))

    def buffers(self) -> dict[str, torch.Tensor]:
        """Every DDP module's buffers, keyed "index:name" (parameters are taken through the optimizers)."""
        out: dict[str, torch.Tensor] = {}
        for index, ref in enumerate(self.modules):
            ddp = ref()
            if ddp is not None:
                out.update({f"{index}:{name}": b for name, b in ddp.module.named_buffers()})
        return out

    def module_limits(self) -> dict[str, list[str]]:
        """What in the DDP modules makes one process compute otherwise than N ranks, by kind: BatchNorm in
        training mode (not SyncBatchNorm) normalizes per rank, dropout draws masks per rank."""
        found: dict[str, list[str]] = {}
        for ref in self.modules:
            ddp = ref()
            for name, module in ddp.module.named_modules() if ddp is not None else ():
                if not module.training:
                    continue
                if isinstance(module, _BATCHNORM_TYPES) and not isinstance(module, torch.nn.SyncBatchNorm):
                    found.setdefault("batchnorm", []).append(f"`{name}`")
                elif isinstance(module, _DROPOUT_TYPES) and module.p > 0:
                    found.setdefault("dropout", []).append(f"`{name}` (p={module.p:g})")
        return found

    def optimizer_params(self) -> list[list[torch.Tensor]]:
        """Each optimizer's parameters (in the order the script built the optimizers, then param_groups order):
        the same in the N-rank run and the replay, whether or not the replay wraps the model in DDP."""
        out = []
        for ref in self.built:
            optimizer = ref()
            out.append([] if optimizer is None else params_of(optimizer))
        return out

    def built_index(self, optimizer: Any) -> Optional[int]:
        return next((i for i, ref in enumerate(self.built) if ref() is optimizer), None)

    # -- loaders (data probe listener) ----------------------------------------------------------
    probe = PROBE

    def started(self, iterator: Any, loader: Any) -> None:
        key, _ = data_probe.loader_key(loader)
        number = self.pass_counts[key]
        self.pass_counts[key] += 1
        self.loader_of[iterator] = (key, number)
        self.drawn[iterator] = collections.deque()

    def yielded(self, iterator: Any, batch: Any) -> None:
        pass

    def ended(self, iterator: Any, complete: bool) -> None:
        pass

    def next_indices(self, iterator: Any) -> Optional[list[int]]:
        """The sample indices of the batch the iterator yields now (drawn in order, maybe ahead by workers)."""
        queue = self.drawn.get(iterator)
        if not queue:
            return None
        index = queue.popleft()
        return list(index) if isinstance(index, (list, tuple)) else None

    # -- steps -----------------------------------------------------------------------------------
    def first_batch_of_step(self) -> Optional[int]:
        """The step (1-based) a batch yielded now starts, if it is the first batch since the last step."""
        step = self.rec.num_steps + 1
        if step > self.steps or step in self.step_started:
            return None
        self.step_started.add(step)
        return step

    def optimizer_step(self, optimizer: Any) -> Optional[str]:
        """"index:n" of a (not nested) optimizer's step within the first K (index: the order it was built in),
        else None."""
        if not self.active or self.running is not None and self.running is not optimizer:
            return None
        self.running = optimizer
        index = self.built_index(optimizer)
        count = self.step_counts[optimizer] = self.step_counts.get(optimizer, 0) + 1
        return None if index is None else f"{index}:{count}"

    def backward_root(self, tensors: Any, grad_tensors: Any) -> None:
        if not self.active:
            return
        roots = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors or [])
        values = self.losses.setdefault(self.rec.num_steps + 1, [])
        if grad_tensors is None and len(roots) == 1 and isinstance(roots[0], torch.Tensor) and roots[0].numel() == 1:
            values.append(float(roots[0].detach().double().sum()))
        else:
            values.append(None)  # not a scalar loss: not compared

    def on_forward(self, ddp: Any, state: Any, inputs: tuple, kwargs: dict) -> None:
        """A DDP forward: the rows of its first input, to prove the replay fed the model the ranks' data."""
        if not (self.active and torch.is_grad_enabled() and ddp.training):
            return
        with self.rec.guard(PROBE, "forward"):
            tensor = first_tensor((inputs, kwargs))
            if tensor is not None and tensor.dim() >= 1 and tensor.shape[0] > 0:
                self.inputs.setdefault(self.rec.num_steps + 1, []).append(batch_union.row_prefixes(tensor))

    def install(self) -> Callable[[], None]:
        rec = self.rec
        ddp_probe.ATTACH_LISTENERS.append(self.attached)
        ddp_probe.BEFORE_FORWARD.append(self.on_forward)
        data_probe.LISTENERS.append(self)

        def wrap_next_index(original: Any) -> Any:
            def _next_index(iterator: Any) -> Any:
                index = original(iterator)
                queue = self.drawn.get(iterator)
                if queue is not None and self.active:
                    queue.append(index)
                return index

            return _next_index

        patch(rec, PROBE, _BaseDataLoaderIter, "_next_index", wrap_next_index)

        def wrap_optimizer_init(original: Any) -> Any:
            def __init__(optimizer: Any, *args: Any, **kwargs: Any) -> None:
                original(optimizer, *args, **kwargs)
                if self.active and self.built_index(optimizer) is None:
                    self.built.append(weakref.ref(optimizer))

            return __init__

        patch(rec, PROBE, torch.optim.Optimizer, "__init__", wrap_optimizer_init)

        def wrap_backward(original: Any) -> Any:
            def backward(tensors: Any, grad_tensors: Any = None, *args: Any, **kwargs: Any) -> Any:
                if not torch.compiler.is_compiling():
                    with rec.guard(PROBE, "backward"):
                        self.backward_root(tensors, grad_tensors)
                return original(tensors, grad_tensors, *args, **kwargs)

            return backward

        patch(rec, PROBE, torch.autograd, "backward", wrap_backward)

        def pre_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
            with rec.guard(PROBE, "step"):
                key = self.optimizer_step(optimizer)
                if key is not None:
                    self.before_step(optimizer, key)

        def post_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
            if self.running is optimizer:
                self.running = None
            with rec.guard(PROBE, "step"):
                if rec.num_steps >= self.steps:
                    self.done()

        handles = [register_optimizer_step_pre_hook(pre_hook), register_optimizer_step_post_hook(post_hook)]

        def finish() -> None:
            for handle in handles:
                handle.remove()
            for listeners, own in ((ddp_probe.ATTACH_LISTENERS, self.attached), (data_probe.LISTENERS, self),
                                   (ddp_probe.BEFORE_FORWARD, self.on_forward)):
                if own in listeners:
                    listeners.remove(own)
            with rec.guard(PROBE, "finish"):
                self.done()

        return finish

    def before_step(self, optimizer: Any, key: str) -> None:
        raise NotImplementedError

    def done(self) -> None:
        raise NotImplementedError


class Record(_Common):
    """Each rank of the N-rank run keeps what the replay needs, and writes it once."""

    def __init__(self, rec: Recorder, directory: str, steps: int) -> None:
        super().__init__(rec, directory, steps)
        self.batches: dict[str, list[list[dict[str, Any]]]] = {}  # loader key -> passes -> batches
        self.complete: dict[str, list[bool]] = {}  # loader key -> whether each pass ran to its end
        self.states: dict[str, dict[str, Any]] = {}  # rank 0: "step{k}" -> the optimizers' parameters, DDP's buffers
        self.grads: dict[str, dict[str, list]] = {}  # rank 0: "optimizer:n" -> names and averaged gradients
        self.limits: dict[str, list[str]] = {}  # what the DDP modules hold that one process computes otherwise
        self.written = False

    @property
    def lead(self) -> bool:
        return not self.rec.rank

    def started(self, iterator: Any, loader: Any) -> None:
        super().started(iterator, loader)
        if self.active:
            key, number = self.loader_of[iterator]
            passes = self.batches.setdefault(key, [])
            while len(passes) <= number:
                passes.append([])
                self.complete.setdefault(key, []).append(False)

    def yielded(self, iterator: Any, batch: Any) -> None:
        if not self.active or iterator not in self.loader_of:
            return
        indices = self.next_indices(iterator)
        with self.rec.guard(PROBE, "batch"):
            step = self.first_batch_of_step()
            if step is not None:
                _merge(self.limits, self.module_limits())
            if step is not None and self.lead:
                self.states[f"step{step}"] = {
                    "params": [[p.detach().clone() for p in params] for params in self.optimizer_params()],
                    "buffers": {k: b.detach().clone() for k, b in self.buffers().items()}}
            key, number = self.loader_of[iterator]
            self.batches[key][number].append({"indices": indices, "batch": batch_union.copy_batch(batch)})

    def ended(self, iterator: Any, complete: bool) -> None:
        entry = self.loader_of.get(iterator)
        if entry is not None and self.active and complete:
            self.complete[entry[0]][entry[1]] = True

    def before_step(self, optimizer: Any, key: str) -> None:
        if not self.lead:
            return
        params = params_of(optimizer)
        # DDP's parameters only: their gradients are the averaged ones one process should match
        self.grads[key] = {"names": [ddp_probe.PARAM_NAMES.get(id(p), f"parameter {i}") for i, p in enumerate(params)],
                           "grads": [None if p.grad is None or id(p) not in ddp_probe.PARAM_NAMES
                                     else p.grad.detach().clone() for p in params]}

    def done(self) -> None:
        if self.written or self.rec.rank is None:
            return
        self.written = True
        record = {"rank": self.rec.rank, "world_size": self.rec.world_size, "steps": self.rec.num_steps,
                  "batches": self.batches, "complete": self.complete, "losses": self.losses, "inputs": self.inputs,
                  "limits": self.limits,
                  "states": self.states, "grads": self.grads}
        try:
            torch.save(record, rank_file(self.directory, self.rec.rank))
        except Exception as exc:  # an unpicklable batch: the replay says so
            torch.save({"rank": self.rec.rank, "error": f"rank {self.rec.rank}'s batches could not be saved: {exc}"},
                       rank_file(self.directory, self.rec.rank))
        self.batches, self.states, self.grads = {}, {}, {}


class _Stop(Exception):
    """The replay cannot go on (its reason is a limit already noted)."""


class Replay(_Common):
    """The one process that replays the recorded run's first K steps."""

    def __init__(self, rec: Recorder, directory: str, steps: int) -> None:
        super().__init__(rec, directory, steps)
        self.result: dict[str, Any] = {"steps_requested": steps, "steps": [], "limits": [], "rows": 0, "fan_in": 0,
                                       "precision": "float32", "batches": "", "error": None}
        self.records: list[dict[str, Any]] = []
        self.positions: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()
        self.rng: Optional[tuple] = None
        self.rng_step = 0
        self.precisions: set[torch.dtype] = set()
        self.limit_kinds: set[str] = set()
        self.written = False
        try:
            self.load()
        except Exception as exc:
            self.result["error"] = f"the recorded run could not be read: {exc}"

    def load(self) -> None:
        files = sorted(f for f in os.listdir(self.directory) if f.startswith("rank") and f.endswith(".pt"))
        records = [torch.load(os.path.join(self.directory, f), map_location="cpu", weights_only=False) for f in files]
        records.sort(key=lambda r: r["rank"])
        if not records or [r["rank"] for r in records] != list(range(len(records))):
            raise ValueError(f"ranks {[r['rank'] for r in records]} left a record, not every rank")
        errors = [r["error"] for r in records if r.get("error")]
        if errors:
            raise ValueError(errors[0])
        self.records = records
        self.result["world_size"] = len(records)
        merged: dict[str, list[str]] = {}
        for record in records:
            _merge(merged, record.get("limits") or {})
        self.note_limits(merged)

    def note_limits(self, found: dict[str, list[str]]) -> None:
        shown = {k: v[:3] + ([f"{len(v) - 3} more"] if len(v) > 3 else []) for k, v in found.items()}
        if "batchnorm" in shown:
            self.limit(f"BatchNorm {', '.join(shown['batchnorm'])}: each rank normalizes its batch with its own "
                       "statistics; one process normalizes the global batch", "batchnorm")
        if "dropout" in shown:
            self.limit(f"dropout {', '.join(shown['dropout'])}: each rank draws its own masks; one process draws "
                       "others", "dropout")

    def limit(self, text: str, kind: Optional[str] = None) -> None:
        """Note what limits the comparison, once per ``kind`` (the first step it happened at is named)."""
        kind = kind or text
        if kind not in self.limit_kinds:
            self.limit_kinds.add(kind)
            self.result["limits"].append(text)

    # -- the global batch, in place of each loader's own --------------------------------------------
    def global_batch(self, iterator: Any) -> Any:
        """The next global batch of ``iterator``'s pass: the ranks' batches at this position, joined (or
        their indices collated); StopIteration where every rank's pass ended here."""
        key, number = self.loader_of[iterator]
        position = self.positions.get(iterator, 0)
        batches_of = [_batches_of_pass(r, key, number) for r in self.records]
        if any(position >= len(b) for b in batches_of):
            ended = [(r["complete"].get(key) or [])[number:number + 1] == [True] for r in self.records]
            if all(ended) and all(position == len(b) for b in batches_of):
                raise StopIteration
            self.limit("the recorded run holds no more batches for a loader at this point (a rank's pass ended "
                       "early, or the replay took another path than the ranks)")
            raise _Stop()
        self.positions[iterator] = position + 1
        per_rank = [b[position] for b in batches_of]
        batches = [b["batch"] for b in per_rank]
        try:
            joined = batch_union.join(batches)
            how = "joined"
        except ValueError as exc:
            indices = [b["indices"] for b in per_rank]
            dataset, collate = getattr(iterator, "_dataset", None), getattr(iterator, "_collate_fn", None)
            if any(i is None for i in indices) or dataset is None or collate is None \
                    or not getattr(iterator, "_auto_collation", False):
                self.limit(f"the ranks' batches cannot be joined into one ({exc}) and their sample indices are unknown")
                raise _Stop() from None
            try:
                joined = batch_union.collate_union(dataset, collate, indices, batches)
            except ValueError as again:
                self.limit(f"the ranks' batches cannot be joined into one ({exc}), and {again}")
                raise _Stop() from None
            how = "collated"
        if how not in self.result["batches"].split(", "):
            self.result["batches"] = ", ".join(filter(None, [self.result["batches"], how]))
        self.result["rows"] = max(self.result["rows"], batch_union.largest_tensor(joined))
        return joined

    def start_step(self, step: int) -> None:
        """The first batch of ``step``: rank 0's weights from before it, and the generators' state."""
        saved = self.records[0]["states"].get(f"step{step}")
        if saved:
            self.load_state(saved)
        self.note_modules()
        self.rng = _rng_state()
        self.rng_step = step

    def load_state(self, saved: dict[str, Any]) -> None:
        """Rank 0's parameters (through the optimizers, in order) and DDP buffers, copied in place."""
        with torch.no_grad():
            for params, theirs in zip(self.optimizer_params(), saved.get("params") or []):
                if len(params) != len(theirs):
                    self.limit("the optimizers hold other parameters in one process than on the ranks", "optimizers")
                    continue
                for p, value in zip(params, theirs):
                    if p.shape == value.shape:
                        p.copy_(value.to(p.device, p.dtype))
            own = self.buffers()
            for key, value in (saved.get("buffers") or {}).items():
                if key in own and own[key].shape == value.shape:
                    own[key].copy_(value.to(own[key].device, own[key].dtype))

    def note_modules(self) -> None:
        self.note_limits(self.module_limits())
        for p in (p for params in self.optimizer_params() for p in params):
            if p.is_floating_point():
                self.precisions.add(p.dtype)
            if p.dim() >= 2:
                self.result["fan_in"] = max(self.result["fan_in"], p.numel() // max(1, p.shape[0]))

    def on_forward(self, ddp: Any, state: Any, inputs: tuple, kwargs: dict) -> None:
        super().on_forward(ddp, state, inputs, kwargs)
        for device in ("cuda", "cpu"):
            try:
                if torch.is_autocast_enabled(device):
                    self.precisions.add(torch.get_autocast_dtype(device))
            except Exception:
                pass

    # -- the comparison --------------------------------------------------------------------------
    def before_step(self, optimizer: Any, key: str) -> None:
        if not self.records or self.result["error"]:
            return
        reference = self.records[0]["grads"].get(key)
        if reference is None:
            return
        step = self.rec.num_steps + 1
        if self.rng_step != step:
            self.limit(f"step {step} took no batch from a DataLoader the ranks recorded: data made outside a "
                       "DataLoader cannot be replayed", "no-loader")
            return
        theirs_rows = [t for r in self.records for t in (r.get("inputs") or {}).get(step, [])]
        # the rows are taken at DDP's forward; a script that wraps no DDP in one process is trusted to feed its loader's
        mine_rows = self.inputs.get(step, [])
        if (self.modules or mine_rows) and not batch_union.same_rows(theirs_rows, mine_rows):
            self.limit(f"at step {step} the model's inputs in one process are not the rows the ranks' forwards took "
                       "(data made or changed outside the DataLoader)", "inputs")
            return
        if self.rng is not None and _rng_state() != self.rng:
            self.limit(f"step {self.rng_step} draws random numbers between its batch and its optimizer step "
                       "(dropout, noise, random masks): one process draws others than the ranks did", "random")
        params = params_of(optimizer)
        names, grads = reference["names"], reference["grads"]
        if len(params) != len(grads):
            self.limit("the optimizers hold other parameters in one process than on the ranks", "optimizers")
            return
        rows: list[list[Any]] = []
        scalars: list[torch.Tensor] = []
        for p, name, theirs in zip(params, names, grads):
            if theirs is None or p.grad is None or p.grad.shape != theirs.shape:
                continue
            mine = p.grad.detach().double()
            theirs = theirs.to(mine.device, torch.float64)
            rows.append([name])
            scalars.append(torch.stack([torch.linalg.vector_norm(theirs - mine), torch.linalg.vector_norm(theirs),
                                        torch.linalg.vector_norm(mine), torch.sum(theirs * mine)]))
        if not scalars:
            self.limit(f"step {step} has no gradient that both the ranks and one process computed", "no-gradient")
            return
        values = torch.stack(scalars).cpu().tolist()  # one host transfer per step
        rows_of = [row + [float(v) for v in value] for row, value in zip(rows, values)]
        self.result["steps"].append({
            "optimizer": int(key.split(":")[0]), "step": step,
            "loss_ranks": _mean_of_sums([r["losses"].get(step) for r in self.records]),
            "loss_one": _sum(self.losses.get(step)), "params": rows_of})

    def done(self) -> None:
        if self.written:
            return
        self.written = True
        order = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
        lowest = max((order.index(d) for d in self.precisions if d in order), default=1)
        self.result["precision"] = str(order[lowest]).replace("torch.", "")
        with open(os.path.join(self.directory, ONE_RANK_RESULT), "w") as f:
            json.dump(self.result, f)

    def install(self) -> Callable[[], None]:
        finish = super().install()
        rec = self.rec

        def wrap_next(original: Any) -> Any:
            def __next__(iterator: Any) -> Any:
                if not self.records or iterator not in self.loader_of or not self.active:
                    return original(iterator)
                try:
                    batch = self.global_batch(iterator)
                except _Stop:
                    self.done()
                    raise RunCut("max-steps", rec.num_steps) from None
                step = self.first_batch_of_step()
                if step is not None:
                    with rec.guard(PROBE, "step start"):
                        self.start_step(step)
                rec.progress += 1
                return batch

            return __next__

        patch(rec, PROBE, _BaseDataLoaderIter, "__next__", wrap_next)

        def wrap_seeding(original: Any) -> Any:
            """A DataLoader iterator draws its workers' seed from the default generator when it starts a
            pass: the loader's own draw, not the step's, so it moves the step's reference state along."""
            def seeding(iterator: Any, *args: Any, **kwargs: Any) -> Any:
                before = _rng_state() if self.rng is not None else None
                result = original(iterator, *args, **kwargs)
                if before is not None and before == self.rng:
                    self.rng = _rng_state()
                return result

            return seeding

        patch(rec, PROBE, _BaseDataLoaderIter, "__init__", wrap_seeding)
        patch(rec, PROBE, _BaseDataLoaderIter, "_reset", wrap_seeding)

        def finish_all() -> None:
            if not self.built and not self.result["error"]:
                self.limit("no optimizer stepped in one process: nothing to compare")
            elif not self.result["steps"] and not self.result["error"] and not self.result["limits"]:
                self.limit("the replay reached no optimizer step with the recorded run's batches (data not from a "
                           "DataLoader cannot be replayed)")
            finish()

        return finish_all


def _batches_of_pass(record: dict[str, Any], key: str, number: int) -> list[dict[str, Any]]:
    """The batches a rank recorded in pass ``number`` of loader ``key`` (none where it made no such pass)."""
    passes = record["batches"].get(key) or []
    return passes[number] if number < len(passes) else []


def _rng_state() -> tuple:
    """The default generators' state: the CPU one, and CUDA's where a real GPU is in use."""
    state: list[Any] = [torch.random.get_rng_state()]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        try:
            state.extend(torch.cuda.get_rng_state_all())
        except Exception:
            pass
    return tuple(bytes(s.numpy().tobytes()) for s in state)


def _sum(values: Optional[list[Optional[float]]]) -> Optional[float]:
    if not values or any(v is None for v in values):
        return None
    return float(sum(v for v in values if v is not None))


def _mean_of_sums(per_rank: list[Optional[list[Optional[float]]]]) -> Optional[float]:
    sums = [_sum(v) for v in per_rank]
    if any(s is None for s in sums) or not sums:
        return None
    return float(sum(s for s in sums if s is not None) / len(sums))


def install(rec: Recorder) -> Optional[Callable[[], None]]:
    role, directory, steps = rec.one_rank
    if role == RECORD:
        return Record(rec, directory, steps).install()
    if role == REPLAY:
        return Replay(rec, directory, steps).install()
    return None


"""Facts derived from the evidence once and shared by the checks, which never import each other.

Each fact is computed on first use and cached on the :class:`Facts` object of one Evidence.
"""

from __future__ import annotations

import dataclasses
import functools
import textwrap
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from ddpdoctor.analysis import passes
from ddpdoctor.analysis.api import Location
from ddpdoctor.analysis.compare import group_by_value
from ddpdoctor.analysis.decode import DecodedError, decode
from ddpdoctor.schema.fingerprints import decode_fingerprints
from ddpdoctor.schema.indices import merge_encoded
from ddpdoctor.analysis.collective_trace import (Mismatch, RankTrace, first_mismatch, first_subgroup_mismatch,
                                                 subgroup_traces, trace_of)
from ddpdoctor.schema.events import (Collective, ConfigState, DDPRewrap, DDPUsage, DDPWrap, ExceptionEvent, Exit,
                                     InitProcessGroup, InternalCollectives, LoaderPass, OptimizerInfo, ProcessStart,
                                     RunCut, Step, SysExit)

if TYPE_CHECKING:
    from ddpdoctor.analysis.evidence import Evidence

# Errors a rank raises because a peer died or stopped answering: symptoms, not causes.
SECONDARY_MARKERS = (
    "Connection closed by peer", "Connection reset by peer", "Broken pipe", "ECONNRESET",
    "NCCL communicator was aborted", "Socket Timeout", "timed out", "DistNetworkError", "Connection refused",
    "process group has been destroyed", "ProcessGroupGloo::", "Read error", "Write error",
)

# A signal reaches the ranks and ddpdoctor about together (a terminal's process group, slurmstepd):
# what a rank raised this long before ddpdoctor saw the signal is still the signal's doing.
SIGNAL_SLACK_S = 1.0
_SIGNAL_EXIT_CODES = frozenset(128 + n for n in (1, 2, 10, 12, 15))  # SIGHUP, SIGINT, SIGUSR1, SIGUSR2, SIGTERM

# DDP's error when a parameter got no gradient, and the rewording Lightning raises instead.
REDUCTION_ERRORS = ("Expected to have finished reduction in the prior iteration",
                    "has parameters that were not used in producing the loss")


def is_reduction_error(message: str) -> bool:
    return any(marker in message for marker in REDUCTION_ERRORS)


@dataclass(frozen=True)
class Divergence:
    """The first fingerprinted (step, parameter) at which replicas differ."""

    step: int
    optimizer: int
    index: int
    kind: str  # "grads" or "params"
    groups: list
    values: dict
    events: dict  # rank -> Step
    last_identical_step: Optional[int] = None


@dataclass(frozen=True)
class ConfigDivergence:
    """The first sampled optimizer step at which ranks' configuration digests differ."""

    step: int
    optimizer: int
    groups: list  # ranks grouped by digest, largest group first
    events: dict  # rank -> Step
    last_identical_step: Optional[int] = None


@dataclass(frozen=True)
class RankFailure:
    """How one rank (or the launcher, rank None) failed."""

    rank: Optional[int]
    kind: str  # "exception" | "exit" (sys.exit) | "signal" | "exitcode"
    t: float
    type: str = ""
    message: str = ""
    location: Optional[Location] = None
    frames: list = field(default_factory=list)
    seq: int = 0
    step: int = 0
    code: Optional[int] = None
    signal: Optional[str] = None
    decoded: Optional[DecodedError] = None
    secondary: bool = False

    @property
    def headline(self) -> str:
        first = _shorten(self.message.strip().splitlines()[0]) if self.message.strip() else ""
        return f"{self.type}: {first}" if self.type else first


class Facts:
    """Derived facts of one Evidence."""

    def __init__(self, evidence: "Evidence") -> None:
        self.evidence = evidence

    # -- process group, DDP, optimizers -----------------------------------------------------------
    @functools.cached_property
    def has_process_group(self) -> bool:
        return self.evidence.any(InitProcessGroup)

    @functools.cached_property
    def ddp_wraps(self) -> dict[int, dict[int, DDPWrap]]:
        """DDP module index -> rank -> its wrap event."""
        out: dict[int, dict[int, DDPWrap]] = {}
        for rank, event in self.evidence.events(DDPWrap):
            out.setdefault(event.ddp, {})[rank] = event
        return out

    @functools.cached_property
    def framework(self) -> Optional[tuple[str, Optional[str]]]:
        """(framework, version) that built the job's DDP modules ("accelerate", "lightning" for the
        Trainer, "fabric"), None for DDP built by hand."""
        for _, wraps in sorted(self.ddp_wraps.items()):
            for _, wrap in sorted(wraps.items()):
                if wrap.framework:
                    return wrap.framework, wrap.framework_version
        return None

    @functools.cached_property
    def ddp_usage(self) -> dict[int, dict[int, DDPUsage]]:
        """DDP module index -> rank -> the usage totals with the most iterations."""
        out: dict[int, dict[int, DDPUsage]] = {}
        for rank, event in self.evidence.events(DDPUsage):
            current = out.setdefault(event.ddp, {}).get(rank)
            if current is None or event.iterations >= current.iterations:
                out[event.ddp][rank] = event
        return out

    @functools.cached_property
    def ddp_backwards(self) -> dict[int, dict[int, int]]:
        """DDP module index -> rank -> backward passes DDP synchronized on it (the one a rank was in
        when the job stopped included); every rank that wrapped the module is listed. Empty for
        evidence written before ranks counted them."""
        out: dict[int, dict[int, int]] = {}
        for rank, event in self.evidence.events(DDPUsage):
            if event.backwards is None:
                return {}
            counts = out.setdefault(event.ddp, {})
            counts[rank] = max(counts.get(rank, 0), event.backwards)
        for index, wraps in self.ddp_wraps.items():
            if index in out:
                for rank in wraps:
                    out[index].setdefault(rank, 0)
        return out

    @functools.cached_property
    def cut(self) -> Optional[RunCut]:
        """Where ddpdoctor stopped a bounded run on purpose (--max-steps/--max-epochs), if it did."""
        return next((e for _, e in self.evidence.events(RunCut)), None)

    @functools.cached_property
    def fingerprint_every(self) -> int:
        return max((e.fingerprint_every for _, e in self.evidence.events(ProcessStart)), default=1)

    @functools.cached_property
    def step_counts(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        for rank, _ in self.evidence.events(Step):
            counts[rank] = counts.get(rank, 0) + 1
        return counts

    def optimizer_info(self, rank: int, opt: int, n: Optional[int] = None) -> Optional[OptimizerInfo]:
        """How optimizer ``opt`` of ``rank`` was described at its step ``n`` (None: its first description)."""
        ev = self.evidence.ranks.get(rank)
        if not ev:
            return None
        found = None
        for info in ev.of(OptimizerInfo):
            if info.opt == opt and (found is None or (n is not None and found.n < info.n <= n)):
                found = info
        return found

    @functools.cached_property
    def _sampled(self) -> tuple[dict[tuple[int, int], dict[int, Step]], bool, bool]:
        by_step: dict[tuple[int, int], dict[int, Step]] = {}
        without_grads = without_config = False
        for rank, event in self.evidence.events(Step):
            if event.grads is not None or event.config is not None:
                by_step.setdefault((event.n, event.opt), {})[rank] = event
                without_grads = without_grads or event.grads is None
                without_config = without_config or event.config is None
        return dict(sorted(by_step.items())), without_grads, without_config

    @property
    def sampled_steps(self) -> dict[tuple[int, int], dict[int, Step]]:
        """(optimizer step, optimizer) -> rank -> its Step, for steps with fingerprints or a config
        digest, in step order."""
        return self._sampled[0]

    @functools.cached_property
    def divergence(self) -> tuple[Optional[Divergence], int]:
        """The first (step, parameter) whose fingerprints differ across ranks, and how many steps compared."""
        num_compared = 0
        last_identical: dict[int, int] = {}
        steps, without_grads, _ = self._sampled
        for (n, opt), sampled in steps.items():
            events = {r: e for r, e in sampled.items() if e.grads is not None} if without_grads else sampled
            if len(events) < 2:
                continue
            num_compared += 1
            for kind in ("grads", "params"):
                reference = getattr(events[min(events)], kind)
                if all(getattr(e, kind) == reference for e in events.values()):
                    continue  # bit-identical replicas, the common case: one string comparison per rank
                decoded = {r: decode_fingerprints(getattr(e, kind) or "") for r, e in events.items()}
                length = min(len(d) for d in decoded.values())
                for i in range(length):
                    values = {r: d[i] for r, d in decoded.items()}
                    groups = group_by_value(values)
                    if len(groups) > 1:
                        return Divergence(n, opt, i, kind, groups, values, events, last_identical.get(opt)), num_compared
            last_identical[opt] = n
        return None, num_compared

    @functools.cached_property
    def ddp_optimizers(self) -> set[tuple[int, int]]:
        """(rank, optimizer) pairs whose optimizer steps parameters of a DDP module."""
        return {(rank, e.opt) for rank, e in self.evidence.events(OptimizerInfo) if any(e.in_ddp)}

    @functools.cached_property
    def config_divergence(self) -> tuple[Optional[ConfigDivergence], int]:
        """The first sampled step of an optimizer of a DDP module at which ranks' configuration
        digests differ, and how many steps were compared (strings, as the fingerprints are)."""
        trained = self.ddp_optimizers
        untrained = {(rank, e.opt) for rank, e in self.evidence.events(OptimizerInfo)} - trained
        steps, _, without_config = self._sampled
        num_compared = 0
        last_identical: dict[int, int] = {}
        for (n, opt), sampled in steps.items():
            events = sampled
            if without_config or untrained:  # the common case, every step of DDP optimizers digested, skips this
                events = {r: e for r, e in sampled.items() if e.config is not None and (r, opt) in trained}
            if len(events) < 2:
                continue
            num_compared += 1
            reference = events[min(events)].config
            if all(e.config == reference for e in events.values()):
                last_identical[opt] = n
                continue
            by_digest: dict[str, list[int]] = {}
            for rank in sorted(events):
                by_digest.setdefault(events[rank].config, []).append(rank)
            groups = sorted(by_digest.values(), key=lambda g: (-len(g), g[0]))
            return ConfigDivergence(n, opt, groups, events, last_identical.get(opt)), num_compared
        return None, num_compared

    def config_state(self, rank: int, step: Step) -> Optional[ConfigState]:
        """The detail behind a step's configuration digest on ``rank``."""
        ev = self.evidence.ranks.get(rank)
        if not ev or step.config is None:
            return None
        found = None
        for state in ev.of(ConfigState):
            if state.opt == step.opt and state.n <= step.n and state.digest == step.config:
                found = state
        return found

    @functools.cached_property
    def ddp_canonical(self) -> dict[int, int]:
        """DDP module index -> the first DDP module wrapping the same module (itself when not rewrapped)."""
        out: dict[int, int] = {}
        for _, event in self.evidence.events(DDPRewrap):
            out[event.ddp] = out.get(event.previous, event.previous)
        return out

    # -- data -------------------------------------------------------------------------------------
    @functools.cached_property
    def _merged_loader_passes(self) -> dict[tuple[int, str, int], LoaderPass]:
        """(rank, loader, raw pass number) -> the whole pass, its parts merged."""
        parts: dict[tuple[int, str, int], list[LoaderPass]] = {}
        for rank, event in self.evidence.events(LoaderPass):
            parts.setdefault((rank, event.loader, event.number), []).append(event)
        return {key: merge_parts(pieces) for key, pieces in parts.items()}

    @functools.cached_property
    def pass_numbers(self) -> dict[tuple[int, str, int], int]:
        """(rank, loader, raw pass number) -> the pass's number as paired across ranks
        (:mod:`ddpdoctor.analysis.passes`), for index passes and content passes alike."""
        from ddpdoctor.schema.events import ContentPass

        kinds: dict[tuple[int, str, int], tuple[str, Optional[int]]] = {}
        for rank, event in self.evidence.events(ContentPass):
            if event.source == "loader":
                kinds[(rank, event.key, event.number)] = (
                    passes.role(fed=bool(event.steps or event.ddp_forwards), complete=event.complete), event.epoch)
        for (rank, loader, number), event in self._merged_loader_passes.items():  # the index probe's counters win
            kinds[(rank, loader, number)] = (
                passes.role(fed=bool(event.steps or event.ddp_forwards), complete=event.complete), event.sampler.epoch)
        return passes.pair((rank, key, number, kind, epoch) for (rank, key, number), (kind, epoch) in kinds.items())

    @functools.cached_property
    def loader_passes(self) -> dict[tuple[str, int], dict[int, LoaderPass]]:
        """(loader, pass number as paired across ranks) -> rank -> the whole pass, its parts merged."""
        numbers = self.pass_numbers
        out: dict[tuple[str, int], dict[int, LoaderPass]] = {}
        for (rank, loader, number), event in self._merged_loader_passes.items():
            out.setdefault((loader, numbers[(rank, loader, number)]), {})[rank] = event
        return out

    @functools.cached_property
    def content_streams(self) -> "dict[tuple, dict[int, content.Stream]]":
        """(source, key, feeds, number) -> rank -> that rank's sample fingerprints of the pass; loader
        passes (and the loader pass a forward window's batches came from) numbered as paired across ranks."""
        from ddpdoctor.analysis import content
        from ddpdoctor.schema.events import ContentPass

        numbers = self.pass_numbers
        out: dict[tuple, dict] = {}
        for (source, key, feeds, number), per_rank in content.merge_streams(self.evidence.events(ContentPass)).items():
            for rank, stream in per_rank.items():
                if source == "loader":
                    number_here, feeds_here = numbers.get((rank, key, number), number), feeds
                else:
                    number_here, feeds_here = number, _paired_feed(numbers, rank, feeds)
                out.setdefault((source, key, feeds_here, number_here), {})[rank] = stream
        return out

    # -- collectives ------------------------------------------------------------------------------
    @functools.cached_property
    def world_traces(self) -> dict[int, RankTrace]:
        """Each rank's numbered world-group collectives, DDP's own included (point-to-point and
        subgroups left out)."""
        missing = set(self.evidence.observations.missing_ranks)  # no trace at all (a rank that left no dump)
        traces = {}
        for rank, ev in self.evidence.ranks.items():
            if rank in missing:
                continue
            init = ev.first(InitProcessGroup)
            traces[rank] = trace_of(ev.of(Collective), ev.of(InternalCollectives), init.numbering if init else "calls")
        return traces

    @functools.cached_property
    def subgroup_mismatch(self) -> Optional[Mismatch]:
        """The first call at which a subgroup's members issued different collectives or shapes
        (``group`` names its global ranks)."""
        missing = set(self.evidence.observations.missing_ranks)
        return first_subgroup_mismatch(subgroup_traces(
            {rank: ev.of(Collective) for rank, ev in self.evidence.ranks.items() if rank not in missing}))

    @functools.cached_property
    def collective_mismatch(self) -> Optional[Mismatch]:
        """First number at which ranks that reached it issued different collectives or shapes."""
        return first_mismatch(self.world_traces, include_missing=False)

    @functools.cached_property
    def collective_divergence(self) -> Optional[Mismatch]:
        """Like collective_mismatch, counting a collective some ranks never issued as a difference."""
        return first_mismatch(self.world_traces, include_missing=True)

    # -- failures ---------------------------------------------------------------------------------
    @functools.cached_property
    def failures(self) -> list[RankFailure]:
        """Every rank that failed, with its own exception, exit code or signal, oldest first."""
        tails = self.evidence.observations.output_tails
        found: list[RankFailure] = []
        explained: set[Optional[int]] = set()
        launcher = [(None, e) for e in self.evidence.unranked if isinstance(e, ExceptionEvent)]
        stop = self.evidence.stop
        interrupted = stop is not None and stop.reason == "interrupted"
        for rank, event in [*self.evidence.events(ExceptionEvent), *launcher]:
            if interrupted and event.type == "KeyboardInterrupt":
                continue  # the Ctrl-C that interrupted the run, raised in the rank
            decoded = decode(event.message, tails.get(rank, []) if rank is not None else [])
            secondary = (event.type == "KeyboardInterrupt" or _is_secondary(event.message)
                         or bool(decoded and decoded.secondary))
            if secondary and stop is not None and stop.t and event.t >= stop.t - (SIGNAL_SLACK_S if interrupted else 0):
                continue  # a peer's error from ddpdoctor stopping the job, not from the job itself
            found.append(RankFailure(rank=rank, kind="exception", t=event.t, type=event.type, message=event.message,
                                     location=Location.from_site(event.location), frames=event.frames, seq=event.seq,
                                     step=event.step, decoded=decoded, secondary=secondary))
            explained.add(rank)
        for rank, event in self.evidence.events(SysExit):
            if interrupted and event.code in _SIGNAL_EXIT_CODES and event.t >= stop.t - SIGNAL_SLACK_S:
                continue  # the script's own signal handler turned the stop signal into sys.exit(128+N)
            if rank not in explained:
                found.append(RankFailure(rank=rank, kind="exit", t=event.t, code=event.code, seq=event.seq,
                                         step=event.step, location=Location.from_site(event.location)))
                explained.add(rank)
        if not self.evidence.stopped_by_ddpdoctor:
            for failure in self.evidence.failures:
                # torchrun stops the survivors with SIGTERM after the first failure: not a cause.
                if failure.rank in explained or failure.signal == "SIGTERM":
                    continue
                if not failure.signal and not failure.exitcode:
                    continue
                ev = self.evidence.ranks.get(failure.rank)
                if failure.rank in self.teardown_aborts:
                    continue  # the script had finished: torch's own teardown crashed (see teardown_aborts)
                last = ev.events[-1] if ev and ev.events else None
                found.append(RankFailure(rank=failure.rank, kind="signal" if failure.signal else "exitcode",
                                         t=last.t if last else failure.t, code=failure.exitcode, signal=failure.signal,
                                         seq=last.seq if last else 0, step=last.step if last else 0,
                                         decoded=decode("", tails.get(failure.rank, []))))
                explained.add(failure.rank)
        return sorted(found, key=lambda f: f.t)

    @functools.cached_property
    def teardown_aborts(self) -> dict[int, str]:
        """rank -> the signal that killed it after its script had finished cleanly (its Exit event
        with code 0 was written): a crash in torch's own teardown, not in the script."""
        found: dict[int, str] = {}
        if self.evidence.stopped_by_ddpdoctor:
            return found
        for failure in self.evidence.failures:
            ev = self.evidence.ranks.get(failure.rank)
            if failure.signal and failure.signal != "SIGTERM" and ev is not None \
                    and any(e.code == 0 for e in ev.of(Exit)):
                found[failure.rank] = failure.signal
        return found

    @functools.cached_property
    def failed_ranks(self) -> set[int]:
        return {f.rank for f in self.failures if f.rank is not None}

    @functools.cached_property
    def first_failure(self) -> Optional[RankFailure]:
        """The earliest failure that is a cause (not a peer's symptom); None if there are only symptoms."""
        return next((f for f in self.failures if not f.secondary), None)


def merge_parts(parts: list[LoaderPass]) -> LoaderPass:
    """One pass from the parts a rank wrote: indices of every part, counters of the last."""
    parts = sorted(parts, key=lambda p: p.part)
    last = parts[-1]
    if len(parts) == 1:
        return last
    opaque = any(p.indices is None for p in parts)
    indices = None if opaque else merge_encoded(p.indices for p in parts)
    return dataclasses.replace(last, part=0, indices=indices, head=parts[0].head,
                               num_samples=None if opaque else sum(p.num_samples or 0 for p in parts))


def _shorten(line: str, limit: int = 200) -> str:
    """A long error line cut after its first sentences, or between words, never inside one."""
    if len(line) <= limit:
        return line
    end = line.rfind(". ", 0, limit)
    if end > limit // 3:
        return line[: end + 1]
    return textwrap.shorten(line, limit, placeholder=" …")


def _is_secondary(message: str) -> bool:
    lowered = message.lower()
    return any(marker.lower() in lowered for marker in SECONDARY_MARKERS)


def _paired_feed(numbers: dict[tuple[int, str, int], int], rank: int, feeds: Optional[str]) -> Optional[str]:
    """A forward window's "loader#raw number" with the loader pass's number as paired across ranks."""
    if not feeds or "#" not in feeds:
        return feeds
    key, _, raw = feeds.rpartition("#")
    try:
        return f"{key}#{numbers.get((rank, key, int(raw)), int(raw))}"
    except ValueError:
        return feeds

"""The kinds of symptom one finding can be of another: the shared vocabulary of the causality pass.

A check that is a cause declares what it explains (``Check(explains=...)``) in terms of these kinds,
never of another check's id or its evidence's keys: ``isinstance(symptom.evidence, RankFailed) and
symptom.evidence.secondary_only``. A check's evidence record says which kinds it is by inheriting
them, and declares their attributes as its own fields (a kind's class attribute is the default for
a record without that field). A plugin check takes part the same way, as a cause or as a symptom.

Checks never import each other; the words several checks must agree on (a divergence's case, a
hang's kind) are declared here once, as enums whose values are the JSON report's strings.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Optional

__all__ = ["Divergence", "HangKind", "FailureKind", "UnevenCause", "Symptom", "RankFailed", "CollectivesUnmatched",
           "ReplicasDiverged", "IterationsUneven", "SamplesOverlap", "BuffersDiffer", "EpochNotSet",
           "ParametersUnused", "NotDistributed"]


class _Words(str, Enum):
    def __str__(self) -> str:
        return str(self.value)

    def __hash__(self) -> int:
        return hash(self.value)


class Divergence(_Words):
    """Why replicas' gradients or parameters differ (gradient-sync's ``case``)."""

    NOT_WRAPPED = "not-wrapped"
    DDP_BYPASSED = "ddp-bypassed"
    STEP_IN_NO_SYNC = "step-in-no-sync"
    PARAMS_MODIFIED = "params-modified"
    MODIFIED_AFTER_BACKWARD = "modified-after-backward"
    REDUCTION_INCOMPLETE = "reduction-incomplete"
    CONVERTED_AFTER_WRAP = "converted-after-wrap"  # the wrapped model moved or cast: new parameter storage
    DDP_REWRAPPED = "ddp-rewrapped"  # DDP built again around a module it wraps
    OUTSIDE_DDP = "outside-ddp"  # a trained parameter in no DDP module
    FROZEN_AT_WRAP = "frozen-at-wrap"  # frozen when DDP was built, unfrozen later
    COMM_HOOK = "comm-hook"  # the communication hook returned different results
    ALL_REDUCE_DIFFERS = "all-reduce-differs"  # the all-reduce itself did
    PERIODIC_AVERAGING = "periodic-averaging"  # Local SGD: apart by design between averagings
    DEVICE_ROUND_TRIP = "device-round-trip"  # moved off the GPU and back (diverges on a GPU, not simulated)
    SHARD_REPLICAS_DIFFER = "shard-replicas-differ"  # HSDP: the ranks holding the same shard disagree


class HangKind(_Words):
    """What collective-hang saw (its ``kind``): ranks stuck, a collective some ranks never called, ..."""

    HANG = "hang"
    NO_PROGRESS = "no-progress"
    ORPHAN = "orphan"
    MISMATCH = "mismatch"
    STALL = "stall"


class UnevenCause(_Words):
    """Why ranks ran different numbers of iterations (uneven-inputs' ``cause``)."""

    DATA = "data"  # a short rank exhausted its loader: its share of the data is shorter
    CONTROL_FLOW = "control-flow"  # a short rank left its loop early (a break, an early stop on one rank)
    UNKNOWN = "unknown"  # no loader pass tells which


class FailureKind(_Words):
    """How a rank failed (rank-failure's ``kind``)."""

    EXCEPTION = "exception"
    EXIT = "exit"
    SIGNAL = "signal"
    TIMEOUT = "timeout"
    TEARDOWN = "teardown"


class Symptom:
    """Base of every symptom kind: a marker class, no fields of its own."""


class RankFailed(Symptom):
    """A rank failed: an exception, an exit code, a signal, or --timeout stopping the job."""

    rank: Optional[int] = None
    kind: Optional[str] = None
    seq: Optional[int] = None  # the collective sequence number it failed in
    secondary_only: Optional[bool] = None  # only peers' symptoms (connection closed): another rank failed first
    reduction_error: Optional[bool] = None  # DDP's "Expected to have finished reduction"
    exception: Optional[str] = None  # the exception's type name, where it raised one
    frames: Optional[list[dict[str, Any]]] = None  # its traceback, innermost last: [{file, line, function, code, user}]

    @property
    def error_code(self) -> Optional[str]:
        """The decoded error's code (ddpdoctor.analysis.decode), where the failure was decoded."""
        return None


class CollectivesUnmatched(Symptom):
    """Ranks stuck in, or disagreeing on, collectives."""

    kind: Optional[str] = None
    sequence: Optional[int] = None  # the first collective the ranks disagree on
    culprit_phase: Optional[str] = None  # the DDP phase (ddp-forward, ddp-backward...) of the culprit's call
    never_called_by: Optional[list[int]] = None

    def in_ddp_internals(self) -> bool:
        """About DDP's own collectives (a gradient all-reduce some ranks never issued), not a user call."""
        return str(self.culprit_phase or "").startswith("ddp-")


class ReplicasDiverged(Symptom):
    """The replicas' gradients or parameters differ."""

    case: Optional[str] = None
    step: Optional[int] = None


class IterationsUneven(Symptom):
    """Ranks ran different numbers of batches or iterations."""

    cause: Optional[str] = None  # an UnevenCause


class SamplesOverlap(Symptom):
    """Ranks drew the same samples."""

    basis: Optional[str] = None  # "indices" (the sampler's) or "content" (the samples' fingerprints)
    loader: Optional[str] = None
    source: Optional[str] = None  # "loader" or "forward"


class BuffersDiffer(Symptom):
    """Module buffers differ across ranks."""

    broadcast_buffers: Optional[bool] = None


class EpochNotSet(Symptom):
    """A DistributedSampler's epoch was not advanced between passes."""


class ParametersUnused(Symptom):
    """Parameters DDP expected a gradient for got none."""


class NotDistributed(Symptom):
    """The job did not train one model across its ranks."""


"""rank0-checkpoint: one writer per checkpoint file, no read before the write is done."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Optional

from ddpdoctor.analysis import facts
from ddpdoctor.analysis.api import (Check, CheckResult, EvidenceRecord, Explains, Finding, Location, Severity,
                                    evidence_field)
from ddpdoctor.analysis.evidence import Evidence
from ddpdoctor.analysis.symptoms import RankFailed
from ddpdoctor.schema.events import DistributedCheckpoint, Load, Save

from . import _frameworks as frameworks
from ._common import fmt_ranks

ID = "rank0-checkpoint"

DOCS = """\
## What it does
Records every `torch.save` and `torch.load` (paths, pathlib paths and file objects): rank, resolved
path, size, call site, `map_location`, and the rank's collective sequence number before and after.
`torch.distributed.checkpoint` saves and loads are recorded as collective by design, never flagged.
It reports:

- **error**: the same path written by more than one rank (a race: torn or interleaved files);
- **warning**: every rank writes its own copy of identical state (N times the I/O for one file);
- **error**: a rank reads a path another rank writes in the same run with no collective between the
  end of the write and the read, or before the file exists;
- **warning**: `torch.load` without `map_location` while ranks use different GPUs (every rank loads
  onto the GPU the tensors were saved from, usually cuda:0);
- **info**: a state dict saved from the DDP wrapper (keys start with `module.`).

A save under `if rank == 0:` followed by a collective inside that block (`dist.barrier()`) is one
writer, as it should be: the save is not the problem, the collective only rank 0 calls is, and
`collective-hang` reports it at the collective's line.

Under FSDP the same holds for a full state dict: gathering it (`get_model_state_dict(model,
options=StateDictOptions(full_state_dict=True, cpu_offload=True))`) is a collective every rank calls,
and only the `torch.save` after it belongs under `if rank == 0:`. DCP (`dcp.save` from every rank)
needs no guard at all.

## Why it matters
Checkpoints are the only thing a long run leaves behind. Two ranks writing one file, or a rank
reading a half-written file, corrupt weeks of training silently. With `--nnodes 2` code that saves
on `LOCAL_RANK == 0` shows its second writer, as it would on a shared filesystem.

## Example
```python
torch.save(model.state_dict(), "ckpt.pt")          # every rank writes the same file
state = torch.load("ckpt.pt")                       # maybe before rank 0 finished writing
```

## Use instead
```python
if dist.get_rank() == 0:                            # the global rank, not LOCAL_RANK
    torch.save(model.module.state_dict(), "ckpt.pt")
dist.barrier()                                      # the write happens-before every read
state = torch.load("ckpt.pt", map_location=device)
```
"""


@dataclass(frozen=True)
class SavedFromWrapper(EvidenceRecord):
    """A state dict saved from the DDP wrapper (keys start with ``module.``)."""

    path: Optional[str] = evidence_field(keep_none=True)


@dataclass(frozen=True)
class LoadedWithoutMapLocation(EvidenceRecord):
    """torch.load without map_location while ranks use different GPUs."""

    devices: dict[str, str] = evidence_field(label="devices per rank", default_factory=dict)
    path: Optional[str] = evidence_field(keep_none=True)


@dataclass(frozen=True)
class SeveralWriters(EvidenceRecord):
    """One path written by more than one rank."""

    path: Optional[str] = evidence_field(keep_none=True)
    writes: dict[str, int] = evidence_field(label="saves per rank", default_factory=dict)
    bytes: Optional[int] = evidence_field(label="size", unit="bytes", keep_none=True)


@dataclass(frozen=True)
class IdenticalCopies(EvidenceRecord):
    """Every rank saved its own file of identical state."""

    paths: dict[str, str] = evidence_field(label="paths", default_factory=dict)
    fingerprint: Any = evidence_field(hidden=True)


@dataclass(frozen=True)
class UnorderedRead(EvidenceRecord):
    """A rank read a file another rank writes, with no collective ordering the read after the write."""

    path: Optional[str] = evidence_field(keep_none=True)
    writer: Optional[int] = evidence_field(label="writer", unit="rank")
    reader: Optional[int] = evidence_field(label="reader", unit="rank")
    writer_collectives_after_write: Optional[int] = evidence_field(label="writer's collectives when the save returned",
                                                                   keep_none=True)
    write_finished: Optional[bool] = evidence_field()
    reader_collectives_before_read: Optional[int] = evidence_field(label="reader's collectives before the load")
    write_site: Any = evidence_field(label="written at", unit="site", keep_none=True)
    read_site: Any = evidence_field(label="read at", unit="site", keep_none=True)
    read_error: Optional[str] = evidence_field(keep_none=True)


def _raced_read(finding: Finding) -> bool:
    return finding.severity == Severity.ERROR and isinstance(finding.evidence, UnorderedRead) \
        and finding.evidence.reader is not None


def _crash_in_the_raced_read(symptom: Finding, cause: Finding) -> bool:
    """The reader of a file its writer had not finished died in that read (a torn checkpoint)."""
    failed, race = symptom.evidence, cause.evidence
    return (isinstance(failed, RankFailed) and isinstance(race, UnorderedRead) and failed.rank == race.reader
            and (bool(race.read_error) or symptom.location == cause.location))


EXPLAINS = (
    # A rank read a checkpoint another rank was still writing, and died loading the torn file.
    Explains("a checkpoint read raced its write", _crash_in_the_raced_read, cause=_raced_read, priority=100),
)


def _loc(event):
    return Location.from_site(event.site)


def _writers(saves: list[tuple[int, Save]]) -> dict[str, dict[int, list[Save]]]:
    by_path: dict[str, dict[int, list[Save]]] = defaultdict(lambda: defaultdict(list))
    for rank, event in saves:
        if event.path:
            by_path[event.path][rank].append(event)
    return by_path


def _one_writer_fix(evidence: Evidence) -> str:
    """How to save with one writer; for a sharded model (FSDP), keep the gather on every rank."""
    one_writer = ("Save on the global rank 0 only (`if dist.get_rank() == 0:`, not LOCAL_RANK, which is 0 once per "
                  "node), then dist.barrier() before anyone reads it.")
    sharding = facts.ddp.sharding(evidence)
    if sharding is None or not sharding.shards_parameters:
        return one_writer
    return ("Keep gathering the full state dict on every rank (`get_model_state_dict(model, options="
            "StateDictOptions(full_state_dict=True, cpu_offload=True))` is a collective: called on rank 0 alone it "
            "hangs), then put only the torch.save under `if dist.get_rank() == 0:` (not LOCAL_RANK, which is 0 once "
            "per node) and call dist.barrier() before anyone reads it. Or let every rank save its own shards with "
            "torch.distributed.checkpoint: `dcp.save(state, checkpoint_id=directory)`.")


def _multi_writer(evidence: Evidence, by_path) -> list[Finding]:
    findings = []
    for path, per_rank in sorted(by_path.items()):
        if len(per_rank) > 1:
            ranks = sorted(per_rank)
            first = per_rank[ranks[0]][0]
            findings.append(Finding(
                check=ID, severity="error", ranks=tuple(ranks), location=_loc(first),
                message=f"{fmt_ranks(ranks)} all wrote {path}: concurrent writers can leave a torn or mixed file",
                fix=frameworks.fix(evidence, "save", _one_writer_fix(evidence)),
                evidence=SeveralWriters(path=path, writes={str(r): len(v) for r, v in sorted(per_rank.items())},
                                        bytes=first.bytes),
            ))
    return findings


def _identical_copies(evidence: Evidence, saves: list[tuple[int, Save]], world_size: int,
                      multi_paths: set[str]) -> list[Finding]:
    nth: dict[int, dict[int, Save]] = defaultdict(dict)
    counts: dict[int, int] = defaultdict(int)
    for rank, event in saves:
        if event.path in multi_paths:
            continue
        nth[counts[rank]][rank] = event
        counts[rank] += 1
    for _, per_rank in sorted(nth.items()):
        prints = {e.fingerprint for e in per_rank.values()}
        paths = {e.path for e in per_rank.values()}
        if len(per_rank) >= 2 and len(per_rank) == world_size and len(prints) == 1 and None not in prints \
                and len(paths) == len(per_rank):
            first = per_rank[min(per_rank)]
            return [Finding(
                check=ID, severity="warning", ranks=tuple(sorted(per_rank)), location=_loc(first),
                message=(f"every rank saved its own copy of identical state ({len(per_rank)} files, e.g. "
                         f"{first.path}): {len(per_rank)}x the I/O for one checkpoint"),
                fix=frameworks.fix(evidence, "save",
                                   "Save once, on rank 0 (`if dist.get_rank() == 0:`), then dist.barrier()."),
                evidence=IdenticalCopies(paths={str(r): e.path for r, e in sorted(per_rank.items())},
                                         fingerprint=first.fingerprint),
            )]
    return []


def _unordered_reads(evidence: Evidence, by_path, loads: list[tuple[int, Load]]) -> list[Finding]:
    """A read of a file another rank writes, ordered neither after nor before that write.

    Collective sequence numbers give happens-before: a write that ended when its rank had made
    ``w_end`` collectives precedes a read made after the reader completed collective ``w_end + 1``;
    symmetrically, a read precedes a write that starts after collective ``read + 1``.
    """
    for reader, load in loads:
        writes = by_path.get(load.path or "", {})
        read_at = load.seq_start
        for writer, events in sorted(writes.items()):
            if writer == reader:
                continue
            for write in events:
                read_after = read_at >= write.seq_end + 1
                read_before = write.seq_start >= read_at + 1
                missing = load.existed is False or "FileNotFound" in (load.error or "")
                if read_before or (read_after and not missing):
                    continue
                what = ("before the file existed" if missing
                        else f"while that write was still running (rank {writer} never finished it)"
                        if write.seq_end == UNFINISHED
                        else "with no collective between the end of that write and the read")
                return [Finding(
                    check=ID, severity="error", ranks=(writer, reader), location=_loc(load),
                    message=f"rank {reader} read {load.path} that rank {writer} writes, {what}",
                    fix=frameworks.fix(evidence, "save", "Put a collective between the write and the reads: rank 0 "
                                       "saves, then `dist.barrier()` on every rank, then load."),
                    evidence=UnorderedRead(
                        path=load.path, writer=writer, reader=reader,
                        writer_collectives_after_write=None if write.seq_end == UNFINISHED else write.seq_end,
                        write_finished=write.seq_end != UNFINISHED, reader_collectives_before_read=read_at,
                        write_site=write.site, read_site=load.site, read_error=load.error),
                )]
    return []


def _map_location(evidence: Evidence, loads: list[tuple[int, Load]]) -> list[Finding]:
    devices = {r: str(e.device) for index, per_rank in facts.ddp.wraps(evidence).items() for r, e in per_rank.items()}
    cuda = {d for d in devices.values() if d.startswith("cuda")}
    if len(cuda) < 2:
        return []
    bare = [(r, e) for r, e in loads if e.map_location is None and not e.error]
    if not bare:
        return []
    ranks = sorted({r for r, _ in bare})
    return [Finding(
        check=ID, severity="warning", ranks=tuple(ranks), location=_loc(bare[0][1]),
        message=(f"torch.load without map_location on {fmt_ranks(ranks)} while ranks use different GPUs "
                 f"({', '.join(sorted(cuda))}): tensors land on the device they were saved from, usually cuda:0"),
        fix="Pass map_location: `torch.load(path, map_location=f'cuda:{local_rank}')` (or 'cpu').",
        evidence=LoadedWithoutMapLocation(devices={str(r): d for r, d in sorted(devices.items())},
                                          path=bare[0][1].path),
    )]


def _module_prefix(saves: list[tuple[int, Save]]) -> list[Finding]:
    prefixed = [(r, e) for r, e in saves if e.module_prefix]
    if not prefixed:
        return []
    rank, event = prefixed[0]
    return [Finding(
        check=ID, severity="info", ranks=(rank,), location=_loc(event),
        message=(f"state dict saved from the DDP wrapper (keys start with 'module.') to {event.path}: loading "
                 "it into an unwrapped model needs the prefix stripped"),
        fix="Save `model.module.state_dict()`, or strip the prefix with "
            "torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(state, 'module.').",
        evidence=SavedFromWrapper(path=event.path),
    )]


UNFINISHED = 1 << 62  # seq_end of a save its rank never finished: no read is ordered after it


def saves_of(evidence: Evidence) -> list[tuple[int, Save]]:
    """Each save once: the finished event, or the begun one whose rank never finished it (killed
    mid-write), with an open end."""
    finished = {(r, e.path, e.seq_start) for r, e in evidence.events(Save) if e.done}
    out = []
    for rank, event in evidence.events(Save):
        if event.done:
            out.append((rank, event))
        elif (rank, event.path, event.seq_start) not in finished:
            out.append((rank, dataclasses.replace(event, seq_end=UNFINISHED)))
    return out


def analyze(evidence: Evidence) -> CheckResult:
    saves = saves_of(evidence)
    loads = list(evidence.events(Load))
    dcp_calls = list(evidence.events(DistributedCheckpoint))
    if not saves and not loads and not dcp_calls:
        return CheckResult(summary="no checkpoint saved or loaded", applicable=False)
    by_path = _writers(saves)
    findings = _multi_writer(evidence, by_path)
    multi_paths = {path for path, per_rank in by_path.items() if len(per_rank) > 1}
    findings += _identical_copies(evidence, saves, evidence.world_size, multi_paths)
    findings += _unordered_reads(evidence, by_path, loads)
    findings += _map_location(evidence, loads)
    findings += _module_prefix(saves)
    summary = (f"{len(saves)} save(s), {len(loads)} load(s)"
               + (f", {len(dcp_calls)} distributed-checkpoint call(s)" if dcp_calls else ""))
    bad = [f for f in findings if f.severity != "info"]
    return CheckResult(findings=findings, summary=("problems: " if bad else "") + summary)


CHECK = Check(id=ID, title="rank-0-only checkpointing", analyze=analyze, docs=DOCS, order=80,
              probes=('collectives', 'checkpoint'),
              evidence=(SavedFromWrapper, LoadedWithoutMapLocation, SeveralWriters, IdenticalCopies, UnorderedRead),
              explains=EXPLAINS)

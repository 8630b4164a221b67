"""A job that already hung or failed, from the files PyTorch and torchrun left: the same evidence a
live ``ddpdoctor check`` gathers, so the same checks diagnose it.

Inputs (folders, globs or files, sorted out by their content): per-rank flight recorder dumps
(:mod:`flight_recorder`), torchrun's error files and failure table, and rank logs
(:mod:`torchrun_files`), sorted by :mod:`discover`. Each dump becomes its rank's events
(:mod:`dump_events`, :mod:`read_dumps`); the state the dumps were taken in becomes the monitor's
:class:`StopSnapshot`:

- a rank with a collective enqueued and not completed *waits* in it (its stack: the collective's);
- a rank whose collectives all completed is *computing*: not inside a collective, in its own code
  after its last one (a dump holds no stack of the moment it was taken);
- the job is *hung* when every rank that left a dump waits, or when a rank's pending collective had
  outlived its timeout (``timeout_ms``) when the dump was written: the backend's watchdog fires at
  that timeout, dumps, and ends the job, so whatever the other ranks were doing, they never came;
  *not progressing* when some wait while others are elsewhere and no timeout expired (an outside
  stop: the live monitor's policy, so both report the same), and not stopped at all when nothing
  was pending;
- unless a rank failed on its own (an exception that is not a peer's symptom, or a signal to a
  rank that was not waiting): then that failure is the cause and the waiting ranks its victims.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Optional

from ddpdoctor.analysis.evidence import POST_MORTEM, Evidence, RankEvidence
from ddpdoctor.analysis.facts import failures as failure_facts
from ddpdoctor.analysis.watchdog_timeout import timed_out_ranks
from ddpdoctor.postmortem import torchrun_files
from ddpdoctor.postmortem.discover import Inputs, discover, read_text_tail
from ddpdoctor.postmortem.dump_events import ConvertedRank, Interner, as_stack, is_library_file
from ddpdoctor.postmortem.read_dumps import MapChunks, converted_dumps
from ddpdoctor.schema.events import Event, InitProcessGroup, ProbeError, ProcessStart
from ddpdoctor.schema.observations import Heartbeat, Observations, Outcome, RankState, StopSnapshot

__all__ = ["PostMortem", "load", "PROBE"]

PROBE = "flight-recorder"  # what the report names when a dump could not show something
Classify = Callable[[list, Optional[Heartbeat]], tuple[str, Optional[str]]]


@dataclass
class PostMortem:
    """The evidence, and what the report should say about the inputs themselves."""

    evidence: Evidence
    inputs: Inputs
    notes: list[str] = field(default_factory=list)
    torchrun_root_cause: Optional[int] = None  # the rank torchrun called the first observed failure
    formats: list[str] = field(default_factory=list)


def load(paths: list[str], *, classify: Classify, world_size: Optional[int] = None,
         map_chunks: Optional[MapChunks] = None) -> PostMortem:
    """The evidence in ``paths``. ``classify``: the live monitor's stack classifier
    (``ddpdoctor.supervisor.hang.classify``), so a rank is "waiting" by the same rule; ``map_chunks``:
    how to convert many dumps at once (the caller's process pool), None for one by one here."""
    inputs = discover(paths)
    if not inputs.dumps and not inputs.error_files and not inputs.logs:
        raise ValueError("found no flight recorder dump, torchrun error file or log in " + ", ".join(paths))
    interner = Interner()
    group_ranks: dict[str, list] = {}
    converted: dict[int, ConvertedRank] = {}
    dumps_meta: dict[int, tuple[str, float, str, str]] = {}  # rank -> (path, mtime, format, version)
    world_ranks = 0
    notes: list[str] = []
    unreadable: set[Optional[int]] = set()
    for result in converted_dumps(inputs.dumps, group_ranks, interner, map_chunks):
        if result[0] == "bad":
            _, path, why, rank = result
            inputs.ignored.append((path, why))
            unreadable.add(rank)  # a dump cut short still names its rank
            continue
        _, rank, meta, world, _, conv = result
        if rank in converted:
            raise ValueError(f"two dumps for rank {rank}: {dumps_meta[rank][0]} and {meta[0]}")
        world_ranks = max(world_ranks, world)
        converted[rank] = conv
        dumps_meta[rank] = meta
    for name, ranks in group_ranks.items():  # gloo records no members: the ranks that used the group
        if not ranks:
            ranks.extend(sorted(r for r, c in converted.items() if name in c.groups))
            if ranks:
                notes.append(f"process group {name}: gloo does not record its members; ranks "
                             f"{', '.join(map(str, ranks))} used it")

    table = torchrun_files.FailureTable()
    logs: dict[int, torchrun_files.RankLog] = {}
    for path in inputs.logs:
        text = read_text_tail(path)
        if torchrun_files.looks_like_failure_table(text):
            found = torchrun_files.parse_failure_table(text)
            table.failures.extend(f for f in found.failures if f.rank not in {x.rank for x in table.failures})
            table.error_files.update(found.error_files)
            table.root_cause = found.root_cause if table.root_cause is None else table.root_cause
        for rank, log in torchrun_files.read_log(path, text).items():
            logs.setdefault(rank, log)
    errors: dict[int, torchrun_files.ErrorFile] = {}
    for path in inputs.error_files:
        data = torchrun_files.load_json(path)
        error = torchrun_files.read_error_file(path, data)  # type: ignore[arg-type]
        rank = table.error_files.get(os.path.normpath(path), error.rank)
        if rank is None:
            inputs.ignored.append((path, "an error file whose rank neither its path nor torchrun's failure table says"))
            continue
        errors.setdefault(rank, error)

    failed_logs = {r for r, log in logs.items() if log.exception is not None}  # other logs only lend their tails
    if not converted and not errors and not table.failures and not failed_logs:
        raise ValueError("found no flight recorder dump, torchrun error file, failure table or traceback in "
                         + ", ".join(paths) + (f" (skipped: {', '.join(p for p, _ in inputs.ignored)})"
                                               if inputs.ignored else ""))
    known = set(converted) | set(errors) | {f.rank for f in table.failures} | failed_logs | (unreadable - {None})
    size = max([world_size or 0, world_ranks, max(known, default=-1) + 1])
    missing = sorted(set(range(size)) - set(converted)) if converted else []
    evidence = _evidence(converted, dumps_meta, errors, {r: logs[r] for r in failed_logs}, size)
    script = _script(converted) or os.path.abspath(paths[0])  # no stack (JSON dumps): name what was read
    pending = {r: c.pending for r, c in converted.items() if c.pending is not None}
    waiting_ranks = set(pending)
    failures = [f for f in table.failures if f.rank not in waiting_ranks]  # a waiting rank's death is a symptom
    observations = Observations(outcome=Outcome.FAILED if (errors or table.failures) else Outcome.COMPLETED,
                                world_size=size,
                                launch_mode=POST_MORTEM, failures=failures, missing_ranks=missing,
                                output_tails={r: log.lines for r, log in logs.items()})
    evidence.observations = observations
    evidence.script = script
    if missing:  # what those ranks did is unknown: the checks say they are incomplete, never a silent pass
        evidence.unranked.append(ProbeError(probe=f"{PROBE}-missing", error=(
            f"no dump from {_ranks_text(missing)}: what "
            f"{'they' if len(missing) > 1 else 'it'} did is unknown (killed before dumping, or the dump was not "
            "collected)")))
    cause = failure_facts.first_failure(evidence)
    stop = None if cause is not None else _snapshot(converted, dumps_meta, missing, classify)
    if stop is not None:
        observations.stop = stop
        observations.outcome = Outcome.HUNG
        evidence = Evidence(ranks=evidence.ranks, unranked=evidence.unranked, observations=observations,
                            script=script)  # its facts derived anew
    notes.extend(_notes(converted, dumps_meta, missing, evidence))
    return PostMortem(evidence=evidence, inputs=inputs, notes=notes, torchrun_root_cause=table.root_cause,
                      formats=sorted({meta[2] for meta in dumps_meta.values()}))


def _evidence(converted: dict[int, ConvertedRank], meta: dict, errors: dict[int, torchrun_files.ErrorFile],
              logs: dict[int, torchrun_files.RankLog], world_size: int) -> Evidence:
    evidence = Evidence()
    for rank in sorted(set(converted) | set(errors) | set(logs)):
        conv = converted.get(rank)
        exception = errors[rank].event if rank in errors else (logs[rank].exception if rank in logs else None)
        # The first thing known of the rank: its oldest recorded collective, else its error.
        first_t = next((e.t for e in conv.events), meta[rank][1]) if conv is not None else \
            (exception.t if exception is not None else 0.0)
        events: list[Event] = [ProcessStart(t=first_t, rank=rank, world_size=world_size)]
        if conv is not None:
            events.append(InitProcessGroup(t=first_t, rank=rank, backend=conv.backend, world_size=world_size,
                                           numbering="pg"))
            events.extend(conv.events)
            if conv.cut_off:
                events.append(ProbeError(t=first_t, rank=rank, probe=PROBE, error=(
                    "the ring buffer was full: its oldest collectives were overwritten, so the first ones are "
                    "compared on no rank (raise TORCH_FR_BUFFER_SIZE to keep more)")))
        if exception is not None:
            exception.rank = rank
            if conv is not None and conv.last is not None:
                exception.seq = conv.last["n"]
            events.append(exception)
        for event in events:
            event.rank = rank
        evidence.ranks[rank] = RankEvidence(rank=rank, events=events)
    return evidence


def _script(converted: dict[int, ConvertedRank]) -> Optional[str]:
    """The script the ranks ran: the outermost of the user's frames in a recorded stack."""
    for conv in converted.values():
        record = conv.last or {}
        for frame in reversed(record.get("frames") or []):
            path = frame.get("filename") or ""
            if not is_library_file(path):
                return path
    return None


def _snapshot(converted: dict[int, ConvertedRank], meta: dict, missing: list[int],
              classify: Classify) -> Optional[StopSnapshot]:
    """How the ranks stood when they dumped, as the live monitor reports a stopped job; None when no
    collective was pending anywhere (the dumps show no hang)."""
    if not any(c.pending for c in converted.values()):
        return None
    interner = Interner()
    ranks: dict[int, RankState] = {}
    started: list[float] = []
    threshold: Optional[float] = None
    for rank, conv in sorted(converted.items()):
        dumped_at = meta[rank][1]
        pending = conv.pending
        beat = Heartbeat(pid=0, rank=rank, t=dumped_at, last_collective=conv.last_traced,
                         seq=conv.last["n"] if conv.last else 0, activity="training")
        if pending is not None:
            if pending.traced or not pending.frames:  # a traced call, or a JSON dump (no stack to read)
                beat.activity = f"in {pending.op} #{pending.n}"
            stack = as_stack(pending.frames, interner)
            state, waiting_in = classify(stack, beat)
            started.append(pending.time_s)
            threshold = pending.timeout_s if threshold is None else max(threshold, pending.timeout_s or 0)
            ranks[rank] = RankState(rank=rank, state=state, waiting_in=waiting_in, heartbeat=beat, stack=stack,
                                    stalled_s=max(0.0, dumped_at - pending.time_s))
        else:
            last_t = conv.last["t"] if conv.last else dumped_at
            ranks[rank] = RankState(rank=rank, state="computing", heartbeat=beat, stack=[],
                                    stalled_s=max(0.0, dumped_at - last_t))
    for rank in missing:
        ranks[rank] = RankState(rank=rank, state="no dump")
    stop = StopSnapshot(reason="no-progress", threshold_s=threshold or 0.0, ranks=ranks, t=min(started))
    waiting = all(s.state == "waiting" for r, s in ranks.items() if r not in missing)
    if waiting or timed_out_ranks(stop):
        stop.reason = "hang"
    return stop


def _notes(converted: dict[int, ConvertedRank], meta: dict, missing: list[int], evidence: Evidence) -> list[str]:
    notes = []
    if missing:
        notes.append(f"no dump from {_ranks_text(missing)}")
    cut = sorted(r for r, c in converted.items() if c.cut_off)
    if cut:
        by_first: dict[Optional[int], list[int]] = {}
        for r in cut:
            by_first.setdefault(converted[r].first_world, []).append(r)
        firsts = "; ".join(f"{_ranks_text(ranks)} from #{first}" for first, ranks in sorted(
            by_first.items(), key=lambda kv: kv[0] or 0)[:8])
        notes.append(f"ring buffer full on {len(cut)} rank(s): their oldest entries are gone ({firsts}"
                     f"{'; ...' if len(by_first) > 8 else ''}); collectives are compared only where every rank still "
                     "holds them")
    p2p = {r: c.unrecorded_p2p for r, c in converted.items() if c.unrecorded_p2p}
    if p2p:
        rank, gaps = next(iter(sorted(p2p.items())))
        notes.append(f"gloo records no point-to-point operations: {len(p2p)} rank(s) issued send/recv between "
                     f"collectives (rank {rank}: {sum(g for _, g in gaps)} after collective #{gaps[0][0]}...), not "
                     "compared; a rank waiting in one looks as if it were not inside a collective")
    json_only = sorted(r for r, m in meta.items() if m[2] == "json")
    if json_only:
        notes.append(f"JSON dumps hold no Python stacks (ranks {', '.join(map(str, json_only[:8]))}"
                     f"{'...' if len(json_only) > 8 else ''}): no source lines, DDP's collectives not told apart")
    return notes


def _ranks_text(ranks: list[int]) -> str:
    """"rank 3", "ranks 0-516, 518-1023": runs of consecutive ranks as ranges."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    spans, start = [], ranks[0]
    for previous, current in zip(ranks, ranks[1:] + [None]):
        if current is None or current != previous + 1:
            spans.append(f"{start}-{previous}" if previous > start else str(start))
            start = current
    return "ranks " + ", ".join(spans)

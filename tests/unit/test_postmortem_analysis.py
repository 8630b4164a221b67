"""The flight recorder reader and converter on real dumps captured from the fixtures
(tests/data/flight_recorder, made by tests/integration/fr_harness/fr_capture.py), and torchrun's files."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest

from ddpdoctor.postmortem import torchrun_files
from ddpdoctor.postmortem.discover import discover
from ddpdoctor.postmortem.dump_events import Interner, convert_dump, is_library_file
from ddpdoctor.postmortem.flight_recorder import NotADump, rank_from_name, read_dump
from ddpdoctor.postmortem.to_evidence import load
from ddpdoctor.schema.events import Collective, InternalCollectives, ProbeError
from ddpdoctor.supervisor.analyze import analyze
from ddpdoctor.supervisor.hang import classify

DATA = Path(__file__).resolve().parents[1] / "data" / "flight_recorder"


def _convert(case: str, rank: int):
    return convert_dump(read_dump(str(DATA / case / f"fr_trace_rank_{rank}")), group_ranks={}, interner=Interner())


def _root(case_dir) -> dict:
    report = analyze([str(case_dir)]).report
    (finding,) = [f for f in report.findings if f.severity in ("error", "warning")]
    return finding


# -- reading ------------------------------------------------------------------------------------------

def test_rank_comes_from_torchs_file_naming():
    assert rank_from_name("/tmp/nccl_trace_rank_12") == 12
    assert rank_from_name("comm_lib_trace_rank_3.pkl") == 3
    assert rank_from_name("fr_trace_rank_0.json") == 0
    assert rank_from_name("trace") is None


def test_a_pickle_dump_is_read_with_its_entries_and_stacks():
    dump = read_dump(str(DATA / "some_ranks" / "fr_trace_rank_0"))
    assert (dump.rank, dump.format, dump.backend, dump.version) == (0, "pickle", "gloo", "2.10")
    assert dump.has_frames and dump.first_record == 0
    assert [e["collective_seq_id"] for e in dump.entries] == list(range(1, 9))


def test_the_json_twin_is_read_without_stacks():
    dump = read_dump(str(DATA / "json" / "fr_trace_rank_1"))
    assert dump.format == "json" and not dump.has_frames
    assert dump.entries[0]["process_group"] == ("0", "default_pg")
    assert dump.entries[0]["input_sizes"] == [[4]]


def test_a_pickle_that_names_a_class_is_refused_without_running_it(tmp_path):
    path = tmp_path / "evil_0"
    path.write_bytes(pickle.dumps({"entries": [], "x": os.system}))
    with pytest.raises(NotADump, match="not a readable flight recorder pickle"):
        read_dump(str(path))


def test_a_truncated_dump_is_skipped_and_its_rank_named_missing(tmp_path):
    shutil.copy(DATA / "some_ranks" / "fr_trace_rank_0", tmp_path / "fr_trace_rank_0")
    whole = (DATA / "some_ranks" / "fr_trace_rank_1").read_bytes()
    (tmp_path / "fr_trace_rank_1").write_bytes(whole[: len(whole) // 2])  # the writer died mid-file
    postmortem = load([str(tmp_path)], classify=classify)
    assert [p for p, _ in postmortem.inputs.ignored] == [str(tmp_path / "fr_trace_rank_1")]
    assert "not a readable flight recorder pickle" in postmortem.inputs.ignored[0][1]
    assert postmortem.evidence.observations.missing_ranks == [1]
    stop = postmortem.evidence.stop
    assert stop.ranks[1].state == "no dump" and stop.ranks[0].state == "waiting"


def test_discover_sorts_inputs_and_leaves_ddpdoctors_own_files(tmp_path):
    shutil.copytree(DATA / "killed", tmp_path / "job")
    (tmp_path / "job" / "events-123.jsonl").write_text('{"kind": "step"}\n')
    (tmp_path / "job" / "notes.json").write_text('{"hello": 1}')
    (tmp_path / "job" / ".hidden").write_text("x")
    inputs = discover([str(tmp_path / "job")])
    assert [os.path.basename(p) for p in inputs.dumps] == ["fr_trace_rank_0"]
    assert [os.path.basename(p) for p in inputs.error_files] == ["error_0.json"]
    assert [os.path.basename(p) for p in inputs.logs] == ["torchrun.log"]
    assert [os.path.basename(p) for p, _ in inputs.ignored] == ["notes.json"]
    assert discover([str(tmp_path / "job" / "fr_trace_rank_*")]).dumps == [str(tmp_path / "job" / "fr_trace_rank_0")]
    with pytest.raises(ValueError, match="no such file or folder"):
        discover([str(tmp_path / "nope")])


def test_library_frames_are_told_from_the_scripts_by_path():
    assert is_library_file("/opt/conda/lib/python3.10/site-packages/torch/distributed/distributed_c10d.py")
    assert is_library_file("/usr/lib/python3.11/runpy.py")
    assert is_library_file("/home/me/pytorch/torch/nn/parallel/distributed.py")  # a source build
    assert is_library_file("<frozen runpy>")
    assert not is_library_file("/home/me/project/train.py")


# -- converting -----------------------------------------------------------------------------------------

def test_user_calls_and_ddps_own_collectives_are_told_apart():
    converted = _convert("some_ranks", 0)
    calls = [e for e in converted.events if isinstance(e, Collective)]
    internal = [e for e in converted.events if isinstance(e, InternalCollectives)]
    assert [(c.op, c.n, c.site[0]["line"]) for c in calls] == [("all_reduce", 8, 25)]
    assert calls[0].tensors == [[[1], "float32"]]
    phases = [(e.phase, e.first, e.count) for e in internal]
    assert phases[0] == ("ddp-init", 1, 3)  # the constructor's shape check and parameter broadcast
    assert {p for p, _, _ in phases} == {"ddp-init", "ddp-backward", "ddp-forward"}
    backward = next(e for e in internal if e.phase == "ddp-backward")
    assert backward.site[0]["line"] == 82 and backward.ops[0][0] == "all_reduce"  # loss.backward() in train_step
    numbers = sorted([n for e in internal for n in range(e.first, e.first + e.count)] + [c.n for c in calls])
    assert numbers == list(range(1, 9))  # every collective numbered once, as the live clock numbers them
    assert converted.pending.op == "all_reduce" and converted.pending.n == 8 and converted.pending.traced


def test_a_full_ring_buffer_is_said_and_never_guessed_around():
    converted = _convert("ring", 0)
    assert converted.cut_off and converted.first_world == 4
    postmortem = load([str(DATA / "ring")], classify=classify)
    assert any("ring buffer full on 2 rank(s)" in note for note in postmortem.notes)
    assert any(isinstance(e, ProbeError) and "ring buffer was full" in e.error
               for r in postmortem.evidence.ranks.values() for e in r.events)
    report = analyze([str(DATA / "ring")]).report
    assert report.probe_errors[0]["checks"] == ["collective-hang"]
    (finding,) = report.findings
    assert finding.evidence["sequence"] == 9  # the real divergence, not the numbers one rank lost


def test_subgroups_are_mapped_to_the_global_ranks_that_used_them():
    postmortem = load([str(DATA / "subgroup")], classify=classify)
    groups = {tuple(e.group) for r in postmortem.evidence.ranks.values() for e in r.events
              if isinstance(e, Collective) and e.group is not None}
    assert groups == {(0, 1), (2, 3)}
    assert any("gloo does not record its members; ranks 2, 3 used it" in note for note in postmortem.notes)


# -- diagnosing -----------------------------------------------------------------------------------------

def test_a_rank_only_collective_is_the_first_divergence_with_each_ranks_line():
    finding = _root(DATA / "some_ranks")
    assert (finding.check, finding.severity, finding.location.line) == ("collective-hang", "error", 25)
    assert finding.evidence["sequence"] == 8
    assert "rank 0 called all_reduce of float32[1] at hang_collective_some_ranks.py:25" in finding.message
    assert "rank 1 called barrier at hang_collective_some_ranks.py:27" in finding.message


def test_a_rank_stuck_in_its_own_code_is_named_after_its_last_collective():
    finding = _root(DATA / "stuck")
    # A warning: these files' times are their checkout's, long after any watchdog dumps, so they prove
    # no timeout (the dumps the watchdog wrote: the timeout tests below, and test_trust_wave3_hangs.py).
    assert (finding.check, finding.severity) == ("collective-hang", "warning")
    assert "rank 1 is not inside a collective: stuck in its own code after _synthetic.py:82 (train_step)" \
        in finding.message
    assert "rank 0 waits in the backward pass (DDP's gradient all-reduce) at _synthetic.py:82" in finding.message
    assert finding.evidence["sequence"] == 9


def test_a_subgroup_shape_mismatch_is_found_on_its_group():
    finding = _root(DATA / "subgroup")
    assert finding.evidence["group"] == [2, 3] and finding.location.line == 18
    assert "collective #1 of the subgroup of ranks 2, 3" in finding.message
    assert "rank 2 called reduce of float32[5]" in finding.message


def test_json_dumps_still_show_the_mismatch_without_lines():
    finding = _root(DATA / "json")
    assert finding.check == "collective-hang" and finding.location is None
    assert "rank 0 called reduce of float32[5]" in finding.message


def test_the_killed_rank_is_the_cause_and_its_peer_a_victim():
    result = analyze([str(DATA / "killed")])
    (finding,) = result.report.findings
    assert (finding.check, finding.ranks, finding.evidence["signal"]) == ("rank-failure", (1,), "SIGKILL")
    assert result.report.missing_ranks == [1]
    assert [s["rank"] for s in finding.evidence["secondary"]] == [0]


def test_without_the_failure_table_only_the_dumps_speak():
    result = analyze([str(DATA / "killed" / "fr_trace_rank_0")], world_size=2)
    assert result.report.missing_ranks == [1]
    assert "no dump from rank 1" in result.notes()


# -- torchrun's files -----------------------------------------------------------------------------------

def test_torchruns_failure_table_is_parsed_with_signals_and_error_files():
    table = torchrun_files.parse_failure_table((DATA / "killed" / "torchrun.log").read_text())
    by_rank = {f.rank: f for f in table.failures}
    assert by_rank[1].signal == "SIGKILL" and by_rank[1].exitcode == -9
    assert by_rank[0].signal == "SIGTERM" and by_rank[0].local_rank == 0
    assert table.root_cause in (0, 1)
    assert all(path.endswith("error.json") for path in table.error_files)


def test_an_error_file_becomes_the_exception_its_rank_raised():
    path = DATA / "killed" / "error_0.json"
    error = torchrun_files.read_error_file(str(path), json.loads(path.read_text()))
    assert error.rank == 0 and error.event.type == "RuntimeError"
    assert "Connection reset by peer" in error.event.message or "Connection closed" in error.event.message
    assert error.event.location["file"].endswith("_synthetic.py") and error.event.location["line"] == 82
    assert error.event.t > 1e9


def test_a_console_log_is_split_by_rank_prefix(tmp_path):
    log = tmp_path / "job.log"
    log.write_text("[rank1]: Traceback (most recent call last):\n"
                   '[rank1]:   File "/job/train.py", line 9, in <module>\n'
                   "[rank1]:     step()\n"
                   "[rank1]: ValueError: bad batch\n"
                   "[rank0]: epoch 1 done\n")
    logs = torchrun_files.read_log(str(log), log.read_text())
    assert set(logs) == {0, 1}
    assert logs[1].exception.type == "ValueError" and logs[1].exception.message == "bad batch"
    assert logs[1].exception.location == {"file": "/job/train.py", "line": 9}
    assert logs[0].exception is None


# -- `ddpdoctor check` keeps the recorder on ------------------------------------------------------------

def test_check_turns_the_recorder_on_unless_the_user_sized_it(monkeypatch, tmp_path):
    from ddpdoctor.supervisor import launch
    from ddpdoctor.supervisor.config import RunConfig

    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        monkeypatch.delenv(name, raising=False)
    config = RunConfig(script=str(tmp_path / "train.py"))
    env = launch._rank_env(config, str(tmp_path), keep_launcher_vars=False)
    assert env["TORCH_FR_BUFFER_SIZE"] == "2000" and "DDPDOCTOR_FR_DUMPS" not in env
    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "50")  # the older name: the user's choice stands
    env = launch._rank_env(config, str(tmp_path), keep_launcher_vars=False)
    assert "TORCH_FR_BUFFER_SIZE" not in env and env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "50"
    kept = RunConfig(script=str(tmp_path / "train.py"), keep_evidence=str(tmp_path / "kept"))
    assert launch._rank_env(kept, str(tmp_path), keep_launcher_vars=False)["DDPDOCTOR_FR_DUMPS"] == "1"


def test_dumps_converted_in_other_processes_are_the_same_evidence():
    paths = sorted(str(p) for p in (DATA / "subgroup").glob("fr_trace_rank_*"))
    serial = load(paths, classify=classify)

    def events(postmortem):
        return {r: [e.to_json() for e in ev.events] for r, ev in postmortem.evidence.ranks.items()}

    import ddpdoctor.postmortem.read_dumps as module
    saved = module.PARALLEL_FROM
    try:
        module.PARALLEL_FROM = 1  # four dumps: take the packed path anyway, with map() for the pool
        chunked = load(paths, classify=classify, map_chunks=map)
    finally:
        module.PARALLEL_FROM = saved
    assert events(chunked) == events(serial)
    assert chunked.evidence.stop.to_json() == serial.evidence.stop.to_json()


# -- NCCL's dumps (made here: this machine has no GPU), with their group members and send/recv --------

SITE = "/venv/lib/python3.11/site-packages"


def _nccl_entry(record: int, n: int, name: str, *, group=("0", "default_pg"), p2p_n: int = 0, line: int = 30,
                state: str = "completed", sizes=((8,),)) -> dict:
    function = name.split(":")[1].split(" ")[0]
    return {"record_id": record, "pg_id": int(group[0]), "process_group": group, "collective_seq_id": n,
            "p2p_seq_id": p2p_n, "op_id": record + 1, "profiling_name": name, "time_created_ns": 10**18 + record,
            "input_sizes": [list(s) for s in sizes], "input_dtypes": ["Float"] * len(sizes),
            "output_sizes": [list(s) for s in sizes], "output_dtypes": ["Float"] * len(sizes), "state": state,
            "retired": state == "completed", "timeout_ms": 600000, "is_p2p": p2p_n > 0,
            "frames": [{"name": function, "filename": f"{SITE}/torch/distributed/distributed_c10d.py", "line": 100},
                       {"name": "main", "filename": "/job/train.py", "line": line}]}


def _write_nccl(folder: Path, rank: int, entries: list) -> None:
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"},
              "1": {"name": "1", "desc": "undefined", "ranks": "[2, 3]"}}
    with open(folder / f"nccl_trace_rank_{rank}", "wb") as f:
        pickle.dump({"version": "2.10", "pg_config": config, "pg_status": {}, "entries": entries}, f)


def test_nccl_dumps_name_group_members_and_keep_point_to_point_apart(tmp_path):
    for rank in range(4):
        entries = [_nccl_entry(0, 1, "nccl:all_reduce")]
        if rank in (0, 1):  # a send/recv pair: numbered apart from the collectives (p2p_seq_id)
            peer = "nccl:send 0->1" if rank == 0 else "nccl:recv 0<-1"
            entries.append(_nccl_entry(1, 1, peer, p2p_n=1, line=31))
            entries.append(_nccl_entry(2, 2, "nccl:all_reduce", line=32, state="scheduled"))
        else:  # the second pair's subgroup disagrees on its shape, and never reaches the world's #2
            entries.append(_nccl_entry(1, 1, "nccl:all_reduce", group=("1", "undefined"), line=40,
                                       sizes=((8,),) if rank == 2 else ((9,),), state="scheduled"))
        _write_nccl(tmp_path, rank, entries)
    postmortem = load([str(tmp_path)], classify=classify)
    evidence = postmortem.evidence
    assert evidence.world_size == 4 and not evidence.observations.missing_ranks
    sends = [e for e in evidence.ranks[0].events if isinstance(e, Collective) and e.op == "send"]
    assert len(sends) == 1 and sends[0].units == 0 and sends[0].site[0]["line"] == 31
    subgroup = [e for e in evidence.ranks[3].events if isinstance(e, Collective) and e.group is not None]
    assert subgroup[0].group == [2, 3]  # from NCCL's pg_config, not guessed
    assert not any("does not record its members" in note for note in postmortem.notes)
    report = analyze([str(tmp_path)]).report
    (finding,) = report.findings
    assert finding.evidence["group"] == [2, 3] and finding.location.line == 40
    assert "rank 2 called all_reduce of float32[8]" in finding.message
    assert "rank 3 called all_reduce of float32[9]" in finding.message


def test_a_rank_without_dump_leaves_the_checks_incomplete_never_a_silent_pass():
    result = analyze([str(DATA / "killed" / "fr_trace_rank_0")], world_size=2)
    (problem,) = result.report.probe_errors
    assert problem["probe"] == "flight-recorder-missing" and "no dump from rank 1" in problem["error"]
    assert {c.id: c.incomplete for c in result.report.checks} == {
        "collective-hang": ["flight-recorder-missing"], "rank-failure": ["flight-recorder-missing"]}


# -- what error files do not say ----------------------------------------------------------------------

def _record_error_file(folder: Path, local_rank: int, exc_type: str, message: str, frames: list[tuple]) -> None:
    """An error file as torch.distributed.elastic's ``@record`` writes it, where torchrun's --log-dir puts it."""
    stack = "".join(f'  File "{file}", line {line}, in {function}\n    {code}\n'
                    for file, line, function, code in frames)
    data = {"message": {"message": f"{exc_type}: {message}",
                        "extraInfo": {"py_callstack": "Traceback (most recent call last):\n"
                                                      f"{stack}{exc_type}: {message}\n",
                                      "timestamp": str(1764000000 + local_rank)}}}
    path = folder / "run_x" / "attempt_0" / str(local_rank) / "error.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(data))


def test_error_files_hold_no_step_so_the_report_names_none(tmp_path):
    """Rank 1 raised at step 5: its error file says where, never when in training, so neither the
    message ("before the first optimizer step") nor the evidence ("last optimizer step 0") says a step."""
    import io

    from rich.console import Console

    from ddpdoctor.analysis.render.html import render_html
    from ddpdoctor.analysis.render.junit import render_junit
    from ddpdoctor.analysis.render.markdown import render_markdown
    from ddpdoctor.analysis.render.terminal import render

    _record_error_file(tmp_path, 1, "ValueError", "bad batch",
                       [("/job/train.py", 30, "main", "raise ValueError('bad batch')")])
    _record_error_file(tmp_path, 0, "RuntimeError", "Connection closed by peer [127.0.0.1]:29358",
                       [("/job/train.py", 31, "main", "loss.backward()")])
    report = analyze([str(tmp_path)]).report
    (finding,) = report.findings
    assert (finding.check, finding.ranks, finding.location.line) == ("rank-failure", (1,), 30)
    assert finding.message == "rank 1 raised ValueError: bad batch"
    assert finding.evidence["last_step"] is None  # unknown, not 0
    out = io.StringIO()
    render(Console(file=out, width=160, no_color=True, soft_wrap=True), report, plain=True)
    for name, text in {"terminal": out.getvalue(), "html": render_html(report), "markdown": render_markdown(report),
                       "junit": render_junit(report)}.items():
        assert not any(claim in text for claim in ("first optimizer step", "last optimizer step",
                                                   "after optimizer step", "step 0")), name
        assert "no process group" not in text, name  # the ranks had one: the files just do not show it
        if name != "junit":  # the header: no run time the files do not hold, no backend or device they do not name
            assert "post-mortem, its files read in" in text and "(1 node, unknown, unknown)" in text, name


def test_a_post_mortem_says_the_dumps_not_ddpdoctor_stopped_the_ranks():
    finding = _root(DATA / "stuck")
    assert "when the ranks dumped" in finding.message and "the job was stopped" not in finding.message
    assert {rank: state["steps"] for rank, state in finding.evidence["ranks"].items()} == {"0": None, "1": None}


# -- dumps the watchdog wrote on a timeout, and dumps it did not -------------------------------------------

T0 = 1_800_000_000  # when rank 0's all_reduce #3 was enqueued (s)


def _record_stuck_rank(folder: Path, *, dumped_after_s: float, timeout_s: float = 10.0) -> None:
    """Rank 0 waits in all_reduce #3 (train.py:31); rank 1 completed #2 at the same line and was in
    its own code since. Both dumps are written ``dumped_after_s`` after #3 was enqueued."""
    def entry(record: int, n: int, state: str, line: int) -> dict:
        created = T0 if state != "completed" else T0 - 10 + record
        return {**_nccl_entry(record, n, "nccl:all_reduce", line=line, state=state),
                "time_created_ns": created * 10**9, "timeout_ms": int(timeout_s * 1000)}

    done = [entry(0, 1, "completed", 30), entry(1, 2, "completed", 31)]
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}}
    for rank, entries in ((0, [*done, entry(2, 3, "started", 31)]), (1, done)):
        path = folder / f"nccl_trace_rank_{rank}"
        with open(path, "wb") as f:
            pickle.dump({"version": "2.10", "pg_config": config, "pg_status": {}, "entries": entries}, f)
        os.utime(path, (T0 + dumped_after_s, T0 + dumped_after_s))


def test_a_collective_that_outlived_its_timeout_proves_the_hang_on_the_rank_that_never_came(tmp_path):
    """The watchdog dumps when a collective times out: rank 1 was elsewhere for the whole timeout."""
    _record_stuck_rank(tmp_path, dumped_after_s=10.5)
    report = analyze([str(tmp_path)]).report
    (finding,) = report.findings
    assert (finding.check, finding.severity, finding.ranks) == ("collective-hang", "error", (1,))
    assert finding.location.line == 31 and finding.evidence["culprit"] == 1
    assert finding.message.startswith("the job hung: rank 1 never reached the collective rank 0 was waiting in, "
                                      "which timed out after 10s, and the watchdog dumped every rank: ")
    assert report.outcome == "hung"


def test_dumps_written_before_any_timeout_show_a_stall_not_a_hang(tmp_path):
    """Dumps taken on demand, or by a stop from outside, 4 s into a 10 s timeout: rank 1 may still
    have come, so the stall is a warning, as the live monitor says."""
    _record_stuck_rank(tmp_path, dumped_after_s=4.0)
    (finding,) = analyze([str(tmp_path)]).report.findings
    assert (finding.check, finding.severity) == ("collective-hang", "warning")
    assert finding.evidence["kind"] == "no-progress" and "not proven to be a hang" in finding.message


def test_dumps_whose_file_times_were_lost_in_a_copy_prove_no_timeout(tmp_path):
    """A copy that did not keep the files' times (a checkout, cp without -p) makes them look written
    long after the collective began, later than any watchdog dumps: no proof of a timeout."""
    _record_stuck_rank(tmp_path, dumped_after_s=10 * 86400.0)
    (finding,) = analyze([str(tmp_path)]).report.findings
    assert (finding.check, finding.severity) == ("collective-hang", "warning")


def _fsdp_frames(function: str, fsdp_file: str, *, backward: bool) -> list[dict]:
    """A stack from a dump of an FSDP2 job: c10d, FSDP's file, autograd (a backward), the script."""
    frames = [{"name": function, "filename": f"{SITE}/torch/distributed/distributed_c10d.py", "line": 100},
              {"name": "foreach_all_gather", "filename": f"{SITE}/torch/distributed/fsdp/{fsdp_file}", "line": 50}]
    if backward:
        frames.append({"name": "backward", "filename": f"{SITE}/torch/_tensor.py", "line": 600})
    return frames + [{"name": "main", "filename": "/job/train.py", "line": 31 if backward else 30}]


def test_fsdps_collectives_in_a_dump_carry_the_phase_the_live_probe_gives_them(tmp_path):
    """Not "a library's collective": FSDP's all-gather of a forward, its reduce-scatter in a backward,
    FSDP1's state-dict gathering (traced calls made by FSDP's code carry the phase as well)."""
    entries = [_nccl_entry(0, 1, "nccl:_allgather_base"), _nccl_entry(1, 2, "nccl:_reduce_scatter_base"),
               _nccl_entry(2, 3, "nccl:_allgather_base"), _nccl_entry(3, 4, "nccl:all_gather_into_tensor")]
    entries[0]["frames"] = _fsdp_frames("_all_gather_base", "_fsdp_collectives.py", backward=False)
    entries[1]["frames"] = _fsdp_frames("_reduce_scatter_base", "_fsdp_collectives.py", backward=True)
    entries[2]["frames"] = _fsdp_frames("_all_gather_base", "_state_dict_utils.py", backward=False)
    entries[3]["frames"] = _fsdp_frames("all_gather_into_tensor", "_fsdp_collectives.py", backward=False)
    entries[3]["frames"][0]["line"] = 200  # the public function's own line (stacks are told apart by lines)
    for rank in range(4):
        _write_nccl(tmp_path, rank, entries)
    evidence = load([str(tmp_path)], classify=classify).evidence
    events = [e for e in evidence.ranks[0].events if isinstance(e, (Collective, InternalCollectives))]
    assert [(type(e).__name__, str(e.phase)) for e in events] == [
        ("InternalCollectives", "fsdp-forward"), ("InternalCollectives", "fsdp-backward"),
        ("InternalCollectives", "fsdp-state-dict"), ("Collective", "fsdp-forward")]
    assert events[1].site[0]["line"] == 31  # the user's loss.backward()

"""rank0-checkpoint: writers per path, write/read ordering through collectives, map_location, DCP."""

from __future__ import annotations

from builders import SCRIPT, collective, dcp, ddp_wrap, load, make_evidence, save, sharded

from ddpdoctor.analysis.api import Location
from ddpdoctor.checks.rank0_checkpoint import analyze

CKPT = "/ckpt/model.pt"


def by_severity(result, severity):
    return [f for f in result.findings if f.severity == severity]


# -- writers ---------------------------------------------------------------------------------------

def test_same_path_written_by_two_ranks_is_an_error():
    result = analyze(make_evidence(2, [save(CKPT)]))
    (finding,) = result.findings
    assert finding.check == "rank0-checkpoint"
    assert finding.severity == "error"
    assert finding.ranks == (0, 1)
    assert finding.location == Location(SCRIPT, 80)
    assert finding.message == f"ranks 0, 1 all wrote {CKPT}: concurrent writers can leave a torn or mixed file"
    assert finding.evidence["path"] == CKPT
    assert finding.evidence["writes"] == {"0": 1, "1": 1}
    assert "dist.get_rank() == 0" in finding.fix
    assert result.status == "fail"
    assert result.summary == "problems: 2 save(s), 0 load(s)"


def test_local_rank_zero_on_two_nodes_is_two_writers():
    evidence = make_evidence(4, {0: [save(CKPT)], 1: [], 2: [save(CKPT)], 3: []}, nnodes=2)
    (finding,) = analyze(evidence).findings
    assert finding.severity == "error"
    assert finding.ranks == (0, 2)


def test_identical_state_saved_by_every_rank_to_its_own_path_is_a_warning():
    evidence = make_evidence(2, {0: [save("/ckpt/r0.pt", fingerprint="same")],
                                 1: [save("/ckpt/r1.pt", fingerprint="same")]})
    result = analyze(evidence)
    (finding,) = result.findings
    assert finding.severity == "warning"
    assert finding.ranks == (0, 1)
    assert finding.message.startswith("every rank saved its own copy of identical state (2 files, e.g. /ckpt/r0.pt)")
    assert finding.evidence["paths"] == {"0": "/ckpt/r0.pt", "1": "/ckpt/r1.pt"}
    assert result.status == "warn"


def test_per_rank_distinct_state_saved_to_distinct_paths_is_clean():
    evidence = make_evidence(2, {0: [save("/ckpt/optim-r0.pt", fingerprint="state-0")],
                                 1: [save("/ckpt/optim-r1.pt", fingerprint="state-1")]})
    result = analyze(evidence)
    assert result.findings == []
    assert result.status == "pass"
    assert result.summary == "2 save(s), 0 load(s)"


# -- reads -----------------------------------------------------------------------------------------

def test_rank0_saves_then_barrier_then_all_load_is_clean():
    evidence = make_evidence(2, {
        0: [save(CKPT, seq_start=0, seq_end=0), collective("barrier", 1, shape=None), load(CKPT, seq_start=1)],
        1: [collective("barrier", 1, shape=None), load(CKPT, seq_start=1)],
    })
    result = analyze(evidence)
    assert result.findings == []
    assert result.status == "pass"
    assert result.summary == "1 save(s), 2 load(s)"


def test_read_with_no_collective_after_the_write_is_an_error():
    evidence = make_evidence(2, {
        0: [collective("all_reduce", 1), save(CKPT, seq_start=1), load(CKPT, seq_start=1)],
        1: [collective("all_reduce", 1), load(CKPT, seq_start=1, line=91)],
    })
    result = analyze(evidence)
    (finding,) = result.findings
    assert finding.severity == "error"
    assert finding.ranks == (0, 1)
    assert finding.location == Location(SCRIPT, 91)
    assert finding.message == (f"rank 1 read {CKPT} that rank 0 writes, with no collective between the end of that "
                               "write and the read")
    assert finding.evidence["writer"] == 0
    assert finding.evidence["reader"] == 1
    assert finding.evidence["writer_collectives_after_write"] == 1
    assert finding.evidence["reader_collectives_before_read"] == 1
    assert "dist.barrier()" in finding.fix


def test_a_save_begun_and_finished_counts_once_and_keeps_its_order():
    evidence = make_evidence(2, {
        0: [save(CKPT, done=False), save(CKPT), collective("barrier", 1, shape=None), load(CKPT, seq_start=1)],
        1: [collective("barrier", 1, shape=None), load(CKPT, seq_start=1)],
    })
    result = analyze(evidence)
    assert result.findings == [] and result.summary == "1 save(s), 2 load(s)"


def test_a_read_during_a_save_its_rank_never_finished_is_an_error_even_after_a_collective():
    """The writer was killed mid-save (its peer died reading the torn file): only the begun event exists."""
    error = "RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory"
    evidence = make_evidence(2, {
        0: [collective("all_reduce", 1), save(CKPT, seq_start=1, done=False)],
        1: [collective("all_reduce", 1), collective("barrier", 2, shape=None), load(CKPT, seq_start=2, error=error)],
    })
    (finding,) = analyze(evidence).findings
    assert finding.severity == "error" and finding.ranks == (0, 1)
    assert finding.message == (f"rank 1 read {CKPT} that rank 0 writes, while that write was still running "
                               "(rank 0 never finished it)")
    assert finding.evidence["write_finished"] is False and finding.evidence["writer_collectives_after_write"] is None
    assert finding.evidence["read_error"] == error


def test_read_before_the_file_existed_is_an_error_even_after_a_collective():
    evidence = make_evidence(2, {
        0: [save(CKPT, seq_start=0), collective("barrier", 1, shape=None)],
        1: [collective("barrier", 1, shape=None), load(CKPT, seq_start=1, existed=False)],
    })
    (finding,) = analyze(evidence).findings
    assert finding.severity == "error"
    assert finding.message == f"rank 1 read {CKPT} that rank 0 writes, before the file existed"


def test_read_failing_with_file_not_found_is_an_error():
    evidence = make_evidence(2, {
        0: [save(CKPT, seq_start=0), collective("barrier", 1, shape=None)],
        1: [collective("barrier", 1, shape=None),
            load(CKPT, seq_start=1, existed=None, error=f"FileNotFoundError: No such file: {CKPT}")],
    })
    (finding,) = analyze(evidence).findings
    assert "before the file existed" in finding.message


def test_load_of_a_file_nobody_writes_in_this_run_is_clean():
    result = analyze(make_evidence(2, [load("/data/pretrained.pt")]))
    assert result.findings == []
    assert result.status == "pass"


def test_resume_load_before_rank0_overwrites_the_checkpoint_is_clean():
    steps = [collective("all_reduce", n) for n in range(1, 6)]
    evidence = make_evidence(2, {
        0: [load(CKPT, seq_start=0), *steps, save(CKPT, seq_start=5, seq_end=5), collective("barrier", 6, shape=None)],
        1: [load(CKPT, seq_start=0), *steps, collective("barrier", 6, shape=None)],
    })
    result = analyze(evidence)
    assert result.findings == []


def test_read_racing_with_a_later_write_of_the_same_path_is_an_error():
    evidence = make_evidence(2, {
        0: [save(CKPT, seq_start=0, seq_end=0), collective("barrier", 1, shape=None),
            *[collective("all_reduce", n) for n in range(2, 6)],
            save(CKPT, seq_start=5, seq_end=5), collective("barrier", 6, shape=None)],
        1: [collective("barrier", 1, shape=None), load(CKPT, seq_start=1),
            *[collective("all_reduce", n) for n in range(2, 6)],
            load(CKPT, seq_start=5, line=92), collective("barrier", 6, shape=None)],
    })
    errors = by_severity(analyze(evidence), "error")
    assert len(errors) == 1
    assert errors[0].location == Location(SCRIPT, 92)


# -- map_location ----------------------------------------------------------------------------------

def test_load_without_map_location_while_ranks_use_different_gpus_is_a_warning():
    evidence = make_evidence(2, {
        0: [ddp_wrap(device="cuda:0"), load("/data/pretrained.pt", map_location=None, line=93)],
        1: [ddp_wrap(device="cuda:1"), load("/data/pretrained.pt", map_location=None, line=93)],
    })
    result = analyze(evidence)
    (finding,) = result.findings
    assert finding.check == "rank0-checkpoint"
    assert finding.severity == "warning"
    assert finding.ranks == (0, 1)
    assert finding.location == Location(SCRIPT, 93)
    assert "torch.load without map_location on ranks 0, 1" in finding.message
    assert "(cuda:0, cuda:1)" in finding.message
    assert finding.evidence["devices"] == {"0": "cuda:0", "1": "cuda:1"}
    assert finding.evidence["path"] == "/data/pretrained.pt"
    assert "map_location" in finding.fix
    assert result.status == "warn"


def test_only_the_ranks_loading_without_map_location_are_named():
    evidence = make_evidence(2, {
        0: [ddp_wrap(device="cuda:0"), load("/data/pretrained.pt", map_location="cuda:0")],
        1: [ddp_wrap(device="cuda:1"), load("/data/pretrained.pt", map_location=None)],
    })
    (finding,) = analyze(evidence).findings
    assert finding.ranks == (1,)


def test_load_with_map_location_on_gpus_is_clean():
    evidence = make_evidence(2, {
        0: [ddp_wrap(device="cuda:0"), load("/data/pretrained.pt", map_location="cuda:0")],
        1: [ddp_wrap(device="cuda:1"), load("/data/pretrained.pt", map_location="cuda:1")],
    })
    assert analyze(evidence).findings == []


def test_load_without_map_location_on_cpu_is_clean():
    result = analyze(make_evidence(2, [ddp_wrap(device="cpu"), load("/data/pretrained.pt", map_location=None)]))
    assert result.findings == []


def test_failed_load_without_map_location_is_not_a_map_location_warning():
    evidence = make_evidence(2, {
        0: [ddp_wrap(device="cuda:0"), load("/data/x.pt", map_location=None, error="RuntimeError: corrupt")],
        1: [ddp_wrap(device="cuda:1"), load("/data/x.pt", map_location=None, error="RuntimeError: corrupt")],
    })
    assert analyze(evidence).findings == []


# -- collectives around a rank-0 save --------------------------------------------------------------

def test_a_collective_inside_the_rank0_save_block_is_not_a_checkpoint_finding():
    """One rank writes, as it should: the barrier only rank 0 calls is collective-hang's finding, at
    the barrier's line, not a second root on a correct save."""
    evidence = make_evidence(2, {
        0: [collective("all_reduce", 1), save(CKPT, seq_start=1, line=81),
            collective("barrier", 2, shape=None, line=82)],
        1: [collective("all_reduce", 1)],
    }, outcome="hung")
    result = analyze(evidence)
    assert result.findings == []
    assert result.status == "pass"
    assert result.summary == "1 save(s), 0 load(s)"


# -- DDP-prefixed state dict -----------------------------------------------------------------------

def test_state_dict_saved_from_the_ddp_wrapper_is_info():
    result = analyze(make_evidence(2, {0: [save(CKPT, module_prefix=True)], 1: []}))
    (finding,) = result.findings
    assert finding.severity == "info"
    assert finding.ranks == (0,)
    assert "keys start with 'module.'" in finding.message
    assert CKPT in finding.message
    assert result.status == "pass"


# -- torch.distributed.checkpoint ------------------------------------------------------------------

def test_distributed_checkpoint_calls_are_never_flagged():
    result = analyze(make_evidence(2, [dcp("save", "/ckpt/dcp"), collective("barrier", 1, shape=None),
                                       dcp("load", "/ckpt/dcp")]))
    assert result.findings == []
    assert result.status == "pass"
    assert result.summary == "0 save(s), 0 load(s), 4 distributed-checkpoint call(s)"


# -- not applicable --------------------------------------------------------------------------------

def test_no_checkpoint_is_skipped():
    result = analyze(make_evidence(2, [collective("all_reduce", 1)]))
    assert result.status == "skip"
    assert result.summary == "no checkpoint saved or loaded"


def test_two_writers_of_a_sharded_models_checkpoint_keep_the_gather_on_every_rank_in_the_fix():
    """Under FSDP the fix must not send the gather (a collective) under `if rank == 0:` with the save."""
    evidence = make_evidence(2, [sharded(), save(CKPT)])
    (finding,) = analyze(evidence).findings
    assert finding.severity == "error"
    assert finding.ranks == (0, 1)
    assert finding.message == f"ranks 0, 1 all wrote {CKPT}: concurrent writers can leave a torn or mixed file"
    assert finding.fix.startswith("Keep gathering the full state dict on every rank (`get_model_state_dict(")
    assert "put only the torch.save under `if dist.get_rank() == 0:`" in finding.fix
    assert "dcp.save(state, checkpoint_id=directory)" in finding.fix


def test_replicate_keeps_the_plain_one_writer_fix():
    """replicate() holds whole replicas: there is no gather to keep on every rank."""
    (finding,) = analyze(make_evidence(2, [sharded("replicate"), save(CKPT)])).findings
    assert finding.fix.startswith("Save on the global rank 0 only (`if dist.get_rank() == 0:`")

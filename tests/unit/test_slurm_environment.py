"""Slurm's variables as a launch: hostlists, tasks per node, the step -> rank mapping, precedence."""

from __future__ import annotations

import pytest

from ddpdoctor.schema import settings
from ddpdoctor.supervisor.launch import existing_launch
from ddpdoctor.supervisor.slurm import detect, expand_hostlist, job, parse_tasks_per_node, port_for_job


# Expected values are what `scontrol show hostnames` prints for the same expressions (Slurm 22.05).
@pytest.mark.parametrize("spec, hosts", [
    ("tux[0-5,12,20-25]", ["tux0", "tux1", "tux2", "tux3", "tux4", "tux5", "tux12",
                           "tux20", "tux21", "tux22", "tux23", "tux24", "tux25"]),  # Slurm's hostlist docs
    ("linux[1-3,6]", ["linux1", "linux2", "linux3", "linux6"]),  # slurm_hostlist_create(3)
    ("node1,node[2-5,12]", ["node1", "node2", "node3", "node4", "node5", "node12"]),  # Slurm::Hostlist(3pm)
    ("gpu-[001-004,010]", ["gpu-001", "gpu-002", "gpu-003", "gpu-004", "gpu-010"]),
    ("rack[0-1]_blade[0-2]", ["rack0_blade0", "rack0_blade1", "rack0_blade2",
                              "rack1_blade0", "rack1_blade1", "rack1_blade2"]),
    ("n[9-10]", ["n9", "n10"]),
    ("x,y[1-2],z", ["x", "y1", "y2", "z"]),
    ("n[1-2],m[01-02]", ["n1", "n2", "m01", "m02"]),
    ("vm", ["vm"]),
])
def test_hostlists_expand_as_scontrol_does(spec, hosts):
    assert expand_hostlist(spec) == hosts


@pytest.mark.parametrize("spec", ["gpu-[001-004", "gpu-001]", "n[a-b]", "n[5-1]"])
def test_malformed_hostlists_are_refused(spec):
    with pytest.raises(ValueError):
        expand_hostlist(spec)


@pytest.mark.parametrize("spec, counts", [
    ("2(x3),1", [2, 2, 2, 1]),  # sbatch(1), SLURM_TASKS_PER_NODE: "the first three nodes will each execute two tasks"
    ("4", [4]),
    ("8(x2)", [8, 8]),
    ("1,2(x2),3", [1, 2, 2, 3]),
])
def test_tasks_per_node(spec, counts):
    assert parse_tasks_per_node(spec) == counts


def test_tasks_per_node_refuses_other_text():
    with pytest.raises(ValueError):
        parse_tasks_per_node("2x3")


def _step(**overrides) -> dict[str, str]:
    """The variables srun sets in task 5 of `srun -N 3 -n 7` (2, 2 and 3 tasks per node)."""
    env = {"SLURM_JOB_ID": "123456", "SLURM_STEP_ID": "0", "SLURM_PROCID": "5", "SLURM_NTASKS": "7",
           "SLURM_STEP_NUM_TASKS": "7", "SLURM_LOCALID": "1", "SLURM_NODEID": "2",
           "SLURM_STEP_TASKS_PER_NODE": "2(x2),3", "SLURM_TASKS_PER_NODE": "2(x2),3",
           "SLURM_STEP_NODELIST": "gpu-[001-002,010]", "SLURM_JOB_NODELIST": "gpu-[001-002,010]",
           "SLURMD_NODENAME": "gpu-010"}
    env.update(overrides)
    return env


def test_a_task_of_a_multi_task_step_is_a_rank():
    step = detect(_step())
    assert step is not None
    assert (step.rank, step.world_size, step.local_rank, step.node_rank, step.local_world_size) == (5, 7, 1, 2, 3)
    assert step.nodes == ["gpu-001", "gpu-002", "gpu-010"]
    assert step.variables() == {"RANK": "5", "WORLD_SIZE": "7", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "3",
                                "GROUP_RANK": "2", "MASTER_ADDR": "gpu-001", "MASTER_PORT": str(15000 + 3456)}


def test_master_address_and_port_given_by_the_user_win():
    step = detect(_step(MASTER_ADDR="10.0.0.1", MASTER_PORT="29999"))
    assert step is not None and (step.master_addr, step.master_port) == ("10.0.0.1", 29999)


def test_the_port_is_derived_from_the_job_id():
    assert port_for_job("123456") == 18456 and port_for_job("7") == 15007


@pytest.mark.parametrize("env", [
    _step(SLURM_STEP_NUM_TASKS="1", SLURM_NTASKS="1"),  # srun -n 1
    # the batch script, salloc
    {k: v for k, v in _step().items() if k not in ("SLURM_STEP_ID", "SLURM_STEP_NUM_TASKS")},
    {},
])
def test_single_task_steps_batch_scripts_and_no_slurm_are_no_launch(env):
    assert detect(env) is None
    assert existing_launch(env) is None


def test_launcher_variables_win_over_slurm():
    """`srun torchrun ... -m ddpdoctor check`: torchrun made this process rank 3 of 8."""
    env = _step(RANK="3", WORLD_SIZE="8", LOCAL_RANK="3", LOCAL_WORLD_SIZE="4", TORCHELASTIC_RUN_ID="abc",
                MASTER_ADDR="gpu-001", MASTER_PORT="29400", TORCHELASTIC_USE_AGENT_STORE="True")
    launch = existing_launch(env)
    assert launch is not None and launch.detected == "torchrun"
    assert (launch.rank, launch.world_size, launch.local_world_size, launch.agent_store) == (3, 8, 4, True)
    assert launch.exported == {}


def test_slurm_launch_exports_the_mapping():
    launch = existing_launch(_step())
    assert launch is not None and launch.detected == "slurm"
    assert launch.exported["RANK"] == "5" and launch.nnodes == 3  # the step's nodes
    assert launch.run_id == "123456" and not launch.agent_store


def test_a_rank_of_a_job_ddpdoctor_launched_is_no_launch_of_its_own():
    assert existing_launch({**_step(), settings.ACTIVE: "1"}) is None


def test_the_job_is_described_for_the_report_in_any_mode():
    info = job(_step(SLURM_STEP_NUM_TASKS="1"))
    assert info is not None
    assert ((info["job_id"], info["step_id"], info["nodes"], info["num_tasks"])
            == ("123456", "0", ["gpu-001", "gpu-002", "gpu-010"], 1))
    assert job({}) is None

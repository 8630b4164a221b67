"""Device simulation pieces that run in one process: the device-rewriting mode, map_location,
torch.cuda / torch.accelerator answers, autocast and GradScaler, SyncBatchNorm's math. Every test
installs the simulation through the real entry point and undoes it (patching.restore_all)."""

from __future__ import annotations

import json
import os
import types

import pytest
import torch
import torch.nn as nn

from ddpdoctor.analysis.decode import decode
from ddpdoctor.rank import devicesim
from ddpdoctor.rank.devicesim.mode import cpu_map_location, is_cuda
from ddpdoctor.rank.devicesim.syncbn import sync_batch_norm
from ddpdoctor.rank.probes import patching
from ddpdoctor.rank.recorder import Recorder
from ddpdoctor.schema.settings import RankSettings


@pytest.fixture
def sim(tmp_path, monkeypatch):
    """The simulation installed as a rank installs it (mode "simulate": also where a GPU exists)."""
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    rec = Recorder(RankSettings(evidence_dir=str(tmp_path)))
    finish = devicesim.install(rec, mode="simulate", nproc_per_node=2)
    try:
        yield rec
    finally:
        finish()
        patching.restore_all()
        rec.close()


def last_event(rec: Recorder) -> dict:
    rec.close()
    (name,) = os.listdir(rec.evidence_dir)
    lines = [json.loads(line) for line in open(os.path.join(rec.evidence_dir, name))]
    return [e for e in lines if e["kind"] == "device_sim"][-1]


def test_is_cuda_reads_every_device_form():
    assert all(is_cuda(d) for d in (0, 3, "cuda", "cuda:1", torch.device("cuda"), torch.device("cuda", 2)))
    assert not any(is_cuda(d) for d in (None, True, "cpu", "meta", torch.device("cpu"), torch.float16))


def test_tensors_and_modules_land_on_the_cpu(sim):
    assert torch.zeros(2, device=0).device.type == "cpu"
    assert torch.tensor([1.0], device="cuda:1").device.type == "cpu"
    for factory in (torch.ones, torch.randn, torch.empty, torch.rand):
        assert factory(2, device=torch.device("cuda", 1)).device.type == "cpu"
    assert torch.arange(3, device="cuda").device.type == "cpu"
    assert torch.full((2,), 1.0, device=1).device.type == "cpu"
    assert torch.randint(0, 4, (3,), device="cuda").device.type == "cpu"
    x = torch.ones(2)
    assert x.to(1).device.type == x.to("cuda:0").device.type == x.cuda().device.type == "cpu"
    assert x.to("cuda", torch.float64).dtype == torch.float64
    assert x.to(device=torch.device("cuda"), non_blocking=True).device.type == "cpu"
    assert x.pin_memory() is x and x.cuda() is x
    net = nn.Linear(2, 2).to(0).cuda().to(torch.device("cuda:1"))
    assert next(net.parameters()).device.type == "cpu"
    assert x.to(torch.float16).dtype == torch.float16  # no device: untouched
    event = last_event(sim)
    assert {"cuda tensors->cpu", "cuda modules->cpu", "pin_memory->no-op"} <= set(event["calls"])
    assert event["active"] is True and event["devices"] == [0, 1]


def test_torch_cuda_answers_one_gpu_per_local_rank(sim):
    assert torch.cuda.is_available() and torch.cuda.device_count() == 4  # LOCAL_WORLD_SIZE wins
    torch.cuda.set_device(3)
    assert torch.cuda.current_device() == 3
    with torch.cuda.device(1):
        assert torch.cuda.current_device() == 1
    assert torch.cuda.current_device() == 3
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        torch.cuda.set_device(4)
    torch.cuda.synchronize()
    torch.cuda.manual_seed_all(0)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    assert torch.cuda.memory_allocated() == torch.cuda.max_memory_allocated() == 0
    free, total = torch.cuda.mem_get_info()
    assert free == total > 0
    assert "simulated" in torch.cuda.get_device_name(0)
    assert torch.cuda.get_device_properties(0).total_memory == total
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) >= 0
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        stream.wait_stream(torch.cuda.current_stream())
    torch.cuda.nvtx.range_push("step")
    torch.cuda.nvtx.range_pop()
    assert isinstance(torch.cuda.get_rng_state(), torch.Tensor)
    assert torch.accelerator.is_available() and torch.accelerator.device_count() == 4
    assert torch.accelerator.current_accelerator() == torch.device("cuda")
    torch.accelerator.set_device_index(2)
    assert torch.accelerator.current_device_index() == torch.cuda.current_device() == 2
    torch.accelerator.synchronize()
    assert {"torch.cuda.set_device", "torch.cuda.device_count", "torch.cuda.synchronize",
            "torch.accelerator.set_device_index"} <= set(last_event(sim)["calls"])


def _error(call) -> tuple[type, str]:
    """(type, message) of what ``call`` raises."""
    try:
        call()
    except Exception as exc:
        return type(exc), str(exc)
    raise AssertionError("did not raise")


NEGATIVE = (lambda: torch.ones(2).cuda(-1), lambda: nn.Linear(2, 2).cuda(-1), lambda: torch.ones(2).to(-1),
            lambda: nn.Linear(2, 2).to(-1), lambda: torch.zeros(1, device=-1), lambda: torch.ones(2).to("cuda:-1"),
            lambda: nn.Linear(2, 2).to("cuda:-1"), lambda: torch.device("cuda", -1))


def test_a_negative_device_index_raises_what_torch_raises_on_any_machine(tmp_path, monkeypatch):
    """`model.cuda(args.local_rank)` with the launch-era default -1: torch's argument parser refuses
    it before any CUDA call, so a CPU-only torch raises exactly what a GPU machine raises."""
    native = [_error(call) for call in NEGATIVE]
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    rec = Recorder(RankSettings(evidence_dir=str(tmp_path)))
    finish = devicesim.install(rec, mode="simulate", nproc_per_node=2)
    try:
        assert [_error(call) for call in NEGATIVE] == native
        assert native[0] == (RuntimeError, "Device index must not be negative")
        torch.cuda.set_device(-1)  # torch: a negative index is a no-op
        with torch.cuda.device(-1):
            assert torch.cuda.current_device() == 0
    finally:
        finish()
        patching.restore_all()
        rec.close()


@pytest.mark.parametrize("call", [
    lambda: torch.ones(2).cuda(4), lambda: nn.Linear(2, 2).cuda(4), lambda: torch.ones(2).to("cuda:5"),
    lambda: nn.Linear(2, 2).to(torch.device("cuda", 4)), lambda: torch.zeros(1, device=7),
    lambda: torch.cuda.set_device(4), lambda: torch.cuda.device(4).__enter__(),
    lambda: torch.accelerator.set_device_index(4)])
def test_an_index_past_the_simulated_gpus_raises_invalid_device_ordinal(sim, call):
    kind, message = _error(call)
    assert issubclass(kind, RuntimeError) and kind is getattr(torch, "AcceleratorError", RuntimeError)
    assert message.startswith("CUDA error: invalid device ordinal\n")
    assert decode(message).code == "invalid-device-ordinal"
    assert torch.ones(2).cuda(3).device.type == "cpu"  # the node's last simulated GPU is fine


def test_data_parallel_runs_its_module_as_on_the_simulated_gpus(sim):
    """`nn.DataParallel(model).to(device)`: it takes every simulated GPU and runs the step the module
    runs on the whole batch (CUDA's scatter and gather have no CPU form), never its device check."""
    torch.manual_seed(0)
    net = nn.Linear(4, 2)
    model = nn.DataParallel(net).to(torch.device("cuda"))
    assert model.device_ids == [0, 1, 2, 3]
    x = torch.randn(8, 4).cuda()
    assert torch.equal(model(x), net(x))
    model(x).sum().backward()
    assert net.weight.grad is not None
    assert "DataParallel->module on cpu" in last_event(sim)["calls"]


def test_device_count_falls_back_to_nproc_per_node_in_a_spawn_launcher(tmp_path, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    rec = Recorder(RankSettings(evidence_dir=str(tmp_path)))
    finish = devicesim.install(rec, mode="cpu", nproc_per_node=3)  # the old name of "simulate"
    try:
        assert torch.cuda.device_count() == 3
    finally:
        finish()
        patching.restore_all()
        rec.close()


def test_what_cannot_be_simulated_raises_naming_the_api(sim):
    with pytest.raises(devicesim.NotSimulatedError, match=r"torch\.cuda\.CUDAGraph cannot be simulated on CPU"):
        torch.cuda.CUDAGraph()
    with pytest.raises(devicesim.NotSimulatedError, match=r"torch\.cuda\.nccl\.version"):
        torch.cuda.nccl.version()
    torch.cuda.memory._record_memory_history()  # a debugging aid: ignored, and reported as such
    event = last_event(sim)
    assert event["unsupported"] == ["torch.cuda.CUDAGraph", "torch.cuda.nccl.version"]
    assert event["ignored"] == ["torch.cuda.memory._record_memory_history"]


# What cannot be simulated, called as a script would, with the kind of error a CPU-only torch raises
# for the same call: each must fail so under simulation, on a CPU build and on a CUDA build alike
# (so `except AssertionError` etc. still catch it). On a CUDA build without a GPU torch itself fails
# differently (the driver is missing) or not at all (NCCL's version, TunableOp's flags), so the kinds
# are written here, and checked against the real CPU-only torch wherever that is the one installed.
UNSUPPORTED_CALLS = {
    "torch.cuda.CUDAGraph": (lambda: torch.cuda.CUDAGraph(), RuntimeError),
    "torch.cuda.graph": (lambda: torch.cuda.graph(None), RuntimeError),
    "torch.cuda.MemPool": (lambda: torch.cuda.MemPool(), RuntimeError),
    "torch.cuda.ExternalStream": (lambda: torch.cuda.ExternalStream(0, device=0), RuntimeError),
    "torch.cuda.graph_pool_handle": (lambda: torch.cuda.graph_pool_handle(), RuntimeError),
    "torch.cuda.nccl.version": (lambda: torch.cuda.nccl.version(), AttributeError),
    "torch.cuda.nccl.unique_id": (lambda: torch.cuda.nccl.unique_id(), AttributeError),
    "torch.cuda.nccl.all_reduce": (lambda: torch.cuda.nccl.all_reduce([torch.ones(2)]), AttributeError),
    "torch.cuda.cudart": (lambda: torch.cuda.cudart(), AssertionError),
    "torch.cuda.current_blas_handle": (lambda: torch.cuda.current_blas_handle(), AssertionError),
    "torch.cuda.caching_allocator_alloc": (lambda: torch.cuda.caching_allocator_alloc(16), AssertionError),
    "torch.cuda.use_mem_pool": (lambda: torch.cuda.use_mem_pool(None).__enter__(), AssertionError),
    "torch.cuda.utilization": (lambda: torch.cuda.utilization(), ModuleNotFoundError),  # no pynvml on either
    "torch.cuda.tunable.enable": (lambda: torch.cuda.tunable.enable(), AttributeError),
    "torch.cuda.tunable.is_enabled": (lambda: torch.cuda.tunable.is_enabled(), AttributeError),
    "torch.cuda.get_stream_from_external": (lambda: torch.cuda.get_stream_from_external(0), AssertionError),
    "torch.cuda.change_current_allocator": (lambda: torch.cuda.change_current_allocator(None), AttributeError),
    "torch.cuda.jiterator._create_jit_fn": (lambda: torch.cuda.jiterator._create_jit_fn(
        "template <typename T> T identity(T x) { return x; }")(torch.ones(2)), AssertionError),
    "torch.accelerator.Graph": (lambda: torch.accelerator.Graph(), RuntimeError),
}


def _raised(call) -> type:
    try:
        call()
    except Exception as exc:  # noqa: BLE001 (the kind is what is compared)
        return type(exc)
    raise AssertionError("expected the call to fail")


def test_the_cpu_only_kinds_are_what_a_cpu_only_torch_raises():
    if torch.version.cuda is not None:
        pytest.skip("a CUDA build: its own failures are not a CPU-only torch's (CI runs the CPU build)")
    measured = {api: _raised(call) for api, (call, _) in UNSUPPORTED_CALLS.items()}  # no simulation
    assert {api: kind for api, kind in measured.items() if not issubclass(kind, UNSUPPORTED_CALLS[api][1])} == {}


def test_what_cannot_be_simulated_fails_with_the_kind_a_cpu_only_torch_raises(tmp_path):
    """On whichever build is installed (CI runs the CPU build; a CUDA build without a GPU was run by
    hand, see README): the same kinds, the same `unsupported` list."""
    rec = Recorder(RankSettings(evidence_dir=str(tmp_path)))
    finish = devicesim.install(rec, mode="simulate", nproc_per_node=2)
    try:
        for api, (call, kind) in UNSUPPORTED_CALLS.items():
            with pytest.raises(kind) as raised:
                call()
            assert type(raised.value) is devicesim.NotSimulatedError.of(kind), (api, raised.value)
            decoded = decode(str(raised.value))
            assert decoded is not None and decoded.code == "not-simulated", (api, str(raised.value))
    finally:
        finish()
        patching.restore_all()
    unsupported = set(last_event(rec)["unsupported"])
    # make_graphed-style calls name what failed inside (the graph), everything else itself
    assert set(UNSUPPORTED_CALLS) <= unsupported, set(UNSUPPORTED_CALLS) - unsupported


def test_not_simulated_errors_pickle_as_their_kind():
    import pickle

    error = pickle.loads(pickle.dumps(devicesim.NotSimulatedError.of(AssertionError)("torch.cuda.cudart", "x")))
    assert isinstance(error, AssertionError) and isinstance(error, devicesim.NotSimulatedError)
    assert str(error).startswith("torch.cuda.cudart cannot be simulated on CPU")


# The public namespaces libraries touch at import and at run time.
CONFORMANCE_MODULES = ("torch.cuda", "torch.cuda.memory", "torch.cuda.random", "torch.accelerator",
                       "torch.backends.cuda", "torch.backends.cudnn")


def _namespace() -> dict[tuple[str, str], object]:
    import importlib

    values = {}
    for module_name in CONFORMANCE_MODULES:
        module = importlib.import_module(module_name)
        for name in dir(module):
            if not name.startswith("_"):
                values[(module_name, name)] = getattr(module, name)
    return values


def _kind(value: object) -> str:
    if isinstance(value, type):
        return "class"
    if isinstance(value, types.ModuleType):
        return "module"
    return "function" if callable(value) else type(value).__name__


def test_every_public_name_is_simulated_with_its_kind_or_left_as_it_is(tmp_path):
    before = _namespace()
    rec = Recorder(RankSettings(evidence_dir=str(tmp_path)))
    finish = devicesim.install(rec, mode="simulate", nproc_per_node=2)
    try:
        after = _namespace()
        assert after.keys() == before.keys()
        simulated = 0
        for key, original in before.items():
            value = after[key]
            if value is original:
                continue
            simulated += 1
            assert _kind(value) == _kind(original), (key, _kind(original), _kind(value))
            if isinstance(original, type):
                # a subclass of torch's class, or (torch.cuda.FloatTensor...) the CPU's class of that name
                assert issubclass(value, original) or value is getattr(torch, key[1]), key
                assert (value | None) is not None  # the annotations transformers writes
        assert simulated > 50
    finally:
        finish()
        patching.restore_all()
    assert _namespace() == before  # and all of it restored


def test_classes_stay_classes_for_isinstance_and_subclassing(sim):
    stream = torch.cuda.Stream()
    assert isinstance(stream, torch.cuda.Stream) and isinstance(stream, torch.cuda.streams.Stream)
    assert isinstance(torch.cuda.current_stream(), torch.cuda.Stream)
    event = torch.cuda.Event(enable_timing=True)
    assert isinstance(event, torch.cuda.streams.Event)
    assert stream.record_event(event) is event and event.query()

    class Graph(torch.cuda.CUDAGraph):  # a library's subclass, defined at import
        pass

    assert torch.cuda.CUDAGraph | None is not None
    with pytest.raises(RuntimeError, match="cannot be simulated"):
        Graph()
    generator = torch.Generator(device="cuda:1")
    assert isinstance(generator, torch.Generator) and isinstance(torch.default_generator, torch.Generator)
    assert issubclass(torch._C.Generator, torch.Generator)
    assert torch.Generator | None is not None
    assert torch.randn(3, generator=generator.manual_seed(0), device="cuda").device.type == "cpu"
    assert torch.equal(torch.randn(3, generator=torch.Generator("cuda").manual_seed(0)),
                       torch.randn(3, generator=torch.Generator().manual_seed(0)))
    assert torch.cuda.FloatTensor is torch.FloatTensor
    assert torch.ones(2, dtype=torch.float64).type("torch.cuda.FloatTensor").dtype == torch.float32
    assert torch.ones(2).type(torch.cuda.LongTensor).dtype == torch.int64
    assert "torch.Generator(cuda)->cpu" in last_event(sim)["calls"]


# A CUDA build of torch (what a plain `pip install torch` gets on Linux) on a machine without a GPU.
# There torch.cuda.Stream and Event derive from C types (torch._C._CudaStreamBase, a torch.Stream;
# _CudaEventBase, a torch.Event) whose constructors ask the CUDA driver for the current device, and
# Python refuses object.__new__ for a subclass of such a type ("object.__new__(Stream) is not safe"):
# the simulation broke every GPU script at its first optimizer.step(). CI runs only the CPU build, so
# these tests build the stand-ins over bases shaped like the CUDA build's, which torch.Stream and
# torch.Event (C types on either build) make possible; the CUDA build itself was run by hand (README).


class DriverStream(torch.Stream):
    """torch.cuda.Stream of a CUDA build, as far as construction goes: a C base, and a constructor
    that needs the CUDA driver."""

    def __new__(cls, *args, **kwargs):
        raise RuntimeError("Found no NVIDIA driver on your system")


class DriverEvent(torch.Event):
    def __new__(cls, *args, **kwargs):
        raise RuntimeError("Found no NVIDIA driver on your system")


def _devices(count: int = 2, current: int = 1):
    from ddpdoctor.rank.devicesim.cuda_api import SimulatedDevices
    from ddpdoctor.rank.devicesim.ledger import Ledger

    devices = SimulatedDevices(Ledger(None, mode="simulate", active=True), count)
    devices.current = current
    return devices


def test_object_new_refuses_a_subclass_of_a_c_base_as_on_a_cuda_build():
    """The failure the stand-ins must avoid, reproduced on whichever build is installed."""

    class Naive(DriverStream):
        def __new__(cls, *args, **kwargs):
            return object.__new__(cls)

    with pytest.raises(TypeError, match=r"object\.__new__\(Naive\) is not safe"):
        Naive()


def test_stand_in_streams_and_events_never_run_a_constructor_of_torchs_bases():
    import gc

    from ddpdoctor.rank.devicesim.streams import stream_classes

    Stream, Event = stream_classes(_devices(), bases=(DriverStream, DriverEvent))
    for _ in range(100):  # and freeing them (the C base's own dealloc) is fine
        stream = Stream()
        assert isinstance(stream, DriverStream) and isinstance(stream, torch.Stream)
        assert stream.device == torch.device("cuda", 1) and stream.device_index == 1
        assert (stream.device_type, stream.stream_id, stream.cuda_stream, stream.priority) == (1, 0, 0, 0)
        assert stream.query() and stream.is_capturing() is False and stream == Stream(1)
        assert Stream("cuda:0").device == torch.device("cuda", 0) and Stream(0) != stream
        event = stream.record_event(Event(enable_timing=True))
        assert isinstance(event, DriverEvent) and isinstance(event, torch.Event)
        assert event.device == torch.device("cuda", 1) and event.query() and event.elapsed_time(event) == 0.0
        assert Event().device is None
        del stream, event
    gc.collect()


def test_the_simulated_stream_skips_torchs_own_constructors(sim, monkeypatch):
    """torch.cuda's Python Stream/Event constructors (which call the build's C constructors) are
    never reached: they raise here, and the stand-ins are built all the same."""
    for stand_in in (torch.cuda.Stream, torch.cuda.Event):
        torchs = stand_in.__mro__[1]
        assert torchs.__module__ == "torch.cuda.streams" and stand_in.__module__.startswith("ddpdoctor.")
        monkeypatch.setattr(torchs, "__new__", staticmethod(lambda cls, *a, **k: pytest.fail("torch's __new__")))
    assert torch.cuda.Stream(0).device_index == 0 and torch.cuda.current_stream().device_index == 0
    assert torch.cuda.Event(enable_timing=True).enable_timing is True


def test_a_simulated_stream_is_a_torch_stream_on_either_build(sim):
    """As a CUDA stream is on GPUs (a CPU build's torch.cuda.Stream is not): Tensor.record_stream's
    argument parser takes nothing else, and it reaches the simulation's no-op."""
    stream, event = torch.cuda.current_stream(), torch.cuda.Event()
    assert isinstance(stream, torch.Stream) and isinstance(event, torch.Event)
    torch.ones(2, device="cuda").record_stream(stream)


def test_an_optimizer_step_asks_the_simulated_current_stream(sim):
    """torch.optim's graph-capture health check asks torch.accelerator.current_stream().is_capturing()
    before every step: where the CUDA build first broke."""
    model = nn.Linear(2, 1).cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(3, 2, device="cuda")).sum().backward()
    optimizer.step()
    stream = torch.accelerator.current_stream()
    assert isinstance(stream, torch.cuda.Stream) and stream.is_capturing() is False


def test_a_cuda_runtime_error_is_reraised_as_a_cpu_only_torch_would_raise(sim):
    """A CUDA build without a GPU raises torch.AcceleratorError from the CUDA runtime; a CPU-only
    torch never runs it. A guarded call re-raises it as a RuntimeError, named."""
    from ddpdoctor.rank.devicesim.cuda_api import guarded

    accelerator_error = getattr(torch, "AcceleratorError", None)
    if accelerator_error is None:
        pytest.skip("this torch has no AcceleratorError")
    noted = []

    def needs_the_driver():
        raise accelerator_error("CUDA error: no CUDA-capable device is detected")

    with pytest.raises(RuntimeError) as raised:
        guarded("torch.cuda.some_query", needs_the_driver, noted.append)()
    assert type(raised.value) is devicesim.NotSimulatedError.of(RuntimeError)
    assert not isinstance(raised.value, accelerator_error) and noted == ["torch.cuda.some_query"]


def test_ddpdoctors_own_probes_get_torchs_answer_about_the_build(sim):
    """The environment probe reports the NCCL a CUDA build ships (a CPU build has none: torch's own
    AttributeError); the script's call fails on either build, as in a CPU-only torch."""
    probe = {"__name__": "ddpdoctor.rank.probes.environment"}
    exec("import torch\ntry:\n    version = torch.cuda.nccl.version()\nexcept AttributeError as e:\n"
         "    version = e", probe)
    if torch.version.cuda is None:
        assert not isinstance(probe["version"], devicesim.NotSimulatedError)
    else:
        assert isinstance(probe["version"], tuple)
    assert last_event(sim)["unsupported"] == []
    with pytest.raises(AttributeError, match="torch.cuda.nccl.version cannot be simulated"):
        torch.cuda.nccl.version()


def test_cuda_rng_state_round_trips_per_device(sim):
    torch.cuda.manual_seed_all(7)
    assert torch.cuda.initial_seed() == 7
    state = torch.cuda.get_rng_state()
    torch.cuda.manual_seed(8)
    assert not torch.equal(torch.cuda.get_rng_state(), state)
    torch.cuda.set_rng_state(state)
    assert torch.equal(torch.cuda.get_rng_state(), state)
    states = torch.cuda.random.get_rng_state_all()
    assert len(states) == torch.cuda.device_count() == 4
    torch.cuda.random.set_rng_state_all(states)
    foreign = torch.tensor([1, 2, 3], dtype=torch.uint8)  # a real GPU's (seed, offset) from a checkpoint
    torch.cuda.set_rng_state(foreign, "cuda:2")
    assert torch.equal(torch.cuda.get_rng_state(2), foreign)
    assert len(torch.cuda.default_generators) == 4
    cpu_state = torch.get_rng_state()
    with torch.random.fork_rng(devices=[0, 1], device_type="cuda"):
        torch.randn(4)
        torch.cuda.manual_seed(1)
    assert torch.equal(torch.get_rng_state(), cpu_state)
    torch.manual_seed(3)  # seeds the simulated CUDA generators too, as on GPUs
    assert torch.cuda.initial_seed() == 3


def test_memory_statistics_have_torch_keys_and_summaries_work(sim):
    stats = torch.cuda.memory_stats()
    assert stats["allocated_bytes.all.peak"] == 0 and stats["num_ooms"] == 0
    assert torch.cuda.memory_allocated(0) == torch.cuda.max_memory_reserved("cuda:1") == 0
    assert torch.cuda.memory.memory_allocated is torch.cuda.memory_allocated
    assert "Allocated memory" in torch.cuda.memory_summary()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.reset_accumulated_memory_stats()
    props = torch.cuda.get_device_properties("cuda:0")
    assert (props.major, props.minor) == torch.cuda.get_device_capability() == (8, 0)
    assert torch.cuda.is_bf16_supported() and torch.cuda.is_tf32_supported()
    assert torch.accelerator.memory_stats()["allocated_bytes.all.current"] == 0
    assert torch.float16 in torch.accelerator.get_device_capability()["supported_dtypes"]
    # the same answers under torch.accelerator.memory's own names (a CUDA build's torch answers an
    # empty dict without a GPU, a CPU build raises)
    memory = pytest.importorskip("torch.accelerator.memory")
    assert memory.memory_stats() == torch.cuda.memory_stats() and memory.memory_allocated() == 0


def test_accelerator_rng_is_the_simulated_cuda_rng(sim):
    """torch.accelerator.random (torch 2.14) reads the generators torch.cuda's RNG calls seed."""
    random = getattr(torch.accelerator, "random", None)
    if random is None:
        pytest.skip("torch.accelerator.random is newer than this torch")
    torch.cuda.manual_seed_all(11)
    torch.cuda.set_device(1)
    torch.cuda.manual_seed(12)
    assert random.initial_seed() == 12 and random.initial_seed(0) == 11
    assert torch.equal(random.get_rng_state(2), torch.cuda.get_rng_state(2))
    assert len(random.get_rng_state_all()) == torch.cuda.device_count()


def test_backend_flags_and_legacy_calls_work_as_on_gpus(sim):
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.enable_flash_sdp(True)
    with pytest.warns(FutureWarning), torch.cuda.amp.autocast(dtype=torch.bfloat16):  # deprecated, still used
        assert nn.Linear(2, 2)(torch.ones(1, 2)).dtype == torch.bfloat16
    torch.cuda.nvtx.range_push("x")
    torch.cuda.nvtx.range_pop()
    with torch.cuda.nvtx.range("y"), torch.cuda.device(1), torch.accelerator.device_index(2):
        assert torch.cuda.current_device() == 2
    torch.cuda.init()
    torch.cuda.set_sync_debug_mode(1)
    assert torch.cuda.get_sync_debug_mode() == 0
    assert last_event(sim)["ignored"] == ["torch.cuda.set_sync_debug_mode"]


def test_not_simulated_error_decodes_to_its_own_cause():
    decoded = decode(str(devicesim.NotSimulatedError("torch.cuda.CUDAGraph")))
    assert decoded is not None and decoded.code == "not-simulated"
    assert decoded.detail == "torch.cuda.CUDAGraph cannot be simulated on CPU"


@pytest.mark.parametrize("asked", [None, "cuda:1", torch.device("cuda", 0), 1, {"cuda:0": "cuda:1"},
                                   lambda storage, location: storage.cuda(1)])
def test_every_map_location_form_loads_on_the_cpu(sim, tmp_path, asked):
    path = tmp_path / "ckpt.pt"
    torch.save({"w": torch.ones(2)}, path)
    assert cpu_map_location(asked) == "cpu"
    assert torch.load(path, map_location=asked)["w"].device.type == "cpu"
    assert torch.load(path, asked)["w"].device.type == "cpu"


def test_autocast_and_grad_scaler_take_their_cpu_forms(sim):
    net = nn.Linear(4, 4)
    with torch.autocast("cuda", dtype=torch.float16):
        assert net(torch.ones(2, 4)).dtype == torch.bfloat16
    with torch.autocast("cuda", enabled=False):
        assert net(torch.ones(2, 4)).dtype == torch.float32
    scaler = torch.amp.GradScaler("cuda")
    assert not scaler.is_enabled()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    loss = net(torch.ones(2, 4)).sum()
    assert scaler.scale(loss) is loss
    loss.backward()
    before = net.weight.detach().clone()
    scaler.step(optimizer)
    scaler.update()
    assert not torch.equal(before, net.weight)
    assert set(last_event(sim)["calls"]) >= {"autocast(cuda)->autocast(cpu, bfloat16)", "GradScaler(cuda)->disabled"}


def test_everything_is_restored(tmp_path):
    originals = (torch.cuda.is_available, torch.cuda.set_device, torch.load, torch.distributed.init_process_group,
                 torch.nn.SyncBatchNorm.forward, torch.amp.GradScaler.__init__)
    rec = Recorder(RankSettings(evidence_dir=str(tmp_path)))
    finish = devicesim.install(rec, mode="cpu")
    finish()
    patching.restore_all()
    rec.close()
    assert (torch.cuda.is_available, torch.cuda.set_device, torch.load, torch.distributed.init_process_group,
            torch.nn.SyncBatchNorm.forward, torch.amp.GradScaler.__init__) == originals
    # no mode left behind: torch without CUDA asserts, torch with CUDA finds no driver
    with pytest.raises((AssertionError, RuntimeError)):
        torch.zeros(1, device="cuda")


def test_native_and_auto_with_a_gpu_do_not_simulate(tmp_path, monkeypatch):
    assert devicesim.should_simulate("native") is False
    assert devicesim.should_simulate("cpu") is True
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert devicesim.should_simulate("auto") is False
    with pytest.raises(ValueError):
        devicesim.should_simulate("gpu")


@pytest.mark.parametrize("env, reason", [
    ({}, "no GPU visible"),
    ({"ACCELERATE_USE_CPU": "False"}, "no GPU visible"),  # what `accelerate launch` sets without --cpu
    ({"ACCELERATE_USE_CPU": "True"}, "ACCELERATE_USE_CPU=True (accelerate launch --cpu) chose the CPU"),
    ({"ACCELERATE_USE_CPU": "1"}, "ACCELERATE_USE_CPU=1 (accelerate launch --cpu) chose the CPU"),
    ({"PL_TRAINER_ACCELERATOR": "cpu"},
     'PL_TRAINER_ACCELERATOR=cpu (Lightning Trainer(accelerator="cpu")) chose the CPU'),
    ({"PL_TRAINER_ACCELERATOR": "gpu"}, "no GPU visible"),
    ({"LT_ACCELERATOR": "CPU"}, "LT_ACCELERATOR=CPU (lightning run --accelerator cpu) chose the CPU"),
    ({"DS_ACCELERATOR": "cpu"}, "DS_ACCELERATOR=cpu (DeepSpeed's CPU accelerator) chose the CPU"),
    ({"CUDA_VISIBLE_DEVICES": ""}, "CUDA_VISIBLE_DEVICES='' hides every GPU"),
    ({"CUDA_VISIBLE_DEVICES": "-1"}, "CUDA_VISIBLE_DEVICES='-1' hides every GPU"),
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, "no GPU visible"),
])
def test_auto_respects_an_explicit_cpu_choice_and_says_why(monkeypatch, env, reason):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    decision = devicesim.decide("auto", env)
    assert decision.reason == reason
    assert decision.active is (reason == "no GPU visible")
    # an explicit mode wins over the environment
    assert devicesim.decide("simulate", env).active and devicesim.decide("cpu", env).mode == "simulate"
    assert not devicesim.decide("native", env).active


def test_the_old_mode_name_is_an_alias_everywhere(tmp_path):
    from ddpdoctor.supervisor import project_config
    from ddpdoctor.supervisor.config import RunConfig

    assert RunConfig(device="cpu").device == RunConfig(device="simulate").device == "simulate"
    with pytest.raises(ValueError, match="simulate"):
        RunConfig(device="gpu")
    (tmp_path / "pyproject.toml").write_text('[tool.ddpdoctor]\ndevice = "cpu"\n')
    assert project_config.load(str(tmp_path))[1]["device"] == "cpu"
    assert RankSettings.from_env({"DDPDOCTOR_EVIDENCE_DIR": "x", "DDPDOCTOR_DEVICE": "cpu"}).device == "cpu"
    assert devicesim.decide("cpu").mode == "simulate"


def test_the_report_says_why_the_simulation_was_off():
    from ddpdoctor.analysis.render.words import device_simulation_line

    off = {"mode": "auto", "active": False, "simulated": [], "reason": "ACCELERATE_USE_CPU=true (accelerate "
                                                                          "launch --cpu) chose the CPU"}
    assert device_simulation_line(off) == ("device simulation off (auto): ACCELERATE_USE_CPU=true "
                                           "(accelerate launch --cpu) chose the CPU")
    assert device_simulation_line({**off, "reason": "a GPU is visible"}) is None  # nothing to tell on GPUs
    assert device_simulation_line({**off, "mode": "native", "reason": "--device native"}) is None


def _local_stats(half: torch.Tensor) -> torch.Tensor:
    dims = [d for d in range(half.dim()) if d != 1]
    return torch.cat([half.sum(dims, dtype=torch.float64), (half * half).sum(dims, dtype=torch.float64),
                      torch.full((1,), float(half.numel() // half.shape[1]), dtype=torch.float64)])


def _reduce_with(other: torch.Tensor):
    """Rank i's all_reduce of two ranks, in one process: its own statistics plus the other rank's,
    through autograd, so the backward reaches both halves as the all_reduce's backward does."""
    return lambda local: local + _local_stats(other)


@pytest.mark.parametrize("shape", [(6, 3), (4, 3, 5), (4, 3, 2, 2)])
def test_sync_batch_norm_math_equals_batch_norm_over_the_concatenated_batch(shape):
    torch.manual_seed(0)
    x = torch.randn(*shape, dtype=torch.float64) * 3 + 1
    reference = nn.BatchNorm1d(3) if len(shape) < 4 else nn.BatchNorm2d(3)
    reference = reference.double()
    with torch.no_grad():
        reference.weight.uniform_(0.5, 1.5)
        reference.bias.uniform_(-0.5, 0.5)
    x_ref = x.clone().requires_grad_()
    out_ref = reference(x_ref)
    (out_ref * torch.arange(out_ref.numel(), dtype=torch.float64).view_as(out_ref)).sum().backward()

    # The same batch, split between two "ranks" that each hold half and a copy of the parameters.
    x_sim = x.clone().requires_grad_()
    halves = list(x_sim.chunk(2))
    weight = reference.weight.detach().clone().requires_grad_()
    bias = reference.bias.detach().clone().requires_grad_()
    running = [(torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)) for _ in halves]
    outs = [sync_batch_norm(half, weight, bias, *running[i], momentum=0.1, eps=reference.eps,
                            reduce=_reduce_with(halves[1 - i])) for i, half in enumerate(halves)]
    out = torch.cat(outs)
    torch.testing.assert_close(out, out_ref)
    (out * torch.arange(out.numel(), dtype=torch.float64).view_as(out)).sum().backward()
    torch.testing.assert_close(x_sim.grad, x_ref.grad)
    torch.testing.assert_close(weight.grad, reference.weight.grad)
    torch.testing.assert_close(bias.grad, reference.bias.grad)
    running_mean, running_var = running[0]
    torch.testing.assert_close(running[1][0], running_mean)
    torch.testing.assert_close(running_mean, reference.running_mean)
    torch.testing.assert_close(running_var, reference.running_var)


@pytest.fixture
def one_rank_group():
    """A one-rank gloo process group in this process (FSDP1 needs one to wrap anything)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("device_id", [0, torch.device("cuda", 0), "no device_id"])
def test_fsdp1_wraps_a_simulated_gpu_module_in_its_cpu_mode(sim, one_rank_group, device_id):
    """FSDP1 given a GPU (``torch.device(0)`` raises on a CPU build) or nothing (it refuses a CPU
    module) runs in its CPU mode; sync_module_states broadcasts the simulated GPU (CPU) tensors."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    kwargs = {} if device_id == "no device_id" else {"device_id": device_id}
    model = FullyShardedDataParallel(nn.Linear(4, 2).cuda(), sync_module_states=True, **kwargs)
    model(torch.randn(3, 4, device="cuda")).sum().backward()
    assert model.compute_device == torch.device("cpu")
    calls = last_event(sim)["calls"]
    assert calls["FSDP device_id->cpu"] == 1 and calls["FSDP sync_module_states on cpu"] == 1


def test_fsdp1_full_state_dict_offloaded_to_the_cpu_keeps_the_parameters(sim, one_rank_group):
    """``offload_to_cpu=True`` would free FSDP1's CPU flat parameter (its unshard then reads a storage of
    size 0): under simulation the state dict is gathered in place, with the trained values."""
    from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel, StateDictType

    torch.manual_seed(0)
    plain = nn.Linear(4, 2)
    expected = {k: v.clone() for k, v in plain.state_dict().items()}
    model = FullyShardedDataParallel(plain.cuda(), device_id=0)
    with FullyShardedDataParallel.state_dict_type(model, StateDictType.FULL_STATE_DICT,
                                                  FullStateDictConfig(offload_to_cpu=True, rank0_only=True)):
        state = model.state_dict()
    assert {k: v.tolist() for k, v in state.items()} == {k: v.tolist() for k, v in expected.items()}
    assert type(FullyShardedDataParallel.__dict__["set_state_dict_type"]) is staticmethod
    model.set_state_dict_type(model, StateDictType.FULL_STATE_DICT)  # still a staticmethod on an instance
    assert last_event(sim)["calls"]["FSDP state dict offload_to_cpu->in place"] == 1


_STEP_SCRIPT = """
import hashlib, json, sys
import torch, torch.nn as nn
simulated = sys.argv[1] == "simulate"
if simulated:
    from ddpdoctor.rank import devicesim
    from ddpdoctor.rank.devicesim.mode import CpuDeviceMode
    from ddpdoctor.rank.recorder import Recorder
    from ddpdoctor.schema.settings import RankSettings
    calls = []
    dispatch = CpuDeviceMode.__torch_function__

    def counted(self, func, types, args=(), kwargs=None):
        calls.append(func)
        return dispatch(self, func, types, args, kwargs)

    CpuDeviceMode.__torch_function__ = counted
    finish = devicesim.install(Recorder(RankSettings(evidence_dir=sys.argv[2])), mode="simulate", nproc_per_node=1)
device = "cuda" if simulated else "cpu"
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
out = {}
for step in range(3):
    model(torch.ones(3, 16, device=device)).sum().backward()
    before = len(calls) if simulated else 0
    optimizer.step()
    if simulated:
        out["dispatched in a step"] = len(calls) - before
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
out["parameters"] = digest
if simulated:
    made = []
    optimizer.register_step_pre_hook(lambda o, a, k: made.append(torch.zeros(1, device="cuda")))
    optimizer.step()
    lbfgs = torch.optim.LBFGS(model.parameters(), max_iter=2)

    def closure():
        lbfgs.zero_grad()
        loss = model(torch.ones(3, 16, device="cuda")).sum()
        loss.backward()
        return loss

    lbfgs.step(closure)

    class Mine(torch.optim.SGD):
        def step(self, closure=None):
            self.extra = torch.zeros(1, device="cuda")
            return super().step(closure)

    mine = Mine(model.parameters(), lr=0.1)
    mine.step()

    class KeepsStep(torch.optim.AdamW):  # AdamW's step, with a helper of the script's inside it
        def _init_group(self, *args, **kwargs):
            self.extra = torch.zeros(1, device="cuda")
            return super()._init_group(*args, **kwargs)

    keeps = KeepsStep(model.parameters())
    model(torch.ones(3, 16, device="cuda")).sum().backward()
    keeps.step()
    out.update(hook=len(made), mine=str(mine.extra.device), keeps=str(keeps.extra.device))
    finish()
print(json.dumps(out))
"""


def test_a_builtin_optimizers_step_runs_outside_the_simulations_mode(tmp_path):
    """AdamW's step body makes no call through the simulation's mode (only the profiler's
    record_function around it does) and steps the parameters bit for bit as on the CPU without
    simulation; a step hook of the script's, an LBFGS closure, an optimizer class of the script's
    own and a subclass of AdamW that keeps its step but overrides a helper still place tensors on
    "cuda" (inside the mode). A fresh interpreter: each class's
    step is wrapped at its first instance."""
    import subprocess
    import sys

    results = {}
    for mode in ("simulate", "native"):
        out = subprocess.run([sys.executable, "-c", _STEP_SCRIPT, mode, str(tmp_path)], capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
        results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    simulated = results["simulate"]
    assert simulated["dispatched in a step"] <= 2
    assert simulated["parameters"] == results["native"]["parameters"]
    assert simulated["hook"] == 1 and simulated["mine"] == simulated["keeps"] == "cpu"


@pytest.fixture
def dispatched(sim, monkeypatch):
    """The torch functions that went through the simulation's mode, in order, from now on."""
    from ddpdoctor.rank.devicesim.mode import CpuDeviceMode

    calls: list = []
    dispatch = CpuDeviceMode.__torch_function__

    def counted(self, func, types, args=(), kwargs=None):
        calls.append(func)
        return dispatch(self, func, types, args, kwargs)

    monkeypatch.setattr(CpuDeviceMode, "__torch_function__", counted)
    return calls


def _named(calls: list, name: str) -> list:
    return [f for f in calls if getattr(f, "__name__", "") == name]


def test_a_builtin_optimizers_zero_grad_runs_outside_the_mode(dispatched):
    """torch.optim's zero_grad reads and sets every .grad (two calls through the mode per parameter)
    and places nothing: it runs outside the mode, both ways of zeroing; a class of the script's keeps
    the mode, whether it overrides zero_grad (and places a tensor on "cuda" there) or inherits it."""
    model = nn.Linear(4, 4).to("cuda")

    def backward() -> None:
        model(torch.ones(2, 4, device="cuda")).sum().backward()

    backward()
    builtin = torch.optim.SGD(model.parameters(), lr=0.1)
    dispatched.clear()
    builtin.zero_grad(set_to_none=False)
    assert dispatched == [] and all(torch.count_nonzero(p.grad) == 0 for p in model.parameters())
    dispatched.clear()
    builtin.zero_grad()
    assert dispatched == [] and all(p.grad is None for p in model.parameters())

    class Mine(torch.optim.SGD):
        def zero_grad(self, set_to_none: bool = True) -> None:
            self.extra = torch.zeros(1, device="cuda")
            super().zero_grad(set_to_none)

    class Inherits(torch.optim.SGD):
        pass

    mine = Mine(model.parameters(), lr=0.1)
    for optimizer in (mine, Inherits(model.parameters(), lr=0.1)):
        backward()
        dispatched.clear()
        optimizer.zero_grad()
        assert _named(dispatched, "__get__") and all(p.grad is None for p in model.parameters())
    assert mine.extra.device.type == "cpu"


def test_a_tensor_dataset_is_fetched_outside_the_mode(dispatched):
    """A TensorDataset's batch, collated by default_collate, is indexed and stacked outside the mode
    (two calls per sample through it otherwise) and is the same batch; a dataset of the script's, or a
    collate function of its own, is fetched inside the mode: its tensors placed on "cuda" land on the CPU."""
    from torch.utils.data import DataLoader, Dataset, TensorDataset

    data = TensorDataset(torch.arange(12.0).reshape(6, 2), torch.arange(6))
    dispatched.clear()
    batches = list(DataLoader(data, batch_size=3))
    assert _named(dispatched, "__getitem__") == [] and _named(dispatched, "stack") == []
    assert torch.equal(batches[1][0], data.tensors[0][3:]) and torch.equal(batches[1][1], data.tensors[1][3:])

    dispatched.clear()
    list(DataLoader(data, batch_size=3, collate_fn=lambda rows: rows))
    assert len(_named(dispatched, "__getitem__")) == 12  # the script's collate function: inside the mode

    class OnTheGpu(Dataset):
        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int) -> torch.Tensor:
            return torch.full((1,), float(i), device="cuda")

    dispatched.clear()
    (first, second) = list(DataLoader(OnTheGpu(), batch_size=2))
    assert first.device.type == "cpu" and second.tolist() == [[2.0], [3.0]]
    assert len(_named(dispatched, "full")) == 4

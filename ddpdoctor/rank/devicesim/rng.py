"""CUDA random number generators on the CPU.

``torch.cuda.manual_seed``, ``get_rng_state`` and friends keep one CPU generator per simulated GPU,
so seeding, saving and restoring RNG state (``fork_rng``, Accelerate's and Lightning's checkpoints,
transformers' ``set_seed``) behave as on GPUs: a state set is the state read back. Random ops on
simulated CUDA tensors run on the CPU and draw from the CPU generator, as every CPU op does.

``torch.Generator(device="cuda:N")`` is a CPU generator. ``torch.Generator`` becomes a subclass of
torch's class whose metaclass answers ``isinstance``/``issubclass`` for every generator, so
``isinstance(torch.default_generator, torch.Generator)`` holds and ``Generator | None`` works.
"""

from __future__ import annotations

from typing import Any

import torch

from ddpdoctor.rank.devicesim.ledger import GENERATORS, Ledger
from ddpdoctor.rank.devicesim.mode import CPU, is_cuda


class SimulatedRng:
    """One CPU generator per simulated GPU, standing in for ``torch.cuda.default_generators``."""

    def __init__(self, devices: Any) -> None:
        self.devices = devices
        self.generators = tuple(torch.Generator() for _ in range(devices.count))
        self.foreign: dict[int, torch.Tensor] = {}  # states of another layout (a real GPU's checkpoint)

    def _index(self, device: Any) -> int:
        index = self.devices.index(device, "torch.cuda.random")
        if not 0 <= index < len(self.generators):
            raise RuntimeError(f"CUDA error: invalid device ordinal (simulated: device {index} with "
                               f"{len(self.generators)} simulated GPUs on this node)")
        return index

    def get_rng_state(self, device: Any = "cuda") -> torch.Tensor:
        index = self._index(device)
        foreign = self.foreign.get(index)
        return foreign.clone() if foreign is not None else self.generators[index].get_state()

    def get_rng_state_all(self) -> list[torch.Tensor]:
        return [self.get_rng_state(i) for i in range(len(self.generators))]

    def set_rng_state(self, new_state: torch.Tensor, device: Any = "cuda") -> None:
        index = self._index(device)
        try:
            self.generators[index].set_state(new_state)
            self.foreign.pop(index, None)
        except (RuntimeError, TypeError):
            # a CUDA generator's state (seed and offset) saved on a real GPU: kept, read back as is
            self.foreign[index] = new_state.detach().clone()

    def set_rng_state_all(self, new_states: Any) -> None:
        for index, state in enumerate(new_states):
            self.set_rng_state(state, index)

    def manual_seed(self, seed: int) -> None:
        self._seed(self.devices.current, int(seed))

    def manual_seed_all(self, seed: int) -> None:
        for index in range(len(self.generators)):
            self._seed(index, int(seed))

    def _seed(self, index: int, seed: int) -> None:
        self.generators[index].manual_seed(seed)
        self.foreign.pop(index, None)

    def seed(self) -> None:
        self.foreign.pop(self.devices.current, None)
        self.generators[self.devices.current].seed()

    def seed_all(self) -> None:
        seed = self.generators[self.devices.current].seed()
        self.manual_seed_all(seed)

    def initial_seed(self, device: Any = None) -> int:
        """``torch.cuda.initial_seed()`` (the current device), ``torch.accelerator.random``'s (any)."""
        return self.generators[self._index(device)].initial_seed()

    def answers(self) -> dict[str, Any]:
        """torch.cuda (and torch.cuda.random) name -> stand-in."""
        return {"get_rng_state": self.get_rng_state, "get_rng_state_all": self.get_rng_state_all,
                "set_rng_state": self.set_rng_state, "set_rng_state_all": self.set_rng_state_all,
                "manual_seed": self.manual_seed, "manual_seed_all": self.manual_seed_all, "seed": self.seed,
                "seed_all": self.seed_all, "initial_seed": self.initial_seed,
                "default_generators": self.generators}

    def accelerator_answers(self) -> dict[str, Any]:
        """torch.accelerator.random (torch 2.14) name -> stand-in."""
        return {"random.initial_seed": self.initial_seed, "random.get_rng_state": self.get_rng_state,
                "random.get_rng_state_all": self.get_rng_state_all}


def generator_class(ledger: Ledger) -> type:
    """``torch.Generator`` whose ``device="cuda..."`` is the CPU."""
    original = torch.Generator

    class AnyGenerator(type(original)):  # type: ignore[misc]
        def __instancecheck__(cls, instance: Any) -> bool:
            return isinstance(instance, original)

        def __subclasscheck__(cls, subclass: type) -> bool:
            return issubclass(subclass, original)

    class Generator(original, metaclass=AnyGenerator):  # type: ignore[misc]
        __doc__ = original.__doc__

        def __new__(cls, device: Any = "cpu") -> "Generator":
            if device is not None and is_cuda(device):
                ledger.count(GENERATORS)
                device = CPU
            return original.__new__(cls, device)

        def __init__(self, device: Any = "cpu") -> None:
            pass

    Generator.__module__, Generator.__qualname__ = "torch", "Generator"
    return Generator


"""The error a script gets for a CUDA feature that has no CPU stand-in.

Raised at the call, with the API named, so ``rank-failure`` reports the user's line and the
reason (decoded by ``analysis.decode``'s "not-simulated" pattern) instead of a misleading symptom.

The error is of the kind a CPU-only torch raises for the same call (``AssertionError`` "Torch not
compiled with CUDA enabled", ``RuntimeError``, ``AttributeError`` ...), never a new kind: a script or
library that catches the CPU build's error (``except AssertionError``) catches this one too.
``NotSimulatedError.of(kind)`` is that kind with :class:`NotSimulatedError` mixed in.
"""

from __future__ import annotations

from typing import Callable, Optional

MARKER = "cannot be simulated on CPU"
NOT_COMPILED = "Torch not compiled with CUDA enabled"  # torch.cuda._lazy_init's error in a CPU build


class NotSimulatedError(Exception):
    """A CUDA-only API called under ddpdoctor's device simulation (mixed into the CPU build's kind)."""

    _kinds: dict[type, type] = {}

    def __init__(self, api: str, cause: str = "") -> None:
        self.api = api
        self.cause = cause
        message = (f"{api} {MARKER} (ddpdoctor --device simulation: CUDA/NCCL stand-ins on a machine without "
                   f"a GPU); run the check on a GPU machine, or guard this call")
        super().__init__(f"{message} [a CPU-only torch: {cause}]" if cause else message)

    def __reduce__(self) -> tuple:
        return type(self), (self.api, self.cause)

    @classmethod
    def of(cls, kind: type[BaseException]) -> type["NotSimulatedError"]:
        """The subclass of ``kind`` (and of this class) raised where a CPU-only torch raises ``kind``."""
        if issubclass(kind, NotSimulatedError):
            return kind
        made = cls._kinds.get(kind)
        if made is None:
            made = type(f"NotSimulated{kind.__name__}", (cls, kind), {"__module__": __name__})
            cls._kinds[kind] = made
            globals().setdefault(made.__name__, made)  # picklable by name, as a spawned worker's error
        return made


def not_simulated(api: str, kind: type[BaseException] = RuntimeError, cause: str = "") -> NotSimulatedError:
    """The error for ``api``: ``kind`` as a CPU-only torch raises it, naming the API."""
    return NotSimulatedError.of(kind)(api, cause)


# Kinds a CPU-only torch raises for CUDA it does not have: AssertionError ("Torch not compiled with
# CUDA enabled"), RuntimeError (dummy base classes, "requires CUDA support"), AttributeError (torch._C
# without its _cuda_* functions), ImportError (pynvml for the NVML queries). TypeError and ValueError
# mean a bad call, whatever the device: they pass through untouched.
CPU_BUILD_ERRORS: tuple[type[BaseException], ...] = (AssertionError, RuntimeError, AttributeError, ImportError)


def raiser(api: str, on_call: Optional[Callable[[str], None]] = None, *,
           kind: type[BaseException] = RuntimeError, cause: str = "") -> Callable[..., None]:
    """A function that records ``api`` and raises its :func:`not_simulated` error when called."""

    def not_simulated_call(*_args: object, **_kwargs: object) -> None:
        if on_call is not None:
            on_call(api)
        raise not_simulated(api, kind, cause)

    not_simulated_call.__qualname__ = not_simulated_call.__name__ = api.rsplit(".", 1)[-1]
    return not_simulated_call


# What torch itself raises for a device index it refuses, word for word, so a script (or a library)
# that catches it behaves as on a GPU machine and the analysis decodes it as torch's own error.
NEGATIVE_INDEX = "Device index must not be negative"  # torch's argument parser, on any build
INVALID_ORDINAL = ("CUDA error: invalid device ordinal\nGPU device may be out of range, do you have enough GPUs?\n"
                   "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")  # c10's CUDA check


def negative_index() -> RuntimeError:
    """A negative CUDA device index (``x.cuda(-1)``, ``Module.to(-1)``, ``device=-1``)."""
    return RuntimeError(NEGATIVE_INDEX)


def invalid_ordinal() -> RuntimeError:
    """A CUDA device index past the devices of this node: cudaSetDevice's cudaErrorInvalidDevice,
    as the ``torch.AcceleratorError`` recent torch raises (a RuntimeError before it existed)."""
    import torch  # not at import: this module is read before the script imports torch

    kind = getattr(torch, "AcceleratorError", RuntimeError)
    return kind(INVALID_ORDINAL)

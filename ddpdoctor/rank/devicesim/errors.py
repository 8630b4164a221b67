"""The error a script gets for a CUDA feature that has no CPU stand-in.

Raised at the call, with the API named, so ``rank-failure`` reports the user's line and the
reason (decoded by ``analysis.decode``'s "not-simulated" pattern) instead of a misleading symptom.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

MARKER = "cannot be simulated on CPU"


class NotSimulatedError(RuntimeError):
    """A CUDA-only API called under ddpdoctor's device simulation."""

    def __init__(self, api: str) -> None:
        self.api = api
        super().__init__(f"{api} {MARKER} (ddpdoctor --device simulation: CUDA/NCCL stand-ins on a machine without "
                         f"a GPU); run the check on a GPU machine, or guard this call")


def raiser(api: str, on_call: Optional[Callable[[str], None]] = None) -> Callable[..., Any]:
    """A stand-in for ``api`` that records and raises :class:`NotSimulatedError` when called."""

    def not_simulated(*_args: Any, **_kwargs: Any) -> Any:
        if on_call is not None:
            on_call(api)
        raise NotSimulatedError(api)

    not_simulated.__qualname__ = not_simulated.__name__ = api.rsplit(".", 1)[-1]
    return not_simulated


class NotSimulatedModule:
    """Stand-in for a CUDA-only module (torch.cuda.nccl, torch.cuda.jiterator): any attribute
    raises when called."""

    def __init__(self, name: str, on_call: Optional[Callable[[str], None]] = None) -> None:
        self.__name__ = name
        self._on_call = on_call

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return raiser(f"{self.__name__}.{attr}", self._on_call)

"""Tensor fingerprints, compared across ranks: the wrapping sum of each tensor's bytes as 64-bit words.

One read of every byte, nothing else: each tensor is viewed as int64 words (no copy) and summed
modulo 2**64, on the tensor's own device, and a step's sums (gradients and parameters together, see
:class:`Pending`) reach the host in one copy per device. Integer addition is associative, so the sum
does not depend on the reduction order, the thread count or the kernel: identical replicas give
identical sums everywhere, and any difference in any bit of any element changes the sum (unless
other changes cancel it exactly), including the last-bit drift that a rank-dependent rounding
(clipping with another thread count, a rank-dependent learning rate) leaves in the weights, which
a float norm rounds away. Viewing a float tensor's bytes as int64 is a no-op view, and summing
int64 runs at memory speed on the CPU, unlike a norm and a max (two reads) or a float64
accumulation. On a GPU with Triton, one kernel sums every tensor of a call
(:mod:`ddpdoctor.rank.fused_word_sums`: a host launch costs more than the read of a small tensor, and
a fingerprinted step's launches used to outlast the device's step); elsewhere, small tensors (layer
norms, biases) are summed together in a few kernels and big ones each by its own.

A sampled fingerprint (``start(..., sampled=True)``) sums only a strided sample of a big tensor's
words, 128 bytes in every 8 KiB, at a tenth of a full read's time; small tensors are summed
whole. It tells whether a tensor changed between two moments, or differs across ranks,
wherever a change reaches most of its elements (a scaling, a clipping, a rank-dependent rounding),
not a change confined to a few elements. Its only use is the snapshot of the gradients at the end
of DDP's all-reduce (:mod:`ddpdoctor.rank.probes.wrapping`): the one full read of the gradients
stays the one before the step, so a fingerprinted step reads gradients and parameters once each.

A DTensor (FSDP2's sharded parameters and gradients) is fingerprinted by its rank's local shard,
as it is in memory: no redistribution, no collective, no copy. A tensor subclass whose bytes cannot
be read directly (a wrapper subclass without storage of its own) is not fingerprinted: its value
is None, as for a missing tensor, and never an error.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from typing import Optional, Sequence

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ddpdoctor.rank import fused_word_sums

Fingerprint = Optional[list]  # [word sum] or None for a missing tensor (e.g. grad is None)

_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def readable(t: torch.Tensor) -> Optional[torch.Tensor]:
    """``t`` as a plain tensor whose bytes this rank holds, without a copy or a collective: itself,
    a DTensor's local shard, a plain subclass's storage seen as a Tensor; None for a tensor
    subclass that has no such bytes (a wrapper subclass: quantized or lazy formats)."""
    if type(t) in _PLAIN:
        return t
    dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)  # none exists unless imported
    try:
        if dtensor is not None and isinstance(t, dtensor):
            with torch.no_grad():
                local = t.to_local()  # the local shard itself (a view), whatever the placements
            return local if type(local) in _PLAIN else readable(local)
        if is_traceable_wrapper_subclass(t):
            return None
        return t.as_subclass(torch.Tensor)
    except Exception:
        return None


class Pending:
    """Fingerprints still on the device: resolved by one host copy, possibly with others."""

    def __init__(self, size: int, parts: list[tuple[list[int], torch.Tensor]], fixed: dict[int, list]) -> None:
        self.size = size
        self.parts = parts  # (positions, 1-d int64 tensor on a device: one sum per position)
        self.fixed = fixed  # position -> value known on the host already (None, empty or meta tensors)
        self.sample: Optional[Pending] = None  # the sampled fingerprints too, when asked (start(also_sampled=True))

    def values(self) -> list[Fingerprint]:
        return resolve(self)[0]


_SMALL_WORDS = 1 << 15  # below this many 64-bit words a tensor's own sum kernel is launch-bound
# A sample every 1021 words (a prime, so that samples walk through every column of a power-of-two
# row width rather than always hitting the same ones), 16 words (two cache lines, which the CPU
# fetches as a pair) each: 1/64 of the words. A read of strided samples from memory costs by the
# sample (its latency), not by the byte: 16 words every 1021 take 0.16 ms for 40 MB on one core,
# 8 every 509 took 0.39 ms, a full read 1.8 ms.
_SAMPLE_STRIDE = 1021
_SAMPLE_RUN = 16


def _aligned_words(t: torch.Tensor) -> Optional[torch.Tensor]:
    """``t``'s bytes as an int64 view (no copy), or None when they do not start and end on 8-byte
    boundaries or are not contiguous (then :func:`_word_sum` takes the careful path). The view
    keeps ``t``'s shape where its rows are whole words, which saves a reshape per tensor: the
    same words, and a sum of them, or a sample by :func:`_sampled_word_sum` (which strides through
    the storage), does not depend on the shape."""
    if t.dtype == torch.bool:
        t = t.view(torch.uint8)
    size = t.element_size()
    if not t.is_contiguous() or (t.storage_offset() * size) % 8 or (t.numel() * size) % 8:
        return None
    if t.dim() and not (t.shape[-1] * size) % 8:
        return t.view(torch.int64)
    return t.reshape(-1).view(torch.int64)


def _word_sum(t: torch.Tensor) -> torch.Tensor:
    """The wrapping int64 sum of ``t``'s bytes as 64-bit words (a 0-d tensor on ``t``'s device)."""
    words = _aligned_words(t)
    return words.sum() if words is not None else _unaligned_word_sum(t)


def _sampled_word_sum(words: torch.Tensor) -> torch.Tensor:
    """The wrapping sum of runs of ``_SAMPLE_RUN`` words every ``_SAMPLE_STRIDE`` words of a
    contiguous int64 view of at least ``_SMALL_WORDS`` words (no copy; any shape: the runs stride
    through its storage from its first word)."""
    rows = (words.numel() - _SAMPLE_RUN) // _SAMPLE_STRIDE + 1
    return words.as_strided((rows, _SAMPLE_RUN), (_SAMPLE_STRIDE, 1)).sum()


def _unaligned_word_sum(t: torch.Tensor) -> torch.Tensor:
    """:func:`_word_sum` of a tensor whose bytes do not start and end on 8-byte boundaries, or are
    not contiguous: the edges widened and summed apart."""
    if not t.is_contiguous():
        t = t.contiguous()  # rare for parameters and gradients; a copy, still exact
    flat = t.reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    size = flat.element_size()
    per_word = 8 // size if size < 8 else 1
    head = (-flat.storage_offset()) % per_word  # elements before the first 8-byte boundary
    body = (flat.numel() - head) // per_word * per_word
    total = flat[head:head + body].view(torch.int64).sum() if body else torch.zeros((), dtype=torch.int64,
                                                                                     device=flat.device)
    edges = [flat[:head], flat[head + body:]]
    for edge in edges:  # at most seven elements on either side: widened, summed as small integers
        if edge.numel():
            total = total + edge.view(_SAME_SIZE_INT[size]).to(torch.int64).sum()
    return total


_ENDS: dict[tuple, torch.Tensor] = {}  # (device, word counts) -> last index of each tensor, on the device


def _small_sums(words: list[torch.Tensor]) -> torch.Tensor:
    """The word sums of many small tensors in four kernels instead of one launch each: their words
    concatenated, a running sum, its value at each tensor's end, the differences (exact: wrapping
    int64 addition). The end positions stay cached on the device: the same tensors come every step,
    and copying them there anew would wait for the device."""
    if words[0].device.type == "cpu":  # no launches to save on a CPU, and the copy and the running sum cost
        return torch.stack([w.sum() for w in words])
    flat = torch.cat([w.view(-1) for w in words])
    key = (flat.device, tuple(w.numel() for w in words))
    ends = _ENDS.get(key)
    if ends is None:
        if len(_ENDS) > 64:
            _ENDS.clear()
        ends = _ENDS[key] = torch.tensor(key[1], dtype=torch.int64).cumsum(0).sub_(1).to(flat.device)
    totals = flat.cumsum(0)[ends]
    return torch.diff(totals, prepend=totals.new_zeros(1))


class _Plan:
    """How :func:`start` reads one list of tensors: positions with a value known on the host, the
    fused kernel's tensors per device (their positions, word counts, and addresses when the plan was
    made: a kept plan reads them anew at each call), and the positions for the per-tensor kernels.
    Kept per list layout (:func:`_layout`): the same parameters come every step, and gradients of
    the same sizes (at new addresses), and sorting 149 tensors anew in Python cost more than the
    kernel's launch."""

    __slots__ = ("fixed", "fused", "others", "cacheable")

    def __init__(self) -> None:
        self.fixed: dict[int, Optional[int]] = {}  # position -> None (no tensor) or 0 (no bytes)
        # device -> (positions, word counts, the addresses when the plan was made)
        self.fused: dict[torch.device, tuple[list[int], tuple[int, ...], tuple[int, ...]]] = {}
        self.others: list[int] = []
        self.cacheable = True  # False when a tensor needed more than its layout to read (a subclass)


_PLANS: dict[tuple, _Plan] = {}  # list layout -> plan
_MAX_PLANS = 16


def _layout(tensors: Sequence[Optional[torch.Tensor]]) -> tuple[Optional[tuple], list[int]]:
    """What decides a list's plan, per tensor: its type, device, byte count, contiguity and the
    alignment of its address (a plain tensor with all five equal is read the same way, at its own
    address); and the addresses. (None, []) where a tensor has no address (sparse, or no storage)."""
    try:
        entries = [(type(t), t.device, t.nbytes, t.is_contiguous(), t.data_ptr()) if t is not None else None
                   for t in tensors]
    except Exception:
        return None, []
    return (tuple([e[:4] + (e[4] % 8,) if e is not None else None for e in entries]),
            [e[4] if e is not None else 0 for e in entries])


def _plan_of(tensors: Sequence[Optional[torch.Tensor]], layout: Optional[tuple]) -> tuple[_Plan, bool]:
    """(the plan for ``tensors``, whether it was made now: then its addresses are theirs)."""
    plan = _PLANS.get(layout) if layout is not None else None
    if plan is not None:
        return plan, False
    plan = _Plan()
    fused_types = fused_word_sums.DEVICE_TYPES
    fused: dict[torch.device, list[tuple[int, int, int]]] = defaultdict(list)
    for i, given in enumerate(tensors):
        t = readable(given) if given is not None else None
        if given is not None and t is not given:
            plan.cacheable = False  # a DTensor's shard, a subclass seen as a Tensor: read anew each call
        if t is None:
            plan.fixed[i] = None
        elif t.is_meta or not t.numel():
            plan.fixed[i] = 0
        elif t.device.type in fused_types and t.layout == torch.strided and t.is_contiguous() \
                and not t.data_ptr() % 8 and not t.nbytes % 8:
            fused[t.device].append((i, t.nbytes // 8, t.data_ptr()))  # its bytes as words, where they are
        else:
            plan.others.append(i)
    plan.fused = {device: ([i for i, _, _ in entries], tuple(n for _, n, _ in entries), tuple(a for _, _, a in entries))
                  for device, entries in fused.items()}
    if layout is not None and plan.cacheable:
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        _PLANS[layout] = plan
    return plan, True


@torch.no_grad()
def start(tensors: Sequence[Optional[torch.Tensor]], *, sampled: bool = False, also_sampled: bool = False) -> Pending:
    """Launch the fingerprint kernels of ``tensors`` without waiting for them; ``sampled``: the
    sampled fingerprint of big tensors (see the module's docstring), comparable only with another
    sampled one; ``also_sampled``: the full ones, and the sampled ones in ``.sample``, from one
    pass over the tensors (small tensors are summed once for both). On a GPU, the contiguous
    tensors whose bytes start and end on 8-byte boundaries are summed by one kernel per device
    (:mod:`ddpdoctor.rank.fused_word_sums`) where Triton is there."""
    layout, addresses = _layout(tensors)
    plan, made_now = _plan_of(tensors, layout)
    kernels = _Kernels(sampled, also_sampled)
    for i in plan.others:
        t = readable(tensors[i])  # type: ignore[arg-type]  (a None is in plan.fixed)
        if t is not None:
            kernels.add(i, t)
    mode = "both" if also_sampled else "sampled" if sampled else "full"
    fused_parts: list[tuple[list[int], torch.Tensor]] = []  # the fused kernels' sums, per device
    fused_sampled_parts: list[tuple[list[int], torch.Tensor]] = []
    for device, (positions, sizes, made_at) in plan.fused.items():
        # A plan made now has the addresses of what it read (a DTensor's shard, not the DTensor).
        launched = _fused(device, made_at if made_now else tuple([addresses[i] for i in positions]), sizes, mode)
        if launched is None:  # no fused kernel here: the per-tensor kernels, as on any device
            for i in positions:
                kernels.add(i, readable(tensors[i]))  # type: ignore[arg-type]
            continue
        fused_parts.append((positions, launched[0]))
        if launched[1] is not None:
            fused_sampled_parts.append((positions, launched[1]))
    small_sums = {device: _small_sums([w for _, w in entries]) for device, entries in kernels.small.items()}
    pending = Pending(len(tensors), _parts(kernels.own, kernels.small, small_sums) + fused_parts, _fixed(plan))
    if also_sampled:
        pending.sample = Pending(len(tensors), _parts(kernels.own_sampled, kernels.small, small_sums)
                                 + fused_sampled_parts, _fixed(plan))
    return pending


def _fixed(plan: _Plan) -> dict[int, list]:
    """A plan's host-known values, as new lists: a consumer may keep or change them."""
    return {i: None if value is None else [value] for i, value in plan.fixed.items()}  # type: ignore[misc]


class _Kernels:
    """The per-tensor path: a kernel per big tensor, small ones summed together per device."""

    def __init__(self, sampled: bool, also_sampled: bool) -> None:
        self.sampled, self.also_sampled = sampled, also_sampled
        self.own: dict[torch.device, list[tuple[int, torch.Tensor]]] = defaultdict(list)  # a kernel each
        self.own_sampled: dict[torch.device, list[tuple[int, torch.Tensor]]] = defaultdict(list)
        self.small: dict[torch.device, list[tuple[int, torch.Tensor]]] = defaultdict(list)  # summed together

    def add(self, i: int, t: torch.Tensor) -> None:
        """Launch (or queue, for a small tensor) the sums of tensor ``t`` at position ``i``."""
        if t.is_complex():
            t = torch.view_as_real(t.detach())
        words = _aligned_words(t)  # no detach first: start() runs without grad, so no view records one
        if words is None:
            total = _unaligned_word_sum(t)
            self.own[t.device].append((i, total))
            self.own_sampled[t.device].append((i, total))
        elif words.numel() < _SMALL_WORDS:
            self.small[t.device].append((i, words))
        elif self.also_sampled:
            self.own[t.device].append((i, words.sum()))
            self.own_sampled[t.device].append((i, _sampled_word_sum(words)))
        else:
            self.own[t.device].append((i, _sampled_word_sum(words) if self.sampled else words.sum()))


def _fused(device: torch.device, addresses: Sequence[int], sizes: Sequence[int],
           mode: str) -> Optional[tuple[torch.Tensor, Optional[torch.Tensor]]]:
    """The fused kernel's sums of the words at ``addresses`` on a GPU, or None where it cannot run
    (no Triton, Triton's interpreter for a GPU, a CUDA graph being captured, a failure: then never again in
    this process)."""
    if (fused_word_sums.interpreted_on_host(device) or not fused_word_sums.available()
            or (device.type == "cuda" and torch.cuda.is_current_stream_capturing())):
        return None
    try:
        return fused_word_sums.word_sums(device, addresses, sizes, mode, small=_SMALL_WORDS, stride=_SAMPLE_STRIDE,
                                         run=_SAMPLE_RUN)
    except Exception as exc:  # a compiler or launch failure: the per-tensor kernels from now on
        fused_word_sums.disable(exc)
        return None


def _parts(own: dict[torch.device, list[tuple[int, torch.Tensor]]],
           small: dict[torch.device, list[tuple[int, torch.Tensor]]],
           small_sums: dict[torch.device, torch.Tensor]) -> list[tuple[list[int], torch.Tensor]]:
    """Per device: the positions and one tensor of their sums (big tensors', then the small ones')."""
    parts = []
    for device in {*own, *small}:
        positions = [i for i, _ in own[device]] + [i for i, _ in small[device]]
        sums = [torch.stack([s for _, s in own[device]])] if own[device] else []
        if small[device]:
            sums.append(small_sums[device])
        parts.append((positions, sums[0] if len(sums) == 1 else torch.cat(sums)))
    return parts


def gather(*pending: Pending) -> list[torch.Tensor]:
    """The device tensors holding several pending fingerprints: one per device involved, whose host
    copies :func:`assign` turns into values (a copy that can wait: rank/host_copies.py)."""
    by_device: dict[torch.device, list[torch.Tensor]] = defaultdict(list)
    for p in pending:
        for _, values in p.parts:
            by_device[values.device].append(values)
    return [tensors[0] if len(tensors) == 1 else torch.cat(tensors) for tensors in by_device.values()]


def assign(pending: Sequence[Pending], host: list[list]) -> list[list[Fingerprint]]:
    """The values of ``pending`` from the host copies of what :func:`gather` returned for them."""
    out: list[list[Fingerprint]] = []
    for p in pending:
        row: list[Fingerprint] = [None] * p.size
        for i, value in p.fixed.items():
            row[i] = value
        out.append(row)
    devices = dict.fromkeys(values.device for p in pending for _, values in p.parts)  # gather()'s order
    words = {device: iter(values) for device, values in zip(devices, host)}
    for k, p in enumerate(pending):
        row = out[k]
        for positions, values in p.parts:
            for position, value in zip(positions, words[values.device]):  # takes len(positions) values
                row[position] = [value]
    return out

def resolve(*pending: Pending) -> list[list[Fingerprint]]:
    """The values of several pending fingerprints now, with one host copy (and wait) per device."""
    return assign(pending, [t.tolist() for t in gather(*pending)])


def fingerprint(tensors: Sequence[Optional[torch.Tensor]]) -> list[Fingerprint]:
    """[word sum] for each tensor, None where the tensor is None (launch and resolve at once)."""
    return start(tensors).values()

"""Fault injectors that test laggard's detectors on real training runs.

:class:`BitFlipInjector` flips one bit of one element, once, at a chosen rank, step and place, as
a cosmic ray, a bad DRAM cell or an unchecked link would; the gradient-integrity checks of
:mod:`laggard.integrations.integrity` must catch it and name the rank.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

#: Places a bit can be flipped (see :class:`BitFlipInjector`).
WHERE = ("before_send", "after_reduce", "param")


@dataclass(slots=True)
class BitFlipInjector:
    """Flip bit ``bit`` of element ``element`` once, on rank ``rank`` at step ``step``.

    Attributes:
        rank: rank (in the data-parallel group) whose data is corrupted.
        step: training step (0-based, :attr:`GradientIntegrity.step`) of the flip.
        bucket: DDP bucket index (``before_send``, ``after_reduce``); ignored for ``param``.
        element: index of the element in the flattened tensor (for ``param``: in all trainable
            parameters concatenated in ``model.parameters()`` order); taken modulo the tensor's
            size, so any index hits something.
        bit: bit position within the element, 0 = least significant; for float32, 0-22 are the
            mantissa, 23-30 the exponent, 31 the sign (IEEE 754 binary32). Taken modulo the
            element's width in bits.
        where: ``before_send``: this rank's payload after it was fingerprinted and before the
            collective (corruption in the send buffer or on the wire); ``after_reduce``: this
            rank's reduced bucket (memory corruption of the result); ``param``: one parameter of
            this rank (memory corruption of the model).
        stage: for hooks with several collectives per bucket, the one whose payload
            ``before_send`` corrupts (0 = the first).
        fired: set once the flip has been applied.
        old, new: the element's value before and after the flip (floats for float tensors).

    Raises:
        ValueError: an unknown ``where`` or a negative index.
    """

    rank: int
    step: int
    bucket: int
    element: int
    bit: int
    where: str
    stage: int = 0
    fired: bool = False
    old: float | int | None = None
    new: float | int | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.where not in WHERE:
            raise ValueError(f"where {self.where!r} not in {WHERE}")
        if min(self.rank, self.step, self.bucket, self.element, self.bit, self.stage) < 0:
            raise ValueError("rank, step, bucket, element, bit and stage must be >= 0")

    @classmethod
    def parse(cls, spec: str) -> BitFlipInjector:
        """Build from ``"rank=1,step=30,bucket=0,element=123,bit=30,where=after_reduce"``
        (the ``laggard demo --inject-bitflip`` syntax; ``stage`` optional).

        Raises:
            ValueError: a missing or unknown key, or a value of the wrong type.
        """
        fields: dict[str, str] = {}
        for part in spec.split(","):
            key, sep, value = part.partition("=")
            if not sep:
                raise ValueError(f"expected key=value, got {part!r}")
            fields[key.strip()] = value.strip()
        names = ("rank", "step", "bucket", "element", "bit", "where", "stage")
        unknown = set(fields) - set(names)
        missing = set(names[:6]) - set(fields)
        if unknown or missing:
            raise ValueError(f"bit flip spec: unknown {sorted(unknown)}, missing {sorted(missing)}"
                             f" (keys: {', '.join(names)})")
        try:
            ints = {k: int(v) for k, v in fields.items() if k != "where"}
        except ValueError as exc:
            raise ValueError(f"bit flip spec: {exc}") from None
        return cls(where=fields["where"], **ints)

    def due(self, where: str, rank: int, step: int, bucket: int, stage: int = 0) -> bool:
        """Whether a flip at this place and time is this injector's (and not yet done)."""
        return (not self.fired and where == self.where and rank == self.rank
                and step == self.step and (where == "param" or bucket == self.bucket)
                and (where != "before_send" or stage == self.stage))

    def maybe_flip(self, where: str, rank: int, step: int, bucket: int, tensor: torch.Tensor,
                   stage: int = 0) -> bool:
        """Flip the bit in ``tensor`` (in place) if :meth:`due`; return whether it flipped.

        For ``param`` the caller passes the one-element slice of the chosen parameter.
        """
        with self._lock:
            if not self.due(where, rank, step, bucket, stage) or tensor.numel() == 0:
                return False
            self.fired = True
        flat = tensor.reshape(-1)
        index = self.element % flat.numel() if where != "param" else 0
        self.old, self.new = flip_bit(flat, index, self.bit)
        return True


def flip_bit(flat: torch.Tensor, index: int, bit: int) -> tuple[float | int, float | int]:
    """Flip bit ``bit`` (mod the element's width) of ``flat[index]`` in place.

    Args:
        flat: a 1-D view sharing storage with the tensor to corrupt (any dtype).
        index: element index.
        bit: bit position, 0 = least significant, little-endian element layout.

    Returns:
        The element's value before and after, as Python numbers.
    """
    width = flat.element_size() * 8
    bit %= width
    element = flat[index:index + 1]
    before = element.item()
    raw = element.view(torch.uint8)  # little-endian: bit b lives in byte b // 8
    raw[bit // 8] ^= 1 << (bit % 8)
    return before, element.item()


__all__ = ["WHERE", "BitFlipInjector", "flip_bit"]

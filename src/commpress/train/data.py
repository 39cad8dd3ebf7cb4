"""Training text that ships with Python: the standard library's own source files.

Bytes are the tokens (a vocabulary of 256), so there is no tokenizer to download
or train. The corpus is the ``.py`` files of the stdlib in sorted order, read
until ``limit_bytes``; the last ``validation_fraction`` is held out.
"""

from __future__ import annotations

import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

VOCAB_SIZE = 256


@dataclass(frozen=True)
class Corpus:
    train: torch.Tensor  # uint8 tokens
    validation: torch.Tensor
    source: str

    @classmethod
    def standard_library(cls, limit_bytes: int = 4 << 20, validation_fraction: float = 0.05):
        root = Path(sysconfig.get_paths()["stdlib"])
        chunks, total = [], 0
        for path in sorted(root.glob("*.py")) + sorted(root.glob("*/*.py")):
            data = path.read_bytes()
            chunks.append(data)
            total += len(data)
            if total >= limit_bytes:
                break
        if total < 1 << 16:
            raise RuntimeError(f"found only {total} bytes of Python source under {root}")
        tokens = torch.frombuffer(bytearray(b"".join(chunks)[:limit_bytes]), dtype=torch.uint8)
        split = int(len(tokens) * (1 - validation_fraction))
        return cls(tokens[:split].clone(), tokens[split:].clone(), f"{root} ({len(tokens)} bytes)")


def batch(tokens: torch.Tensor, size: int, context: int, generator: torch.Generator):
    """``size`` random windows of ``context + 1`` tokens, any start from the first to the
    last that fits: inputs and next-token targets, as int64."""
    last_start = len(tokens) - context - 1
    if last_start < 0:
        raise ValueError(
            f"{len(tokens)} tokens hold no window of context {context} "
            f"(the next-token targets need {context + 1})"
        )
    starts = torch.randint(0, last_start + 1, (size,), generator=generator)
    windows = torch.stack([tokens[s : s + context + 1] for s in starts.tolist()]).long()
    return windows[:, :-1], windows[:, 1:]

"""A cheap fingerprint of the data a run trains on, saved with each checkpoint: a resume over changed data
(files added to an images:DIR folder or a shards: glob, another CSV) would draw another shuffle and
another held-out split, so it is refused unless asked for (--resume-changed-data accept).

What is read: image folders, their file list with sizes and modification times (one stat a file);
Parquet streams, their file list and row-group sizes (already in memory); tensors, their bytes (rows
sampled evenly above 64 MiB); any other dataset, its length alone.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import torch

_FULL_BYTES = 64 << 20      # tensors up to this size are hashed whole; larger ones by SAMPLED_ROWS rows
_SAMPLED_ROWS = 4096


def fingerprint(train: Any, val: Any = None) -> dict[str, Any]:
    """{"what": "train: 123 files, 4.5 MB, val: ..." (for a message), "digest": hex} of the training and held-out data.

    Example:
        >>> from torch.utils.data import TensorDataset
        >>> fingerprint(TensorDataset(torch.zeros(4, 2)))["what"]
        'train: 4 samples'
    """
    digest, parts = hashlib.sha256(), []
    for name, data in (("train", train), ("val", val)):
        if data is None:
            continue
        files, unit = _files(data)
        if files:
            root = os.path.commonpath([f[0] for f in files]) if len(files) > 1 else os.path.dirname(files[0][0])
            for file, *sizes in files:    # relative names: the same data under another mount point is the same
                digest.update(f"{name}\0{os.path.relpath(file, root)}\0{sizes}\n".encode())
            total = sum(f[1] for f in files if f[1] > 0)
            parts.append(f"{name}: {len(files)} files, " + (f"{total / 1e6:.1f} MB" if unit == "bytes" else
                                                            f"{total} rows"))
            continue
        tensors = getattr(data, "tensors", None)
        if isinstance(tensors, tuple) and all(isinstance(t, torch.Tensor) for t in tensors):
            for tensor in tensors:
                _hash_tensor(digest, tensor)
        size = _length(data)
        digest.update(f"{name}\0{type(data).__name__}\0{size}\n".encode())
        parts.append(f"{name}: {size} samples" if size is not None else f"{name}: a {type(data).__name__}")
    return {"what": ", ".join(parts), "digest": digest.hexdigest()}


def changed(saved: dict[str, Any] | None, now: dict[str, Any] | None) -> str | None:
    """'then train: 120 files, 1.2 MB; now train: 121 files, 1.3 MB' when the data differs; None when alike or
    either is unknown (a checkpoint written before fingerprints)."""
    if not (isinstance(saved, dict) and isinstance(now, dict)) or saved.get("digest") == now.get("digest"):
        return None
    if saved.get("what") == now.get("what"):
        return f"{now.get('what')}, but file names, sizes, times or content differ"
    return f"then {saved.get('what')}; now {now.get('what')}"


def _files(data: Any) -> tuple[list[tuple[Any, ...]], str]:
    """([(name, bytes, mtime_ns, label)] of an image folder, "bytes"), ([(name, rows, row groups)] of a Parquet
    stream or table, "rows"), or ([], "") for other data."""
    samples = getattr(data, "samples", None)
    if isinstance(samples, list) and samples and isinstance(samples[0], tuple) and isinstance(samples[0][0], Path):
        return [(str(path), *_stat(path), label) for path, label in samples], "bytes"
    units = getattr(data, "units", None)
    if isinstance(getattr(data, "files", None), list) and isinstance(units, list):
        rows: dict[str, list[int]] = {}
        for unit in units:
            rows.setdefault(str(unit.file), []).append(int(unit.rows))
        return [(str(f), sum(rows.get(str(f), [])), rows.get(str(f), [])) for f in data.files], "rows"
    return [], ""


def _stat(path: Path) -> tuple[int, int]:
    try:
        info = path.stat()
    except OSError:         # gone or unreadable: the loader will say so; here it counts as changed
        return -1, -1
    return info.st_size, info.st_mtime_ns


def _hash_tensor(digest: Any, tensor: torch.Tensor) -> None:
    tensor = tensor.detach().cpu()
    digest.update(f"{tuple(tensor.shape)}\0{tensor.dtype}\n".encode())
    if tensor.numel() * tensor.element_size() > _FULL_BYTES and tensor.dim() and len(tensor) > _SAMPLED_ROWS:
        tensor = tensor[torch.linspace(0, len(tensor) - 1, _SAMPLED_ROWS).long()]
    digest.update(tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes())


def _length(data: Any) -> int | None:
    try:
        return len(data)
    except TypeError:
        return None

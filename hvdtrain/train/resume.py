"""--resume: rank 0 reads the checkpoint (read_on_root); every rank applies its share (apply_resume)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from hvdtrain.config.train_config import TrainConfig
from hvdtrain.distributed import runtime
from hvdtrain.errors import UserError, first_line
from hvdtrain.train import checkpoint


def read_on_root(config: TrainConfig, run_path: str | None, model: torch.nn.Module,
                  optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Load weights into this rank's model and optimizer; return what the other ranks need."""
    notes: list[str] = []
    if config.resume == "auto":
        directory = checkpoint.checkpoint_dir(run_path or "")
        payload, path, notes = checkpoint.find_latest(directory)
        if payload is None:
            return {"payload": None, "note": "; ".join(notes + [f"no checkpoint in {directory}: starting fresh"])}
    else:
        path = Path(config.resume)
        try:
            payload = checkpoint.load(path)
        except UserError as err:
            return {"error": str(err)}
    try:
        model.load_state_dict(payload["model"])
        optimizer.load_state_dict(payload["optimizer"])
    except (RuntimeError, ValueError, KeyError) as err:
        made_with = payload.get("config", {}).get("model", "?")
        return {"error": f"checkpoint {path} does not fit this model/optimizer ({first_line(err)}); it was "
                         f"written with --model {made_with}: use the same model and optimizer, or another checkpoint"}
    meta = {key: payload[key] for key in ("progress", "world_size", "rng", "stats")}
    if run_path:
        branch = checkpoint.branch_after(checkpoint.checkpoint_dir(run_path), meta["progress"].get("branch", 0),
                                         meta["progress"]["step"])
        if branch != meta["progress"].get("branch", 0):
            notes.append(f"newer checkpoints of the run stay; this one's follow them as *-b{branch}.pt")
        meta["progress"] = {**meta["progress"], "branch": branch}
    meta["scaler"] = payload.get("scaler")  # fp16's loss scale; absent otherwise
    return {"payload": meta, "path": str(path), "note": "; ".join(notes)}


def apply_resume(found: dict[str, Any], progress: Any, world: runtime.World,
                 scaler: torch.amp.GradScaler | None = None) -> str | None:
    """This rank's share of what rank 0 read: progress, its RNG state and metric sums, the loss scale."""
    if found.get("error"):
        raise UserError(found["error"])
    meta = found["payload"]
    if meta is None:
        return found["note"]
    for name, value in meta["progress"].items():
        setattr(progress, name, value)
    if scaler is not None and meta.get("scaler"):
        scaler.load_state_dict(meta["scaler"])
    old_size = meta["world_size"]
    if old_size == world.size:
        progress.stats = meta["stats"][world.rank]
        checkpoint.set_rng_state(meta["rng"][world.rank])
        how = "exactly where it stopped"
    else:
        # Sums are what metrics need; keep them once, on rank 0 (the others: zeros in the run's own layout).
        progress.stats = sum(meta["stats"]) if world.is_root else torch.zeros_like(meta["stats"][0])
        checkpoint.set_rng_state(meta["rng"][world.rank % old_size])
        how = (f"with {world.size} workers instead of {old_size}: the rest of epoch {progress.epoch + 1} "
               "is re-split across the new workers (every sample still seen once, but batches differ "
               "from an uninterrupted run)" if progress.position else
               f"at an epoch boundary with {world.size} workers instead of {old_size}")
    note = f" ({found['note']})" if found["note"] else ""
    return (f"resumed from {found['path']} at epoch {progress.epoch + 1}, step {progress.step} "
            f"({progress.position} samples into the epoch), {how}{note}")

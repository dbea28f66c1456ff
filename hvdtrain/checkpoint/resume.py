"""--resume: rank 0 reads the checkpoint (read_on_root); every rank applies its share (apply_resume)."""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, cast

import torch

from hvdtrain.checkpoint import format as checkpoint
from hvdtrain.checkpoint.stateful import Stateful, TrainingState
from hvdtrain.data import fingerprint
from hvdtrain.distributed import runtime
from hvdtrain.errors import UserError, first_line

# What the data and its split are (every TrainConfig field that builds the data), and what `best` measures:
# changed, the resumed run would train on other samples or targets (the held-out set among them) or compare the
# saved best with another metric. The data's own content is checked by its fingerprint (data/fingerprint.py).
DATA_KEYS = ("dataset", "features", "label", "image_size", "seed", "val_fraction", "synthetic_samples",
             "synthetic_shape", "num_classes", "monitor")
# Mid-epoch, the saved position counts whole batches of this layout (a stream's, or a DataLoader's drop_last).
MID_EPOCH_KEYS = ("batch_size", "accumulate")
# What a checkpoint records about its run, besides the components' states: not loaded into any component.
RECORD_KEYS = ("format", "config", "data")
# The LR is not restored: each step sets it from this run's own optimizer (Trainer.base_lrs) and schedule.
SCHEDULED = ("lr", "initial_lr")


def config_conflict(saved: dict[str, Any], now: dict[str, Any], *, mid_epoch: bool) -> str | None:
    """The one-line refusal when a checkpoint's config (`saved`) and this run's differ in what defines the
    data; None when they agree (keys an older checkpoint lacks are not compared)."""
    for key in DATA_KEYS + (MID_EPOCH_KEYS if mid_epoch else ()):
        if key in saved and key in now and _differ(saved[key], now[key]):
            old = ",".join(map(str, saved[key])) if isinstance(saved[key], list | tuple) else saved[key]
            old = shlex.quote(old) if isinstance(old, str) else old    # '' for the default --features
            what = "targets" if key == "label" else "inputs" if key in ("features", "image_size") else "samples"
            why = ("would compare the saved best with another metric" if key == "monitor" else
                   f"{' in the middle of an epoch' if key in MID_EPOCH_KEYS else ''} would train on other {what}")
            return (f"the checkpoint was written with {key} {saved[key]!r}, this run has {now[key]!r}: resuming "
                    f"{why}; pass --{key.replace('_', '-')} {old}, or start a new run "
                    "(another --name, no --resume)")
    return None


def restore_hyperparameters(restored: list[dict[str, Any]], wanted: list[dict[str, Any]],
                            also: list[str] | None = None) -> str | None:
    """Set the optimizer settings this run asked for (momentum, weight_decay, betas...) over those a checkpoint
    restored, in place; returns one line naming what changed (`also` first, e.g. the LR), or None."""
    changes: list[str] = list(also or [])
    for group, want in zip(restored, wanted, strict=False):
        for key, value in want.items():
            if key in SCHEDULED or key == "params" or not _differ(group.get(key), value):
                continue
            change = f"{key} {group.get(key)} -> {value}"
            if change not in changes:
                changes.append(change)
            group[key] = value
    return f"optimizer settings changed since the checkpoint, applied: {', '.join(changes)}" if changes else None


def _differ(a: Any, b: Any) -> bool:
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return list(a) != list(b)   # a config read back from a checkpoint holds lists for tuples
    try:
        return bool(a != b)
    except (RuntimeError, ValueError):   # tensors of several elements: not a setting to compare
        return False


def read_on_root(resume: str, config: dict[str, Any], changed_data: str, run_path: str | None,
                 weights: dict[str, Stateful], data: dict[str, Any] | None = None, *,
                 keep_saved_settings: bool = False) -> dict[str, Any]:
    """Load `weights` (model and optimizer, by file key) on this rank; return what the other ranks need: every
    other component's state in the file. `resume`: --resume; `config`: this run's (as a dict), compared with the
    checkpoint's; `changed_data`: --resume-changed-data; `data`: this run's data fingerprint
    (data/fingerprint.py), compared with the checkpoint's. The optimizer's param-group settings win over the file's,
    unless `keep_saved_settings` (a user's LR scheduler sets them, and its restored state expects the saved ones:
    OneCycleLR's momentum)."""
    notes: list[str] = []
    if resume == "auto":
        directory = checkpoint.checkpoint_dir(run_path or "")
        try:    # a checkpoint of another version, or storage that fails: an error on every rank, not a fresh start
            payload, path, notes = checkpoint.find_latest(directory)
        except UserError as err:
            return {"error": f"--resume auto: {err}"}
        if payload is None:
            return {"payload": None, "note": "; ".join(notes + [f"no checkpoint in {directory}: starting fresh"])}
    else:
        path = Path(resume)
        try:
            payload = checkpoint.load(path)
        except UserError as err:
            return {"error": str(err)}
    conflict = config_conflict(payload.get("config") or {}, config,
                               mid_epoch=bool(payload.get("progress", {}).get("position")))
    if conflict:
        return {"error": f"--resume {path}: {conflict}"}
    data_change = fingerprint.changed(payload.get("data"), data)
    if data_change and changed_data != "accept":
        return {"error": f"--resume {path}: the data changed since the checkpoint ({data_change}): resuming would "
                         "draw another shuffle and held-out split; pass --resume-changed-data accept to resume "
                         "anyway, or start a new run (another --name, no --resume)"}
    if data_change:
        notes.append(f"the data changed since the checkpoint ({data_change}); resumed over it "
                     "(--resume-changed-data accept)")
    optimizer = cast(torch.optim.Optimizer, weights["optimizer"])   # Horovod's wrapper: a torch Optimizer subclass
    wanted = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    try:
        for name, component in weights.items():
            component.load_state_dict(payload[name])
    except (RuntimeError, ValueError, KeyError) as err:
        made_with = payload.get("config", {}).get("model", "?")
        return {"error": f"checkpoint {path} does not fit this model/optimizer ({first_line(err)}); it was "
                         f"written with --model {made_with}: use the same model and optimizer, or another checkpoint"}
    old_lr = (payload.get("config") or {}).get("lr")
    new_lr = [f"lr {old_lr} -> {config['lr']}"] if old_lr is not None and _differ(old_lr, config["lr"]) else []
    changed = None if keep_saved_settings else restore_hyperparameters(optimizer.param_groups, wanted, new_lr)
    if changed:
        notes.append(changed)
    meta = {key: value for key, value in payload.items() if key not in weights and key not in RECORD_KEYS}
    rollback = False
    if run_path:
        branch = checkpoint.branch_after(checkpoint.checkpoint_dir(run_path), meta["progress"].get("branch", 0),
                                         meta["progress"]["step"])
        rollback = branch != meta["progress"].get("branch", 0)
        if rollback:
            notes.append(f"newer checkpoints of the run stay; this one's follow them as *-b{branch}.pt")
        meta["progress"] = {**meta["progress"], "branch": branch}
    # Steps from here on may differ from those the run's first process logged beyond this checkpoint (a rollback,
    # other settings or data): the tracker logs them as a new branch instead of dropping them (tracking/tracker.py).
    diverges = rollback or bool(changed) or bool(data_change)
    return {"payload": meta, "path": str(path), "note": "; ".join(notes),
            "branch_from": meta["progress"]["step"] if diverges else None}


def apply_resume(found: dict[str, Any], state: TrainingState, world: runtime.World) -> str | None:
    """This rank's share of what rank 0 read, loaded into `state`'s components by name: the shared ones as
    saved, the per-rank ones as this rank saved them (or, written by another number of workers, as each
    component takes a share of them)."""
    if found.get("error"):
        raise UserError(found["error"])
    meta = found["payload"]
    if meta is None:
        return found["note"]
    for name, component in state.shared.items():
        component.load_state_dict(meta.get(name))
    old_size = meta["world_size"]
    for name, rank_component in state.per_rank.items():
        if old_size == world.size:
            rank_component.load_state_dict(meta[name][world.rank])
        else:
            rank_component.load_resized(meta[name], world.rank)
    progress = meta["progress"]
    if old_size == world.size:
        how = "exactly where it stopped"
    else:
        how = (f"with {world.size} workers instead of {old_size}: the rest of epoch {progress['epoch'] + 1} "
               "is re-split across the new workers (every sample still seen once, but batches differ "
               "from an uninterrupted run)" if progress["position"] else
               f"at an epoch boundary with {world.size} workers instead of {old_size}")
        how += "; random augmentations start from this run's seeds (their state is per worker)"
    note = f" ({found['note']})" if found["note"] else ""
    return (f"resumed from {found['path']} at epoch {progress['epoch'] + 1}, step {progress['step']} "
            f"({progress['position']} samples into the epoch), {how}{note}")

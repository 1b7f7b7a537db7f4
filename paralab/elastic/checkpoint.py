"""Checkpoints that survive the crash of any worker, at any moment, and load at any world size.

Why torch.distributed.checkpoint (DCP): every rank writes its own files in parallel and the loader
reads whatever pieces it needs, so a checkpoint written by 4 workers loads on 2 or 3 (resharding).
paralab's elastic workers replicate the model (DDP), so DCP de-duplicates the copies on save and every
rank reads the full tensors on load; a sharded strategy would go through the same two calls.

Why a temporary directory and a rename: DCP writes many files, and a worker killed half-way leaves
some of them behind. Every save goes to ``.tmp-step-N``; only when all ranks have written their part
(a barrier) does rank 0 add ``manifest.json`` and rename the directory to ``step-N`` in one atomic
``os.rename``. A loader only ever considers ``step-*`` directories holding a manifest, so a crash
mid-save leaves the previous checkpoint as the latest one, untouched. Old checkpoints are retired the
same way (renamed out of sight, then deleted).

The manifest is small JSON (never pickle): the model signature (model config, strategy, optimizer,
global batch, seed), the step, the sampler position and the RNG state, so a directory that holds
another run's checkpoint is refused, naming the settings that differ, before anything is loaded.

Why loading never unpickles arbitrary objects: DCP reads its ``.metadata`` file with pickle, and the
state dict's non-tensor entries (the optimizer's hyper-parameters) with ``torch.load(weights_only=
False)``; a crafted checkpoint could run code in every worker that resumes from it. So before DCP
reads ``.metadata``, :func:`check_metadata` unpickles it with an unpickler that knows only DCP's own
metadata classes, torch sizes, dtypes and layouts, paths and plain builtins, and refuses anything
else; and each non-tensor entry is first read with torch's weights-only unpickler (plain data and
tensors). Tensors DCP reads weights-only itself. What remains trusted is the directory: no one else
may write to it while a run loads from it (see docs/failures.md).
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import CheckpointException, DefaultLoadPlanner
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from paralab.config import ConfigError
from paralab.outputs import check_dir

MANIFEST = "manifest.json"
METADATA = ".metadata"  # DCP's own file: pickled
PREFIX, TMP_PREFIX, TRASH_PREFIX = "step-", ".tmp-step-", ".trash-step-"


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _barrier() -> None:
    if _distributed():
        dist.barrier()


def _is_rank0() -> bool:
    return not _distributed() or dist.get_rank() == 0


def step_dir(root: Path, step: int, prefix: str = PREFIX) -> Path:
    return root / f"{prefix}{step:08d}"


def committed(root: str | Path) -> list[Path]:
    """Checkpoints that finished saving (a manifest exists), oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob(f"{PREFIX}*") if (p / MANIFEST).is_file())


def latest(root: str | Path) -> Path | None:
    done = committed(root)
    return done[-1] if done else None


MANIFEST_KEYS = ("signature", "step", "sampler", "rng", "world_size")  # what save writes and load reads


def read_manifest(path: str | Path) -> dict:
    """A checkpoint's manifest; ValueError if it is not one (not JSON, or a key missing)."""
    manifest = json.loads((Path(path) / MANIFEST).read_text())
    missing = [k for k in MANIFEST_KEYS if not isinstance(manifest, dict) or k not in manifest]
    if missing:
        raise ValueError(f"no {', '.join(missing)}")
    if not isinstance(manifest["signature"], dict):
        raise ValueError(f"signature is {type(manifest['signature']).__name__}, not an object")
    if type(manifest["step"]) is not int or manifest["step"] < 0:
        raise ValueError(f"step is {manifest['step']!r}, not a step number")
    return manifest


def check_signature(root: str | Path, signature: dict) -> None:
    """Refuse a directory whose latest checkpoint was written by another model or training setup."""
    last = latest(root)
    if last is None:
        return
    try:
        theirs = read_manifest(last)["signature"]
    except (OSError, ValueError) as err:
        raise ConfigError(f"checkpoint directory {root}: {last / MANIFEST} cannot be read as a checkpoint "
                          f"manifest ({type(err).__name__}: {err}). Use another --checkpoint-dir, or remove "
                          f"{last.name}.") from None
    if differ := _differences(theirs, signature):
        detail = "; ".join(f"{k}: checkpoint {a!r}, this run {b!r}" for k, a, b in differ)
        raise ConfigError(f"checkpoint directory {root} holds the checkpoint of another run ({last.name}): "
                          f"{detail}. Use another --checkpoint-dir, or the settings it was trained with.")


def _differences(theirs: dict, ours: dict, prefix: str = "") -> list[tuple[str, object, object]]:
    """(key, theirs, ours) for each setting that differs, a model's field by field ("model.hidden"):
    a model of another preset had been said as its whole config beside this run's."""
    out = []
    for key in sorted(set(theirs) | set(ours)):
        a, b = theirs.get(key), ours.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append((prefix + key, a, b))
    return out


class UnsafeCheckpoint(ConfigError):
    """A checkpoint holds more than a checkpoint needs: objects whose unpickling could run code."""


# What DCP's metadata is made of, besides the classes of torch.distributed.checkpoint.metadata
_METADATA_GLOBALS = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
    ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"), ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "complex"),
    ("builtins", "bytearray"),
}


def _is_metadata_global(module: str, name: str) -> bool:
    if "." in name:  # no attribute paths (SomeClass.__init__.__globals__ ...)
        return False
    if (module, name) in _METADATA_GLOBALS:
        return True
    if module == dcp_metadata.__name__:
        found = getattr(dcp_metadata, name, None)
        return isinstance(found, type) and found.__module__ == module  # defined there, not imported
    return module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if not _is_metadata_global(module, name):
            raise pickle.UnpicklingError(f"it refers to {module}.{name}, which no checkpoint metadata holds")
        return super().find_class(module, name)


def check_metadata(path: str | Path) -> None:
    """Refuse checkpoint ``path`` unless its DCP metadata is made of metadata classes and plain data
    (read without running any other code)."""
    file = Path(path) / METADATA
    try:
        with open(file, "rb") as f:
            _MetadataUnpickler(f).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, KeyError,
            IndexError) as exc:
        raise UnsafeCheckpoint(f"checkpoint {path} is refused: {file.name} is not plain checkpoint metadata "
                               f"({exc}). "
                               "Only load checkpoints from a directory no one else can write to.") from None
    except OSError as exc:  # missing, a directory, unreadable: a damaged checkpoint, not a crash
        raise ConfigError(f"checkpoint {path} cannot be resumed: its {file.name} cannot be read "
                          f"({type(exc).__name__}: {exc.strerror or exc}). Use another --checkpoint-dir, "
                          f"or remove {Path(path).name}.") from None


class _PlainDataLoadPlanner(DefaultLoadPlanner):
    """DCP's planner unpickles the non-tensor entries of a state dict without restriction; these are
    first read weights-only (plain data and tensors, nothing that runs code), then handed over."""

    def load_bytes(self, read_item, value) -> None:
        try:
            torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            lines = str(exc).splitlines()
            reason = next((line.strip() for line in lines if "Unsupported global" in line), lines[0])
            raise UnsafeCheckpoint(
                f"checkpoint entry {read_item.dest_index.fqn} is not plain data ({reason})") from None
        value.seek(0)
        super().load_bytes(read_item, value)


def check_resumable(root: str | Path, signature: dict, steps: int) -> None:
    """Before any process starts: ``root`` is a directory (or can be made one), and its latest
    checkpoint (if any) was written by this model and training setup, holds nothing but checkpoint
    metadata and plain data, and leaves some of the run's ``steps`` to train."""
    check_dir(root, "--checkpoint-dir")
    check_signature(root, signature)
    last = latest(root)
    if last is not None:
        check_metadata(last)
        resumes_at = read_manifest(last)["step"]
        if resumes_at >= steps:
            raise ConfigError(f"checkpoint directory {root}: {last.name} resumes at step {resumes_at}, and "
                              f"the run has {steps} steps: nothing would train. Ask for more --steps, or "
                              "use another --checkpoint-dir.")


def _rng_state() -> dict:
    state = {"torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = base64.b64encode(torch.cuda.get_rng_state().numpy().tobytes()).decode()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["torch"])), dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["cuda"])),
                                                  dtype=torch.uint8))


def _quiet(call, *args, **kwargs):
    """DCP warns that it runs in one process when no process group exists; that is the intent here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to.*single process")
        return call(*args, **kwargs)


def save(root: str | Path, step: int, model, optimizer, signature: dict, sampler_position: dict,
         keep: int = 2, before_commit=None) -> Path:
    """Collective: every rank calls it. Writes checkpoint ``step`` (the number of steps completed).

    ``before_commit`` runs on every rank after its files are written and before the commit barrier:
    the failure injector uses it to kill a worker in the middle of a save.
    """
    root = Path(root)
    tmp, final = step_dir(root, step, TMP_PREFIX), step_dir(root, step)
    if _is_rank0():
        root.mkdir(parents=True, exist_ok=True)
        # left by a save, or a retirement, that crashed
        for stale in (*root.glob(f"{TMP_PREFIX}*"), *root.glob(f"{TRASH_PREFIX}*")):
            shutil.rmtree(stale, ignore_errors=True)
    _barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    _quiet(dcp.save, {"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
    if before_commit is not None:
        before_commit()
    _barrier()  # every rank's files are on disk
    if _is_rank0():
        manifest = {"format": "paralab-elastic-checkpoint", "version": 1,
                    "signature": signature, "step": step, "sampler": sampler_position, "rng": _rng_state(),
                    "world_size": dist.get_world_size() if _distributed() else 1}
        (tmp / MANIFEST).write_text(json.dumps(manifest))
        _fsync_dir(tmp)
        os.rename(tmp, final)
        _fsync_dir(root)
        _retire(root, keep)
    _barrier()
    return final


def _retire(root: Path, keep: int) -> None:
    for old in committed(root)[:-keep]:
        trash = root / (TRASH_PREFIX + old.name[len(PREFIX):])
        os.rename(old, trash)  # out of sight first: a crash mid-delete must not leave a half checkpoint
        shutil.rmtree(trash, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load(path: str | Path, model, optimizer) -> dict:
    """Collective: load checkpoint ``path`` into ``model`` and ``optimizer`` (whatever world size wrote
    it) and restore the RNG state. Returns its manifest. Refuses (UnsafeCheckpoint) a checkpoint
    that holds anything but checkpoint metadata, plain data and tensors."""
    manifest = read_manifest(path)
    check_metadata(path)
    model_sd, optim_sd = get_state_dict(model, optimizer)  # the shapes DCP fills in
    state = {"model": model_sd, "optim": optim_sd}
    try:
        _quiet(dcp.load, state, checkpoint_id=str(path), planner=_PlainDataLoadPlanner())
    except CheckpointException as exc:  # DCP gathers every rank's exception into one
        refused = [err for err, _ in exc.failures.values() if isinstance(err, UnsafeCheckpoint)]
        if refused:
            raise refused[0] from None
        raise
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    _set_rng_state(manifest["rng"])
    return manifest

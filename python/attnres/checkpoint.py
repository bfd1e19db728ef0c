"""Loading attnres checkpoints as AttnResModel, and saving models in attnres's weights format.

Accepted inputs (docs/training.md, src/train/trainer.cpp):
  * ``model.safetensors``: one tensor per parameter (named as in docs/model.md), the model config as
    JSON under metadata ``config``, the tokenizer spec under ``tokenizer``, the step under ``step``;
  * ``checkpoint-STEP.safetensors`` (``checkpoint.safetensors`` in runs written before attnres kept
    several): the training state, whose ``params`` tensor is every parameter flat in ParamLayout
    order (attnres.model.param_layout), with ``config`` (and, newer ones, ``tokenizer``) in its
    metadata;
  * a run directory holding either (model.safetensors preferred: it names the tokenizer; else the
    newest checkpoint).
"""
from __future__ import annotations

import json
import os
import re
from typing import Dict, Mapping, Optional, Tuple

import numpy as np
import torch

from . import safetensors
from .config import ModelConfig
from .model import AttnResModel, param_layout
from .tokenizers import TokenizerError, make_tokenizer

WEIGHTS_FILE = "model.safetensors"
# The names attnres's trainer gives checkpoints (src/train/checkpoint.cpp, checkpoint_file_name).
CHECKPOINT_PATTERN = re.compile(r"checkpoint-([0-9]+)\.safetensors")
LEGACY_CHECKPOINT_FILE = "checkpoint.safetensors"


class CheckpointError(ValueError):
    """A file that is not an attnres checkpoint of the model it claims; the message names it."""


def checkpoints(run_dir: str) -> list:
    """The checkpoint files of a run directory, newest (highest step) first; an older run's
    checkpoint.safetensors counts as the oldest."""
    found = []
    for name in os.listdir(run_dir):
        m = CHECKPOINT_PATTERN.fullmatch(name)
        if m:
            found.append((int(m.group(1)), name))
        elif name == LEGACY_CHECKPOINT_FILE:
            found.append((-1, name))
    return [os.path.join(run_dir, name) for _, name in sorted(found, key=lambda s: (-s[0], s[1]))]


def resolve(path: str) -> str:
    """The weights file a path means: the file itself, or a run directory's model.safetensors
    (else its newest checkpoint)."""
    if os.path.isdir(path):
        candidate = os.path.join(path, WEIGHTS_FILE)
        if os.path.isfile(candidate):
            return candidate
        found = [c for c in checkpoints(path) if os.path.isfile(c)]
        if found:
            return found[0]
        raise CheckpointError(f"'{path}' holds neither {WEIGHTS_FILE} nor a checkpoint (checkpoint-STEP.safetensors)")
    if not os.path.isfile(path):
        raise CheckpointError(f"'{path}' does not exist")
    return path


def read_config(path: str) -> ModelConfig:
    """The model config stored in a weights or checkpoint file (or a run directory's)."""
    file = resolve(path)
    _, meta, _ = safetensors.read_header(file)
    return _config_of(file, meta)


def _config_of(file: str, meta: Mapping[str, str]) -> ModelConfig:
    if "config" not in meta:
        raise CheckpointError(f"'{file}': no 'config' in the safetensors metadata (not an attnres checkpoint)")
    return ModelConfig.from_json(meta["config"], where=f"'{file}'")


def state_dict_of(file: str, config: ModelConfig, arrays: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """{name: array} of every parameter, from named tensors or from a flat `params` tensor."""
    layout = param_layout(config)
    if "params" in arrays and "tok_emb.weight" not in arrays:
        flat = arrays["params"].reshape(-1)
        total = sum(int(np.prod(shape)) for _, shape in layout)
        if flat.size != total:
            raise CheckpointError(f"'{file}': tensor 'params' has {flat.size} values; the model of its config has "
                                  f"{total} parameters")
        out, offset = {}, 0
        for name, shape in layout:
            n = int(np.prod(shape))
            out[name] = flat[offset:offset + n].reshape(shape)
            offset += n
        return out
    want = dict(layout)
    missing = [n for n in want if n not in arrays]
    unexpected = sorted(set(arrays) - set(want))
    if missing or unexpected:
        raise CheckpointError(f"'{file}': tensors do not match its config (residual={config.residual}): "
                              f"missing {missing}, unexpected {unexpected}")
    bad = [f"{n} {list(arrays[n].shape)} (expected {list(s)})" for n, s in want.items()
           if tuple(arrays[n].shape) != tuple(s)]
    if bad:
        raise CheckpointError(f"'{file}': wrong tensor shapes: " + "; ".join(bad))
    return {n: arrays[n] for n in want}


def require_finite(file: str, tensors: Mapping[str, np.ndarray]) -> None:
    """Refuses weights holding a NaN or an infinity, naming the file, the tensor and the first such element,
    as attnres's load_weights does."""
    for name, a in tensors.items():
        if a.dtype.kind != "f":
            continue
        bad = np.flatnonzero(~np.isfinite(a.reshape(-1)))
        if bad.size:
            first = int(bad[0])
            what = "a NaN" if np.isnan(a.reshape(-1)[first]) else "an infinity"
            raise CheckpointError(f"'{file}': tensor '{name}' holds {what} (element {first} of {a.size}): the "
                                  "weights are corrupt or training diverged before they were saved")


def load(path: str, *, dtype=torch.float32, device=None) -> AttnResModel:
    """An AttnResModel built from a checkpoint's own config, holding its weights.

    path: model.safetensors, a checkpoint-STEP.safetensors, or a run directory. The model is in eval mode
    (it has no dropout, so this only matters to code that checks) with gradients enabled, ready for
    inference or fine-tuning. ``model.tokenizer_spec`` is the checkpoint's tokenizer (None if it does
    not name one) and ``model.metadata`` its safetensors metadata (without the checksum entry).

    The file is checked as attnres checks it: its payload checksums (safetensors.SafetensorsError naming
    the first tensor whose bytes differ; a file without them loads with a safetensors.UnverifiedWarning)
    and finite weights (CheckpointError naming the tensor and element).
    """
    file = resolve(path)
    arrays, meta = safetensors.load(file)
    config = _config_of(file, meta)
    tensors = state_dict_of(file, config, arrays)
    require_finite(file, tensors)
    model = AttnResModel(config, dtype=dtype, device=device)
    with torch.no_grad():
        params = dict(model.named_parameters())
        for name, value in tensors.items():
            params[name].copy_(torch.from_numpy(np.ascontiguousarray(value)))
    model.tokenizer_spec = meta.get("tokenizer")
    model.metadata = dict(meta)
    model.source_path = file
    return model.eval()


def save(model: AttnResModel, path: str, *, tokenizer=None, metadata: Optional[Mapping[str, str]] = None) -> None:
    """Writes ``model`` as attnres writes model.safetensors (F32 tensors, config JSON, tokenizer spec and content
    hash, payload checksums), so `attnres eval`, `sample` and `info` read and verify it (e.g. after fine-tuning in
    PyTorch). Atomic. ``metadata`` adds entries (``attnres.checksum`` is reserved).

    The tokenizer: ``tokenizer`` (a spec or a Tokenizer; its files must be readable: their content hash is
    recorded), else the model's own (``model.tokenizer_spec``) with the content hash its checkpoint recorded,
    so the saved weights are matched by content as attnres's are (docs/data.md "Content hash"): `eval` and
    `sample` refuse a tokenizer of another hash."""
    meta = {"config": json.dumps(model.config.to_json())}
    spec, content_hash = tokenizer_of_model(model, tokenizer)
    if spec is not None:
        meta["tokenizer"] = spec
    if content_hash is not None:
        meta["tokenizer_hash"] = content_hash
    if metadata:
        meta.update({str(k): str(v) for k, v in metadata.items()})
    state = model.state_dict()
    tensors = {name: state[name].detach().to("cpu", torch.float32).numpy() for name, _ in param_layout(model.config)}
    safetensors.save(path, tensors, meta)


def tokenizer_of_model(model: AttnResModel, tokenizer=None) -> Tuple[Optional[str], Optional[str]]:
    """(spec, content hash) of the tokenizer weights of ``model`` are saved with: ``tokenizer`` (a spec or a
    Tokenizer) with its hash, else the model's spec with the hash its checkpoint recorded (computed from the
    spec's files when none was recorded and they are readable; else None, as in checkpoints from before
    attnres recorded hashes)."""
    if tokenizer is not None:
        tok = make_tokenizer(tokenizer)
        return tok.spec, tok.content_hash
    spec = model.tokenizer_spec
    if spec is None:
        return None, None
    loaded = getattr(model, "metadata", None) or {}
    recorded = loaded.get("tokenizer_hash")
    if recorded is not None and loaded.get("tokenizer") == spec:  # not when tokenizer_spec was changed since
        return spec, recorded
    try:
        return spec, make_tokenizer(spec).content_hash
    except TokenizerError:
        return spec, None

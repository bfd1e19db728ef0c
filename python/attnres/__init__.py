"""attnres from Python: load attnres checkpoints as PyTorch modules, sample and score with them, and
read experiment results as tables. See docs/python.md.

    import attnres
    model = attnres.load("runs/demo/runs/rd/seed-1")        # a run directory or a .safetensors file
    logits, reads = model(ids, return_weights=True)          # reads[j].qk: depth weights of read j
    print(attnres.generate(model, "The residual stream", top_k=50))
    exp = attnres.read_experiment("runs/demo"); exp.frame("test")

Names are imported on first use, so `import attnres` is cheap and the experiment reader works
without loading torch (attnres.bench_worker relies on this: it must configure OpenMP before torch
loads).
"""
import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "ModelConfig": "config", "ConfigError": "config",
    "AttnResModel": "model", "ReadWeights": "model", "KVCache": "model", "ResidualMode": "model",
    "MODES": "model", "param_layout": "model", "EMBEDDING": "model", "NULL_SOURCE": "model",
    "routing_max_weight": "model",
    "load": "checkpoint", "save": "checkpoint", "read_config": "checkpoint", "CheckpointError": "checkpoint",
    "generate": "sampling", "generate_ids": "sampling", "score": "sampling", "sample_token": "sampling",
    "Rng": "sampling",
    "make_tokenizer": "tokenizers", "Tokenizer": "tokenizers", "TokenizerError": "tokenizers",
    "read_experiment": "experiment", "Experiment": "experiment", "ExperimentError": "experiment",
}

_SUBMODULES = ("config", "model", "checkpoint", "sampling", "tokenizers", "experiment", "safetensors")

__all__ = sorted(_EXPORTS) + list(_SUBMODULES) + ["__version__"]


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'attnres' has no attribute '{name}'")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__

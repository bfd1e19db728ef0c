"""Reading a paired experiment directory (docs/experiments.md) as plain records and DataFrames.

    exp = attnres.read_experiment("runs/demo")
    exp.records("test")        # [{"arm": "block", "seed": 1, "test_nll": 4.21}, ...]
    exp.frame("milestones")    # the same as a pandas DataFrame (when pandas is installed)

Tables (each a list of flat dicts, one row per ...):
  runs        finished run: arm, seed, params, test_nll, tokens_per_sec, step_time_ms, peak_rss_bytes, path,
              routing_max_weight (delta, delta_block: the routing-collapse statistic, docs/delta-gated-spec.md
              §1.8; None for other modes)
  milestones  validation point of a run: arm, seed, tokens, val_nll
  test        finished run: arm, seed, test_nll
  deltas      paired seed (both the arm and the baseline finished) and evaluation: arm, seed, split
              ("val" at each experiment milestone, "test" at the budget), tokens, nll, baseline_nll, delta_nll
  routing     run, attention layer, route and source: arm, seed, layer, sources, route ("qk" | "k" | "v";
              mudd: "qk" is its Q route, "k" its K route), source (0 = the embedding), weight (the route's
              token-averaged depth weight; mudd: of p_c(j) = |dw[c,j]|·‖X_j‖ / Σ_j |dw[c,j]|·‖X_j‖)
  js          run, attention layer and route compared with the V route, of a two-route arm: arm, seed, layer,
              sources, route ("qk", or for mudd "qk" for its Q route and "k"), js_nats, js_bits
  systems     finished run: arm, seed, params, tokens_per_sec, step_time_ms, peak_rss_bytes
  curve       logged training-loss point of a run: arm, seed, tokens, train_loss
  paired      from summary.json (`attnres report` writes it), per split/milestone and non-baseline arm:
              split, tokens, arm, n, mean, sd, ci95_low, ci95_high, t, p_value, wins, ppl_change
  missing     run without result.json: arm, seed

The files are checked as `attnres report` checks them: a malformed one raises ExperimentError naming
the file and the key ("…/runs/rd/seed-2/result.json: key 'milestones[1].val_nll' is missing").
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Dict, List, Optional, Tuple

LN2 = math.log(2.0)
# The tables and their columns, in order (the docstring says what a row is).
COLUMNS = {
    "runs": ("arm", "seed", "params", "test_nll", "tokens_per_sec", "step_time_ms", "peak_rss_bytes", "path",
             "routing_max_weight"),
    "milestones": ("arm", "seed", "tokens", "val_nll"),
    "test": ("arm", "seed", "test_nll"),
    "deltas": ("arm", "seed", "split", "tokens", "nll", "baseline_nll", "delta_nll"),
    "routing": ("arm", "seed", "layer", "sources", "route", "source", "weight"),
    "js": ("arm", "seed", "layer", "sources", "route", "js_nats", "js_bits"),
    "systems": ("arm", "seed", "params", "tokens_per_sec", "step_time_ms", "peak_rss_bytes"),
    "curve": ("arm", "seed", "tokens", "train_loss"),
    "paired": ("split", "tokens", "arm", "n", "mean", "sd", "ci95_low", "ci95_high", "t", "p_value", "wins",
               "ppl_change"),
    "missing": ("arm", "seed"),
}
TABLES = tuple(COLUMNS)


class ExperimentError(ValueError):
    """A missing or malformed experiment file; the message names the file and the key."""


class _Json:
    """Strict access to one JSON file: errors name the file and the key path."""

    def __init__(self, path: str):
        self.path = path
        try:
            with open(path, encoding="utf-8") as f:
                self.root = json.load(f)
        except OSError as e:
            raise ExperimentError(f"{path}: cannot read: {e.strerror}") from None
        except json.JSONDecodeError as e:
            raise ExperimentError(f"{path}: malformed JSON: {e}") from None

    def bad(self, key: str, what: str):
        raise ExperimentError(f"{self.path}: key '{key}' {what}")

    @staticmethod
    def join(prefix: str, key: str) -> str:
        return f"{prefix}.{key}" if prefix else key

    def find(self, obj, prefix: str, key: str):
        if not isinstance(obj, dict):
            self.bad(prefix or "(top level)", "must be an object")
        return obj.get(key)

    def get(self, obj, prefix: str, key: str):
        if not isinstance(obj, dict):
            self.bad(prefix or "(top level)", "must be an object")
        if key not in obj:
            self.bad(self.join(prefix, key), "is missing")
        return obj[key]

    def number(self, v, key: str) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            self.bad(key, "must be a number")
        if not math.isfinite(v):
            self.bad(key, "must be finite")
        return float(v)

    def integer(self, v, key: str) -> int:
        if isinstance(v, int) and not isinstance(v, bool):
            return v
        if isinstance(v, float) and math.isfinite(v) and v == math.floor(v):
            return int(v)  # integers written as floats (2e9) are accepted when integral
        self.bad(key, "must be an integer")

    def field(self, obj, prefix: str, key: str, kind: str):
        v, k = self.get(obj, prefix, key), self.join(prefix, key)
        if kind == "number":
            return self.number(v, k)
        if kind == "non_negative":
            d = self.number(v, k)
            if d < 0:
                self.bad(k, "must not be negative")
            return d
        if kind == "integer":
            return self.integer(v, k)
        if kind == "string":
            if not isinstance(v, str):
                self.bad(k, "must be a string")
            return v
        if kind == "array":
            if not isinstance(v, list):
                self.bad(k, "must be an array")
            return v
        raise AssertionError(kind)

    def distribution(self, v, key: str, n: int) -> List[float]:
        if not isinstance(v, list):
            self.bad(key, "must be an array of numbers")
        if len(v) != n:
            self.bad(key, f"has {len(v)} entries but 'sources' is {n}")
        out = [self.number(p, f"{key}[{i}]") for i, p in enumerate(v)]
        for i, p in enumerate(out):
            if p < 0:
                self.bad(f"{key}[{i}]", "must not be negative")
        if abs(sum(out) - 1) > 1e-2:
            self.bad(key, f"must sum to 1 (a distribution over sources), sums to {sum(out)}")
        return out


@dataclasses.dataclass
class LayerRouting:
    layer: int
    sources: int
    qk_mean: List[float]
    v_mean: Optional[List[float]] = None
    js_nats: Optional[float] = None
    k_mean: Optional[List[float]] = None  # mudd: its K route (qk_mean is then its Q route)
    js_k_nats: Optional[float] = None


@dataclasses.dataclass
class Run:
    """One finished run's result.json."""

    arm: str
    seed: int
    path: str  # the run directory (holds model.safetensors: attnres.load(run.path))
    params: int
    milestones: List[Tuple[int, float]]  # (tokens, val_nll)
    test_nll: float
    tokens_per_sec: float
    step_time_ms: float
    peak_rss_bytes: float
    curve: List[Tuple[int, float]]  # (tokens, train_loss)
    routing: Optional[List[LayerRouting]]  # None for prenorm
    raw: Dict[str, Any]
    # Delta AttnRes: per read with more than one source the token mean of its largest weight, then
    # the mean over those reads (docs/delta-gated-spec.md §1.8); None for other modes.
    routing_max_weight: Optional[float] = None

    def val_nll_at(self, tokens: int) -> Optional[float]:
        return next((v for t, v in self.milestones if t == tokens), None)


def _read_comparison(f: "_Json", j: dict, prefix: str) -> dict:
    """arms, baseline, tokens and milestones of the main comparison or of one group, checked."""
    key = (lambda k: f"{prefix}.{k}") if prefix else (lambda k: k)
    arms = f.field(j, prefix, "arms", "array")
    for i, a in enumerate(arms):
        if not isinstance(a, str) or not a:
            f.bad(key(f"arms[{i}]"), "must be a non-empty string")
        if arms.index(a) != i:
            f.bad(key(f"arms[{i}]"), f"repeats arm '{a}'")
    if not arms:
        f.bad(key("arms"), "must not be empty")
    baseline = f.field(j, prefix, "baseline", "string")
    if baseline not in arms:
        f.bad(key("baseline"), "'" + baseline + "' is not one of 'arms'")
    tokens = f.field(j, prefix, "tokens", "integer")
    if tokens <= 0:
        f.bad(key("tokens"), "must be positive")
    milestones = [f.integer(m, key(f"milestones[{i}]")) for i, m in enumerate(f.field(j, prefix, "milestones", "array"))]
    for i, m in enumerate(milestones):
        if m <= 0:
            f.bad(key(f"milestones[{i}]"), "must be positive")
        if i and m <= milestones[i - 1]:
            f.bad(key(f"milestones[{i}]"), "must be larger than the one before")
    if not milestones:
        f.bad(key("milestones"), "must not be empty")
    return dict(j, arms=arms, baseline=baseline, tokens=tokens, milestones=milestones)


def _read_spec(path: str) -> dict:
    """experiment.json: version 1 (command-line experiments) or 2 (protocol files: a name and
    further comparisons, "groups", beside the main arms: docs/experiments.md)."""
    if not os.path.exists(path):
        raise ExperimentError(f"{path}: not found (is this an experiment directory?)")
    f = _Json(path)
    j = f.root
    version = f.field(j, "", "version", "integer")
    if version not in (1, 2):
        f.bad("version", f"is {version}; this reader reads versions 1 and 2")
    spec = _read_comparison(f, j, "")
    seeds = [f.integer(s, f"seeds[{i}]") for i, s in enumerate(f.field(j, "", "seeds", "array"))]
    for i, s in enumerate(seeds):
        if seeds.index(s) != i:
            f.bad(f"seeds[{i}]", f"repeats seed {s}")
    if not seeds:
        f.bad("seeds", "must not be empty")
    groups = []
    for i, g in enumerate(j.get("groups") or []):
        prefix = f"groups[{i}]"
        name = f.field(g, prefix, "name", "string")
        if not name or "/" in name or name == "main" or name in spec["arms"] or any(x["name"] == name for x in groups):
            f.bad(prefix + ".name", f"'{name}' is not a usable group name (empty, 'main', an arm's, or repeated)")
        kind = f.field(g, prefix, "kind", "string")
        if kind not in ("controls", "probe"):
            f.bad(prefix + ".kind", f"is '{kind}'; expected 'controls' or 'probe'")
        groups.append(dict(_read_comparison(f, g, prefix), name=name, kind=kind,
                           baseline_from_main=bool(g.get("baseline_from_main", False))))
    return dict(spec, version=version, seeds=seeds, groups=groups)


def _read_run(path: str, spec: dict, arm: str, seed: int) -> Run:
    f = _Json(path)
    j = f.root
    # result.json's schema version: 1, or none in files of earlier builds (docs/experiments.md).
    version = f.find(j, "", "version")
    if version is not None and (type(version) is not int or version != 1):
        f.bad("version", f"is {version}; this reader reads version 1 (or none: files of earlier builds)")
    if f.field(j, "", "arm", "string") != arm:
        f.bad("arm", f"is '{j['arm']}' but the file is in the directory of arm '{arm}'")
    if f.field(j, "", "seed", "integer") != seed:
        f.bad("seed", f"is {j['seed']} but the file is in the directory of seed {seed}")
    params = f.field(j, "", "params", "integer")
    if params <= 0:
        f.bad("params", "must be positive")
    milestones = []
    for i, m in enumerate(f.field(j, "", "milestones", "array")):
        p = f"milestones[{i}]"
        point = (f.field(m, p, "tokens", "integer"), f.field(m, p, "val_nll", "number"))
        if milestones and point[0] <= milestones[-1][0]:
            f.bad(p + ".tokens", "must be larger than the one before")
        milestones.append(point)
    for m in spec["milestones"]:
        if all(t != m for t, _ in milestones):
            f.bad("milestones", f"has no entry at {m} tokens (an experiment.json milestone)")
    curve = []
    c = f.find(j, "", "curve")
    if c is not None:
        if not isinstance(c, list):
            f.bad("curve", "must be an array")
        curve = [(f.field(x, f"curve[{i}]", "tokens", "integer"), f.field(x, f"curve[{i}]", "train_loss", "number"))
                 for i, x in enumerate(c)]
    routing = None
    r = f.find(j, "", "routing")
    if r is not None:
        routing = []
        for i, layer in enumerate(f.field(r, "routing", "layers", "array")):
            p = f"routing.layers[{i}]"
            number = f.field(layer, p, "layer", "integer")
            if number < 0:
                f.bad(p + ".layer", "must not be negative")
            if any(x.layer == number for x in routing):
                f.bad(p + ".layer", f"repeats layer {number}")
            n = f.field(layer, p, "sources", "integer")
            if n < 1:
                f.bad(p + ".sources", "must be at least 1")
            lr = LayerRouting(number, n, f.distribution(f.get(layer, p, "qk_mean"), p + ".qk_mean", n))
            for route in ("v", "k"):
                if layer.get(f"{route}_mean") is not None:
                    setattr(lr, f"{route}_mean", f.distribution(layer[f"{route}_mean"], f"{p}.{route}_mean", n))
            for js_key, route_key in (("js_nats", "v_mean"), ("js_k_nats", "k_mean")):
                if layer.get(js_key) is not None:
                    js = f.number(layer[js_key], f"{p}.{js_key}")
                    if not -1e-9 <= js <= LN2 + 1e-6:
                        f.bad(f"{p}.{js_key}", "must lie in [0, ln 2]")
                    if getattr(lr, route_key) is None:
                        f.bad(f"{p}.{js_key}", f"is given without '{route_key}'")
                    setattr(lr, js_key, js)
            routing.append(lr)
        given = {}
        for key in ("v_mean", "k_mean"):
            given[key] = any(getattr(x, key) is not None for x in routing)
            if given[key]:
                for x in routing:
                    if getattr(x, key) is None:
                        if x.sources != 1:
                            f.bad("routing.layers", f"gives '{key}' for some layers but not for layer {x.layer}")
                        setattr(x, key, [1.0])  # a single source gets all the weight on any route
        if given["k_mean"] and not given["v_mean"]:
            f.bad("routing.layers", "gives 'k_mean' without 'v_mean'")
        routing.sort(key=lambda x: x.layer)
    max_weight = None
    if j.get("routing_max_weight") is not None:
        max_weight = f.number(j["routing_max_weight"], "routing_max_weight")
        if not 0 <= max_weight <= 1:
            f.bad("routing_max_weight", "must lie in [0, 1]")
    return Run(arm=arm, seed=seed, path=os.path.dirname(path), params=params, milestones=milestones,
               test_nll=f.field(j, "", "test_nll", "number"),
               tokens_per_sec=f.field(j, "", "tokens_per_sec", "non_negative"),
               step_time_ms=f.field(j, "", "step_time_ms", "non_negative"),
               peak_rss_bytes=f.field(j, "", "peak_rss_bytes", "non_negative"), curve=curve, routing=routing, raw=j,
               routing_max_weight=max_weight)


def run_result_path(directory: str, arm: str, seed: int, group: str = "") -> str:
    """Where a run's result.json lies: runs/<arm>/seed-<seed>/, or runs/<group>/<arm>/seed-<seed>/."""
    return os.path.join(directory, "runs", *([group] if group else []), arm, f"seed-{seed}", "result.json")


class Experiment:
    """An experiment directory: its protocol (experiment.json), finished runs, missing runs and,
    when `attnres report` has written it, summary.json."""

    def __init__(self, directory: str):
        if not os.path.isdir(directory):
            raise ExperimentError(f"experiment directory '{directory}' does not exist")
        spec = _read_spec(os.path.join(directory, "experiment.json"))
        summary_path = os.path.join(directory, "summary.json")
        summary = _Json(summary_path).root if os.path.exists(summary_path) else None
        self._load(directory, spec, spec["seeds"], "", summary, None)
        # Further comparisons of a protocol experiment (controls at their own budget, probes), each
        # an Experiment of its own: same records and frames, its runs under runs/<group>/.
        self.groups: Dict[str, "Experiment"] = {}
        for g in spec["groups"]:
            group = Experiment.__new__(Experiment)
            group_summary = next((x for x in (summary or {}).get("groups") or [] if x.get("name") == g["name"]), None)
            group._load(directory, g, spec["seeds"], g["name"], group_summary, self if g["baseline_from_main"] else None)
            group.groups = {}
            self.groups[g["name"]] = group

    def _load(self, directory: str, spec: dict, seeds: List[int], group: str, summary: Optional[dict],
              main: Optional["Experiment"]) -> None:
        self.path = directory
        self.spec = spec
        self.name: str = group or spec.get("name", "")
        self.kind: str = spec.get("kind", "main")
        self.arms: List[str] = spec["arms"]
        self.baseline: str = spec["baseline"]
        self.seeds: List[int] = seeds
        self.tokens: int = spec["tokens"]
        self.milestones: List[int] = spec["milestones"]
        self.runs: List[Run] = []
        self.missing: List[Tuple[str, int]] = []
        # Twins (arm~) run on the first twin_seeds seeds only, a group on its first seed_count: later
        # seeds are not planned runs, so not missing ones (docs/experiments.md, "Twins and the noise floor").
        twin_seeds = spec.get("twin_seeds") or 0
        seed_count = spec.get("seed_count") or 0
        for arm in self.arms:
            for i, seed in enumerate(self.seeds):
                if (seed_count and i >= seed_count) or (arm.endswith("~") and twin_seeds and i >= twin_seeds):
                    continue
                if main is not None and arm == self.baseline:  # the main baseline's runs, read at these milestones
                    p = run_result_path(directory, arm, seed)
                else:
                    p = run_result_path(directory, arm, seed, group)
                if os.path.exists(p):
                    self.runs.append(_read_run(p, spec, arm, seed))
                else:
                    self.missing.append((arm, seed))
        # Runs a stopped sequential study did not need (summary.json, written by `attnres report`)
        # are not missing.
        not_needed = {(r.get("arm"), r.get("seed")) for r in (summary or {}).get("not_needed_runs") or []
                      if isinstance(r, dict)}
        self.not_needed: List[Tuple[str, int]] = [m for m in self.missing if m in not_needed]
        self.missing = [m for m in self.missing if m not in not_needed]
        self.summary: Optional[dict] = summary

    def __repr__(self) -> str:
        where = f"'{self.path}'" + (f" group '{self.name}'" if self.kind != "main" else "")
        return (f"Experiment({where}: arms {self.arms}, baseline {self.baseline}, seeds {self.seeds}, "
                f"{len(self.runs)} finished, {len(self.missing)} missing"
                + (f", {len(self.not_needed)} not needed by the sequential design" if self.not_needed else "") + ")")

    def run(self, arm: str, seed: int) -> Run:
        for r in self.runs:
            if r.arm == arm and r.seed == seed:
                return r
        raise KeyError(f"no finished run of arm '{arm}' seed {seed} in '{self.path}'")

    # --------------------------------------------------------------------------- records
    def records(self, table: str) -> List[Dict[str, Any]]:
        """One of TABLES as a list of flat dicts (see the module docstring)."""
        if table not in TABLES:
            raise ValueError(f"unknown table '{table}' (expected one of {', '.join(TABLES)})")
        return getattr(self, "_" + table)()

    def _runs(self):
        return [{"arm": r.arm, "seed": r.seed, "params": r.params, "test_nll": r.test_nll,
                 "tokens_per_sec": r.tokens_per_sec, "step_time_ms": r.step_time_ms,
                 "peak_rss_bytes": r.peak_rss_bytes, "path": r.path, "routing_max_weight": r.routing_max_weight}
                for r in self.runs]

    def _milestones(self):
        return [{"arm": r.arm, "seed": r.seed, "tokens": t, "val_nll": v} for r in self.runs for t, v in r.milestones]

    def _test(self):
        return [{"arm": r.arm, "seed": r.seed, "test_nll": r.test_nll} for r in self.runs]

    def _deltas(self):
        base = {r.seed: r for r in self.runs if r.arm == self.baseline}
        out = []
        for r in self.runs:
            b = base.get(r.seed)
            if r.arm == self.baseline or b is None:
                continue
            for t in self.milestones:
                nll, ref = r.val_nll_at(t), b.val_nll_at(t)
                out.append({"arm": r.arm, "seed": r.seed, "split": "val", "tokens": t, "nll": nll,
                            "baseline_nll": ref, "delta_nll": nll - ref})
            out.append({"arm": r.arm, "seed": r.seed, "split": "test", "tokens": self.tokens, "nll": r.test_nll,
                        "baseline_nll": b.test_nll, "delta_nll": r.test_nll - b.test_nll})
        return out

    def _routing(self):
        out = []
        for r in self.runs:
            for layer in r.routing or []:
                for route, dist in (("qk", layer.qk_mean), ("k", layer.k_mean), ("v", layer.v_mean)):
                    for s, w in enumerate(dist or []):
                        out.append({"arm": r.arm, "seed": r.seed, "layer": layer.layer, "sources": layer.sources,
                                    "route": route, "source": s, "weight": w})
        return out

    def _js(self):
        return [{"arm": r.arm, "seed": r.seed, "layer": layer.layer, "sources": layer.sources, "route": route,
                 "js_nats": js, "js_bits": js / LN2}
                for r in self.runs for layer in r.routing or []
                for route, js in (("qk", layer.js_nats), ("k", layer.js_k_nats)) if js is not None]

    def _systems(self):
        return [{"arm": r.arm, "seed": r.seed, "params": r.params, "tokens_per_sec": r.tokens_per_sec,
                 "step_time_ms": r.step_time_ms, "peak_rss_bytes": r.peak_rss_bytes} for r in self.runs]

    def _curve(self):
        return [{"arm": r.arm, "seed": r.seed, "tokens": t, "train_loss": l} for r in self.runs for t, l in r.curve]

    def _paired(self):
        if self.summary is None:
            return []
        comparisons = list(self.summary.get("validation") or []) + [self.summary.get("test")]
        out = []
        for comp in comparisons:
            if not comp:
                continue
            for a in comp.get("arms", []):
                if a.get("baseline"):
                    continue
                p = a.get("paired") or {}
                out.append({"split": comp.get("split"), "tokens": comp.get("tokens"), "arm": a.get("arm"),
                            **{k: p.get(k) for k in ("n", "mean", "sd", "ci95_low", "ci95_high", "t", "p_value",
                                                     "wins")},
                            "ppl_change": a.get("ppl_change")})
        return out

    def _missing(self):
        return [{"arm": a, "seed": s} for a, s in self.missing]

    # --------------------------------------------------------------------------- pandas
    def frame(self, table: str):
        """records(table) as a pandas DataFrame (pandas is optional: Debian's python3-pandas)."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("Experiment.frame needs pandas (apt-get install python3-pandas); "
                              "Experiment.records gives the same rows as plain dicts") from None
        return pd.DataFrame(self.records(table), columns=list(COLUMNS[table]))

    def frames(self) -> Dict[str, Any]:
        return {t: self.frame(t) for t in TABLES}


def read_experiment(directory: str) -> Experiment:
    """Reads an `attnres experiment` directory (experiment.json, runs/<arm>/seed-<seed>/result.json and,
    if present, summary.json). A protocol experiment's controls and probes are in .groups, by name."""
    return Experiment(directory)

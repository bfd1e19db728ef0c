"""attnres.read_experiment on a real tiny `attnres experiment` (+ `attnres report`) directory: the
records equal the files' numbers, the paired differences agree with summary.json, DataFrames, missing
runs, and errors that name the file and the key. The same directory, laid out as `make demo`'s
runs/demo, runs docs/python.md's walk-through as written."""
import json
import os
import re
import shutil
import statistics
import unittest

import support
import attnres
from attnres.experiment import COLUMNS, TABLES, ExperimentError


class ExperimentTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        support.need_binary()
        cls.tmp = support.TempDir("exp")
        data = support.prepare_synthetic_data(cls.tmp.path)
        cls.dir = cls.tmp("runs", "demo")  # where `make demo` puts its experiment
        support.cli("experiment", *support.TINY, "--arms", "block,rd,prenorm", "--seeds", "1,2", "--data", data,
                    "--out", cls.dir)
        support.cli("report", "--experiment", cls.dir, "--quiet")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def result(self, arm, seed):
        with open(os.path.join(self.dir, "runs", arm, f"seed-{seed}", "result.json")) as f:
            return json.load(f)

    def test_records_are_the_files_numbers(self):
        exp = attnres.read_experiment(self.dir)
        with open(os.path.join(self.dir, "experiment.json")) as f:
            spec = json.load(f)
        self.assertEqual((exp.arms, exp.baseline, exp.seeds, exp.tokens, exp.milestones),
                         (spec["arms"], "block", [1, 2], spec["tokens"], spec["milestones"]))
        self.assertEqual(len(exp.runs), 6)
        self.assertEqual(exp.missing, [])
        self.assertIn("6 finished, 0 missing", repr(exp))
        for r in exp.runs:
            raw = self.result(r.arm, r.seed)
            self.assertEqual(r.test_nll, raw["test_nll"])
            self.assertEqual(r.milestones, [(m["tokens"], m["val_nll"]) for m in raw["milestones"]])
            self.assertEqual((r.params, r.tokens_per_sec, r.step_time_ms, r.peak_rss_bytes),
                             (raw["params"], raw["tokens_per_sec"], raw["step_time_ms"], raw["peak_rss_bytes"]))
            self.assertEqual(r.routing is None, r.arm == "prenorm")
        ms = exp.records("milestones")
        self.assertEqual(len(ms), sum(len(r.milestones) for r in exp.runs))
        self.assertEqual({(m["arm"], m["seed"]) for m in ms}, {(a, s) for a in exp.arms for s in exp.seeds})
        test = {(t["arm"], t["seed"]): t["test_nll"] for t in exp.records("test")}
        self.assertEqual(test[("rd", 2)], self.result("rd", 2)["test_nll"])

        deltas = exp.records("deltas")
        self.assertEqual(len(deltas), 2 * 2 * (len(exp.milestones) + 1))  # rd, prenorm x 2 seeds x (milestones + test)
        d = next(x for x in deltas if x["arm"] == "rd" and x["seed"] == 1 and x["split"] == "test")
        self.assertEqual(d["delta_nll"], test[("rd", 1)] - test[("block", 1)])

        routing = exp.records("routing")
        for arm in ("block", "rd"):
            for layer in self.result(arm, 1)["routing"]["layers"]:
                rows = [x for x in routing if x["arm"] == arm and x["seed"] == 1 and x["layer"] == layer["layer"]]
                self.assertEqual([x["weight"] for x in rows if x["route"] == "qk"], layer["qk_mean"])
                self.assertEqual([x["weight"] for x in rows if x["route"] == "v"], layer.get("v_mean", []))
        js = exp.records("js")
        self.assertEqual({x["arm"] for x in js}, {"rd"})
        self.assertEqual({x["route"] for x in js}, {"qk"})
        self.assertTrue(all(abs(x["js_bits"] * 0.6931471805599453 - x["js_nats"]) < 1e-15 for x in js))
        self.assertEqual(len(exp.records("systems")), 6)
        self.assertGreater(len(exp.records("curve")), 0)
        for table in TABLES:
            for row in exp.records(table):
                self.assertEqual(tuple(row), COLUMNS[table], table)
        self.assertEqual(exp.run("rd", 2).path, os.path.join(self.dir, "runs", "rd", "seed-2"))
        self.assertEqual(attnres.load(exp.run("rd", 2).path).config.residual, "rd")

    def test_paired_statistics_agree_with_the_deltas(self):
        exp = attnres.read_experiment(self.dir)
        self.assertIsNotNone(exp.summary)
        paired = exp.records("paired")
        self.assertEqual(len(paired), 2 * (len(exp.milestones) + 1))
        deltas = exp.records("deltas")
        for p in paired:
            mine = [d["delta_nll"] for d in deltas if d["arm"] == p["arm"] and d["split"] == p["split"] and
                    d["tokens"] == p["tokens"]]
            self.assertEqual(p["n"], len(mine))
            self.assertAlmostEqual(p["mean"], statistics.fmean(mine), delta=1e-12)
            self.assertEqual(p["wins"], sum(x < 0 for x in mine))

    def test_frames(self):
        try:
            import pandas  # noqa: F401
        except ImportError:
            self.skipTest("pandas is not installed (Debian: python3-pandas)")
        exp = attnres.read_experiment(self.dir)
        frames = exp.frames()
        self.assertEqual(set(frames), set(TABLES))
        test = frames["test"].pivot(index="seed", columns="arm", values="test_nll")
        self.assertEqual(test.loc[2, "rd"], self.result("rd", 2)["test_nll"])
        self.assertEqual(list(frames["missing"].columns), ["arm", "seed"])
        self.assertEqual(len(frames["missing"]), 0)
        self.assertEqual(list(frames["milestones"].columns), ["arm", "seed", "tokens", "val_nll"])

    def test_missing_runs_and_bad_files(self):
        copy = self.tmp("copy")
        shutil.copytree(self.dir, copy)
        os.remove(os.path.join(copy, "runs", "rd", "seed-2", "result.json"))
        exp = attnres.read_experiment(copy)
        self.assertEqual(exp.missing, [("rd", 2)])
        self.assertEqual(exp.records("missing"), [{"arm": "rd", "seed": 2}])
        self.assertNotIn(("rd", 2), {(d["arm"], d["seed"]) for d in exp.records("deltas")})
        path = os.path.join(copy, "runs", "rd", "seed-1", "result.json")
        with open(path) as f:
            raw = json.load(f)
        del raw["milestones"][1]["val_nll"]
        with open(path, "w") as f:
            json.dump(raw, f)
        with self.assertRaisesRegex(ExperimentError, r"seed-1/result.json: key 'milestones\[1\].val_nll' is missing"):
            attnres.read_experiment(copy)
        raw = self.result("rd", 1)
        raw["routing"]["layers"][1]["qk_mean"] = [0.5] * raw["routing"]["layers"][1]["sources"] + [0.5]
        with open(path, "w") as f:
            json.dump(raw, f)
        with self.assertRaisesRegex(ExperimentError, r"key 'routing.layers\[1\].qk_mean' has \d+ entries"):
            attnres.read_experiment(copy)
        # MUDD's K route (k_mean, js_k_nats): read into the routing and js tables, and checked.
        raw = self.result("rd", 1)
        for layer in raw["routing"]["layers"]:
            layer["k_mean"] = layer["v_mean"]
            layer["js_k_nats"] = 0.25 if layer["sources"] > 1 else 0.0
        with open(path, "w") as f:
            json.dump(raw, f)
        exp = attnres.read_experiment(copy)
        k_rows = [x for x in exp.records("routing") if x["arm"] == "rd" and x["seed"] == 1 and x["route"] == "k"]
        self.assertEqual([x["weight"] for x in k_rows], [w for l in raw["routing"]["layers"] for w in l["v_mean"]])
        self.assertIn({"arm": "rd", "seed": 1, "layer": 1, "sources": raw["routing"]["layers"][1]["sources"],
                       "route": "k", "js_nats": 0.25, "js_bits": 0.25 / 0.6931471805599453}, exp.records("js"))
        raw["routing"]["layers"][1]["js_k_nats"] = 0.8
        with open(path, "w") as f:
            json.dump(raw, f)
        with self.assertRaisesRegex(ExperimentError, r"'routing.layers\[1\].js_k_nats' must lie in \[0, ln 2\]"):
            attnres.read_experiment(copy)
        del raw["routing"]["layers"][1]["k_mean"]
        del raw["routing"]["layers"][1]["js_k_nats"]
        with open(path, "w") as f:
            json.dump(raw, f)
        with self.assertRaisesRegex(ExperimentError, "gives 'k_mean' for some layers but not for layer 1"):
            attnres.read_experiment(copy)
        # Delta AttnRes's routing-collapse statistic: read into the run and the runs table, and checked.
        raw = self.result("rd", 1)
        raw["routing_max_weight"] = 0.625
        with open(path, "w") as f:
            json.dump(raw, f)
        exp = attnres.read_experiment(copy)
        self.assertEqual(exp.run("rd", 1).routing_max_weight, 0.625)
        self.assertIsNone(exp.run("block", 1).routing_max_weight)
        self.assertIn(0.625, [x["routing_max_weight"] for x in exp.records("runs")])
        raw["routing_max_weight"] = 1.5
        with open(path, "w") as f:
            json.dump(raw, f)
        with self.assertRaisesRegex(ExperimentError, r"seed-1/result.json: key 'routing_max_weight' must lie in \[0, 1\]"):
            attnres.read_experiment(copy)
        # The schema version (C++ writes 1 since it was introduced; earlier files have none).
        raw = self.result("rd", 1)
        raw["version"] = 1
        with open(path, "w") as f:
            json.dump(raw, f)
        attnres.read_experiment(copy)
        raw["version"] = 2
        with open(path, "w") as f:
            json.dump(raw, f)
        with self.assertRaisesRegex(ExperimentError, "key 'version' is 2; this reader reads version 1"):
            attnres.read_experiment(copy)
        raw = self.result("rd", 1)
        raw["seed"] = 7
        with open(path, "w") as f:
            json.dump(raw, f)
        with self.assertRaisesRegex(ExperimentError, "key 'seed' is 7 but the file is in the directory of seed 1"):
            attnres.read_experiment(copy)
        with self.assertRaisesRegex(ExperimentError, "does not exist"):
            attnres.read_experiment(self.tmp("nowhere"))
        os.makedirs(self.tmp("empty"))
        with self.assertRaisesRegex(ExperimentError, "experiment.json: not found"):
            attnres.read_experiment(self.tmp("empty"))
        with self.assertRaisesRegex(ValueError, "unknown table 'tests'"):
            exp.records("tests")

    def test_twins_and_sequential_seeds_are_not_missing_runs(self):
        """Twins run on their first twin_seeds seeds, and runs a stopped sequential study did not need
        (summary.json's not_needed_runs) are not missing runs (issue #47: the demo read "8 missing")."""
        d = self.tmp("twins")
        shutil.copytree(self.dir, d)
        with open(os.path.join(d, "experiment.json")) as f:
            spec = json.load(f)
        spec["arms"] = spec["arms"] + ["rd~"]
        spec["seeds"] = [1, 2, 3]
        spec["twin_seeds"] = 1
        with open(os.path.join(d, "experiment.json"), "w") as f:
            json.dump(spec, f)
        twin = self.result("rd", 1)
        twin["arm"] = "rd~"
        os.makedirs(os.path.join(d, "runs", "rd~", "seed-1"))
        with open(os.path.join(d, "runs", "rd~", "seed-1", "result.json"), "w") as f:
            json.dump(twin, f)
        with open(os.path.join(d, "summary.json")) as f:
            summary = json.load(f)
        summary["not_needed_runs"] = [{"arm": a, "seed": 3} for a in ("block", "rd", "prenorm")]
        with open(os.path.join(d, "summary.json"), "w") as f:
            json.dump(summary, f)
        exp = attnres.read_experiment(d)
        self.assertEqual(len(exp.runs), 7)
        self.assertEqual(exp.missing, [])
        self.assertEqual(exp.not_needed, [("block", 3), ("rd", 3), ("prenorm", 3)])
        self.assertIn("7 finished, 0 missing, 3 not needed by the sequential design", repr(exp))
        os.remove(os.path.join(d, "summary.json"))  # without the report's summary, seed 3 is missing
        self.assertEqual(len(attnres.read_experiment(d).missing), 3)

    def test_docs_walkthrough_runs_as_written(self):
        """Every ```python block of docs/python.md in order, in one namespace, from a directory whose
        runs/demo is this experiment (bytes tokenizer instead of the demo's sp: one)."""
        with open(os.path.join(support.SOURCE_DIR, "docs", "python.md"), encoding="utf-8") as f:
            blocks = re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)
        self.assertGreaterEqual(len(blocks), 4)
        cwd = os.getcwd()
        os.chdir(self.tmp.path)  # the page's paths are relative to the repository root
        self.addCleanup(os.chdir, cwd)
        for module in ("matplotlib", "pandas"):
            try:
                __import__(module)
            except ImportError:
                self.skipTest(f"{module} is not installed (Debian: python3-{module}; scripts/install-deps.sh)")
        namespace = {}
        for i, block in enumerate(blocks):
            exec(compile(block, f"docs/python.md python block {i + 1}", "exec"), namespace)
        self.assertGreater(os.path.getsize(self.tmp("depth_weights.png")), 1000)
        self.assertEqual(attnres.load(self.tmp("tuned.safetensors")).config.residual, "rd")


class FixtureTest(unittest.TestCase):
    """tests/results/data/old-format: a paired experiment as the runner and `attnres report` wrote it
    (committed, so this needs no binary)."""

    def test_reads_the_committed_experiment(self):
        directory = os.path.join(support.SOURCE_DIR, "tests", "results", "data", "old-format")
        exp = attnres.read_experiment(directory)
        self.assertEqual((exp.arms, exp.baseline, exp.seeds, len(exp.runs), exp.missing),
                         (["block", "rd", "prenorm"], "block", [1, 2], 6, []))
        with open(os.path.join(directory, "summary.json")) as f:
            summary = json.load(f)
        test = {a["arm"]: a for a in summary["test"]["arms"]}
        paired = {(p["split"], p["tokens"], p["arm"]): p for p in exp.records("paired")}
        for arm in ("rd", "prenorm"):
            p = paired[("test", exp.tokens, arm)]
            self.assertEqual({k: p[k] for k in test[arm]["paired"]}, test[arm]["paired"])
            mine = [d["delta_nll"] for d in exp.records("deltas") if d["arm"] == arm and d["split"] == "test"]
            self.assertEqual(mine, [x["value"] for x in test[arm]["delta_nll"]])
            self.assertEqual([r.test_nll for r in exp.runs if r.arm == arm], [x["value"] for x in test[arm]["nll"]])
        routing = next(r for r in summary["routing"] if r["arm"] == "rd")
        for layer in routing["layers"]:
            js = [x["js_nats"] for x in exp.records("js") if x["layer"] == layer["layer"]]
            self.assertAlmostEqual(statistics.fmean(js), layer["js_nats"], delta=1e-12)


if __name__ == "__main__":
    unittest.main()


class StudyTest(unittest.TestCase):
    """docs/results/cpu: the committed CPU study (experiment.json version 2 from studies/cpu.toml,
    with its controls and depth probe as groups), read from the repository alone."""

    def setUp(self):
        self.dir = os.path.join(support.SOURCE_DIR, "docs", "results", "cpu")
        self.exp = attnres.read_experiment(self.dir)

    def test_main_arms_and_groups(self):
        exp = self.exp
        self.assertEqual((exp.name, exp.kind, exp.arms, exp.baseline, exp.seeds, exp.missing),
                         ("cpu", "main", ["block", "prenorm", "rd"], "block", [1, 2, 3, 4, 5], []))
        self.assertEqual(sorted(exp.groups), ["controls", "depth-4"])
        controls, probe = exp.groups["controls"], exp.groups["depth-4"]
        self.assertEqual((controls.kind, controls.arms, controls.missing, len(controls.runs)),
                         ("controls", ["block", "rd-tied", "rd-average", "rd-frozen"], [], 20))
        self.assertEqual((probe.kind, probe.arms, len(probe.runs)), ("probe", ["block", "rd"], 10))
        self.assertLessEqual(abs(controls.tokens - exp.tokens / 4), 2048)  # a quarter of the budget, in whole steps
        # Group runs are the group's own (runs/<group>/<arm>/): the controls' block is retrained.
        self.assertTrue(all("/runs/controls/" in r.path for r in controls.runs))
        self.assertNotEqual(controls.run("block", 1).test_nll, exp.run("block", 1).test_nll)

    def test_group_records_match_the_summary(self):
        controls = self.exp.groups["controls"]
        # rd-tied reproduces block bit for bit: every paired difference is exactly zero.
        tied = [d["delta_nll"] for d in controls.records("deltas") if d["arm"] == "rd-tied"]
        self.assertEqual(len(tied), 5 * (len(controls.milestones) + 1))
        self.assertTrue(all(d == 0.0 for d in tied))
        group = next(g for g in self.exp.summary["groups"] if g["name"] == "controls")
        final = {a["arm"]: a for a in group["validation"][-1]["arms"]}
        for p in controls.records("paired"):
            if p["split"] == "val" and p["tokens"] == controls.milestones[-1]:
                self.assertEqual(p["mean"], final[p["arm"]]["paired"]["mean"])
                mine = [d["delta_nll"] for d in controls.records("deltas")
                        if d["arm"] == p["arm"] and d["split"] == "val" and d["tokens"] == p["tokens"]]
                self.assertAlmostEqual(statistics.mean(mine), p["mean"], places=12)


class PrecisionEffectTest(unittest.TestCase):
    """scripts/precision_effect.py on docs/results/precision (studies/precision.toml): each main (fp32)
    run paired with its bf16 probe twin by arm and seed, the differences read from the result files."""

    def test_pairs_by_arm_and_seed_with_a_t_interval(self):
        import importlib.util
        path = os.path.join(support.SOURCE_DIR, "scripts", "precision_effect.py")
        spec = importlib.util.spec_from_file_location("precision_effect", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        directory = os.path.join(support.SOURCE_DIR, "docs", "results", "precision")
        rows = {r["arm"]: r for r in module.effect(directory, "bf16")}
        self.assertEqual(sorted(rows), ["block", "rd"])
        for arm, r in rows.items():
            want = []
            for seed in (1, 2, 3):
                with open(os.path.join(directory, "runs", arm, f"seed-{seed}", "result.json")) as f:
                    fp32 = json.load(f)["test_nll"]
                with open(os.path.join(directory, "runs", "bf16", arm, f"seed-{seed}", "result.json")) as f:
                    bf16 = json.load(f)["test_nll"]
                want.append(bf16 - fp32)
            self.assertEqual((r["n"], r["seeds"]), (3, [1, 2, 3]))
            self.assertEqual(r["delta_test_nll"], want)
            self.assertAlmostEqual(r["mean"], statistics.fmean(want), places=15)
            half = 4.302652729911275 * statistics.stdev(want) / 3 ** 0.5  # t(0.975, 2)
            self.assertAlmostEqual(r["ci95_high"] - r["mean"], half, places=12)
        with self.assertRaises(SystemExit):
            module.effect(directory, "no-such-group")

"""The developer scripts' logic. scripts/perf_step_shares.py: a training step's profile as the
difference of two perf profiles (parsing `perf report`'s rows, the subtraction, the shares and the
setup scatter; perf itself is not needed). scripts/compare_runs.py and scripts/torch_peer.py: the GPU
device script's run comparison and PyTorch peer (tests/gpu/device-run.sh), here on the CPU."""
import json
import os
import struct
import subprocess
import sys
import tempfile
import unittest

import support

sys.path.insert(0, os.path.join(support.SOURCE_DIR, "scripts"))
import perf_step_shares as pss  # noqa: E402
import compare_runs  # noqa: E402

# Two `perf report -F overhead,sample,sym --stdio` texts, as perf prints them (header lines, blank
# lines, kernel and user symbols, unresolved addresses, a name with spaces and template arguments).
SHORT = """# Samples: 2K of event 'cpu-clock'
#
# Overhead       Samples  Symbol
# ........  ............  ......
#
    40.00%           400  [k] pvm_irq_enable
    30.00%           300  [.] attnres::kernels::(anonymous namespace)::tile512_rows<2, false>
    20.00%           200  [.] __memset_avx512_unaligned_erms
     9.90%            99  [.] sgemm_kernel_COOPERLAKE
     0.10%             1  [.] 0x00000000009a1f3c
"""
LONG = """# Samples: 3K of event 'cpu-clock'
    30.00%          1300  [.] attnres::kernels::(anonymous namespace)::tile512_rows<2, false>
    10.00%           396  [k] pvm_irq_enable
     5.00%           200  [.] __memset_avx512_unaligned_erms
     5.00%           100  [.] attnres::kernels::depth_read_backward<float>
     2.00%            99  [.] sgemm_kernel_COOPERLAKE
     0.10%             2  [.] 0x0000000000b5516e
     0.10%             1  [.] 0x0000000000a6b248

"""


class PerfStepSharesTest(unittest.TestCase):
    def test_parse_report_reads_every_row(self):
        c = pss.parse_report(SHORT)
        self.assertEqual(c["pvm_irq_enable"], 400)
        self.assertEqual(c["attnres::kernels::(anonymous namespace)::tile512_rows<2, false>"], 300)
        self.assertEqual(c["[unresolved addresses]"], 1)
        self.assertEqual(sum(c.values()), 1000)
        self.assertEqual(pss.parse_report("# only a header\n\n"), {})

    def test_unresolved_addresses_share_one_bucket(self):
        self.assertEqual(pss.parse_report(LONG)["[unresolved addresses]"], 3)

    def test_shares_are_the_difference_of_the_profiles(self):
        total, rows, scatter = pss.step_shares(pss.parse_report(SHORT), pss.parse_report(LONG))
        self.assertEqual(total, 2098 - 1000)
        by_name = {name: (share, n) for name, share, n in rows}
        self.assertEqual(by_name["attnres::kernels::(anonymous namespace)::tile512_rows<2, false>"][1], 1000)
        self.assertEqual(by_name["attnres::kernels::depth_read_backward<float>"][1], 100)
        self.assertAlmostEqual(by_name["attnres::kernels::depth_read_backward<float>"][0], 100 / 1098)
        self.assertEqual(by_name["__memset_avx512_unaligned_erms"][1], 0)  # setup only: cancels
        self.assertEqual(rows[0][0], "attnres::kernels::(anonymous namespace)::tile512_rows<2, false>")
        self.assertEqual([n for _, _, n in rows], sorted((n for _, _, n in rows), reverse=True))
        self.assertAlmostEqual(scatter, 4 / 1098)  # pvm_irq_enable: 4 fewer samples in the long run

    def test_a_long_profile_no_longer_than_the_short_one_is_refused(self):
        with self.assertRaisesRegex(ValueError, "more steps"):
            pss.step_shares(pss.parse_report(LONG), pss.parse_report(SHORT))


if __name__ == "__main__":
    unittest.main()


def write_run(directory, weights, metrics):
    """A run directory with model.safetensors (F32 tensors from lists) and metrics.jsonl."""
    os.makedirs(directory, exist_ok=True)
    header, data = {"__metadata__": {"any": "thing"}}, b""
    for name, values in weights.items():
        blob = struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": "F32", "shape": [len(values)], "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    text = json.dumps(header).encode()
    with open(os.path.join(directory, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)
    with open(os.path.join(directory, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(m) + "\n" for m in metrics)


class CompareRunsTest(unittest.TestCase):
    METRICS = [{"step": 1, "loss": 6.0, "grad_norm": 1.0, "lr": 1e-3, "tokens_per_sec": 10.0},
               {"step": 2, "loss": 5.0, "grad_norm": 0.5, "lr": 1e-3, "tokens_per_sec": 11.0},
               {"step": 2, "val_nll": 5.5, "val_tokens": 64}]

    def run_pair(self, weights_b, metrics_b, *flags):
        with tempfile.TemporaryDirectory() as d:
            write_run(os.path.join(d, "a"), {"w": [1.0, 2.0], "b": [0.5]}, self.METRICS)
            write_run(os.path.join(d, "b"), weights_b, metrics_b)
            out = os.path.join(d, "c.json")
            rc = compare_runs.main([os.path.join(d, "a"), os.path.join(d, "b"), "--json", out, *flags])
            with open(out) as f:
                return rc, json.load(f)

    def test_identical_runs_are_bit_identical_whatever_their_timings(self):
        timings = [dict(m, tokens_per_sec=99.0) if "loss" in m else m for m in self.METRICS]
        rc, r = self.run_pair({"w": [1.0, 2.0], "b": [0.5]}, timings)
        self.assertEqual((rc, r["bit_identical"], r["lines_compared"]), (0, True, 3))

    def test_one_bit_of_a_weight_or_a_logged_loss_is_a_difference(self):
        rc, r = self.run_pair({"w": [1.0, 2.0000002], "b": [0.5]}, self.METRICS)
        self.assertEqual((rc, r["tensors_differing"]), (1, 1))
        self.assertGreater(r["weights_max_rel_diff"], 0)
        changed = [dict(m, val_nll=5.5000001) if "val_nll" in m else m for m in self.METRICS]
        rc, r = self.run_pair({"w": [1.0, 2.0], "b": [0.5]}, changed)
        self.assertEqual(rc, 1)
        self.assertIn("val_nll", r["metrics_first_difference"])

    def test_tolerance_compares_the_final_losses(self):
        close = [dict(m, loss=m["loss"] * 1.001) if "loss" in m else m for m in self.METRICS]
        rc, r = self.run_pair({"w": [1.5, 2.0], "b": [0.5]}, close, "--tolerance", "0.01")
        self.assertEqual(rc, 0)
        self.assertEqual(r["final_train_loss"], [5.0, 5.0 * 1.001])
        rc, _ = self.run_pair({"w": [1.5, 2.0], "b": [0.5]}, close, "--tolerance", "0.0001")
        self.assertEqual(rc, 1)


class TorchPeerTest(unittest.TestCase):
    """scripts/torch_peer.py on the CPU (eager: Debian's torch has no torch.compile) against a bench
    JSON of attnres' shape: the same model per arm, MFU against the bench's rate."""

    def test_peer_reads_the_bench_runs(self):
        model = {"vocab_size": 64, "d_model": 16, "n_layers": 2, "n_heads": 2, "n_blocks": 2, "max_seq_len": 8,
                 "residual": "block"}
        run = {"impl": "attnres", "arm": "block", "seq": 8, "batch": 2, "tokens_per_sec": 1000.0, "mfu": 0.1,
               "flops_per_token": {"total": 1e5}, "model": model}
        bench = {"steps": 1, "warmup": 0, "precision": {"attnres": "fp32"}, "config": model,
                 "mfu_reference": {"fp32": {"impl": "attnres", "op": "sgemm", "shape": "1x1x1", "gflops": 2.0}},
                 "runs": [run, dict(run, arm="rd", model=dict(model, residual="rd"))]}
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "bench.json"), "w") as f:
                json.dump(bench, f)
            p = subprocess.run([sys.executable, os.path.join(support.SOURCE_DIR, "scripts", "torch_peer.py"),
                                "--bench-json", os.path.join(d, "bench.json"), "--device", "cpu", "--no-compile",
                                "--threads", "1", "--json-file", os.path.join(d, "peer.json")],
                               capture_output=True, text=True, timeout=240)
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(os.path.join(d, "peer.json")) as f:
                out = json.load(f)
        self.assertEqual([r["arm"] for r in out["runs"]], ["block", "rd"])
        for r in out["runs"]:
            self.assertEqual((r["batch"], r["seq"], r["compiled"], r["compile_s"]), (2, 8, False, 0.0))
            self.assertAlmostEqual(r["mfu"], 1e5 * r["tokens_per_sec"] / 2e9)
            self.assertEqual(r["attnres_over_torch"], 1000.0 / r["tokens_per_sec"])
        self.assertEqual(out["reference_gflops"], 2.0)

"""tests/gpu/kernel_times.py (the profile table of tests/gpu/profile.sh), without a GPU: the
committed H200 profile re-derives its committed table, and a small CSV in ncu's layout (its own
messages between the rows, thousands separators, another time unit) gives the sums it must."""
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SCRIPT = os.path.join(HERE, "kernel_times.py")
RESULTS = os.path.join(ROOT, "docs", "results", "gpu-h200")

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
          '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def row(i, name, unit, value):
    return (f'"{i}","1","check","h","{name}","1","7","(256, 1, 1)","(8, 1, 1)","0","9.0",'
            f'"Command line profiler metrics","gpu__time_duration.sum","{unit}","{value}"')


def run(path):
    return subprocess.run([sys.executable, SCRIPT, path], capture_output=True, text=True, check=False)


class KernelTimes(unittest.TestCase):
    def test_committed_profile_gives_committed_table(self):
        out = run(os.path.join(RESULTS, "kernels.csv.gz"))
        self.assertEqual(out.returncode, 0, out.stderr)
        with open(os.path.join(RESULTS, "kernel-times.txt")) as f:
            self.assertEqual(out.stdout, f.read())

    def test_arms_families_and_units(self):
        lines = ["==PROF== Connected to process 1", HEADER,
                 row(0, "attn_fwd_wmma", "ns", "1,500,000"),
                 row(1, "nvjet_sm90_tst_192x192", "us", "500"),
                 row(2, "cudnn_generated_fort_native_sdpa_sm90_flash_bprop", "us", "250"),
                 "==PROF== Disconnected",
                 row(3, "adamw_kernel", "ns", "0"),
                 row(4, "depth_read_backward_kernel", "ms", "3"),
                 row(5, "adamw_kernel", "ns", "1,000,000")]
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "k.csv")
            with open(path, "w") as f:
                f.write("\n".join(lines) + "\n")
            out = run(path)
        self.assertEqual(out.returncode, 0, out.stderr)
        text = out.stdout
        self.assertIn("block: 4 launches, 2.25 ms of kernel time", text)
        self.assertIn("rd: 2 launches, 4.00 ms of kernel time", text)
        # cuDNN's fused attention counts as attention, not as a GEMM (its name has sm90 too)
        self.assertRegex(text, r"attention +1\.75 ms +77\.8%")
        self.assertRegex(text, r"GEMM \(cuBLASLt\) +0\.50 ms +22\.2%")
        self.assertRegex(text, r"depth read +3\.00 ms +75\.0%")

    def test_no_rows_is_an_error(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "empty.csv")
            with open(path, "w") as f:
                f.write(HEADER + "\n")
            out = run(path)
        self.assertEqual(out.returncode, 1)
        self.assertIn("no gpu__time_duration.sum rows", out.stdout)


if __name__ == "__main__":
    unittest.main()

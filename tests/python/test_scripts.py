"""scripts/perf_step_shares.py: a training step's profile as the difference of two perf profiles
(parsing `perf report`'s rows, the subtraction, the shares and the setup scatter; perf itself is
not needed)."""
import os
import sys
import unittest

import support

sys.path.insert(0, os.path.join(support.SOURCE_DIR, "scripts"))
import perf_step_shares as pss  # noqa: E402

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

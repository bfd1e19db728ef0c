// util/huge_pages.hpp: buffers of a huge page or more start on a huge-page boundary and are marked
// for transparent huge pages (the kernel's THPeligible for their mapping), smaller ones are
// cache-line aligned, and the values are those of a std::vector either way.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <new>
#include <sstream>
#include <string>
#include <vector>

#include "common/cli_util.hpp"
#include "util/huge_pages.hpp"

using namespace attnres;
using attnres::testing::read_file;

namespace {

std::uintptr_t address(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

// The THPeligible value of the mapping in /proc/self/smaps that holds p: 0 or 1, or -1 where the
// kernel does not report it.
int thp_eligible(const void* p) {
  std::istringstream smaps(read_file("/proc/self/smaps"));
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    std::uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-' && line.find(':') > line.find(' ')) {
      inside = lo <= address(p) && address(p) < hi;
      continue;
    }
    if (inside && line.rfind("THPeligible:", 0) == 0) return std::stoi(line.substr(12));
  }
  return -1;
}

}  // namespace

TEST(HugePages, LargeBuffersStartOnAHugePageAndHoldTheirValues) {
  const std::size_t n = 3 * kHugePageBytes / sizeof(float) + 5;  // not a whole number of huge pages
  HugePageVector<float> v(n, 1.5f);
  EXPECT_EQ(address(v.data()) % kHugePageBytes, 0u);
  for (std::size_t i = 0; i < n; i += 4099) EXPECT_EQ(v[i], 1.5f);
  EXPECT_EQ(v.back(), 1.5f);
  v.assign(n, 0.0f);
  v[n - 1] = 7.0f;
  EXPECT_EQ(v[n - 1], 7.0f);
  HugePageVector<double> copy(v.begin(), v.end());
  EXPECT_EQ(copy.size(), n);
  EXPECT_EQ(copy[n - 1], 7.0);
}

TEST(HugePages, SmallBuffersAreCacheLineAligned) {
  for (const std::size_t n : {std::size_t(1), std::size_t(17), std::size_t(100000)}) {
    HugePageVector<float> v(n, 2.0f);
    EXPECT_EQ(address(v.data()) % 64, 0u) << n;
    EXPECT_EQ(v[n - 1], 2.0f);
  }
  HugePageVector<float> empty;
  empty.reserve(0);
  EXPECT_TRUE(empty.empty());
}

TEST(HugePages, TooLargeARequestThrows) {
  HugePageAllocator<double> a;
  EXPECT_THROW((void)a.allocate(std::numeric_limits<std::size_t>::max() / 4), std::bad_array_new_length);
}

// Where the kernel has transparent huge pages at all ("always" or "madvise"), the buffer's
// mapping is eligible for them; in "madvise" mode, the default on Debian, only because of the
// allocator's request.
TEST(HugePages, LargeBuffersAreMarkedForTransparentHugePages) {
  const std::string mode = read_file("/sys/kernel/mm/transparent_hugepage/enabled");
  if (mode.empty() || mode.find("[never]") != std::string::npos)
    GTEST_SKIP() << "transparent huge pages are off on this kernel";
  HugePageVector<float> v(2 * kHugePageBytes / sizeof(float), 0.0f);
  const int eligible = thp_eligible(v.data());
  if (eligible < 0) GTEST_SKIP() << "this kernel's smaps has no THPeligible";
  EXPECT_EQ(eligible, 1) << "THP mode: " << mode;
  std::vector<float> plain(2 * kHugePageBytes / sizeof(float), 0.0f);
  if (mode.find("[madvise]") != std::string::npos) {
    EXPECT_EQ(thp_eligible(plain.data()), 0);  // the test can tell the difference
  }
}

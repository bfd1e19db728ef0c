// The C++ model against the independent PyTorch float64 implementation in
// tests/reference/attnres_ref.py: logits, loss, every parameter gradient, and a 10-step
// AdamW trajectory, in every residual mode and control. Both load the same safetensors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/model_util.hpp"
#include "model/model.hpp"
#include "model/safetensors.hpp"
#include "optim/adamw.hpp"

using namespace attnres;
using namespace attnres::testing;
namespace fs = std::filesystem;

namespace {

constexpr int kBatch = 2, kSeq = 12, kSteps = 10;
constexpr double kLr = 2e-3, kWeightDecay = 0.1, kClip = 1.0, kMinLrRatio = 0.1;
constexpr int kWarmup = 3;
// The float64 run of the same code must agree with the float64 reference to rounding: the
// exactness check, relative to each tensor's largest value.
constexpr double kDoubleTolerance = 1e-9;
// The fp32 run gets, per tensor, the tolerance its computation's own rounding sensitivity gives:
// the reference estimates it in float64 (--rounding-trials, tests/reference/rounding.py: every
// rounding operation of the forward, backward and the 10 AdamW steps perturbed as float32 rounds,
// a sum of n terms sqrt(n) times as much; the largest deviation over the trials), and the
// tolerance is kRoundingSafety times that plus the final rounding of the reference value to
// float32. It follows the model's conditioning: MUDD's and HC's unnormalised mixes amplify rounding
// tenfold more than pre-norm, and an fp32 AdamW trajectory (Adam normalises each element's update,
// so rounding in near-zero gradients changes updates discretely) drifts by orders of magnitude more
// than one forward pass. Largest measured error: 0.28 of its tolerance (rounding.py).
constexpr int kRoundingTrials = 3;
constexpr double kRoundingSafety = 10.0;
constexpr double kFloat32Roundoff = 0x1p-24;

ModelConfig reference_config(const Variant& v, bool tied_head) {
  ModelConfig c;
  c.vocab_size = 64;
  c.d_model = 32;
  c.n_layers = 4;
  c.n_heads = 4;
  c.mlp_hidden = 48;
  c.n_blocks = 4;  // blocks of two sublayers
  c = v.apply(c);
  c.tie_embeddings = tied_head;
  c.max_seq_len = 16;
  return c;
}

// Runs tests/reference/attnres_ref.py with `args`: through the fixture's server
// (tests/reference/ref_server.py, which imports torch once for every test) when one answers on
// ATTNRES_REFERENCE_SERVER, else as a python process of its own (a test run by itself). Returns the
// exit status (0: done) and, from the server, the run's output.
struct ReferenceRun {
  int status = -1;
  std::string output;
};

std::optional<ReferenceRun> run_on_server(const std::vector<std::string>& args) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string_view path = ATTNRES_REFERENCE_SERVER;
  if (path.size() >= sizeof(addr.sun_path)) return std::nullopt;  // the server does not start either
  std::copy(path.begin(), path.end(), addr.sun_path);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::nullopt;
  std::string request;
  for (const auto& a : args) request.append(a).push_back('\0');
  std::string reply;
  bool sent = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0;
  for (std::size_t done = 0; sent && done < request.size();) {
    const ssize_t n = ::send(fd, request.data() + done, request.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    sent = n > 0;
    done += sent ? static_cast<std::size_t>(n) : 0;
  }
  if (sent && ::shutdown(fd, SHUT_WR) == 0) {
    char buffer[65536];
    for (;;) {
      const ssize_t n = ::read(fd, buffer, sizeof buffer);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      reply.append(buffer, static_cast<std::size_t>(n));
    }
  }
  ::close(fd);
  const std::size_t eol = reply.find('\n');
  if (eol == std::string::npos) return std::nullopt;  // no server, or it ended mid-request
  return ReferenceRun{std::atoi(reply.substr(0, eol).c_str()), reply.substr(eol + 1)};
}

ReferenceRun run_reference(const std::vector<std::string>& args) {
  if (auto served = run_on_server(args)) return *served;
  std::string cmd = std::string(ATTNRES_TEST_PYTHON) + " " + ATTNRES_SOURCE_DIR + "/tests/reference/attnres_ref.py";
  for (const auto& a : args) cmd += " " + a;
  return ReferenceRun{std::system(cmd.c_str()), cmd + " (its output is above)"};
}

struct Worst {
  double ratio = 0;  // the largest error over its tolerance
  std::string what;
  void update(double r, const std::string& name) {
    if (r > ratio) {
      ratio = r;
      what = name;
    }
  }
};

// What one tensor of the model may differ from the reference's `key` (see kDoubleTolerance and
// kRoundingTrials): its largest absolute difference over the tolerance, which must stay below 1.
class Tolerances {
 public:
  Tolerances(const SafetensorsFile& ref, std::string path, bool fp32) : ref_(ref), path_(std::move(path)), fp32_(fp32) {}
  std::vector<double> reference(const std::string& key) const { return ref_.at(key, path_).values<double>(); }
  template <class Real>
  double ratio(std::span<const Real> mine, const std::string& key) const {
    const std::vector<double> want = reference(key);
    double diff = 0, magnitude = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      diff = std::max(diff, std::abs(static_cast<double>(mine[i]) - want[i]));
      magnitude = std::max(magnitude, std::abs(want[i]));
    }
    if (!fp32_) return diff / (kDoubleTolerance * (magnitude > 0 ? magnitude : 1.0));
    double sensitivity = 0;
    for (double x : ref_.at("rounding." + key, path_).values<double>()) sensitivity = std::max(sensitivity, x);
    const double tolerance = kRoundingSafety * sensitivity + 2 * kFloat32Roundoff * magnitude;
    return tolerance > 0 ? diff / tolerance : (diff > 0 ? HUGE_VAL : 0.0);
  }

 private:
  const SafetensorsFile& ref_;
  std::string path_;
  bool fp32_;
};

template <class Real>
void compare_with_reference(const Variant& v, bool tied_head) {
  constexpr bool fp32 = sizeof(Real) == 4;
  const ModelConfig config = reference_config(v, tied_head);
  const fs::path dir = fs::temp_directory_path() /
                       ("attnres_ref_" + std::to_string(::getpid()) + "_" + v.name + (tied_head ? "" : "_untied"));
  fs::create_directories(dir);
  const std::string weights = (dir / "weights.safetensors").string();
  const std::string tokens_path = (dir / "tokens.safetensors").string();
  const std::string out_path = (dir / "out.safetensors").string();

  {
    Model<float> init(config, 1, 1, false);
    randomize_weights(init, 21, WeightScales{0.15, 0.2, 0.3, 0.1});  // activations of order one
    save_weights<float>(weights, config, init.layout(), init.params());
  }
  Model<Real> model(config, kBatch, kSeq, true);
  load_weights<Real>(weights, config, model.layout(), model.params());
  const std::vector<Real> initial(model.params().begin(), model.params().end());
  const auto tokens = random_tokens(kBatch, kSeq, config.vocab_size, 17);
  const TensorRef tok{"tokens", DType::I32, {kBatch, kSeq + 1}, tokens.data()};
  write_safetensors(tokens_path, {}, std::span<const TensorRef>(&tok, 1));

  std::vector<std::string> args = {"--weights", weights, "--tokens", tokens_path, "--out", out_path,
                                   "--adamw-steps", std::to_string(kSteps), "--lr", std::to_string(kLr),
                                   "--weight-decay", std::to_string(kWeightDecay), "--clip", std::to_string(kClip),
                                   "--warmup", std::to_string(kWarmup), "--min-lr-ratio", std::to_string(kMinLrRatio),
                                   "--schedule", "cosine", "--cache", ATTNRES_REFERENCE_CACHE};
  if (fp32) args.insert(args.end(), {"--rounding-trials", std::to_string(kRoundingTrials)});
  const ReferenceRun run = run_reference(args);
  ASSERT_EQ(run.status, 0) << "the PyTorch reference failed (is python3-torch installed? run "
                              "scripts/install-deps.sh): "
                           << run.output;
  const SafetensorsFile ref = read_safetensors(out_path);
  const Tolerances tol(ref, out_path, fp32);

  Worst worst;
  const auto check = [&](std::span<const Real> mine, const std::string& key, const std::string& what) {
    const double r = tol.ratio(mine, key);
    EXPECT_LT(r, 1.0) << what << ": error " << r << " times its tolerance";
    worst.update(r, what);
  };
  // Logits and loss at the initial weights.
  std::vector<std::int32_t> inputs;
  for (int b = 0; b < kBatch; ++b)
    for (int t = 0; t < kSeq; ++t) inputs.push_back(tokens[b * (kSeq + 1) + t]);
  std::vector<Real> logits(static_cast<std::size_t>(kBatch * kSeq * config.vocab_size));
  model.logits(inputs, kBatch, kSeq, logits);
  check(logits, "logits", "logits");

  const Real loss = static_cast<Real>(model.forward_backward(tokens, kBatch, kSeq));
  check(std::span<const Real>(&loss, 1), "loss", "loss");

  std::size_t tensors_seen = 0;
  for (const auto& p : model.layout().params()) {
    const std::vector<double> g = tol.reference("grad." + p.name);
    const std::span<const Real> mine(model.grads().data() + p.offset, static_cast<std::size_t>(p.numel));
    if (std::all_of(g.begin(), g.end(), [](double x) { return x == 0; })) {  // the first read has a single source
      for (Real x : mine) EXPECT_EQ(x, Real(0)) << p.name;
      continue;
    }
    check(mine, "grad." + p.name, "grad " + p.name);
    ++tensors_seen;
  }
  EXPECT_GT(tensors_seen, model.layout().params().size() / 2);

  // The 10-step AdamW trajectory on the same batch.
  std::copy(initial.begin(), initial.end(), model.params().begin());
  AdamW<Real> opt(model.layout(), AdamWConfig{0.9, 0.95, 1e-8, kWeightDecay});
  LrSchedule schedule;
  schedule.max_lr = kLr;
  schedule.min_lr_ratio = kMinLrRatio;
  schedule.warmup_steps = kWarmup;
  schedule.total_steps = kSteps;
  std::vector<Real> losses;
  for (int s = 0; s < kSteps; ++s) {
    losses.push_back(static_cast<Real>(model.forward_backward(tokens, kBatch, kSeq)));
    clip_grad_norm<Real>(model.grads(), kClip);
    opt.step(model.params(), model.grads(), schedule.at(s));
  }
  ASSERT_EQ(tol.reference("losses").size(), static_cast<std::size_t>(kSteps));
  check(losses, "losses", "trajectory losses");
  for (const auto& p : model.layout().params())
    check(std::span<const Real>(model.params().data() + p.offset, static_cast<std::size_t>(p.numel)),
          "param." + p.name, "param after 10 steps " + p.name);
  std::cout << "[reference] " << (fp32 ? "fp32 " : "fp64 ") << v.name << (tied_head ? "" : " (untied head)")
            << ": largest error " << worst.ratio << " times its tolerance (" << worst.what << ")\n";
  fs::remove_all(dir);
}

}  // namespace

class Reference : public ::testing::TestWithParam<Variant> {};

TEST_P(Reference, Float32MatchesPyTorchFloat64) { compare_with_reference<float>(GetParam(), true); }
TEST_P(Reference, Float64MatchesPyTorchFloat64) { compare_with_reference<double>(GetParam(), true); }

INSTANTIATE_TEST_SUITE_P(AllModes, Reference, ::testing::ValuesIn(all_variants()),
                         [](const auto& info) { return info.param.name; });

TEST(ReferenceUntied, GatedResidualWithSeparateHeadMatchesPyTorch) {  // no final norm: the head reads the mixer
  const Variant gr{.name = "gr", .residual = ResidualMode::gr, .n_streams = 3, .gr_rank = 2};
  compare_with_reference<float>(gr, false);
  compare_with_reference<double>(gr, false);
}

TEST(ReferenceUntied, RdWithSeparateHeadMatchesPyTorch) {
  compare_with_reference<float>({"rd", ResidualMode::rd, ValueRoute::decoupled}, false);
  compare_with_reference<double>({"rd", ResidualMode::rd, ValueRoute::decoupled}, false);
}

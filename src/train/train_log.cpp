#include "train/train_log.hpp"

#include <cmath>
#include <cstdio>
#include <utility>
#include <nlohmann/json.hpp>

#include "util/error.hpp"

namespace attnres {

namespace {

std::string format_eta(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<long>(seconds);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  else std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  return buf;
}

}  // namespace

TrainLog::TrainLog(std::string metrics_path, bool root, bool progress, const std::string& label)
    : metrics_path_(std::move(metrics_path)),
      root_(root),
      status_(progress && root),
      prefix_(label.empty() ? "" : label + ": ") {}

void TrainLog::message(const std::string& text) { status_.message(prefix_ + text); }

void TrainLog::step(std::int64_t step, std::int64_t total_steps, std::int64_t tokens_per_step, double loss, double lr,
                    double grad_norm, double tokens_per_sec) {
  const std::int64_t tokens = step * tokens_per_step;
  if (root_)
    append_metrics(nlohmann::json{{"step", step}, {"tokens", tokens}, {"loss", loss}, {"lr", lr},
                                  {"grad_norm", grad_norm}, {"tokens_per_sec", tokens_per_sec}}
                       .dump());
  char line[256];
  std::snprintf(line, sizeof line, "%sstep %lld/%lld  tokens %lld  loss %.4f  %.0f tok/s  ETA %s", prefix_.c_str(),
                static_cast<long long>(step), static_cast<long long>(total_steps), static_cast<long long>(tokens),
                loss, tokens_per_sec,
                format_eta(double(total_steps - step) * double(tokens_per_step) / tokens_per_sec).c_str());
  status_.update(line, step == total_steps);
}

void TrainLog::evaluation(std::int64_t step, std::int64_t tokens, const EvalResult& eval) {
  if (root_)
    append_metrics(
        nlohmann::json{{"step", step}, {"tokens", tokens}, {"val_nll", eval.nll}, {"val_tokens", eval.tokens}}.dump());
  char msg[192];
  std::snprintf(msg, sizeof msg, "%sval NLL %.4f at %lld tokens", prefix_.c_str(), eval.nll,
                static_cast<long long>(tokens));
  status_.message(msg);
}

void TrainLog::append_metrics(const std::string& line) const {
  std::FILE* f = std::fopen(metrics_path_.c_str(), "ab");
  if (f == nullptr) fail("cannot append to '", metrics_path_, "'");
  const std::string text = line + "\n";
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  std::fclose(f);
  require(ok, "cannot write to '", metrics_path_, "'");
}

}  // namespace attnres

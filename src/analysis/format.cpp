#include "analysis/format.hpp"

#include <cmath>
#include <cstdio>

namespace attnres::analysis {

std::string format_printf(const char* format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, value);
  return buf;
}

std::string format_number(double value, int decimals) {
  if (std::isnan(value)) return "n/a";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, value);
  return buf;
}

std::string format_signed(double value, int decimals) {
  if (std::isnan(value)) return "n/a";
  if (std::isinf(value)) return value > 0 ? "+inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%+.*f", decimals, value);
  return buf;
}

namespace {
bool rounds_to_zero(double value, int decimals) {
  return std::isfinite(value) && value != 0 && std::abs(value) < 0.5 * std::pow(10.0, -decimals);
}
}  // namespace

std::string format_nats(double value, int decimals) {
  return rounds_to_zero(value, decimals) ? format_printf("%.2g", value) : format_number(value, decimals);
}

std::string format_signed_nats(double value, int decimals) {
  return rounds_to_zero(value, decimals) ? format_printf("%+.2g", value) : format_signed(value, decimals);
}

std::string format_p_value(double p) {
  if (std::isnan(p)) return "n/a";
  if (p >= 0.01) return format_printf("%.3f", p);
  if (p >= 0.001) return format_printf("%.4f", p);
  return p == 0 ? "0" : format_printf("%.1e", p);
}

std::string format_percent(double fraction, int decimals) {
  if (std::isnan(fraction)) return "n/a";
  return format_signed(100 * fraction, decimals) + "%";
}

std::string format_count(std::int64_t n) {
  const std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

std::string format_tokens(double tokens) {
  if (std::isnan(tokens)) return "n/a";
  const double a = std::abs(tokens);
  if (a < 1e3) return format_printf("%.0f", tokens);
  if (a < 1e6) return format_printf("%.3gK", tokens / 1e3);
  if (a < 1e9) return format_printf("%.3gM", tokens / 1e6);
  return format_printf("%.3gB", tokens / 1e9);
}

std::string escape_html(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace attnres::analysis

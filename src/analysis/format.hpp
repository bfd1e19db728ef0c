// Number and text formatting shared by every rendering of a summary: the terminal and Markdown
// tables, the HTML page and its SVG plots. NaN (not available) prints as "n/a".
#pragma once

#include <cstdint>
#include <string>

namespace attnres::analysis {

std::string format_number(double value, int decimals);
std::string format_signed(double value, int decimals);
// A difference in nats at `decimals` places, or to two significant digits where those places would
// print a non-zero value as zero (a twin's ΔNLL of 6e-06 is not "0.0000": a floor that reads as zero
// misleads). The second, with a sign.
std::string format_nats(double value, int decimals = 4);
std::string format_signed_nats(double value, int decimals = 4);
std::string format_p_value(double p);
std::string format_percent(double fraction, int decimals);  // signed, e.g. "-2.97%"
std::string format_tokens(double tokens);                   // 1.5K, 250M, 2B
std::string format_count(std::int64_t n);                   // 9,812,736
// One double through a printf format ("%.1f MiB"); the format must take exactly one double.
std::string format_printf(const char* format, double value);

// &, <, >, " and ' as HTML entities (for HTML text, SVG text and attribute values).
std::string escape_html(const std::string& s);

}  // namespace attnres::analysis

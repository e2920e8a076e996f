#include "loom/metrics/plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace loom::metrics {
namespace {

constexpr double kWidth = 1000, kHeight = 740;
constexpr double kPanelW = 410, kPanelH = 260;
constexpr const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                    "#9467bd", "#8c564b", "#e377c2", "#17becf"};

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string label(double v) {
  if (v == 0) return "0";
  const double a = std::fabs(v);
  if (a >= 1e5 || a < 1e-2) return fmt::format("{:.2g}", v);
  return fmt::format("{:.4g}", v);
}

// Tick positions at 1, 2 or 5 times a power of ten, about five per axis.
std::vector<double> ticks(double lo, double hi) {
  const double raw = (hi - lo) / 5;
  const double power = std::pow(10, std::floor(std::log10(raw)));
  double step = power;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * power;
    if (step >= raw) break;
  }
  std::vector<double> out;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) {
    out.push_back(std::fabs(t) < step * 1e-9 ? 0 : t);
  }
  return out;
}

struct Line {
  std::vector<std::pair<double, double>> points;
  const char* color;
  bool dashed;
};

struct Range {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -std::numeric_limits<double>::infinity();
  void add(double v) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  // A flat series still gets a visible band.
  void widen() {
    if (!(hi > lo)) {
      const double pad = lo == 0 ? 1 : std::fabs(lo) * 0.05;
      lo -= pad;
      hi += pad;
    }
  }
};

std::string panel(double x0, double y0, const std::string& title, const std::string& x_name,
                  const std::vector<Line>& lines) {
  std::string svg = fmt::format(
      "<g><text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"15\" font-weight=\"bold\">{}</text>\n", x0,
      y0 - 10, escape(title));
  Range xs, ys;
  for (const auto& line : lines) {
    for (const auto& [x, y] : line.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      xs.add(x);
      ys.add(y);
    }
  }
  svg += fmt::format(
      "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{}\" height=\"{}\" fill=\"#ffffff\" "
      "stroke=\"#444444\"/>\n",
      x0, y0, kPanelW, kPanelH);
  if (!(xs.lo <= xs.hi)) {
    return svg + fmt::format(
                     "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"13\" fill=\"#888888\" "
                     "text-anchor=\"middle\">no data</text></g>\n",
                     x0 + kPanelW / 2, y0 + kPanelH / 2);
  }
  xs.widen();
  ys.widen();
  const double margin = (ys.hi - ys.lo) * 0.05;  // curves clear of the frame
  ys.lo -= margin;
  ys.hi += margin;
  auto px = [&](double x) { return x0 + (x - xs.lo) / (xs.hi - xs.lo) * kPanelW; };
  auto py = [&](double y) { return y0 + kPanelH - (y - ys.lo) / (ys.hi - ys.lo) * kPanelH; };
  for (double t : ticks(ys.lo, ys.hi)) {
    svg += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#dddddd\"/>"
        "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\" text-anchor=\"end\">{}</text>\n",
        x0, py(t), x0 + kPanelW, py(t), x0 - 5, py(t) + 4, label(t));
  }
  for (double t : ticks(xs.lo, xs.hi)) {
    svg += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#eeeeee\"/>"
        "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\" text-anchor=\"middle\">{}</text>\n",
        px(t), y0, px(t), y0 + kPanelH, px(t), y0 + kPanelH + 15, label(t));
  }
  svg += fmt::format(
      "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"12\" text-anchor=\"middle\">{}</text>\n",
      x0 + kPanelW / 2, y0 + kPanelH + 32, x_name);
  for (const auto& line : lines) {
    std::string points;
    for (const auto& [x, y] : line.points) {
      if (std::isfinite(x) && std::isfinite(y))
        points += fmt::format("{:.1f},{:.1f} ", px(x), py(y));
    }
    if (points.empty()) continue;
    svg += fmt::format(
        "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.8\"{} points=\"{}\"/>\n",
        line.color, line.dashed ? " stroke-dasharray=\"6,4\"" : "", points);
    if (line.points.size() == 1) {  // a single point has no length: mark it
      svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n",
                         px(line.points[0].first), py(line.points[0].second), line.color);
    }
  }
  return svg + "</g>\n";
}

}  // namespace

std::string plot_svg(const std::vector<RunLog>& runs, const PlotOptions& options) {
  const std::string x_name = options.by_tokens ? "tokens" : "step";
  struct PanelSpec {
    const char* title;
    const char* key;
  };
  std::vector<PanelSpec> specs = {{"loss (dashed: val_loss)", "loss"},
                                  {"learning rate", "lr"},
                                  {"throughput (tokens/s per device)", "tps"},
                                  {"peak memory (GiB)", "mem_peak_gib"}};
  // Mixture-of-experts runs add their expert load (1 = balanced) and the balancing bias range.
  bool moe = false;
  for (const auto& run : runs) moe = moe || !series(run.train, "moe/load_max_mean", false).empty();
  if (moe) {
    specs.push_back({"expert load, max/mean over experts (worst layer)", "moe/load_max_mean"});
    specs.push_back({"balancing bias, max (dashed: min)", "moe/bias_max"});
  }
  const double height = kHeight + (moe ? kPanelH + 80 : 0);
  std::string title = options.title;
  if (title.empty()) {
    for (const auto& run : runs) title += (title.empty() ? "" : " vs ") + run.name;
  }
  std::string svg = fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n"
      "<rect width=\"{0}\" height=\"{1}\" fill=\"#fafafa\"/>\n"
      "<text x=\"{2}\" y=\"28\" font-size=\"18\" text-anchor=\"middle\">{3}</text>\n",
      kWidth, height, kWidth / 2, escape(title));
  // Legend: one swatch per run.
  double lx = 70;
  for (size_t i = 0; i < runs.size(); ++i) {
    const char* color = kPalette[i % std::size(kPalette)];
    svg += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"52\" x2=\"{1:.1f}\" y2=\"52\" stroke=\"{2}\" "
        "stroke-width=\"3\"/>"
        "<text x=\"{3:.1f}\" y=\"56\" font-size=\"13\">{4}</text>\n",
        lx, lx + 24, color, lx + 30, escape(runs[i].name));
    lx += 50 + 8.0 * static_cast<double>(runs[i].name.size());
  }
  for (size_t p = 0; p < std::size(specs); ++p) {
    std::vector<Line> lines;
    for (size_t i = 0; i < runs.size(); ++i) {
      const char* color = kPalette[i % std::size(kPalette)];
      lines.push_back({series(runs[i].train, specs[p].key, options.by_tokens), color, false});
      if (p == 0) {
        lines.push_back({series(runs[i].validation, "val_loss", options.by_tokens), color, true});
      }
      if (std::string(specs[p].key) == "moe/bias_max") {
        lines.push_back({series(runs[i].train, "moe/bias_min", options.by_tokens), color, true});
      }
    }
    const double x0 = 70 + static_cast<double>(p % 2) * (kPanelW + 90);
    const double y0 = 95 + static_cast<double>(p / 2) * (kPanelH + 80);
    svg += panel(x0, y0, specs[p].title, x_name, lines);
  }
  return svg + "</svg>\n";
}

}  // namespace loom::metrics

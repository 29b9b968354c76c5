#include "sim/uncertainty.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>

namespace chorus::sim {

std::string_view kindName(PredictionKind k) {
  switch (k) {
    case PredictionKind::DenseTrain: return "dense-train";
    case PredictionKind::MoeTrain: return "moe-train";
    case PredictionKind::Collective: return "collective";
    case PredictionKind::Inference: return "inference";
  }
  return "?";
}

std::string gpuGeneration(std::string_view gpu_name) {
  std::string n;
  for (char c : gpu_name) n.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
  // A model number: the letter(s) followed by a digit, at the start or after a non-letter.
  auto has = [&](std::string_view prefix) {
    for (size_t p = n.find(prefix); p != std::string::npos; p = n.find(prefix, p + 1)) {
      const bool start = p == 0 || !std::isalpha(static_cast<unsigned char>(n[p - 1]));
      const size_t e = p + prefix.size();
      if (start && e < n.size() && std::isdigit(static_cast<unsigned char>(n[e]))) return true;
    }
    return false;
  };
  if (has("GB") || has("B")) return "Blackwell";
  if (has("GH") || has("H")) return "Hopper";
  if (has("A")) return "Ampere";
  return "";
}

std::string Band::text() const {
  if (empty()) return "";
  return fmt::format("{:+.0f} %/{:+.0f} % from {} validation row{}", low_pct, high_pct, rows, rows == 1 ? "" : "s");
}

std::string Band::suffix() const { return empty() ? "" : fmt::format(" ({})", text()); }

std::string Band::line() const {
  if (empty()) return fmt::format("uncertainty: none ({})", note);
  return fmt::format("uncertainty: every time above is within {} ({}{}{}{}; docs/validation.md)", text(), kind,
                     generation.empty() ? "" : " on ", generation, note.empty() ? "" : "; " + note);
}

nlohmann::json Band::toJson() const {
  if (empty()) return nlohmann::json{{"rows", 0}, {"note", note}};
  return {{"low_pct", low_pct},       {"high_pct", high_pct}, {"rows", rows},
          {"kind", kind},             {"gpu_generation", generation},
          {"note", note},             {"source", "validation rows of bench/validation/rows.json (docs/validation.md)"},
          {"applies_to", "every time of this output, relative"}};
}

nlohmann::json Band::range(double value) const {
  if (empty()) return nullptr;
  return nlohmann::json::array({value * (1 + low_pct / 100), value * (1 + high_pct / 100)});
}

Result<ValidationErrors> ValidationErrors::fromJson(std::string_view text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("rows") || !j["rows"].is_array())
    return invalidArgument("validation errors: not a JSON object with a 'rows' array");
  ValidationErrors v;
  for (const auto& r : j["rows"]) {
    if (!r.is_object() || !r.contains("id") || !r["id"].is_string() || !r.contains("kind") || !r["kind"].is_string() ||
        !r.contains("error_pct") || !r["error_pct"].is_number())
      return invalidArgument("validation errors: every row needs 'id', 'kind' (strings) and 'error_pct' (a number)");
    const double e = r["error_pct"].get<double>();
    if (!(e > -100 && e < 1e6))
      return invalidArgument("validation errors: row '{}': error_pct {} is not above -100", r["id"].get<std::string>(), e);
    const std::string role = r.contains("role") && r["role"].is_string() ? r["role"].get<std::string>() : "";
    if (role != "validation")
      return invalidArgument("validation errors: row '{}' has role '{}': only validation rows set a band",
                             r["id"].get<std::string>(), role);
    v.rows_.push_back({r["id"].get<std::string>(), r["kind"].get<std::string>(),
                       r.contains("gpu") && r["gpu"].is_string() ? r["gpu"].get<std::string>() : "", e});
  }
  return v;
}

const ValidationErrors& ValidationErrors::builtin() {
  static const ValidationErrors table = [] {
    auto v = fromJson(validationErrorsJson());
    return v.isOk() ? std::move(v.value()) : ValidationErrors{};
  }();
  return table;
}

Band ValidationErrors::band(PredictionKind kind, std::string_view gpu_name) const {
  Band b;
  b.kind = std::string(kindName(kind));
  std::string lower;
  for (char c : gpu_name) lower.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  if (lower.find("cpu") != std::string::npos) {
    b.note = fmt::format("'{}' is not a GPU: the validation rows are GPU runs", gpu_name);
    return b;
  }
  const std::string gen = gpuGeneration(gpu_name);
  std::vector<double> of_kind, of_gen;
  for (const ErrorRow& r : rows_) {
    if (r.kind != b.kind) continue;
    of_kind.push_back(r.error_pct);
    if (!gen.empty() && gpuGeneration(r.gpu) == gen) of_gen.push_back(r.error_pct);
  }
  const std::vector<double>* use = &of_gen;
  if (static_cast<int>(of_gen.size()) >= kMinBandRows) {
    b.generation = gen;
  } else {
    use = &of_kind;
    b.note = gen.empty() ? fmt::format("GPU '{}' of no known generation: every {} row", gpu_name, b.kind)
                         : fmt::format("{} {} row{} on {} (fewer than {}): every {} row", of_gen.size(), b.kind,
                                       of_gen.size() == 1 ? "" : "s", gen, kMinBandRows, b.kind);
  }
  if (use->empty()) {
    b.note = fmt::format("no validation rows of kind {}", b.kind);
    return b;
  }
  // The truth over the prediction on a row: 1 / (1 + e).
  double lo = 1e300, hi = -1e300;
  for (double e : *use) {
    const double t = 1 / (1 + e / 100) - 1;
    lo = std::min(lo, t), hi = std::max(hi, t);
  }
  b.low_pct = 100 * lo, b.high_pct = 100 * hi;
  b.rows = static_cast<int>(use->size());
  return b;
}

Band uncertaintyBand(PredictionKind kind, std::string_view gpu_name) {
  return ValidationErrors::builtin().band(kind, gpu_name);
}

}  // namespace chorus::sim

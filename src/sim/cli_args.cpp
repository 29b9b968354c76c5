#include "sim/cli_args.hpp"

#include <algorithm>
#include <charconv>

#include "plan/plan_file.hpp"

namespace chorus::sim {

namespace {
constexpr int64_t kMaxGpus = int64_t{1} << 24;
constexpr int64_t kMaxTokens = int64_t{1} << 30;
}  // namespace

Status checkCollectiveArgs(int64_t gpus, double bytes) {
  CHORUS_RETURN_IF_ERROR(checkRange<int64_t>("--gpus", gpus, 1, kMaxGpus, "GPUs taking part"));
  return checkRange<double>("--bytes", bytes, 0, std::ldexp(1.0, 50), "bytes per rank, at most 1 PiB");
}

Status checkPlanRanks(const plan::Registry& reg, std::string_view collective, std::string_view algo, int64_t gpus) {
  plan::Collective c;
  if (!plan::parseCollective(collective, &c)) return {};  // simulateCollective names a bad collective
  const auto* file = dynamic_cast<const plan::FileAlgorithm*>(reg.find(c, algo));
  if (file == nullptr || file->spec().nranks == gpus) return {};
  return invalidArgument("--algo {}: the {} plan of '{}' is for {} ranks, not --gpus {} (a plan file serves the one "
                         "rank count it declares)", algo, collective, file->spec().origin, file->spec().nranks, gpus);
}

Status checkTrainArgs(const TrainConfig& c) {
  CHORUS_RETURN_IF_ERROR(checkRange<int64_t>("--gpus", c.gpus, 1, kMaxGpus, "GPUs of the job"));
  for (auto [flag, v] : {std::pair{"--tp", c.tp}, {"--pp", c.pp}, {"--dp", c.dp}, {"--cp", c.cp}, {"--ep", c.ep},
                         {"--vpp", c.vpp}})
    CHORUS_RETURN_IF_ERROR(checkRange<int>(flag, v, 1, 1 << 24, "a parallel degree"));
  CHORUS_RETURN_IF_ERROR(checkRange<int64_t>("--global-batch", c.global_batch, 1, kMaxTokens, "sequences per iteration"));
  CHORUS_RETURN_IF_ERROR(checkRange<int64_t>("--micro-batch", c.micro_batch, 0, kMaxTokens, "sequences per micro-batch; auto = 0"));
  CHORUS_RETURN_IF_ERROR(checkRange<int64_t>("--seq", c.seq, 1, kMaxTokens, "tokens per sequence"));
  return checkRange<int>("--zero", c.zero, 0, 3, "ZeRO stage");
}

Status checkSearchArgs(const SearchConfig& c) {
  CHORUS_RETURN_IF_ERROR(checkRange<int64_t>("--gpus", c.gpus, 1, kMaxGpus, "GPUs of the job"));
  CHORUS_RETURN_IF_ERROR(checkRange<int64_t>("--global-batch", c.global_batch, 1, kMaxTokens, "sequences per iteration"));
  CHORUS_RETURN_IF_ERROR(checkRange<int64_t>("--seq", c.seq, 1, kMaxTokens, "tokens per sequence"));
  CHORUS_RETURN_IF_ERROR(checkRange<int>("--top", c.top, 1, 1 << 20, "layouts to show"));
  return checkRange<int>("--max-micro-batch", c.max_micro_batch, 1, 1 << 20, "largest micro-batch tried");
}

Result<std::vector<int64_t>> parseConcurrency(std::string_view text) {
  std::vector<int64_t> out;
  size_t i = 0;
  while (i <= text.size()) {
    const size_t j = std::min(text.find(',', i), text.size());
    const std::string_view item = text.substr(i, j - i);
    int64_t v = 0;
    auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || p != item.data() + item.size())
      return invalidArgument("--concurrency '{}': '{}' is not an integer (one value, or a list: 1,2,4,8)", text, item);
    CHORUS_RETURN_IF_ERROR(checkRange<int64_t>("--concurrency", v, 1, 1 << 24, "users in the closed loop"));
    out.push_back(v);
    i = j + 1;
  }
  return out;
}

Result<std::vector<double>> parseRates(std::string_view text) {
  auto number = [&](std::string_view item) -> Result<double> {
    double v = 0;
    auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || p != item.data() + item.size())
      return invalidArgument("--rate '{}': '{}' is not a number (one rate, a list 1,2,4 or a range MIN:MAX doubling, "
                             "MIN:MAX:STEP)", text, item);
    CHORUS_RETURN_IF_ERROR(checkRange<double>("--rate", v, 1e-9, 1e9, "requests per second, positive"));
    return v;
  };
  std::vector<double> out;
  if (text.find(':') != std::string_view::npos) {
    std::vector<double> parts;
    size_t i = 0;
    while (i <= text.size()) {
      const size_t j = std::min(text.find(':', i), text.size());
      CHORUS_ASSIGN_OR_RETURN(double v, number(text.substr(i, j - i)));
      parts.push_back(v);
      i = j + 1;
    }
    if (parts.size() > 3 || parts[1] < parts[0])
      return invalidArgument("--rate '{}': a range is MIN:MAX (doubling) or MIN:MAX:STEP with MIN <= MAX", text);
    const double step = parts.size() == 3 ? parts[2] : 0;
    if (step > 0 && (parts[1] - parts[0]) / step > 1000)
      return invalidArgument("--rate '{}': more than 1000 rates", text);
    // A small tolerance so that 1:2:0.1 ends at 2 despite rounding.
    for (double r = parts[0]; r <= parts[1] * (1 + 1e-9); r = step > 0 ? r + step : 2 * r) out.push_back(r);
    return out;
  }
  size_t i = 0;
  while (i <= text.size()) {
    const size_t j = std::min(text.find(',', i), text.size());
    CHORUS_ASSIGN_OR_RETURN(double v, number(text.substr(i, j - i)));
    out.push_back(v);
    i = j + 1;
  }
  return out;
}

Result<int64_t> parseMicroBatch(std::string_view text) {
  if (text == "auto") return int64_t{0};
  int64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size())
    return invalidArgument("--micro-batch '{}': not an integer or auto", text);
  CHORUS_RETURN_IF_ERROR(checkRange<int64_t>("--micro-batch", v, 1, kMaxTokens, "sequences per micro-batch, or auto"));
  return v;
}

}  // namespace chorus::sim

// chorus-sim's uncertainty bands (src/sim/uncertainty.hpp): computed from the
// validation rows' errors, never typed in.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "sim/uncertainty.hpp"

namespace chorus::sim {
namespace {

// A fixture table: three dense rows on Hopper, one on Blackwell, two collective rows.
nlohmann::json fixture() {
  return nlohmann::json::parse(R"({"rows": [
    {"id": "d1", "kind": "dense-train", "gpu": "H100-SXM5-80GB", "role": "validation", "error_pct": -20},
    {"id": "d2", "kind": "dense-train", "gpu": "H100-SXM5-80GB", "role": "validation", "error_pct": 10},
    {"id": "d3", "kind": "dense-train", "gpu": "H800", "role": "validation", "error_pct": 0},
    {"id": "d4", "kind": "dense-train", "gpu": "B200", "role": "validation", "error_pct": 60},
    {"id": "c1", "kind": "collective", "gpu": "GB200", "role": "validation", "error_pct": -50},
    {"id": "c2", "kind": "collective", "gpu": "H100", "role": "validation", "error_pct": 25}
  ]})");
}

ValidationErrors parse(const nlohmann::json& j) {
  auto v = ValidationErrors::fromJson(j.dump());
  EXPECT_TRUE(v.isOk()) << v.status().message();
  return v.isOk() ? std::move(v.value()) : ValidationErrors{};
}

TEST(SimUncertainty, TheBandIsTheRangeOfTruthOverPredictionOnTheRowsOfTheKindAndGeneration) {
  const Band b = parse(fixture()).band(PredictionKind::DenseTrain, "H100-SXM5-80GB");
  // Rows d1-d3 (Hopper): a row predicted 20 % fast says the truth is 1 / 0.8 = 1.25x the
  // prediction, one 10 % slow 1 / 1.1 = 0.909x.
  EXPECT_EQ(b.rows, 3);
  EXPECT_EQ(b.generation, "Hopper");
  EXPECT_NEAR(b.low_pct, 100 * (1 / 1.1 - 1), 1e-9);
  EXPECT_NEAR(b.high_pct, 25.0, 1e-9);
  EXPECT_EQ(b.text(), "-9 %/+25 % from 3 validation rows");
  EXPECT_EQ(b.suffix(), " (-9 %/+25 % from 3 validation rows)");
  const nlohmann::json r = b.range(2.0);
  EXPECT_NEAR(r[0].get<double>(), 2.0 / 1.1, 1e-12);
  EXPECT_NEAR(r[1].get<double>(), 2.5, 1e-12);
  EXPECT_EQ(b.toJson()["rows"], 3);
  EXPECT_EQ(b.toJson()["gpu_generation"], "Hopper");
}

TEST(SimUncertainty, ChangingARowChangesTheBand) {
  nlohmann::json j = fixture();
  const Band before = parse(j).band(PredictionKind::DenseTrain, "H100");
  j["rows"][0]["error_pct"] = -50;  // d1: the truth 2x the prediction
  const Band after = parse(j).band(PredictionKind::DenseTrain, "H100");
  EXPECT_NEAR(before.high_pct, 25.0, 1e-9);
  EXPECT_NEAR(after.high_pct, 100.0, 1e-9);
  j["rows"].erase(1);  // d2 gone: two Hopper rows left, fewer than kMinBandRows: every dense row
  const Band fewer = parse(j).band(PredictionKind::DenseTrain, "H100");
  EXPECT_EQ(fewer.rows, 3);
  EXPECT_EQ(fewer.generation, "");
  EXPECT_NE(fewer.note.find("every dense-train row"), std::string::npos) << fewer.note;
  EXPECT_NEAR(fewer.low_pct, 100 * (1 / 1.6 - 1), 1e-9);  // d4, on Blackwell, now counts
}

TEST(SimUncertainty, AGenerationWithFewRowsTakesEveryRowOfTheKindAndSaysSo) {
  const Band b = parse(fixture()).band(PredictionKind::DenseTrain, "B200");
  EXPECT_EQ(b.rows, 4);
  EXPECT_EQ(b.generation, "");
  EXPECT_NE(b.note.find("1 dense-train row on Blackwell"), std::string::npos) << b.note;
  EXPECT_NEAR(b.low_pct, 100 * (1 / 1.6 - 1), 1e-9);
  EXPECT_NEAR(b.high_pct, 25.0, 1e-9);
  // Collective: two rows, either generation.
  const Band c = parse(fixture()).band(PredictionKind::Collective, "H100");
  EXPECT_EQ(c.rows, 2);
  EXPECT_NEAR(c.low_pct, -20.0, 1e-9);
  EXPECT_NEAR(c.high_pct, 100.0, 1e-9);
}

TEST(SimUncertainty, NoRowsOfTheKindOrACpuClusterGiveNoBand) {
  const ValidationErrors v = parse(fixture());
  const Band m = v.band(PredictionKind::MoeTrain, "H100");
  EXPECT_TRUE(m.empty());
  EXPECT_EQ(m.suffix(), "");
  EXPECT_NE(m.line().find("no validation rows of kind moe-train"), std::string::npos);
  EXPECT_TRUE(v.band(PredictionKind::DenseTrain, "CPU (this machine)").empty());
}

TEST(SimUncertainty, OnlyValidationRowsAreTaken) {
  nlohmann::json j = fixture();
  j["rows"][0]["role"] = "calibration";
  auto v = ValidationErrors::fromJson(j.dump());
  ASSERT_FALSE(v.isOk());
  EXPECT_NE(v.status().message().find("only validation rows"), std::string::npos);
  EXPECT_FALSE(ValidationErrors::fromJson("{").isOk());
  EXPECT_FALSE(ValidationErrors::fromJson(R"({"rows": [{"id": "x", "kind": "collective", "role": "validation",
                                                         "error_pct": -100}]})").isOk());
}

TEST(SimUncertainty, GpuGenerations) {
  EXPECT_EQ(gpuGeneration("A100-SXM4-80GB"), "Ampere");
  EXPECT_EQ(gpuGeneration("H100-SXM5-80GB"), "Hopper");
  EXPECT_EQ(gpuGeneration("NVIDIA H800"), "Hopper");
  EXPECT_EQ(gpuGeneration("H200"), "Hopper");
  EXPECT_EQ(gpuGeneration("GB200"), "Blackwell");
  EXPECT_EQ(gpuGeneration("B200"), "Blackwell");
  EXPECT_EQ(gpuGeneration("MI300X"), "");
}

// The built-in table is bench/validation/errors.json as compiled, every row of it a validation row of
// bench/validation/rows.json, and none a calibration row (bench/validation/calibration.json).
TEST(SimUncertainty, TheBuiltInTableIsTheValidationRowsFile) {
  auto slurp = [](const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  const std::string root = CHORUS_SOURCE_DIR;
  const auto errors = nlohmann::json::parse(slurp(root + "/bench/validation/errors.json"));
  const auto rows = nlohmann::json::parse(slurp(root + "/bench/validation/rows.json"));
  const auto calib = nlohmann::json::parse(slurp(root + "/bench/validation/calibration.json"));
  EXPECT_EQ(ValidationErrors::builtin().rows().size(), errors["rows"].size());
  std::set<std::string> validation, calibration;
  for (const auto& r : rows["rows"]) validation.insert(r["id"].get<std::string>());
  for (const auto& r : calib["rows"]) calibration.insert(r["id"].get<std::string>());
  ASSERT_FALSE(calibration.empty());
  for (const auto& r : errors["rows"]) EXPECT_TRUE(validation.count(r["id"].get<std::string>())) << r["id"];
  for (const std::string& id : calibration) EXPECT_FALSE(validation.count(id)) << id << " is in both lists";
  // Every kind has a band on Hopper from the built-in table.
  for (PredictionKind k : {PredictionKind::DenseTrain, PredictionKind::MoeTrain, PredictionKind::Collective,
                           PredictionKind::Inference})
    EXPECT_FALSE(uncertaintyBand(k, "H100-SXM5-80GB").empty()) << kindName(k);
}

}  // namespace
}  // namespace chorus::sim

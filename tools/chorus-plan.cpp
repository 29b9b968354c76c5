// chorus-plan: reads plans written elsewhere and writes chorus's (docs/plan-format.md, docs/msccl.md).
//
//   chorus-plan import FILE [--out F.plan] [--json]   read a plan file (.plan, MSCCL .xml, MSCCL++ .json), prove it, say so
//   chorus-plan export --algo NAME --ranks N --format msccl-xml|mscclpp-json|chorus [--collective C] [--chunks K] [-o F]
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "plan/plan_file.hpp"
#include "plan/plan_export.hpp"

namespace {

int importFile(const std::string& path, const std::string& out, bool json) {
  using namespace chorus::plan;
  auto spec = readPlanFile(path);
  nlohmann::json j{{"file", path}};
  if (spec.isOk()) {
    size_t steps = 0;
    for (const auto& p : spec->programs) steps += p.size();
    j["name"] = spec->name;
    j["collective"] = std::string(collectiveName(spec->coll));
    j["ranks"] = spec->nranks;
    j["chunks"] = spec->chunks;
    j["scratch"] = spec->scratch;
    j["steps"] = steps;
    j["inplace"] = spec->inplace == PlanInPlace::Yes ? "yes" : spec->inplace == PlanInPlace::Both ? "both" : "no";
  }
  chorus::Status st = spec.status();
  std::unique_ptr<FileAlgorithm> algo;
  if (st.isOk()) {
    auto built = buildPlan(*spec);
    if (built.isOk()) algo = std::move(*built);
    st = built.status();
  }
  j["read"] = spec.isOk();
  j["proven"] = st.isOk();
  if (!st.isOk()) j["error"] = st.message();
  if (algo != nullptr && !out.empty()) {
    auto text = dumpPlanText(*algo, algo->spec().nranks, static_cast<int>(algo->spec().chunks),
                             {.name = algo->spec().name, .inplace = algo->spec().inplace});
    if (!text.isOk()) {
      fmt::print(stderr, "{}\n", text.status().message());
      return 1;
    }
    std::ofstream(out) << *text;
  }
  if (json) {
    fmt::print("{}\n", j.dump(2));
  } else if (st.isOk()) {
    fmt::print("{}: {} plan '{}' on {} ranks, {} chunks per block, {} steps: proven\n", path,
               j["collective"].get<std::string>(), j["name"].get<std::string>(), spec->nranks, spec->chunks,
               j["steps"].get<size_t>());
  } else {
    fmt::print(stderr, "{}\n", st.message());
  }
  return st.isOk() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"chorus-plan: import plans written elsewhere (proving them), export chorus's"};
  app.require_subcommand(1);
  std::string file, out, algo, format = "msccl-xml", coll = "allreduce";
  int ranks = 0, chunks = 0;
  bool json = false;
  auto* imp = app.add_subcommand("import", "read a plan file (.plan, MSCCL .xml, MSCCL++ .json) and prove it");
  imp->add_option("file", file, "the plan file")->required();
  imp->add_option("--out", out, "also write it as a chorus .plan file");
  imp->add_flag("--json", json, "print JSON instead of text");
  auto* exp = app.add_subcommand("export", "write a chorus algorithm for other runtimes");
  exp->add_option("--algo", algo, "the algorithm (ring, recursive_doubling, ...)")->required();
  exp->add_option("--ranks", ranks, "the rank count")->required();
  exp->add_option("--collective", coll, "the collective")->capture_default_str();
  exp->add_option("--chunks", chunks, "chunks per rank block (default: the rank count)");
  exp->add_option("--format", format, "msccl-xml, mscclpp-json (also msccl++-json) or chorus")->capture_default_str();
  exp->add_option("-o,--output", out, "the file to write (default: stdout)");
  CLI11_PARSE(app, argc, argv);

  if (imp->parsed()) return importFile(file, out, json);
  auto text = chorus::plan::exportPlan({.collective = coll, .algo = algo, .ranks = ranks, .chunks = chunks,
                                       .format = format});
  if (!text.isOk()) {
    fmt::print(stderr, "{}\n", text.status().message());
    return 1;
  }
  if (out.empty()) {
    fmt::print("{}", *text);
  } else {
    std::ofstream f(out);
    f << *text;
    if (!f) {
      fmt::print(stderr, "cannot write '{}'\n", out);
      return 1;
    }
  }
  return 0;
}

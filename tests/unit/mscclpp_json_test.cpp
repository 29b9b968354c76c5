// MSCCL++'s JSON execution plans (plan::parseMscclppJson, docs/msccl.md): a
// plan written the way MSCCL++'s own allreduce plans are (put into the peer's
// scratch, signal, wait, reduce), one with two thread blocks and a barrier,
// port channels' put-with-signal, and every refusal with its key path.  The
// round trip of chorus's algorithms is in msccl_file_test.cpp
// (MscclppJson.ExportedBuiltinsRoundTrip).
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "plan/plan_export.hpp"
#include "plan/plan_file.hpp"
#include "sim/cli.hpp"

namespace chorus::plan {
namespace {

using Json = nlohmann::json;

// Read, then prove: "" or the first error.
std::string load(const std::string& text, const std::string& origin = "p.json") {
  auto spec = parseMscclppJson(text, origin);
  if (!spec.isOk()) return spec.status().message();
  auto built = buildPlan(std::move(*spec));
  return built.isOk() ? "" : built.status().message();
}
std::string load(const Json& j) { return load(j.dump()); }

Json local(const char* t, int index, int size = 1) { return {{"type", t}, {"index", index}, {"size", size}}; }
Json remote(int id, int index, int size = 1) { return {{"buffer_id", id}, {"index", index}, {"size", size}}; }
Json chanOp(const char* name, int ch, const char* type = "memory") {
  return {{"name", name}, {"channel_ids", {ch}}, {"channel_type", type}};
}

// A 2-GPU allreduce of one chunk: each GPU puts its input into the other's
// scratch, signals, waits for the other's, and sums input and scratch into
// its output.
Json pairAllreduce() {
  Json gpus = Json::array();
  for (int r = 0; r < 2; ++r) {
    Json ops = Json::array();
    ops.push_back({{"name", "put"}, {"src_buff", {local("i", 0)}}, {"dst_buff", {remote(0, 0)}},
                   {"channel_type", "memory"}});
    ops.push_back(chanOp("signal", 0));
    ops.push_back(chanOp("wait", 0));
    ops.push_back({{"name", "re"}, {"src_buff", {local("i", 0), local("s", 0)}}, {"dst_buff", {local("o", 0)}}});
    gpus.push_back({{"id", r},
                    {"input_chunks", 1},
                    {"output_chunks", 1},
                    {"scratch_chunks", 1},
                    {"channels", {{{"channel_type", "memory"}, {"connected_to", {1 - r}}}}},
                    {"remote_buffers", {{{"rank", 1 - r}, {"type", "s"}, {"access_channel_types", {"memory"}}}}},
                    {"threadblocks",
                     {{{"id", 0},
                       {"ops", ops},
                       {"channels", {{{"channel_type", "memory"}, {"channel_ids", {0}}}}},
                       {"remote_buffer_refs", {{{"access_channel_type", "memory"}, {"remote_buffer_ids", {0}}}}}}}}});
  }
  return {{"name", "Pair"}, {"collective", "allreduce"}, {"protocol", "Simple"}, {"inplace", false},
          {"num_threads_per_block", 1024}, {"min_message_size", 0}, {"max_message_size", 1 << 20}, {"gpus", gpus}};
}

Json& ops(Json& j, int gpu, int tb = 0) { return j["gpus"][gpu]["threadblocks"][tb]["ops"]; }

TEST(MscclppJson, ReadsAPutSignalWaitReducePlan) {
  Json j = pairAllreduce();
  auto spec = parseMscclppJson(j.dump(), "pair.json");
  ASSERT_TRUE(spec.isOk()) << spec.status().message();
  EXPECT_EQ(spec->name, "pair");
  EXPECT_EQ(spec->nranks, 2);
  EXPECT_EQ(spec->chunks, 1u);
  EXPECT_EQ(spec->scratch, 1u);
  ASSERT_EQ(spec->programs[0].size(), 3u);  // send, recv, reduce
  EXPECT_EQ(spec->programs[0][0].op, StepOp::Send);
  EXPECT_EQ(spec->programs[0][1].op, StepOp::Recv);
  EXPECT_EQ(spec->programs[0][1].dst.buf, Buf::Scratch);
  EXPECT_EQ(spec->programs[0][2].op, StepOp::Reduce);
  EXPECT_EQ(load(j), "");

  // In place: MSCCL++'s input is the output.
  j["inplace"] = true;
  EXPECT_EQ(load(j), "");

  // The reduction reads only the scratch: the proof's counter-example.
  j["inplace"] = false;
  ops(j, 0)[3]["src_buff"] = Json::array({local("s", 0)});
  const std::string msg = load(j);
  EXPECT_NE(msg.find("p.json: plan 'pair' fails its proof"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 0: output element 0 holds ranks {1}"), std::string::npos) << msg;
}

// Two thread blocks per GPU: one sends, the other waits and reduces; a
// barrier orders the second's reduction after the first's put; port channels
// with put-with-signal.
TEST(MscclppJson, ThreadBlocksBarriersAndPortChannels) {
  Json j = pairAllreduce();
  for (int r = 0; r < 2; ++r) {
    Json& g = j["gpus"][r];
    Json tb0 = g["threadblocks"][0];
    Json tb1 = tb0;
    tb0["ops"] = {tb0["ops"][0], tb0["ops"][1], {{"name", "barrier"}, {"barrier_id", 0}, {"num_threadblocks", 2}}};
    tb1["id"] = 1;
    tb1["ops"] = {{{"name", "barrier"}, {"barrier_id", 0}, {"num_threadblocks", 2}}, tb1["ops"][2], tb1["ops"][3]};
    g["threadblocks"] = {tb0, tb1};
  }
  EXPECT_EQ(load(j), "");

  Json p = pairAllreduce();
  for (int r = 0; r < 2; ++r) {
    Json& g = p["gpus"][r];
    g["channels"] = {{{"channel_type", "port"}, {"connected_to", {1 - r}}}};
    g["remote_buffers"][0]["access_channel_types"] = {"port"};
    Json& tb = g["threadblocks"][0];
    tb["channels"] = {{{"channel_type", "port"}, {"channel_ids", {0}}}};
    tb["remote_buffer_refs"] = {{{"access_channel_type", "port"}, {"remote_buffer_ids", {0}}}};
    tb["ops"] = {{{"name", "pws"}, {"src_buff", {local("i", 0)}}, {"dst_buff", {remote(0, 0)}},
                  {"channel_ids", {0}}, {"channel_type", "port"}},
                 chanOp("flush", 0, "port"), chanOp("wait", 0, "port"), tb["ops"][3]};
  }
  EXPECT_EQ(load(p), "");
  // Over a memory channel MSCCL++ runs pws as a plain put: nobody signals.
  Json m = pairAllreduce();
  for (int r = 0; r < 2; ++r) {
    Json& o = ops(m, r);
    o[0]["name"] = "pws";
    o[0]["channel_ids"] = {0};
    o.erase(1);
  }
  const std::string msg = load(m);
  EXPECT_NE(msg.find("p.json: gpus[0].threadblocks[0].ops[1]: never runs: it waits for a signal from gpu 1 on "
                     "memory channel 0 that is never sent"), std::string::npos) << msg;
}

TEST(MscclppJson, RefusalsNameTheKeyPath) {
  struct Case {
    const char* what;
    std::function<void(Json&)> change;
    const char* error;
  };
  const Case cases[] = {
      {"an op it does not read", [](Json& j) { ops(j, 1)[3]["name"] = "rre"; },
       "p.json: gpus[1].threadblocks[0].ops[3].name: \"rre\" is not read"},
      {"an unknown op", [](Json& j) { ops(j, 1)[3]["name"] = "frob"; },
       "p.json: gpus[1].threadblocks[0].ops[3].name: \"frob\" is not one of MSCCL++'s operations"},
      {"LL", [](Json& j) { j["protocol"] = "LL"; }, "p.json: protocol: \"LL\" is not read"},
      {"a rooted collective", [](Json& j) { j["collective"] = "broadcast"; },
       "p.json: collective: \"broadcast\" is not read"},
      {"an unknown key", [](Json& j) { j["gpus"][0]["threadblocks"][0]["colour"] = 1; },
       "p.json: gpus[0].threadblocks[0].\"colour\": not a key this reader takes here"},
      {"a missing key", [](Json& j) { j["gpus"][1].erase("scratch_chunks"); }, "p.json: gpus[1].scratch_chunks: missing"},
      {"a string for a number", [](Json& j) { ops(j, 0)[0]["src_buff"][0]["index"] = "0"; },
       "p.json: gpus[0].threadblocks[0].ops[0].src_buff[0].index: \"0\" is not an integer"},
      {"gpus out of order", [](Json& j) { j["gpus"][1]["id"] = 0; }, "p.json: gpus[1].id: 0: MSCCL++ reads gpus[r]"},
      {"outside the buffer", [](Json& j) { ops(j, 0)[0]["dst_buff"][0]["index"] = 1; },
       "p.json: gpus[0].threadblocks[0].ops[0].dst_buff[0]: chunks 1..1 lie outside the scratch buffer's 1 chunks "
       "(of gpu 1)"},
      {"no such channel", [](Json& j) { ops(j, 0)[1]["channel_ids"] = {3}; },
       "p.json: gpus[0].threadblocks[0].ops[1].channel_ids[0]: 3 is not one of its thread block's 1 channels"},
      {"no such remote buffer", [](Json& j) { ops(j, 0)[0]["dst_buff"][0]["buffer_id"] = 2; },
       "p.json: gpus[0].threadblocks[0].ops[0].dst_buff[0].buffer_id: 2 is not one of its thread block's 1 remote"},
      {"a wait for nothing", [](Json& j) { ops(j, 1).erase(1); },
       "p.json: gpus[0].threadblocks[0].ops[2]: never runs: it waits for a signal from gpu 1 on memory channel 0 that "
       "is never sent"},
      {"a put never signalled", [](Json& j) { ops(j, 1).erase(1); ops(j, 0).erase(2); },
       "p.json: gpus[1].threadblocks[0]: a put to gpu 0 is never signalled"},
      {"a signal never waited for", [](Json& j) { ops(j, 1).erase(2); },
       "p.json: gpu 0's signal to gpu 1 on a memory channel (its 0 to that peer) is never waited for"},
      {"writing the input", [](Json& j) { ops(j, 0)[3]["dst_buff"] = Json::array({local("i", 0)}); },
       "p.json: gpus[0].threadblocks[0].ops[3]:"},
      {"a remote operand to a copy", [](Json& j) { ops(j, 0)[3] = {{"name", "copy"}, {"src_buff", {remote(0, 0)}},
                                                                     {"dst_buff", {local("o", 0)}}}; },
       "p.json: gpus[0].threadblocks[0].ops[3].src_buff[0].buffer_id: a remote buffer in an operation without a "
       "channel_type"},
      {"reused scratch", [](Json& j) { j["reuse_resources"] = true; }, "p.json: reuse_resources: true is not read"},
      {"NVLS", [](Json& j) { j["gpus"][0]["channels"][0]["channel_type"] = "switch"; },
       "p.json: gpus[0].channels[0].channel_type: \"switch\": switch (NVLS multicast) channels are not read"},
      {"a thread-block group", [](Json& j) { ops(j, 0)[3]["tbg_info"] = {{"tb_id", 0}, {"tbg_size", 2}}; },
       "p.json: gpus[0].threadblocks[0].ops[3].tbg_info.tbg_size: 2: an operation split over a group"},
      {"a barrier nobody else reaches", [](Json& j) { ops(j, 0).insert(ops(j, 0).begin(), Json{{"name", "barrier"}, {"barrier_id", 0}, {"num_threadblocks", 2}}); },
       "p.json: gpus[0].threadblocks[0].ops[0]: never runs: waits at barrier 0 for 2 thread blocks; 1 arrive"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Json j = pairAllreduce();
    c.change(j);
    const std::string msg = load(j);
    EXPECT_NE(msg.find(c.error), std::string::npos) << msg;
  }
  EXPECT_NE(load("{\"name\": ", "t.json").find("t.json: byte "), std::string::npos);
  EXPECT_NE(load("[1,2]", "t.json").find("t.json: (top level): [1,2] is not an object"), std::string::npos);
  EXPECT_NE(load(std::string(100, '[') + std::string(100, ']'), "t.json").find("t.json: nested deeper than 16"),
            std::string::npos);
  // A put's messages out of the receiver's per-pair order: gpu 0 puts two
  // chunks on two channels, gpu 1 waits on the second channel first.
  Json j = pairAllreduce();
  j["gpus"][0]["input_chunks"] = j["gpus"][1]["input_chunks"] = 2;
  j["gpus"][0]["output_chunks"] = j["gpus"][1]["output_chunks"] = 2;
  j["gpus"][0]["scratch_chunks"] = j["gpus"][1]["scratch_chunks"] = 2;
  for (int r = 0; r < 2; ++r) {
    j["gpus"][r]["channels"][0]["connected_to"] = {1 - r, 1 - r};
    j["gpus"][r]["threadblocks"][0]["channels"][0]["channel_ids"] = {0, 1};
  }
  ops(j, 0) = {{{"name", "put"}, {"src_buff", {local("i", 0)}}, {"dst_buff", {remote(0, 0)}}, {"channel_type", "memory"}},
               chanOp("signal", 0),
               {{"name", "put"}, {"src_buff", {local("i", 1)}}, {"dst_buff", {remote(0, 1)}}, {"channel_type", "memory"}},
               chanOp("signal", 1)};
  ops(j, 1) = {chanOp("wait", 1), chanOp("wait", 0)};
  const std::string msg = load(j);
  EXPECT_NE(msg.find("p.json: gpus[1].threadblocks[0].ops[0]: never runs: the puts its signal from gpu 0 covers are "
                     "not the oldest messages gpu 0 sent it"), std::string::npos) << msg;
}

// The exporter's own files read back with the names and forms they claim,
// and refusals of what it cannot write.
TEST(MscclppJson, ExportWritesTheSchema) {
  auto text = exportPlan({.collective = "allgather", .algo = "ring", .ranks = 3, .format = "mscclpp-json"});
  ASSERT_TRUE(text.isOk()) << text.status().message();
  const Json j = Json::parse(*text);
  EXPECT_EQ(j["name"], "ring3");
  EXPECT_EQ(j["collective"], "allgather");
  EXPECT_EQ(j["protocol"], "Simple");
  EXPECT_EQ(j["inplace"], false);
  ASSERT_EQ(j["gpus"].size(), 3u);
  for (int r = 0; r < 3; ++r) {
    const Json& g = j["gpus"][r];
    EXPECT_EQ(g["id"], r);
    EXPECT_EQ(g["input_chunks"], 3);
    EXPECT_EQ(g["output_chunks"], 9);
    EXPECT_EQ(g["threadblocks"].size(), 1u);
    for (const Json& op : g["threadblocks"][0]["ops"]) {
      const std::string name = op["name"];
      EXPECT_TRUE(name == "put" || name == "signal" || name == "wait" || name == "copy" || name == "re") << name;
    }
  }
  EXPECT_EQ(load(*text), "");
  auto bad = exportPlan({.collective = "broadcast", .algo = "ring", .ranks = 4, .format = "mscclpp-json"});
  EXPECT_FALSE(bad.isOk());
  bad = exportPlan({.collective = "allreduce", .algo = "ring", .ranks = 65, .format = "mscclpp-json"});
  EXPECT_FALSE(bad.isOk());
}

// chorus-sim collective --plan F.json prices an MSCCL++ plan on a modelled
// cluster, and says which GPU count it needs when --gpus is another.
TEST(MscclppJson, SimulatorPricesIt) {
  auto text = exportPlan({.collective = "allreduce", .algo = "ring", .ranks = 4, .format = "mscclpp-json",
                          .name = "ringpp4"});
  ASSERT_TRUE(text.isOk()) << text.status().message();
  const std::string path =
      (std::filesystem::temp_directory_path() / fmt::format("chorus-mscclpp-{}.json", getpid())).string();
  std::ofstream(path) << *text;
  sim::CliOptions o;
  o.cluster_path = std::string(CHORUS_SOURCE_DIR) + "/configs/clusters/h100-rail.json";
  o.gpus = 4;
  o.collective = "allreduce";
  o.bytes_text = "1M";
  o.algo = "ringpp4";
  o.plan_paths = {path};
  o.json = true;
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(sim::runCollectiveCommand(o), 0);
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("\"algo\": \"ringpp4\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"time_us\""), std::string::npos) << out;
  o.gpus = 8;
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(sim::runCollectiveCommand(o), 1);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("is for 4 ranks, not --gpus 8"), std::string::npos) << err;
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace chorus::plan

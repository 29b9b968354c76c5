// Models as users have them: Hugging Face config.json files of every
// supported family (the presets in configs/models/), their parameter counts
// against the totals their makers publish, chorus's own format with the same
// concepts, and the errors for misspelled keys, unsupported families and bad
// values; chorus-sim's command-line ranges.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include <string>

#include "sim/cli_args.hpp"
#include "sim/config.hpp"
#include "sim/model_info.hpp"
#include "sim/report.hpp"
#include "support/sim_fixtures.hpp"

namespace chorus::sim {
namespace {

std::string preset(const std::string& dir) { return std::string(CHORUS_SOURCE_DIR) + "/configs/models/" + dir; }

ModelSpec load(const std::string& dir) {
  auto m = loadModel(preset(dir));
  EXPECT_TRUE(m.isOk()) << dir << ": " << m.status().message();
  return m.isOk() ? *m : ModelSpec{};
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string errorOf(const Result<ModelSpec>& r) { return r.isOk() ? "(parsed)" : r.status().message(); }

// What each maker publishes, and in which convention "active" is counted:
//  both   - every parameter a token touches, both embedding tables (Mistral, Qwen);
//  matmul - without the input embedding, a lookup (OpenAI's gpt-oss card:
//           5.13 B active of 116.83 B; DeepSeek's README_WEIGHTS.md: 36.6 B
//           "including 0.9B for the output Head"; DeepSeek-V2 paper: 21 B of 236 B).
//  Non-embedding totals where the card gives them (Qwen's "Non-Embedding",
//  Gemma 3 report, Table 1).
enum class Conv { Both, Matmul };
struct Published {
  const char* dir;
  double total_b, active_b;
  Conv conv;
  double non_embedding_b;  // 0: not published
  double active_abs_tol_b = 0;  // a figure published to fewer digits than 1 % needs
};

TEST(SimHfModel, ParameterCountsMatchThePublishedTotals) {
  const Published rows[] = {
      {"Llama-3.1-8B", 8.03, 8.03, Conv::Both, 0},           // Meta model card / HF: 8.03 B
      {"Llama-3.1-70B", 70.6, 70.6, Conv::Both, 0},          // HF: 70.6 B
      {"Llama-3.1-405B", 405, 405, Conv::Both, 0},           // Meta: 405 B
      {"Mistral-7B-v0.1", 7.24, 7.24, Conv::Both, 0},        // HF: 7.24 B
      {"Mixtral-8x7B-v0.1", 46.7, 12.9, Conv::Both, 0},      // Mistral AI: 46.7 B, 12.9 B active
      {"Qwen2.5-7B", 7.61, 7.61, Conv::Both, 6.53},          // Qwen2.5-7B card
      {"Qwen1.5-MoE-A2.7B", 14.3, 2.7, Conv::Both, 0},       // Qwen1.5-MoE card: 14.3 B, 2.7 B activated
      {"Qwen3-32B", 32.8, 32.8, Conv::Both, 31.2},           // Qwen3-32B card
      // The card gives "3.3B activated" to two digits; the shapes give 3.35 B
      // (attention 18.9 M + 8 experts of 4.7 M per layer x 48, + 0.62 B of tables).
      {"Qwen3-30B-A3B", 30.5, 3.3, Conv::Both, 29.9, 0.06},  // Qwen3-30B-A3B card
      {"Qwen3-235B-A22B", 235, 22, Conv::Both, 234},         // Qwen3-235B-A22B card
      {"DeepSeek-V2", 236, 21, Conv::Matmul, 0},             // DeepSeek-V2 paper
      {"DeepSeek-V3", 671, 36.6, Conv::Matmul, 0},           // DeepSeek-V3 README_WEIGHTS.md
      {"gpt-oss-120b", 116.83, 5.13, Conv::Matmul, 0},       // gpt-oss model card, Table 1
      {"gemma-2-9b", 9.24, 9.24, Conv::Both, 0},             // HF: 9.24 B
      {"gemma-3-27b-it", 27.016, 27.016, Conv::Both, 25.6},  // Gemma 3 report Table 1: 25,600 M + 1,416 M embedding
  };
  for (const Published& p : rows) {
    const ModelSpec m = load(p.dir);
    const double total = m.params() / 1e9;
    const double active = (p.conv == Conv::Both ? m.activeParams() : m.activeMatmulParams()) / 1e9;
    EXPECT_NEAR(total, p.total_b, 0.01 * p.total_b) << p.dir;
    EXPECT_NEAR(active, p.active_b, std::max(0.01 * p.active_b, p.active_abs_tol_b)) << p.dir;
    if (p.non_embedding_b > 0) {
      EXPECT_NEAR((m.params() - m.embeddingParams()) / 1e9, p.non_embedding_b, 0.01 * p.non_embedding_b) << p.dir;
    }
    EXPECT_LE(m.activeParams(), m.params()) << p.dir;
  }
  // gpt-oss's card splits its total: MLP 114.71 B, attention 0.96 B, embed + unembed 1.16 B.
  const ModelSpec oss = load("gpt-oss-120b");
  double mlp = 0;
  for (int l = 0; l < oss.layers; ++l) mlp += oss.layerExpertParams(l) + oss.hidden * oss.moe.experts;
  EXPECT_NEAR(mlp / 1e9, 114.71, 0.01 * 114.71);
  EXPECT_NEAR(oss.attnParams() * oss.layers / 1e9, 0.96, 0.01 * 0.96);
  EXPECT_NEAR(oss.embeddingParams() / 1e9, 1.16, 0.01 * 1.16);
  // DeepSeek-V3's MTP module: 11.5 B of its own (README_WEIGHTS.md), not in the 671 B.
  EXPECT_NEAR(load("DeepSeek-V3").mtpParams() / 1e9, 11.5, 0.02 * 11.5);
  // Gemma 3's embedding: 1,416 M in the report (262,208 x 5,376 = 1,409.6 M here).
  EXPECT_NEAR(load("gemma-3-27b-it").embeddingParams() / 1e6, 1416, 0.01 * 1416);
}

// The families' wiring: head_dim, windows, MoE layer rules, biases, tied
// embeddings and quantization read from the configs.
TEST(SimHfModel, FamiliesAreWiredAsTheirConfigClassesSay) {
  const ModelSpec q3 = load("Qwen3-32B");
  EXPECT_EQ(q3.source, "qwen3");
  EXPECT_EQ(q3.name, "Qwen3-32B");  // the directory's name: a config.json has none
  EXPECT_EQ(q3.headDim(), 128);     // 5120 / 64 = 80 would be wrong
  EXPECT_DOUBLE_EQ(q3.attnInParams(), 5120.0 * (64 * 128 + 2 * 8 * 128));
  EXPECT_EQ(q3.window, 0);  // use_sliding_window false

  const ModelSpec oss = load("gpt-oss-120b");
  EXPECT_EQ(oss.window, 128);
  ASSERT_EQ(oss.window_layers.size(), 36u);
  EXPECT_TRUE(oss.isWindowLayer(0));
  EXPECT_FALSE(oss.isWindowLayer(1));
  EXPECT_TRUE(oss.qkv_bias && oss.o_bias);
  EXPECT_DOUBLE_EQ(oss.expert_weight_bytes, 4.25 / 8);  // mxfp4 experts
  EXPECT_DOUBLE_EQ(oss.weight_bytes, 2);                 // attention stays bf16
  // 114.7 B expert weights at 4.25 bits + 2.1 B at 2 bytes: about 65 GB (fits one 80 GB GPU, as the card says).
  EXPECT_NEAR(oss.weightBytes() / 1e9, 114.71 * 4.25 / 8 + (116.83 - 114.71) * 2, 1.0);
  EXPECT_LT(oss.weightBytes(), 80e9);

  const ModelSpec v3 = load("DeepSeek-V3");
  EXPECT_DOUBLE_EQ(v3.weight_bytes, 1);  // quant_method fp8
  EXPECT_EQ(v3.moe.dense_layers, 3);
  EXPECT_FALSE(v3.isMoeLayer(2));
  EXPECT_TRUE(v3.isMoeLayer(3));
  EXPECT_EQ(v3.moeLayers(), 58);
  EXPECT_EQ(v3.moe.n_group, 8);
  EXPECT_EQ(v3.moe.topk_group, 4);
  EXPECT_EQ(v3.mtp_layers, 1);
  EXPECT_DOUBLE_EQ(v3.kvCacheElems(), 576);

  const ModelSpec qmoe = load("Qwen1.5-MoE-A2.7B");
  EXPECT_EQ(qmoe.moe.shared_experts, 1);
  EXPECT_DOUBLE_EQ(qmoe.sharedFfn(), 5632);  // one shared expert 4 x as wide as a routed one
  EXPECT_DOUBLE_EQ(qmoe.ffnPerToken(0), 4 * 1408 + 5632);
  EXPECT_TRUE(qmoe.qkv_bias);
  EXPECT_FALSE(qmoe.o_bias);

  const ModelSpec g2 = load("gemma-2-9b");
  EXPECT_TRUE(g2.tie_embeddings);
  EXPECT_EQ(g2.headDim(), 256);
  EXPECT_EQ(g2.window, 4096);
  EXPECT_TRUE(g2.isWindowLayer(0));
  EXPECT_FALSE(g2.isWindowLayer(1));
  EXPECT_EQ(g2.activation_name, "gelu_pytorch_tanh");
  EXPECT_DOUBLE_EQ(g2.embeddingParams(), 256000.0 * 3584);

  const ModelSpec g3 = load("gemma-3-27b-it");  // text_config nested in the multimodal config
  EXPECT_EQ(g3.source, "gemma3");
  EXPECT_EQ(g3.layers, 62);
  EXPECT_EQ(g3.vocab, 262208);  // Gemma3TextConfig's default: the file leaves it out
  EXPECT_EQ(g3.window, 1024);
  int global = 0;
  for (int l = 0; l < g3.layers; ++l) global += g3.isWindowLayer(l) ? 0 : 1;
  EXPECT_EQ(global, 10);  // every 6th of 62 layers
  EXPECT_FALSE(g3.isWindowLayer(5));

  const ModelSpec mistral = load("Mistral-7B-v0.1");
  EXPECT_EQ(mistral.window, 4096);
  EXPECT_TRUE(mistral.window_layers.empty());  // every layer
  EXPECT_EQ(load("Mixtral-8x7B-v0.1").window, 0);  // sliding_window null

  // Keys that do not change a shape are ignored and listed.
  const ModelSpec l8 = load("Llama-3.1-8B");
  auto has = [&](const std::string& k) {
    return std::find(l8.ignored_keys.begin(), l8.ignored_keys.end(), k) != l8.ignored_keys.end();
  };
  EXPECT_TRUE(has("rope_theta"));
  EXPECT_TRUE(has("rms_norm_eps"));
  EXPECT_FALSE(has("hidden_size"));
  EXPECT_FALSE(has("num_key_value_heads"));
  // A config.json given as a file works as its directory does.
  auto file = loadModel(preset("Llama-3.1-8B") + "/config.json");
  ASSERT_TRUE(file.isOk()) << file.status().message();
  EXPECT_EQ(file->name, "Llama-3.1-8B");
  EXPECT_DOUBLE_EQ(file->params(), l8.params());
}

// The chorus-format presets that tests and scripts use describe the same
// models as the HF configs: the same parameters (the chorus DeepSeek-V3 file
// is bf16, the HF one fp8).
TEST(SimHfModel, ChorusPresetsAgreeWithTheHfConfigs) {
  const std::pair<const char*, const char*> same[] = {{"llama3-8b.json", "Llama-3.1-8B"},
                                                      {"llama3-70b.json", "Llama-3.1-70B"},
                                                      {"llama3-405b.json", "Llama-3.1-405B"},
                                                      {"mixtral-8x7b.json", "Mixtral-8x7B-v0.1"},
                                                      {"deepseek-v3.json", "DeepSeek-V3"}};
  for (auto [chorus, hf] : same) {
    const ModelSpec a = load(chorus), b = load(hf);
    EXPECT_DOUBLE_EQ(a.params(), b.params()) << chorus;
    EXPECT_DOUBLE_EQ(a.activeParams(), b.activeParams()) << chorus;
    EXPECT_DOUBLE_EQ(a.kvCacheElems(), b.kvCacheElems()) << chorus;
  }
  EXPECT_DOUBLE_EQ(load("deepseek-v3.json").weightBytes() - load("DeepSeek-V3").weightBytes(),
                   (load("DeepSeek-V3").params() - load("DeepSeek-V3").embeddingParams()));  // 2 B vs 1 B per layer weight
}

TEST(SimHfModel, ChorusFormatHasTheSameConcepts) {
  auto m = parseModel(R"({"name": "t", "layers": 4, "hidden": 1000, "heads": 8, "kv_heads": 2, "head_dim": 128,
    "ffn_hidden": 3000, "vocab": 500, "activation": "geglu", "tie_embeddings": true, "weight_bytes": 1,
    "window": {"size": 256, "pattern": ["sliding", "full"]}, "qkv_bias": true,
    "moe": {"experts": 4, "top_k": 2, "expert_ffn_hidden": 500, "shared_experts": 1, "shared_expert_ffn_hidden": 1500,
            "dense_layers": 1, "sparse_step": 1, "dense_layer_list": [3]}})",
                      "t.json");
  ASSERT_TRUE(m.isOk()) << m.status().message();
  EXPECT_EQ(m->headDim(), 128);  // hidden 1000 is no multiple of 8 heads: head_dim says the width
  EXPECT_DOUBLE_EQ(m->attnParams(), 1000.0 * (8 * 128 + 2 * 2 * 128) + (8 * 128 + 2 * 2 * 128) + 8 * 128 * 1000.0);
  EXPECT_TRUE(m->isWindowLayer(0));
  EXPECT_FALSE(m->isWindowLayer(1));
  EXPECT_DOUBLE_EQ(m->attendedTokens(0, 1000), 256);
  EXPECT_DOUBLE_EQ(m->attendedTokens(1, 1000), 1000);
  EXPECT_FALSE(m->isMoeLayer(0));
  EXPECT_TRUE(m->isMoeLayer(1));
  EXPECT_TRUE(m->isMoeLayer(2));
  EXPECT_FALSE(m->isMoeLayer(3));  // dense_layer_list
  EXPECT_EQ(m->moeLayers(), 2);
  EXPECT_DOUBLE_EQ(m->ffnPerToken(1), 2 * 500 + 1500);
  EXPECT_DOUBLE_EQ(m->embeddingParams(), 500.0 * 1000);  // tied: once
  // Layer weights at 1 byte, the embedding at 2.
  double layers = 0;
  for (int l = 0; l < 4; ++l) layers += m->layerParams(l);
  EXPECT_DOUBLE_EQ(m->weightBytes(), layers * 1 + 500.0 * 1000 * 2);
  EXPECT_DOUBLE_EQ(m->params(), layers + 500.0 * 1000);
  EXPECT_DOUBLE_EQ(m->activeMatmulParams(), m->activeParams());  // tied: the head is the table
}

TEST(SimHfModel, UnknownKeysNameTheNearestValidKey) {
  auto typo = parseModel(R"({"name": "m", "layers": 2, "hidden": 64, "heads": 4, "head_dm": 32, "ffn_hidden": 64, "vocab": 10})",
                         "m.json");
  EXPECT_NE(errorOf(typo).find("m.json: unknown key 'head_dm' (did you mean 'head_dim'?)"), std::string::npos) << errorOf(typo);
  auto nested = parseModel(R"({"name": "m", "layers": 2, "hidden": 64, "heads": 4, "ffn_hidden": 64, "vocab": 10,
    "moe": {"experts": 4, "topk": 2, "expert_ffn_hidden": 16}})", "m.json");
  EXPECT_NE(errorOf(nested).find("unknown key 'moe.topk' (did you mean 'moe.top_k'?)"), std::string::npos) << errorOf(nested);
  auto far = parseModel(R"({"name": "m", "layers": 2, "hidden": 64, "heads": 4, "ffn_hidden": 64, "vocab": 10, "zzzzzzzz": 1})",
                        "m.json");
  EXPECT_NE(errorOf(far).find("unknown key 'zzzzzzzz' (valid here: name, layers"), std::string::npos) << errorOf(far);

  auto cluster = parseCluster(R"({"name": "x", "nodes": 1, "gpu": {"name": "g", "peak_tflop": 1, "hbm_gib": 1, "hbm_gbyte_s": 1},
    "node": {"gpus": 8, "nvlink_gbyte_s": 1, "nvlink_latency_us": 1},
    "network": {"topology": "fat-tree", "nics_per_node": 1, "nic_gbit_s": 1, "latency_us": 1, "oversubscription": 1}})", "c.json");
  ASSERT_FALSE(cluster.isOk());
  EXPECT_NE(cluster.status().message().find("c.json: unknown key 'gpu.peak_tflop' (did you mean 'gpu.peak_tflops'?)"),
            std::string::npos) << cluster.status().message();
  auto net = parseCluster(fixtures::clusterJson("fat-tree", 2, R"(, "leaf_node": 4)"), "c.json");
  ASSERT_FALSE(net.isOk());
  EXPECT_NE(net.status().message().find("'network.leaf_node' (did you mean 'network.leaf_nodes'?)"), std::string::npos)
      << net.status().message();
  // Every shipped cluster file still parses.
  for (const char* f : {"a100-superpod", "gb200-nvl72", "h100-rail", "tpu-torus3d"}) {
    auto c = loadCluster(std::string(CHORUS_SOURCE_DIR) + "/configs/clusters/" + f + ".json");
    EXPECT_TRUE(c.isOk()) << f << ": " << c.status().message();
  }
}

TEST(SimHfModel, UnsupportedFamiliesAndBadValuesAreClearErrors) {
  auto phi = parseModel(R"({"model_type": "phi3", "hidden_size": 64})", "config.json");
  EXPECT_NE(errorOf(phi).find("model_type 'phi3' is not supported (supported: llama, mistral, mixtral, qwen2"),
            std::string::npos) << errorOf(phi);
  auto arch = parseModel(R"({"architectures": ["FalconForCausalLM"]})", "config.json");
  EXPECT_NE(errorOf(arch).find("\"FalconForCausalLM\""), std::string::npos) << errorOf(arch);
  const std::string llama = R"("model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_attention_heads": 32, "vocab_size": 128256)";
  auto zero = parseModel("{" + llama + R"(, "num_hidden_layers": 0})", "config.json");
  EXPECT_NE(errorOf(zero).find("config.json: key 'num_hidden_layers' = 0 is out of range [1, 100000] (model_type llama)"),
            std::string::npos) << errorOf(zero);
  auto missing = parseModel("{" + llama + "}", "config.json");
  EXPECT_NE(errorOf(missing).find("missing key 'num_hidden_layers'"), std::string::npos) << errorOf(missing);
  auto kv = parseModel("{" + llama + R"(, "num_hidden_layers": 2, "num_key_value_heads": 5})", "config.json");
  EXPECT_NE(errorOf(kv).find("'num_attention_heads' = 32 is not a multiple of 'num_key_value_heads' = 5"), std::string::npos)
      << errorOf(kv);
  auto type = parseModel("{" + llama + R"(, "num_hidden_layers": "32"})", "config.json");
  EXPECT_NE(errorOf(type).find("key 'num_hidden_layers' = \"32\" must be an integer"), std::string::npos) << errorOf(type);
  auto quant = parseModel("{" + llama + R"(, "num_hidden_layers": 2, "quantization_config": {"quant_method": "hqq"}})",
                          "config.json");
  EXPECT_NE(errorOf(quant).find("'quantization_config.quant_method' = \"hqq\""), std::string::npos) << errorOf(quant);
  auto types = parseModel(R"({"model_type": "gpt_oss", "hidden_size": 64, "intermediate_size": 64, "num_attention_heads": 4,
    "num_hidden_layers": 2, "vocab_size": 10, "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 8,
    "layer_types": ["sliding_attention"]})", "config.json");
  EXPECT_NE(errorOf(types).find("'layer_types' must be an array of num_hidden_layers = 2 entries"), std::string::npos)
      << errorOf(types);
  auto topk = parseModel(R"({"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 64, "num_attention_heads": 4,
    "num_hidden_layers": 2, "vocab_size": 10, "num_local_experts": 4, "num_experts_per_tok": 9})", "config.json");
  EXPECT_NE(errorOf(topk).find("'num_experts_per_tok' = 9 is out of range [1, 4]"), std::string::npos) << errorOf(topk);
  auto gemma3 = parseModel(R"({"model_type": "gemma3"})", "config.json");
  EXPECT_NE(errorOf(gemma3).find("needs a 'text_config'"), std::string::npos) << errorOf(gemma3);
  auto dir = loadModel(std::string(CHORUS_SOURCE_DIR) + "/configs");
  ASSERT_FALSE(dir.isOk());
  EXPECT_NE(dir.status().message().find("is a directory without a config.json"), std::string::npos);
}

// A model_type the simulator does not know, whose architectures[0] is a class
// it does, is read as that family (Kimi K2 is DeepseekV3ForCausalLM): the
// same shapes as DeepSeek-V3's config; an unknown type with an unknown class
// is still refused, naming both.
TEST(SimHfModel, ArchitecturesNameTheFamilyOfAnUnknownModelType) {
  const ModelSpec v3 = load("DeepSeek-V3");
  nlohmann::json j = nlohmann::json::parse(slurp(preset("DeepSeek-V3") + "/config.json"));
  j["model_type"] = "kimi_k2";
  j["architectures"] = {"DeepseekV3ForCausalLM"};
  auto kimi = parseModel(j.dump(), "config.json");
  ASSERT_TRUE(kimi.isOk()) << kimi.status().message();
  EXPECT_EQ(kimi->params(), v3.params());
  EXPECT_EQ(kimi->moe.experts, 256);
  EXPECT_EQ(kimi->mla.kv_lora_rank, 512);
  EXPECT_NE(kimi->source.find("kimi_k2"), std::string::npos);
  j["architectures"] = {"KimiForCausalLM"};
  auto unknown = parseModel(j.dump(), "config.json");
  EXPECT_NE(errorOf(unknown).find("model_type 'kimi_k2' (architectures[0] = \"KimiForCausalLM\") is not supported"),
            std::string::npos) << errorOf(unknown);
}

// A key the parser does not read, within an edit distance of 2 of one it
// looked for and the file lacks, is refused with a did-you-mean: without it
// num_key_value_head would leave Llama-3.1-70B with 64 KV heads (MHA,
// 79.95 B instead of 70.6 B parameters, 8 x the KV cache).  Allowed, it is
// ignored and listed with the keys not read; a key far from every known one
// (rope_theta) is only listed.
TEST(SimHfModel, AMisspeltKeyIsRefusedWithDidYouMean) {
  nlohmann::json j = nlohmann::json::parse(slurp(preset("Llama-3.1-70B") + "/config.json"));
  j["num_key_value_head"] = j["num_key_value_heads"];
  j.erase("num_key_value_heads");
  auto typo = parseModel(j.dump(), "config.json");
  EXPECT_NE(errorOf(typo).find("unknown key 'num_key_value_head' (did you mean 'num_key_value_heads'?)"), std::string::npos)
      << errorOf(typo);
  EXPECT_NE(errorOf(typo).find("--allow-unknown-keys"), std::string::npos) << errorOf(typo);
  auto allowed = parseModel(j.dump(), "config.json", "", /*allow_unknown_keys=*/true);
  ASSERT_TRUE(allowed.isOk()) << allowed.status().message();
  EXPECT_EQ(allowed->kv_heads, 64);  // the default: num_attention_heads
  const auto& ig = allowed->ignored_keys;
  EXPECT_NE(std::find(ig.begin(), ig.end(), "num_key_value_head"), ig.end());
  // Every preset reads without a near miss.
  for (const char* dir : {"DeepSeek-V2", "DeepSeek-V3", "Llama-3.1-405B", "Llama-3.1-70B", "Llama-3.1-8B",
                          "Mistral-7B-v0.1", "Mixtral-8x7B-v0.1", "Qwen1.5-MoE-A2.7B", "Qwen2.5-7B", "Qwen3-235B-A22B",
                          "Qwen3-30B-A3B", "Qwen3-32B", "gemma-2-9b", "gemma-3-27b-it", "gpt-oss-120b"})
    EXPECT_TRUE(loadModel(preset(dir)).isOk()) << dir;
}

// `chorus-sim model`'s figures, derived by hand.
TEST(SimHfModel, ModelSummaryFigures) {
  // Llama-3.1-70B: KV per token = 80 layers x 2 (K, V) x 8 heads x 128 x 2 B = 327,680 B.
  auto l70 = describeModel(load("Llama-3.1-70B"), 8192);
  ASSERT_TRUE(l70.isOk());
  EXPECT_DOUBLE_EQ(l70->kv_bytes_per_token, 80.0 * 2 * 8 * 128 * 2);
  EXPECT_DOUBLE_EQ(l70->kv_bytes_at_seq, 80.0 * 2 * 8 * 128 * 2 * 8192);
  // Decode FLOPs at context 8192: 2 x (params - input embedding) + 80 x 2 x 64 heads x 256 x 8192.
  const ModelSpec m70 = load("Llama-3.1-70B");
  EXPECT_DOUBLE_EQ(l70->decode_flops_per_token, 2 * (m70.params() - 128256.0 * 8192) + 80.0 * 2 * 64 * 256 * 8192);
  // Prefill averages a causal sequence: (8192 + 1) / 2 positions per token.
  EXPECT_DOUBLE_EQ(l70->prefill_flops_per_token, 2 * (m70.params() - 128256.0 * 8192) + 80.0 * 2 * 64 * 256 * 8193.0 / 2);
  ASSERT_EQ(l70->layers.size(), 1u);
  EXPECT_EQ(l70->layers[0].last, 79);
  // Gemma-2: half the layers keep only 4096 tokens.
  auto g2 = describeModel(load("gemma-2-9b"), 8192);
  ASSERT_TRUE(g2.isOk());
  const double per_layer = 2.0 * 8 * 256 * 2;
  EXPECT_DOUBLE_EQ(g2->kv_bytes_per_token, 21 * per_layer);
  EXPECT_DOUBLE_EQ(g2->kv_bytes_at_seq, 21 * per_layer * 8192 + 21 * per_layer * 4096);
  ASSERT_EQ(g2->layers.size(), 2u);  // alternating sliding / full: two kinds of layer
  EXPECT_EQ(g2->layers[0].attention, "sliding 4096");
  EXPECT_EQ(g2->layers[0].indices.size(), 21u);
  EXPECT_EQ(g2->layers[1].indices[0], 1);
  // DeepSeek-V3: 3 dense layers then 58 MoE ones; the MLA latent cache.
  auto v3 = describeModel(load("DeepSeek-V3"), 4096);
  ASSERT_TRUE(v3.isOk());
  ASSERT_EQ(v3->layers.size(), 2u);
  EXPECT_EQ(v3->layers[0].ffn, "dense");
  EXPECT_EQ(v3->layers[1].first, 3);
  EXPECT_DOUBLE_EQ(v3->kv_bytes_per_token, 61.0 * 576 * 2);
  EXPECT_FALSE(describeModel(load("DeepSeek-V3"), 0).isOk());
}

// chorus-sim's numeric flags: every one has a range, and the message names it.
TEST(SimCli, NumericFlagsHaveRanges) {
  auto msg = [](const Status& s) { return s.isOk() ? std::string("(ok)") : s.message(); };
  TrainConfig t;
  t.gpus = 8, t.tp = 8, t.global_batch = 64, t.seq = 2048;
  EXPECT_TRUE(checkTrainArgs(t).isOk());
  TrainConfig b = t;
  b.global_batch = -64;
  EXPECT_NE(msg(checkTrainArgs(b)).find("--global-batch -64: must be in [1, "), std::string::npos) << msg(checkTrainArgs(b));
  b = t, b.seq = 0;
  EXPECT_NE(msg(checkTrainArgs(b)).find("--seq 0: must be in [1, "), std::string::npos);
  b = t, b.gpus = 0;
  EXPECT_NE(msg(checkTrainArgs(b)).find("--gpus 0"), std::string::npos);
  b = t, b.pp = -1;
  EXPECT_NE(msg(checkTrainArgs(b)).find("--pp -1"), std::string::npos);
  b = t, b.zero = 4;
  EXPECT_NE(msg(checkTrainArgs(b)).find("--zero 4: must be in [0, 3]"), std::string::npos);
  auto mb = parseMicroBatch("0");
  ASSERT_FALSE(mb.isOk());
  EXPECT_NE(mb.status().message().find("--micro-batch 0: must be in [1, "), std::string::npos) << mb.status().message();
  EXPECT_FALSE(parseMicroBatch("2x").isOk());
  EXPECT_EQ(*parseMicroBatch("auto"), 0);
  EXPECT_EQ(*parseMicroBatch("4"), 4);

  SearchConfig s;
  s.gpus = 8, s.global_batch = 0;
  EXPECT_NE(msg(checkSearchArgs(s)).find("--global-batch 0"), std::string::npos);

  EXPECT_NE(msg(checkCollectiveArgs(0, 1024)).find("--gpus 0: must be in [1, "), std::string::npos);
  EXPECT_TRUE(checkCollectiveArgs(8, 0).isOk());
  EXPECT_FALSE(chorus::parseSize("-5", "--bytes").isOk());

  InferConfig i;
  EXPECT_TRUE(checkInferConfig(i).isOk());
  InferConfig j = i;
  j.rate = -1;
  EXPECT_NE(msg(checkInferConfig(j)).find("--rate -1: must be in "), std::string::npos) << msg(checkInferConfig(j));
  j = i, j.input_len = 0;
  EXPECT_NE(msg(checkInferConfig(j)).find("--input 0: must be in [1, "), std::string::npos);
  j = i, j.output_len = -3;
  EXPECT_NE(msg(checkInferConfig(j)).find("--output -3"), std::string::npos);
  j = i, j.rate = std::nan("");
  EXPECT_FALSE(checkInferConfig(j).isOk());
  j = i, j.max_batch = 0;
  EXPECT_NE(msg(checkInferConfig(j)).find("--max-batch 0"), std::string::npos);
}

}  // namespace
}  // namespace chorus::sim

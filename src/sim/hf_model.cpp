// Hugging Face config.json -> ModelSpec, for the model families whose shapes
// the simulator prices: the keys of transformers' configuration classes
// (configuration_<model_type>.py), their defaults where released config
// files leave a key out, and the per-family wiring those classes imply (which
// layers slide, which are MoE, which projections carry biases).  Keys that do
// not change a shape (rope, norms' epsilon, token ids, ...) are ignored and
// listed in ModelSpec::ignored_keys.
#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "sim/config.hpp"

namespace chorus::sim {
namespace {

using nlohmann::json;

constexpr std::string_view kSupported =
    "llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe, deepseek_v2, deepseek_v3, gpt_oss, gemma2, gemma3 "
    "(or its text part, gemma3_text)";

// architectures[0] -> model_type, for a config that names only its class.
const std::map<std::string, std::string>& archTypes() {
  static const std::map<std::string, std::string> m{
      {"LlamaForCausalLM", "llama"},         {"MistralForCausalLM", "mistral"},
      {"MixtralForCausalLM", "mixtral"},     {"Qwen2ForCausalLM", "qwen2"},
      {"Qwen2MoeForCausalLM", "qwen2_moe"},  {"Qwen3ForCausalLM", "qwen3"},
      {"Qwen3MoeForCausalLM", "qwen3_moe"},  {"DeepseekV2ForCausalLM", "deepseek_v2"},
      {"DeepseekV3ForCausalLM", "deepseek_v3"}, {"GptOssForCausalLM", "gpt_oss"},
      {"Gemma2ForCausalLM", "gemma2"},       {"Gemma3ForCausalLM", "gemma3_text"},
      {"Gemma3ForConditionalGeneration", "gemma3"}};
  return m;
}

// One config object: typed reads that remember which keys were used.
class Hf {
 public:
  Hf(const json& j, std::string where, std::string type, std::string prefix = "")
      : j_(j), where_(std::move(where)), type_(std::move(type)), prefix_(std::move(prefix)) {}

  // Marks k as read.
  void use(const std::string& k) { used_.insert(k); }
  // Present and not null (released configs write null for "not used").
  [[nodiscard]] bool has(const std::string& k) {
    used_.insert(k);
    return j_.contains(k) && !j_.at(k).is_null();
  }
  Status integer(const std::string& k, int64_t* out, int64_t lo, int64_t hi, bool required) {
    if (!has(k)) return required ? err("missing key '{}'", name(k)) : Status();
    const json& v = j_.at(k);
    if (!v.is_number_integer()) return err("key '{}' = {} must be an integer", name(k), v.dump());
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi) return err("key '{}' = {} is out of range [{}, {}]", name(k), x, lo, hi);
    *out = x;
    return {};
  }
  template <typename I>
  Status integer(const std::string& k, I* out, int64_t lo, int64_t hi, bool required) {
    int64_t x = *out;
    CHORUS_RETURN_IF_ERROR(integer(k, &x, lo, hi, required));
    *out = static_cast<I>(x);
    return {};
  }
  Status boolean(const std::string& k, bool* out) {
    if (!has(k)) return {};
    const json& v = j_.at(k);
    if (!v.is_boolean()) return err("key '{}' = {} must be true or false", name(k), v.dump());
    *out = v.get<bool>();
    return {};
  }
  Status str(const std::string& k, std::string* out) {
    if (!has(k)) return {};
    const json& v = j_.at(k);
    if (!v.is_string()) return err("key '{}' = {} must be a string", name(k), v.dump());
    *out = v.get<std::string>();
    return {};
  }
  // An array of layer indices in [0, layers).
  Status layerList(const std::string& k, int layers, std::vector<int>* out) {
    if (!has(k)) return {};
    const json& v = j_.at(k);
    if (!v.is_array()) return err("key '{}' = {} must be an array of layer indices", name(k), v.dump());
    for (const json& e : v) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= layers)
        return err("key '{}' has {}, not a layer index in [0, {}]", name(k), e.dump(), layers - 1);
      out->push_back(e.get<int>());
    }
    return {};
  }
  const json& at(const std::string& k) { return j_.at(k); }
  template <typename... A>
  Status err(fmt::format_string<A...> f, A&&... a) const {
    return invalidArgument("{}: {} (model_type {})", where_, fmt::format(f, std::forward<A>(a)...), type_);
  }
  [[nodiscard]] std::string name(const std::string& k) const { return prefix_ + k; }
  // Keys of the file that were not read but lie within a small edit
  // distance of a key the parser looked for and the file lacks (a likely
  // typo: num_key_value_head for num_key_value_heads): (given, meant).
  void nearMisses(std::vector<std::pair<std::string, std::string>>* out) const {
    for (const auto& [k, v] : j_.items()) {
      if (used_.count(k)) continue;
      for (const std::string& u : used_) {
        if (j_.contains(u)) continue;
        const size_t d = keyDistance(k, u);
        if (d > 0 && d <= 2 && 4 * d <= u.size()) {
          out->push_back({prefix_ + k, prefix_ + u});
          break;
        }
      }
    }
  }
  void ignored(std::vector<std::string>* out) const {
    for (const auto& [k, v] : j_.items())
      if (!used_.count(k)) out->push_back(prefix_ + k);
  }
  [[nodiscard]] const std::string& type() const { return type_; }

 private:
  const json& j_;
  std::string where_, type_, prefix_;
  std::set<std::string> used_;
};

bool isAny(const std::string& t, std::initializer_list<std::string_view> set) {
  return std::find(set.begin(), set.end(), t) != set.end();
}

// Which layers slide: transformers' `layer_types` when the file has it, else
// each family's rule.
Status readWindow(Hf& hf, ModelSpec& m) {
  const std::string& t = hf.type();
  if (t == "llama" || t == "deepseek_v2" || t == "deepseek_v3") return {};
  const bool qwen = isAny(t, {"qwen2", "qwen2_moe", "qwen3", "qwen3_moe"});
  bool use = true;
  if (qwen) {
    use = false;
    CHORUS_RETURN_IF_ERROR(hf.boolean("use_sliding_window", &use));
  }
  int64_t w = t == "gemma2" || t == "gemma3_text" ? 4096 : 0;  // Gemma*Config's default
  CHORUS_RETURN_IF_ERROR(hf.integer("sliding_window", &w, 1, int64_t{1} << 40, false));
  int64_t max_window_layers = m.layers, pattern = 6;
  if (qwen) CHORUS_RETURN_IF_ERROR(hf.integer("max_window_layers", &max_window_layers, 0, m.layers, false));
  if (t == "gemma3_text") CHORUS_RETURN_IF_ERROR(hf.integer("sliding_window_pattern", &pattern, 1, m.layers, false));
  std::vector<bool> sliding;
  if (hf.has("layer_types")) {
    const json& v = hf.at("layer_types");
    if (!v.is_array() || v.size() != static_cast<size_t>(m.layers))
      return hf.err("key '{}' must be an array of num_hidden_layers = {} entries", hf.name("layer_types"), m.layers);
    for (const json& e : v) {
      const std::string s = e.is_string() ? e.get<std::string>() : "";
      if (s != "sliding_attention" && s != "full_attention")
        return hf.err("key '{}' has {}, not \"sliding_attention\" or \"full_attention\"", hf.name("layer_types"), e.dump());
      sliding.push_back(s == "sliding_attention");
    }
  } else {
    for (int l = 0; l < m.layers; ++l) {
      if (qwen) sliding.push_back(l >= max_window_layers);             // Qwen2Attention: layer_idx >= max_window_layers
      else if (t == "gemma2" || t == "gpt_oss") sliding.push_back(l % 2 == 0);  // even layers slide
      else if (t == "gemma3_text") sliding.push_back((l + 1) % pattern != 0);   // every pattern-th layer is global
      else sliding.push_back(true);                                       // mistral, mixtral: every layer
    }
  }
  if (!use || w == 0 || std::none_of(sliding.begin(), sliding.end(), [](bool b) { return b; })) return {};
  m.window = w;
  if (std::all_of(sliding.begin(), sliding.end(), [](bool b) { return b; })) return {};
  m.window_layers = sliding;
  return {};
}

Status readQuantization(Hf& hf, ModelSpec& m) {
  if (!hf.has("quantization_config")) return {};
  const json& q = hf.at("quantization_config");
  if (!q.is_object()) return hf.err("key 'quantization_config' = {} must be an object", q.dump());
  const std::string method = q.contains("quant_method") && q.at("quant_method").is_string() ? q.at("quant_method").get<std::string>() : "";
  if (method == "fp8" || method == "fbgemm_fp8") {
    // Every linear layer in fp8 (DeepSeek-V3: e4m3 with a 128 x 128 block's
    // fp32 scale, 1/16384 of a byte per weight, not counted).
    m.weight_bytes = 1;
    m.weight_format = "fp8";
    return {};
  }
  if (method == "mxfp4") {
    // OCP microscaling fp4: 4-bit elements, one 8-bit scale per 32 = 4.25
    // bits; gpt-oss quantizes the experts only (attention, router, embedding
    // and head are in its modules_to_not_convert).
    (m.moe.experts > 0 ? m.expert_weight_bytes : m.weight_bytes) = 4.25 / 8;
    m.weight_format = m.moe.experts > 0 ? "bf16, experts mxfp4" : "mxfp4";
    return {};
  }
  if (q.contains("bits") && q.at("bits").is_number_integer()) {  // gptq, awq: integer weights of `bits`
    const int64_t bits = q.at("bits").get<int64_t>();
    if (bits < 1 || bits > 16) return hf.err("key 'quantization_config.bits' = {} is out of range [1, 16]", bits);
    m.weight_bytes = static_cast<double>(bits) / 8;
    m.weight_format = fmt::format("{} ({}-bit)", method, bits);
    return {};
  }
  return hf.err("key 'quantization_config.quant_method' = \"{}\" is not one the simulator prices (fp8, fbgemm_fp8, "
                "mxfp4, or a method with integer 'bits')", method);
}

Result<ModelSpec> parseOne(Hf& hf, std::string_view where) {
  const std::string& t = hf.type();
  ModelSpec m;
  m.source = t;
  m.activation = Activation::SwiGlu;  // every supported family has a gated MLP
  m.dropout = false;
  m.tie_embeddings = t == "gemma2" || t == "gemma3_text";  // each config class's default
  CHORUS_RETURN_IF_ERROR(hf.integer("num_hidden_layers", &m.layers, 1, 100000, true));
  CHORUS_RETURN_IF_ERROR(hf.integer("hidden_size", &m.hidden, 1, 10000000, true));
  CHORUS_RETURN_IF_ERROR(hf.integer("num_attention_heads", &m.heads, 1, 100000, true));
  m.kv_heads = m.heads;
  CHORUS_RETURN_IF_ERROR(hf.integer("num_key_value_heads", &m.kv_heads, 1, m.heads, false));
  if (m.heads % m.kv_heads != 0)
    return hf.err("key 'num_attention_heads' = {} is not a multiple of 'num_key_value_heads' = {}", m.heads, m.kv_heads);
  if (t == "gemma2" || t == "gemma3_text") m.head_dim = 256;  // Gemma*Config's default
  CHORUS_RETURN_IF_ERROR(hf.integer("head_dim", &m.head_dim, 1, 100000, false));
  if (m.head_dim == 0 && m.hidden % m.heads != 0)
    return hf.err("key 'hidden_size' = {} is not a multiple of 'num_attention_heads' = {} and there is no 'head_dim'",
                  m.hidden, m.heads);
  if (m.head_dim == m.hidden / m.heads && m.hidden % m.heads == 0) m.head_dim = 0;  // the default, said explicitly
  if (t == "gemma3_text") m.vocab = 262208;  // Gemma3TextConfig's default (the released 27B leaves it out)
  CHORUS_RETURN_IF_ERROR(hf.integer("vocab_size", &m.vocab, 1, 100000000, m.vocab == 0));
  CHORUS_RETURN_IF_ERROR(hf.integer("intermediate_size", &m.ffn_hidden, 1, 100000000, true));
  CHORUS_RETURN_IF_ERROR(hf.boolean("tie_word_embeddings", &m.tie_embeddings));
  m.activation_name = "silu";
  CHORUS_RETURN_IF_ERROR(hf.str("hidden_act", &m.activation_name));
  CHORUS_RETURN_IF_ERROR(hf.str("hidden_activation", &m.activation_name));  // gemma2/3 spell it so
  bool bias = false;
  CHORUS_RETURN_IF_ERROR(hf.boolean("attention_bias", &bias));
  m.qkv_bias = bias || t == "qwen2" || t == "qwen2_moe";  // Qwen2's q, k, v projections always have biases
  m.o_bias = bias;
  CHORUS_RETURN_IF_ERROR(readWindow(hf, m));

  if (t == "mixtral" || t == "gpt_oss") {
    CHORUS_RETURN_IF_ERROR(hf.integer("num_local_experts", &m.moe.experts, 1, 100000, true));
    if (t == "gpt_oss" && !hf.has("num_experts_per_tok"))
      CHORUS_RETURN_IF_ERROR(hf.integer("experts_per_token", &m.moe.top_k, 1, m.moe.experts, true));
    else
      CHORUS_RETURN_IF_ERROR(hf.integer("num_experts_per_tok", &m.moe.top_k, 1, m.moe.experts, true));
    hf.use("experts_per_token");
    m.moe.expert_ffn_hidden = m.ffn_hidden;  // every layer's MLP is the experts, each intermediate_size wide
  } else if (t == "qwen2_moe" || t == "qwen3_moe") {
    CHORUS_RETURN_IF_ERROR(hf.integer("num_experts", &m.moe.experts, 1, 100000, true));
    CHORUS_RETURN_IF_ERROR(hf.integer("num_experts_per_tok", &m.moe.top_k, 1, m.moe.experts, true));
    CHORUS_RETURN_IF_ERROR(hf.integer("moe_intermediate_size", &m.moe.expert_ffn_hidden, 1, 100000000, true));
    CHORUS_RETURN_IF_ERROR(hf.integer("decoder_sparse_step", &m.moe.sparse_step, 1, m.layers, false));
    CHORUS_RETURN_IF_ERROR(hf.layerList("mlp_only_layers", m.layers, &m.moe.dense_list));
    if (t == "qwen2_moe") {
      int64_t shared = 0;
      CHORUS_RETURN_IF_ERROR(hf.integer("shared_expert_intermediate_size", &shared, 0, 100000000, false));
      if (shared > 0) m.moe.shared_experts = 1, m.moe.shared_expert_ffn_hidden = shared;
    }
  } else if (t == "deepseek_v2" || t == "deepseek_v3") {
    if (hf.has("n_routed_experts")) {
      CHORUS_RETURN_IF_ERROR(hf.integer("n_routed_experts", &m.moe.experts, 1, 100000, true));
      CHORUS_RETURN_IF_ERROR(hf.integer("num_experts_per_tok", &m.moe.top_k, 1, m.moe.experts, true));
      CHORUS_RETURN_IF_ERROR(hf.integer("moe_intermediate_size", &m.moe.expert_ffn_hidden, 1, 100000000, true));
      CHORUS_RETURN_IF_ERROR(hf.integer("n_shared_experts", &m.moe.shared_experts, 0, 1000, false));
      CHORUS_RETURN_IF_ERROR(hf.integer("first_k_dense_replace", &m.moe.dense_layers, 0, m.layers, false));
      CHORUS_RETURN_IF_ERROR(hf.integer("moe_layer_freq", &m.moe.sparse_step, 1, m.layers, false));
      m.moe.step_from_zero = true;  // DeepseekV2DecoderLayer: layer_idx % moe_layer_freq == 0
      CHORUS_RETURN_IF_ERROR(hf.integer("n_group", &m.moe.n_group, 1, m.moe.experts, false));
      CHORUS_RETURN_IF_ERROR(hf.integer("topk_group", &m.moe.topk_group, 1, std::max(m.moe.n_group, 1), false));
      if (m.moe.n_group > 0 && m.moe.experts % m.moe.n_group != 0)
        return hf.err("key 'n_group' = {} does not divide 'n_routed_experts' = {}", m.moe.n_group, m.moe.experts);
    }
    CHORUS_RETURN_IF_ERROR(hf.integer("q_lora_rank", &m.mla.q_lora_rank, 1, 1000000, false));
    CHORUS_RETURN_IF_ERROR(hf.integer("kv_lora_rank", &m.mla.kv_lora_rank, 1, 1000000, true));
    CHORUS_RETURN_IF_ERROR(hf.integer("qk_nope_head_dim", &m.mla.qk_nope_head_dim, 1, 100000, true));
    CHORUS_RETURN_IF_ERROR(hf.integer("qk_rope_head_dim", &m.mla.qk_rope_head_dim, 0, 100000, true));
    CHORUS_RETURN_IF_ERROR(hf.integer("v_head_dim", &m.mla.v_head_dim, 1, 100000, true));
    if (m.kv_heads != m.heads)
      return hf.err("key 'num_key_value_heads' = {} must equal 'num_attention_heads' = {} under MLA", m.kv_heads, m.heads);
    CHORUS_RETURN_IF_ERROR(hf.integer("num_nextn_predict_layers", &m.mtp_layers, 0, 64, false));
  }
  if (m.moe.experts > 0 && m.moeLayers() == 0)
    return hf.err("the MoE keys leave no layer with experts");
  CHORUS_RETURN_IF_ERROR(readQuantization(hf, m));
  (void)where;
  return m;
}

}  // namespace

std::string_view hfSupportedModelTypes() { return kSupported; }

Result<ModelSpec> parseHfModel(std::string_view text, std::string_view where, std::string_view name,
                               bool allow_unknown_keys) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false, /*ignore_comments=*/true);
  if (j.is_discarded() || !j.is_object()) return invalidArgument("{}: not a JSON object", where);
  std::string type;
  if (j.contains("model_type") && j.at("model_type").is_string()) {
    type = j.at("model_type").get<std::string>();
  } else if (j.contains("architectures") && j.at("architectures").is_array() && !j.at("architectures").empty() &&
             j.at("architectures")[0].is_string()) {
    const std::string arch = j.at("architectures")[0].get<std::string>();
    auto it = archTypes().find(arch);
    if (it == archTypes().end())
      return invalidArgument("{}: architectures[0] = \"{}\" and no model_type: not a supported model (model_type: {})",
                             where, arch, kSupported);
    type = it->second;
  } else {
    return invalidArgument("{}: key 'model_type' must be a string (supported: {})", where, kSupported);
  }
  static const std::vector<std::string_view> kTypes{"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3",
                                                     "qwen3_moe", "deepseek_v2", "deepseek_v3", "gpt_oss", "gemma2",
                                                     "gemma3", "gemma3_text"};
  std::string read_as;  // a model_type read as architectures[0]'s family
  if (std::find(kTypes.begin(), kTypes.end(), type) == kTypes.end()) {
    // A family of its own name whose class is one the simulator knows
    // (kimi_k2: DeepseekV3ForCausalLM) is read as that class's family.
    std::string arch;
    if (j.contains("architectures") && j.at("architectures").is_array() && !j.at("architectures").empty() &&
        j.at("architectures")[0].is_string())
      arch = j.at("architectures")[0].get<std::string>();
    auto it = archTypes().find(arch);
    if (it == archTypes().end())
      return invalidArgument("{}: model_type '{}'{} is not supported (supported: {}; or an architectures[0] of {})",
                             where, type, arch.empty() ? "" : fmt::format(" (architectures[0] = \"{}\")", arch),
                             kSupported, "their *ForCausalLM classes");
    read_as = type;
    type = it->second;
  }

  Hf top(j, std::string(where), type);
  top.use("model_type");
  top.use("architectures");
  std::string given;
  CHORUS_RETURN_IF_ERROR(top.str("_name_or_path", &given));
  ModelSpec m;
  std::vector<std::string> ignored;
  std::vector<std::pair<std::string, std::string>> near;
  if (type == "gemma3") {
    // The multimodal wrapper: the language model is text_config (the vision
    // tower is not simulated).
    if (!top.has("text_config") || !top.at("text_config").is_object())
      return invalidArgument("{}: model_type 'gemma3' needs a 'text_config' object (the language model)", where);
    Hf text(top.at("text_config"), std::string(where), "gemma3_text", "text_config.");
    text.use("model_type");
    CHORUS_ASSIGN_OR_RETURN(m, parseOne(text, where));
    // A quantization_config belongs to the top level.
    CHORUS_RETURN_IF_ERROR(readQuantization(top, m));
    text.ignored(&ignored);
    text.nearMisses(&near);
  } else {
    CHORUS_ASSIGN_OR_RETURN(m, parseOne(top, where));
  }
  top.ignored(&ignored);
  std::sort(ignored.begin(), ignored.end());
  if (!allow_unknown_keys) {
    top.nearMisses(&near);
    if (!near.empty()) {
      std::string list;
      for (const auto& [given_key, meant] : near)
        list += fmt::format("{}'{}' (did you mean '{}'?)", list.empty() ? "" : ", ", given_key, meant);
      return invalidArgument("{}: unknown key {} (model_type {}): a misspelt key would be ignored and its default "
                             "used; correct it, or pass --allow-unknown-keys to ignore it",
                             where, list, type);
    }
  }
  m.ignored_keys = std::move(ignored);
  m.source = read_as.empty() ? type : fmt::format("{} (read as {})", read_as, type);
  m.name = !given.empty() ? given : !name.empty() ? std::string(name) : type;
  return m;
}

}  // namespace chorus::sim

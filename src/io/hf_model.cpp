#include "io/hf_model.hpp"

#include "core/error.hpp"
#include "core/files.hpp"
#include "io/safetensors.hpp"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <string>

namespace pf {

namespace {

// transformers' names of the two GELUs (ACT2FN): "gelu" is erf's, "gelu_new" GPT-2's tanh form.
const char* hf_activation(const ModelConfig& m) { return m.gelu == Gelu::Tanh ? "gelu_new" : "gelu"; }

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Each architecture's config.json, in transformers' names and keys.
nlohmann::ordered_json bert_config(const ModelConfig& m) {
  return {{"architectures", {"BertForPreTraining"}},
          {"model_type", "bert"},
          {"vocab_size", m.vocab},
          {"hidden_size", m.hidden},
          {"num_hidden_layers", m.layers},
          {"num_attention_heads", m.heads},
          {"intermediate_size", m.ffn},
          {"hidden_act", hf_activation(m)},
          {"hidden_dropout_prob", float_as_written(m.dropout)},
          {"attention_probs_dropout_prob", 0.0},
          {"max_position_embeddings", m.max_position},
          {"type_vocab_size", m.type_vocab},
          {"initializer_range", float_as_written(m.init_std)},
          {"layer_norm_eps", float_as_written(m.layer_norm_eps)},
          {"pad_token_id", 0},
          {"position_embedding_type", "absolute"},
          {"tie_word_embeddings", true},
          {"torch_dtype", "float32"}};
}

nlohmann::ordered_json gpt2_config(const ModelConfig& m) {
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", m.vocab},
          {"n_positions", m.max_position},
          {"n_ctx", m.max_position},
          {"n_embd", m.hidden},
          {"n_layer", m.layers},
          {"n_head", m.heads},
          {"n_inner", m.ffn},
          {"activation_function", hf_activation(m)},
          {"resid_pdrop", float_as_written(m.dropout)},
          {"embd_pdrop", float_as_written(m.dropout)},
          {"attn_pdrop", 0.0},
          {"layer_norm_epsilon", float_as_written(m.layer_norm_eps)},
          {"initializer_range", float_as_written(m.init_std)},
          {"bos_token_id", 50256},
          {"eos_token_id", 50256},
          {"tie_word_embeddings", true},
          {"torch_dtype", "float32"}};
}

nlohmann::ordered_json llama_config(const ModelConfig& m) {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", m.vocab},
          {"hidden_size", m.hidden},
          {"intermediate_size", m.ffn},
          {"num_hidden_layers", m.layers},
          {"num_attention_heads", m.heads},
          {"num_key_value_heads", kv_heads_of(m)},
          {"head_dim", m.hidden / m.heads},
          {"hidden_act", "silu"},
          {"max_position_embeddings", m.max_position},
          {"initializer_range", float_as_written(m.init_std)},
          {"rms_norm_eps", float_as_written(m.layer_norm_eps)},
          {"rope_theta", m.rope_theta},
          {"rope_scaling", nullptr},
          {"attention_bias", false},
          {"mlp_bias", false},
          {"attention_dropout", 0.0},
          {"pretraining_tp", 1},
          {"bos_token_id", 50256},
          {"eos_token_id", 50256},
          {"tie_word_embeddings", m.tie_embeddings},
          {"torch_dtype", "float32"}};
}

}  // namespace

std::string hf_config_json(const ModelConfig& m) {
  const nlohmann::ordered_json j = m.arch == Arch::Bert    ? bert_config(m)
                                   : m.arch == Arch::Llama ? llama_config(m)
                                                           : gpt2_config(m);
  return j.dump(2) + "\n";
}

namespace {

// A whole number field of config.json; `fallback` when it is absent or null (< 0: required).
int64_t hf_int(const nlohmann::json& j, const char* field, const std::string& file, int64_t fallback = -1) {
  if (!j.contains(field) || j[field].is_null()) {
    if (fallback >= 0) return fallback;
    usage_error("--init", "'{}' has no {}", file, field);
  }
  if (!j[field].is_number_integer() || j[field].get<int64_t>() <= 0)
    usage_error("--init", "'{}': {} is {}, not a positive whole number", file, field, j[field].dump());
  if (j[field].get<int64_t>() > (int64_t{1} << 30))
    usage_error("--init", "'{}': {} is {}, over the bound of 2^30 = {} (no model of that size is held)", file, field,
                j[field].dump(), int64_t{1} << 30);
  return j[field].get<int64_t>();
}

// A real field as its shortest text, or "" when absent.
std::string hf_real(const nlohmann::json& j, const char* field, const std::string& file) {
  if (!j.contains(field) || j[field].is_null()) return "";
  if (!j[field].is_number()) usage_error("--init", "'{}': {} is {}, not a number", file, field, j[field].dump());
  return fmt::format("{}", j[field].get<double>());
}

// A text field of config.json, `fallback` when absent or null.
std::string hf_text(const nlohmann::json& j, const char* field, const std::string& file, const char* fallback) {
  if (!j.contains(field) || j[field].is_null()) return fallback;
  if (!j[field].is_string()) usage_error("--init", "'{}': {} is {}, not a string", file, field, j[field].dump());
  return j[field].get<std::string>();
}

// transformers' activation names of the two GELUs we compute.
std::string hf_gelu(const nlohmann::json& j, const char* field, const std::string& file) {
  const std::string act = hf_text(j, field, file, "gelu");
  if (act == "gelu") return "erf";
  if (act == "gelu_new" || act == "gelu_pytorch_tanh" || act == "gelu_fast") return "tanh";
  usage_error("--init", "'{}': {} '{}' is not a GELU we compute (gelu, gelu_new)", file, field, act);
}

// A field that must be absent, null or `ours`: what LlamaForCausalLM can vary and we do not compute.
void require_default(const nlohmann::json& j, const char* field, const nlohmann::json& ours, const std::string& file,
                     const char* what) {
  if (!j.contains(field) || j[field].is_null() || j[field] == ours) return;
  usage_error("--init", "'{}': {} is {}; {} is not implemented here (only {})", file, field, j[field].dump(), what,
              ours.is_null() ? "null" : ours.dump());
}

// LlamaForCausalLM's config.json as our keys; what we do not implement (rope scaling, biases, an
// activation other than SiLU, a head size other than hidden / heads) is refused naming the field.
std::vector<std::string> llama_sets(const nlohmann::json& j, const std::string& file) {
  require_default(j, "rope_scaling", nullptr, file, "rotary scaling");
  require_default(j, "attention_bias", false, file, "a bias in the attention's projections");
  require_default(j, "mlp_bias", false, file, "a bias in the MLP's projections");
  require_default(j, "hidden_act", "silu", file, "an MLP activation other than SiLU");
  const int64_t hidden = hf_int(j, "hidden_size", file), heads = hf_int(j, "num_attention_heads", file);
  require_default(j, "head_dim", hidden / heads, file, "a head size other than hidden_size / num_attention_heads");
  bool tied = false;  // LlamaConfig's default
  if (j.contains("tie_word_embeddings") && !j["tie_word_embeddings"].is_null()) {
    if (!j["tie_word_embeddings"].is_boolean())
      usage_error("--init", "'{}': tie_word_embeddings is {}, not true or false", file, j["tie_word_embeddings"].dump());
    tied = j["tie_word_embeddings"].get<bool>();
  }
  std::vector<std::string> sets{"model.arch=llama", fmt::format("model.layers={}", hf_int(j, "num_hidden_layers", file)),
                                fmt::format("model.hidden={}", hidden), fmt::format("model.heads={}", heads),
                                fmt::format("model.kv_heads={}", hf_int(j, "num_key_value_heads", file, heads)),
                                fmt::format("model.ffn={}", hf_int(j, "intermediate_size", file)),
                                fmt::format("model.vocab={}", hf_int(j, "vocab_size", file)),
                                fmt::format("model.max_position={}", hf_int(j, "max_position_embeddings", file)),
                                fmt::format("model.tie_embeddings={}", tied)};
  for (const auto& [field, key] : {std::pair{"rms_norm_eps", "model.layer_norm_eps"}, std::pair{"rope_theta", "model.rope_theta"}})
    if (const std::string v = hf_real(j, field, file); !v.empty()) sets.push_back(fmt::format("{}={}", key, v));
  return sets;
}

}  // namespace

std::vector<std::string> hf_model_sets(const std::string& json_text, const std::string& file) {
  const auto j = nlohmann::json::parse(json_text, nullptr, false);
  if (!j.is_object()) usage_error("--init", "'{}' is not a JSON object (a Hugging Face config.json)", file);
  const std::string type = hf_text(j, "model_type", file, "");
  std::vector<std::string> sets;
  auto set = [&](const char* key, const auto& v) {
    if (!fmt::format("{}", v).empty()) sets.push_back(fmt::format("{}={}", key, v));
  };
  if (type == "bert") {
    const std::string positions = hf_text(j, "position_embedding_type", file, "absolute");
    if (positions != "absolute")
      usage_error("--init", "'{}': position_embedding_type '{}' is not ours (absolute)", file, positions);
    set("model.arch", "bert");
    set("model.layers", hf_int(j, "num_hidden_layers", file));
    set("model.hidden", hf_int(j, "hidden_size", file));
    set("model.heads", hf_int(j, "num_attention_heads", file));
    set("model.ffn", hf_int(j, "intermediate_size", file));
    set("model.vocab", hf_int(j, "vocab_size", file));
    set("model.max_position", hf_int(j, "max_position_embeddings", file));
    set("model.type_vocab", hf_int(j, "type_vocab_size", file, 2));
    set("model.layer_norm_eps", hf_real(j, "layer_norm_eps", file));
    set("model.dropout", hf_real(j, "hidden_dropout_prob", file));
    set("model.gelu", hf_gelu(j, "hidden_act", file));
  } else if (type == "gpt2") {
    const int64_t hidden = hf_int(j, "n_embd", file);
    set("model.arch", "gpt");
    set("model.layers", hf_int(j, "n_layer", file));
    set("model.hidden", hidden);
    set("model.heads", hf_int(j, "n_head", file));
    set("model.ffn", hf_int(j, "n_inner", file, 4 * hidden));  // null: 4 x n_embd, as GPT2MLP
    set("model.vocab", hf_int(j, "vocab_size", file));
    set("model.max_position", hf_int(j, "n_positions", file));
    set("model.layer_norm_eps", hf_real(j, "layer_norm_epsilon", file));
    set("model.dropout", hf_real(j, "resid_pdrop", file));
    set("model.gelu", hf_gelu(j, "activation_function", file));
  } else if (type == "llama") {
    for (const std::string& set_key : llama_sets(j, file)) sets.push_back(set_key);
  } else {
    usage_error("--init", "'{}': model_type '{}' is not one we train (bert, gpt2, llama)", file, type);
  }
  return sets;
}

void save_hf_model(const std::string& dir, const std::vector<const Param*>& params, const ModelConfig& m) {
  save_safetensors(dir + "/model.safetensors", params);
  write_file_atomic(dir + "/config.json", hf_config_json(m));
}

std::vector<std::string> hf_name_candidates(const std::string& name) {
  std::vector<std::string> out{name};
  for (const char* prefix : {"transformer.", "bert.", "model."})
    if (name.rfind(prefix, 0) == 0) out.push_back(name.substr(std::string(prefix).size()));
  for (const auto& [ours, legacy] : {std::pair{".LayerNorm.weight", ".LayerNorm.gamma"},
                                     std::pair{".LayerNorm.bias", ".LayerNorm.beta"}}) {
    if (!ends_with(name, ours)) continue;
    const size_t n = out.size();
    for (size_t i = 0; i < n; ++i)
      out.push_back(out[i].substr(0, out[i].size() - std::string(ours).size()) + legacy);
  }
  return out;
}

}  // namespace pf

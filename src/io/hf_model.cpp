#include "io/hf_model.hpp"

#include "core/files.hpp"
#include "io/safetensors.hpp"

#include <nlohmann/json.hpp>

#include <string>

namespace pf {

namespace {

// transformers' names of the two GELUs (ACT2FN): "gelu" is erf's, "gelu_new" GPT-2's tanh form.
const char* hf_activation(const ModelConfig& m) { return m.gelu == Gelu::Tanh ? "gelu_new" : "gelu"; }

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

std::string hf_config_json(const ModelConfig& m) {
  nlohmann::ordered_json j;
  if (m.arch == Arch::Bert) {
    j = {{"architectures", {"BertForPreTraining"}},
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
  } else {
    j = {{"architectures", {"GPT2LMHeadModel"}},
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
  return j.dump(2) + "\n";
}

void save_hf_model(const std::string& dir, const std::vector<const Param*>& params, const ModelConfig& m) {
  save_safetensors(dir + "/model.safetensors", params);
  write_file_atomic(dir + "/config.json", hf_config_json(m));
}

std::vector<std::string> hf_name_candidates(const std::string& name) {
  std::vector<std::string> out{name};
  for (const char* prefix : {"transformer.", "bert."})
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

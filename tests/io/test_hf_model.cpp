// What transformers reads: config.json's fields for each architecture, and the hub's other names
// for our tensors.
#include "io/hf_model.hpp"
#include "core/error.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>

namespace {

bool has(const std::vector<std::string>& v, const std::string& s) { return std::find(v.begin(), v.end(), s) != v.end(); }

TEST(HfModel, BertConfigIsBertForPreTrainings) {
  pf::ModelConfig m;  // bert-mini's shape
  m.dropout = 0.1f;
  const auto j = nlohmann::json::parse(pf::hf_config_json(m));
  EXPECT_EQ(j.at("architectures"), nlohmann::json::array({"BertForPreTraining"}));
  EXPECT_EQ(j.at("model_type"), "bert");
  EXPECT_EQ(j.at("hidden_size"), 256);
  EXPECT_EQ(j.at("num_hidden_layers"), 4);
  EXPECT_EQ(j.at("num_attention_heads"), 4);
  EXPECT_EQ(j.at("intermediate_size"), 1024);
  EXPECT_EQ(j.at("vocab_size"), 30522);
  EXPECT_EQ(j.at("max_position_embeddings"), 512);
  EXPECT_EQ(j.at("hidden_act"), "gelu");          // erf
  EXPECT_EQ(j.at("hidden_dropout_prob"), 0.1);    // as written, not 0.10000000149011612
  EXPECT_EQ(j.at("attention_probs_dropout_prob"), 0.0);
  EXPECT_EQ(j.at("layer_norm_eps"), 1e-12);
}

TEST(HfModel, GptConfigIsGpt2LMHeadModels) {
  pf::ModelConfig m;
  m.arch = pf::Arch::Gpt;
  m.gelu = pf::Gelu::Tanh;
  m.vocab = 50257;
  m.max_position = 1024;
  m.layer_norm_eps = 1e-5f;
  const auto j = nlohmann::json::parse(pf::hf_config_json(m));
  EXPECT_EQ(j.at("architectures"), nlohmann::json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(j.at("model_type"), "gpt2");
  EXPECT_EQ(j.at("n_embd"), 256);
  EXPECT_EQ(j.at("n_layer"), 4);
  EXPECT_EQ(j.at("n_head"), 4);
  EXPECT_EQ(j.at("n_inner"), 1024);
  EXPECT_EQ(j.at("n_positions"), 1024);
  EXPECT_EQ(j.at("activation_function"), "gelu_new");  // tanh
  EXPECT_EQ(j.at("layer_norm_epsilon"), 1e-5);
  EXPECT_EQ(j.at("tie_word_embeddings"), true);
}

// from_pretrained's direction: the hub's gpt2/config.json (n_inner null: 4 x n_embd) gives
// GPT-2 small's keys; ours round-trips; what we do not train is refused naming the field.
TEST(HfModel, ConfigJsonGivesTheModelKeys) {
  const std::string gpt2 = R"({"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
    "attn_pdrop": 0.1, "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_inner": null,
    "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1, "scale_attn_weights": true, "summary_activation": null,
    "use_cache": true, "vocab_size": 50257})";
  EXPECT_EQ(pf::hf_model_sets(gpt2, "gpt2/config.json"),
            (std::vector<std::string>{"model.arch=gpt", "model.layers=12", "model.hidden=768", "model.heads=12",
                                      "model.ffn=3072", "model.vocab=50257", "model.max_position=1024",
                                      "model.layer_norm_eps=1e-05", "model.dropout=0.1", "model.gelu=tanh"}));
  pf::ModelConfig m;  // bert-mini
  const auto sets = pf::hf_model_sets(pf::hf_config_json(m), "ours");
  EXPECT_TRUE(has(sets, "model.arch=bert") && has(sets, "model.hidden=256") && has(sets, "model.ffn=1024") &&
              has(sets, "model.gelu=erf") && has(sets, "model.layer_norm_eps=1e-12"));
  auto refusal = [](const std::string& text) {
    try {
      pf::hf_model_sets(text, "c.json");
    } catch (const pf::UsageError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(refusal(R"({"model_type": "t5"})"), "--init: 'c.json': model_type 't5' is not one we train (bert, gpt2, llama)");
  EXPECT_EQ(refusal(R"({"model_type": "gpt2", "n_embd": 64, "n_layer": "two"})"),
            "--init: 'c.json': n_layer is \"two\", not a positive whole number");
  EXPECT_EQ(refusal(R"({"model_type": "bert", "position_embedding_type": "relative_key"})"),
            "--init: 'c.json': position_embedding_type 'relative_key' is not ours (absolute)");
  EXPECT_EQ(refusal("[1]"), "--init: 'c.json' is not a JSON object (a Hugging Face config.json)");
  // A text field that is not text is refused naming it, not with the JSON library's type error.
  EXPECT_EQ(refusal(R"({"model_type": 7})"), "--init: 'c.json': model_type is 7, not a string");
  std::string listed_gelu = gpt2;
  listed_gelu.replace(listed_gelu.find("\"gelu_new\""), 10, "[\"gelu\"]");
  EXPECT_EQ(refusal(listed_gelu), "--init: 'c.json': activation_function is [\"gelu\"], not a string");
  EXPECT_EQ(refusal(R"({"model_type": "bert", "position_embedding_type": false})"),
            "--init: 'c.json': position_embedding_type is false, not a string");
}

// LlamaForCausalLM both ways: TinyLlama-1.1B's config.json (as transformers 4.35 writes it: grouped
// query heads, untied head, rope_scaling null) gives our keys; ours round-trips; what we do not
// compute is refused naming the field.
TEST(HfModel, LlamaConfigBothWays) {
  const std::string tiny_llama = R"({"architectures": ["LlamaForCausalLM"], "attention_bias": false,
    "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 5632, "max_position_embeddings": 2048, "model_type": "llama", "num_attention_heads": 32,
    "num_hidden_layers": 22, "num_key_value_heads": 4, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": null, "rope_theta": 10000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.35.0", "use_cache": true, "vocab_size": 32000})";
  EXPECT_EQ(pf::hf_model_sets(tiny_llama, "config.json"),
            (std::vector<std::string>{"model.arch=llama", "model.layers=22", "model.hidden=2048", "model.heads=32",
                                      "model.kv_heads=4", "model.ffn=5632", "model.vocab=32000",
                                      "model.max_position=2048", "model.tie_embeddings=false",
                                      "model.layer_norm_eps=1e-05", "model.rope_theta=10000"}));
  pf::ModelConfig m;
  m.arch = pf::Arch::Llama, m.heads = 4, m.kv_heads = 2, m.rope_theta = 5e5, m.layer_norm_eps = 1e-6f;
  m.tie_embeddings = true;
  const auto j = nlohmann::json::parse(pf::hf_config_json(m));
  EXPECT_EQ(j.at("architectures"), nlohmann::json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(j.at("num_key_value_heads"), 2);
  EXPECT_EQ(j.at("head_dim"), 64);
  EXPECT_EQ(j.at("rms_norm_eps"), 1e-6);
  EXPECT_EQ(j.at("tie_word_embeddings"), true);
  const auto sets = pf::hf_model_sets(j.dump(), "ours");
  EXPECT_TRUE(has(sets, "model.kv_heads=2") && has(sets, "model.rope_theta=500000") &&
              has(sets, "model.tie_embeddings=true") && has(sets, "model.layer_norm_eps=1e-06"));
  auto refusal = [&](const char* field, const nlohmann::json& v) {
    nlohmann::json c = nlohmann::json::parse(tiny_llama);
    c[field] = v;
    try {
      pf::hf_model_sets(c.dump(), "c.json");
    } catch (const pf::UsageError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(refusal("rope_scaling", {{"type", "dynamic"}, {"factor", 2.0}}),
            "--init: 'c.json': rope_scaling is {\"factor\":2.0,\"type\":\"dynamic\"}; rotary scaling is not "
            "implemented here (only null)");
  EXPECT_NE(refusal("mlp_bias", true).find("mlp_bias is true"), std::string::npos);
  EXPECT_NE(refusal("head_dim", 128).find("head_dim is 128"), std::string::npos);
  EXPECT_NE(refusal("hidden_act", "gelu").find("hidden_act is \"gelu\""), std::string::npos);
  EXPECT_NE(refusal("tie_word_embeddings", "yes").find("tie_word_embeddings is \"yes\", not true or false"),
            std::string::npos);
  EXPECT_NE(refusal("num_key_value_heads", 0).find("num_key_value_heads is 0"), std::string::npos);
}

TEST(HfModel, HubNamesOfOurTensors) {
  const auto gpt = pf::hf_name_candidates("transformer.h.0.attn.c_attn.weight");
  EXPECT_EQ(gpt.front(), "transformer.h.0.attn.c_attn.weight");  // ours first
  EXPECT_TRUE(has(gpt, "h.0.attn.c_attn.weight"));
  const auto ln = pf::hf_name_candidates("bert.encoder.layer.1.output.LayerNorm.weight");
  for (const char* n : {"encoder.layer.1.output.LayerNorm.weight", "bert.encoder.layer.1.output.LayerNorm.gamma",
                        "encoder.layer.1.output.LayerNorm.gamma"})
    EXPECT_TRUE(has(ln, n)) << n;
  EXPECT_TRUE(has(pf::hf_name_candidates("cls.predictions.transform.LayerNorm.bias"),
                  "cls.predictions.transform.LayerNorm.beta"));
  EXPECT_EQ(pf::hf_name_candidates("cls.predictions.bias"), std::vector<std::string>{"cls.predictions.bias"});
}

}  // namespace

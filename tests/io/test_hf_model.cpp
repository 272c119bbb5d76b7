// What transformers reads: config.json's fields for each architecture, and the hub's other names
// for our tensors.
#include "io/hf_model.hpp"

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

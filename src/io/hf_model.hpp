#pragma once
// What Hugging Face's transformers needs to open a saved model as it is:
//   AutoModelForPreTraining.from_pretrained(dir) / GPT2LMHeadModel.from_pretrained(dir)
// reads dir/config.json (the architecture and its sizes) and dir/model.safetensors (the tensors
// under HF's names, save_safetensors). BERT is written as BertForPreTraining, GPT as
// GPT2LMHeadModel, both with tied word embeddings, Llama as LlamaForCausalLM (tied as
// model.tie_embeddings says; an HF Llama folder's rope scaling, biases or other activation are
// refused naming the field); our attention probabilities have no dropout
// (attention_probs_dropout_prob / attn_pdrop = 0), the other dropouts are model.dropout.
//
// Loading goes the other way too: hub files name tensors in older or headless layouts, which
// hf_name_candidates maps to ours.
#include "config/config.hpp"
#include "nn/param.hpp"

#include <string>
#include <vector>

namespace pf {

// The config.json text transformers reads for a model of this shape.
std::string hf_config_json(const ModelConfig& m);

// The other way, as from_pretrained reads a folder: the model keys a Hugging Face config.json
// (ours, or one transformers wrote for a BERT or GPT-2) sets, as `--set key=value` texts:
// model.arch, layers, hidden, heads, ffn, vocab, max_position, type_vocab (bert), layer_norm_eps,
// gelu and dropout (the hidden states'). A model we do not train (another model_type, relative
// positions, another activation) is a UsageError naming `file` and the field.
std::vector<std::string> hf_model_sets(const std::string& json_text, const std::string& file);

// Writes dir/model.safetensors and dir/config.json (each through a temporary file, renamed).
void save_hf_model(const std::string& dir, const std::vector<const Param*>& params, const ModelConfig& m);

// The names a tensor of ours may carry in a file from the hub, ours first:
//   GPT2Model's files lack the "transformer." prefix (h.0.attn.c_attn.weight, wte.weight);
//   BertModel's lack "bert." (embeddings.word_embeddings.weight), LlamaModel's "model." (layers.0...);
//   BERT's original TensorFlow-converted files call LayerNorm's weight/bias gamma/beta.
std::vector<std::string> hf_name_candidates(const std::string& name);

}  // namespace pf

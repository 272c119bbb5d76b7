#pragma once
// Settings that take one of a few names (model.arch, kfac.placement, ...): each is an enum class
// with one table of its names. The TOML reader parses a name once (config.cpp); everything after
// compares values, and prints them back by name (fmt, JSON):
//   name_of(Placement::Inline) == "inline";  parse_name<Placement>("inline") == Placement::Inline.
#include "core/gelu.hpp"

#include <fmt/format.h>

#include <optional>
#include <string>
#include <string_view>

namespace pf {

enum class Arch { Bert, Gpt, Llama };      // model.arch: post-LN with an MLM head | pre-LN causal LM | Llama-style causal LM
enum class Vocab { Bert, Gpt2 };           // data.vocab: the tokenizer
enum class OptimName { NvLamb, AdamW, Sgd, Soap };  // optim.name
enum class OnNonfinite { Skip, Stop };     // train.on_nonfinite
enum class ScheduleName { Naive, GPipe, OneFOneB, Interleaved, Chimera, ZbH1, ZbH2, ZbAuto, ZbV };  // parallel.schedule
enum class LrDecay { Poly, Linear, Cosine, Constant };  // optim.schedule
enum class Placement { Bubbles, Inline, Skip, Replay, Adaptive };  // kfac.placement
enum class KfacStrategy { DKfac, MpdKfac, SpdKfac };   // kfac.distributed

// A causal language model (next-token loss on every position, unpadded windows, generation):
// every architecture but BERT's.
constexpr bool causal_lm(Arch a) { return a != Arch::Bert; }

template <typename E>
struct EnumName {
  E value;
  const char* name;
};

// Each enum's names, in the order a refusal lists them.
template <typename E>
struct EnumNames;
template <>
struct EnumNames<Arch> {
  static constexpr EnumName<Arch> table[] = {{Arch::Bert, "bert"}, {Arch::Gpt, "gpt"}, {Arch::Llama, "llama"}};
};
template <>
struct EnumNames<Gelu> {
  static constexpr EnumName<Gelu> table[] = {{Gelu::Erf, "erf"}, {Gelu::Tanh, "tanh"}};  // model.gelu
};
template <>
struct EnumNames<Vocab> {
  static constexpr EnumName<Vocab> table[] = {{Vocab::Bert, "bert"}, {Vocab::Gpt2, "gpt2"}};
};
template <>
struct EnumNames<OptimName> {
  static constexpr EnumName<OptimName> table[] = {
      {OptimName::NvLamb, "nvlamb"}, {OptimName::AdamW, "adamw"}, {OptimName::Sgd, "sgd"}, {OptimName::Soap, "soap"}};
};
template <>
struct EnumNames<OnNonfinite> {
  static constexpr EnumName<OnNonfinite> table[] = {{OnNonfinite::Skip, "skip"}, {OnNonfinite::Stop, "stop"}};
};
template <>
struct EnumNames<ScheduleName> {
  static constexpr EnumName<ScheduleName> table[] = {
      {ScheduleName::Naive, "naive"},     {ScheduleName::GPipe, "gpipe"},     {ScheduleName::OneFOneB, "1f1b"},
      {ScheduleName::Interleaved, "interleaved"}, {ScheduleName::Chimera, "chimera"}, {ScheduleName::ZbH1, "zb-h1"},
      {ScheduleName::ZbH2, "zb-h2"},     {ScheduleName::ZbAuto, "zb-auto"}, {ScheduleName::ZbV, "zb-v"}};
};
template <>
struct EnumNames<LrDecay> {
  static constexpr EnumName<LrDecay> table[] = {{LrDecay::Poly, "poly"},
                                                {LrDecay::Linear, "linear"},
                                                {LrDecay::Cosine, "cosine"},
                                                {LrDecay::Constant, "constant"}};
};
template <>
struct EnumNames<Placement> {
  static constexpr EnumName<Placement> table[] = {
      {Placement::Bubbles, "bubbles"}, {Placement::Inline, "inline"}, {Placement::Skip, "skip"},
      {Placement::Replay, "replay"},   {Placement::Adaptive, "adaptive"}};
};
template <>
struct EnumNames<KfacStrategy> {
  static constexpr EnumName<KfacStrategy> table[] = {
      {KfacStrategy::DKfac, "d-kfac"}, {KfacStrategy::MpdKfac, "mpd-kfac"}, {KfacStrategy::SpdKfac, "spd-kfac"}};
};

template <typename E>
concept ConfigEnum = requires { EnumNames<E>::table; };

template <ConfigEnum E>
std::string name_of(E v) {
  for (const auto& n : EnumNames<E>::table)
    if (n.value == v) return n.name;
  return fmt::format("<{} out of range>", static_cast<int>(v));
}

template <ConfigEnum E>
std::optional<E> parse_name(std::string_view s) {
  for (const auto& n : EnumNames<E>::table)
    if (s == n.name) return n.value;
  return std::nullopt;
}

// The names a setting accepts, as a refusal lists them: "nvlamb, adamw, sgd".
template <ConfigEnum E>
std::string names_of() {
  std::string list;
  for (const auto& n : EnumNames<E>::table) list += (list.empty() ? "" : ", ") + std::string(n.name);
  return list;
}

// JSON (nlohmann, found by ADL) writes a setting by name, not as its integer.
#define PF_ENUM_TO_JSON(E) \
  template <typename Json>  \
  void to_json(Json& j, E v) { j = name_of(v); }
PF_ENUM_TO_JSON(Arch)
PF_ENUM_TO_JSON(Gelu)
PF_ENUM_TO_JSON(Vocab)
PF_ENUM_TO_JSON(OptimName)
PF_ENUM_TO_JSON(OnNonfinite)
PF_ENUM_TO_JSON(ScheduleName)
PF_ENUM_TO_JSON(Placement)
PF_ENUM_TO_JSON(KfacStrategy)
#undef PF_ENUM_TO_JSON

}  // namespace pf

template <pf::ConfigEnum E>
struct fmt::formatter<E> : fmt::formatter<std::string_view> {
  template <typename Ctx>
  auto format(E v, Ctx& ctx) const {
    return fmt::formatter<std::string_view>::format(pf::name_of(v), ctx);
  }
};

// Tokenizer throughput on the committed sample (202 KB of Moby Dick), one thread, in bytes/s.
// "cold" starts each iteration with an empty GPT-2 chunk cache (like the first pass over a
// corpus); "warm" keeps it (the steady state on a large corpus). Needs scripts/fetch-data.sh.
#include "data/bpe.hpp"
#include "data/text_util.hpp"
#include "data/wordpiece.hpp"

#include "bench_main.hpp"

#include <benchmark/benchmark.h>

#include <string>

namespace {

const std::string kVocab = std::string(PF_SOURCE_DIR) + "/data/vocab/";
const std::string& sample() {
  static std::string s = pf::read_text_file(std::string(PF_SOURCE_DIR) + "/data/sample/moby-dick-1-20.txt", "sample");
  return s;
}

void BM_BertEncode(benchmark::State& state) {
  static auto tok = pf::WordPieceTokenizer::load(kVocab + "bert-base-uncased.txt");
  auto st = tok.new_state();
  std::vector<int32_t> ids;
  for (auto _ : state) {
    ids.clear();
    tok.encode_append(sample(), ids, *st);
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(sample().size()));
}

void BM_Gpt2Encode(benchmark::State& state) {
  static auto tok = pf::Gpt2Tokenizer::load(kVocab + "gpt2-encoder.json", kVocab + "gpt2-vocab.bpe");
  const bool warm = state.range(0) != 0;
  auto st = tok.new_state();
  std::vector<int32_t> ids;
  for (auto _ : state) {
    if (!warm) st = tok.new_state();
    ids.clear();
    tok.encode_append(sample(), ids, *st);
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(sample().size()));
  state.SetLabel(warm ? "warm cache" : "cold cache");
}

BENCHMARK(BM_BertEncode)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Gpt2Encode)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

}  // namespace

PF_BENCHMARK_MAIN()

// Text generation with the model family's inference cache (CausalLM::forward_cached): prompts of different lengths are
// left-padded into one batch and prefilled together, then decoded one token per step; a row
// leaves the batch (and the cache) when it ends: end of text, a stop string, max_new_tokens or
// the model's context. Each row draws from its own generator (sampling.h), so a prompt gives
// the same tokens alone or in any batch, and greedy decoding is deterministic.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "loom/generate/inference_model.h"
#include "loom/generate/sampling.h"

namespace loom::generate {

struct GenerationOptions {
  int64_t max_new_tokens = 128;
  std::vector<std::string> stop;  // stop strings: the text ends before the first one
  bool stop_at_eos = true;
  bool add_bos = true;  // prompts start with BOS, as every training document does
  SamplingOptions sampling;
  void validate() const;
};

struct Completion {
  std::vector<int32_t> prompt_tokens;
  std::vector<int32_t> tokens;  // generated ids (the EOS that ended it included)
  std::string text;             // their text, cut before a stop string, without EOS
  std::string finish_reason;    // "eos", "stop" (a stop string), "length" (max or context)
};

struct GenerationStats {
  int64_t prompt_tokens = 0;     // real (unpadded) prompt tokens prefilled
  double prefill_s = 0;          // prefill forwards and the first token
  int64_t decoded_tokens = 0;    // tokens produced by decode steps (after the first)
  double decode_s = 0;
  int64_t generated_tokens = 0;  // every generated token
};

// Text that is final as tokens arrive: held back while it could still be the start of a stop
// string or ends inside a UTF-8 character.
class StreamingText {
 public:
  StreamingText(const data::Tokenizer& tokenizer, std::vector<std::string> stop);
  // Adds one generated token; returns the newly final text (maybe empty).
  std::string push(int32_t token);
  // The rest once the sequence ended (nothing after a stop string).
  std::string finish();
  bool stopped() const { return stopped_; }
  const std::string& text() const { return text_; }

 private:
  const data::Tokenizer& tokenizer_;
  std::vector<std::string> stop_;
  size_t hold_ = 0;  // longest stop string - 1
  std::vector<int32_t> ids_;
  std::string text_;
  size_t emitted_ = 0;
  bool stopped_ = false;
};

// The longest prefix of text[0, limit) that does not end inside a UTF-8 character.
size_t complete_utf8_prefix(const std::string& text, size_t limit);

// (row in the batch, newly final text)
using TextSink = std::function<void(size_t row, const std::string& piece)>;

class Generator {
 public:
  Generator(InferenceModel& model, GenerationOptions options);

  // A prompt's ids as the model sees them (BOS first with add_bos).
  std::vector<int32_t> encode_prompt(const std::string& text) const;
  // Throws InputError when the prompt leaves no room to generate in the model's context;
  // `what` names it ("--prompt", "prompts.jsonl:3").
  void check_fits(const std::vector<int32_t>& prompt, const std::string& what) const;

  // One batch. Row i uses the generator of sequence first_index + i. `sink` gets text as it
  // becomes final.
  std::vector<Completion> generate(const std::vector<std::vector<int32_t>>& prompts,
                                   uint64_t first_index, const TextSink& sink = {});
  const GenerationStats& stats() const { return stats_; }

  struct Row;

 private:
  // Adds a generated token to a row, passes final text to `sink`; true when the row ended.
  bool append(Row& row, int32_t token, const TextSink& sink);

  InferenceModel& model_;
  GenerationOptions options_;
  GenerationStats stats_;
};

}  // namespace loom::generate

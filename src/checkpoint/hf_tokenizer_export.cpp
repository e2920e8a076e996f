// The tokenizer half of a Hugging Face export (checkpoint/hf.h): what transformers' AutoTokenizer
// loads (tokenizer.json, tokenizer_config.json with the special tokens) and what generate()
// needs to start and stop (bos/eos/pad ids in config.json and generation_config.json).
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "loom/checkpoint/hf.h"
#include "loom/core/check.h"
#include "loom/core/files.h"
#include "loom/core/json.h"
#include "loom/core/logging.h"
#include "loom/core/strings.h"
#include "loom/data/tokenizer.h"

namespace loom::checkpoint {
namespace {

std::string read_file(const std::string& path) {
  files::require_regular_file(path, "export: the tokenizer");
  std::ifstream in(path, std::ios::binary);
  LOOM_CHECK_AS(InputError, in.good(), "export: cannot read the tokenizer '", path, "'");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The text of token `id` in a tokenizer.json: an added (special) token, else a vocabulary entry.
std::string token_text(const nlohmann::json& tokenizer, int64_t id, const std::string& path) {
  for (const auto& added : tokenizer.value("added_tokens", nlohmann::json::array())) {
    if (added.value("id", int64_t{-1}) == id) return added.at("content").get<std::string>();
  }
  const auto& vocab = tokenizer.at("model").at("vocab");
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (it.value().get<int64_t>() == id) return it.key();
  }
  LOOM_THROW(InputError, path, ": no token with id ", id);
}

nlohmann::json special_piece(const std::string& text) {
  return {{"SpecialToken", {{"id", text}, {"type_id", 0}}}};
}

bool starts_with_bos(const nlohmann::json& template_list, const std::string& bos_text) {
  return template_list.is_array() && !template_list.empty() &&
         template_list.front() == special_piece(bos_text);
}

// Training puts BOS before every document (data/token_stream.cpp), and loom's generate and eval
// do too; transformers adds only what tokenizer.json's post-processor adds. So the export's
// post-processor adds that BOS: kept when it already does, prepended to a template that does
// not, and run after any other post-processor (GPT-2's ByteLevel) in a Sequence.
void add_training_bos(nlohmann::json& tokenizer, const std::string& bos_text, int64_t bos) {
  nlohmann::json& post = tokenizer["post_processor"];
  const nlohmann::json sequence_a = {{"Sequence", {{"id", "A"}, {"type_id", 0}}}};
  const nlohmann::json sequence_b = {{"Sequence", {{"id", "B"}, {"type_id", 1}}}};
  const nlohmann::json special = {{"id", bos_text}, {"ids", {bos}}, {"tokens", {bos_text}}};
  if (post.is_object() && post.value("type", "") == "TemplateProcessing") {
    if (starts_with_bos(post["single"], bos_text)) return;
    post["single"].insert(post["single"].begin(), special_piece(bos_text));
    post["pair"].insert(post["pair"].begin(), special_piece(bos_text));
    post["special_tokens"][bos_text] = special;
    return;
  }
  nlohmann::json bos_template = {
      {"type", "TemplateProcessing"},
      {"single", {special_piece(bos_text), sequence_a}},
      {"pair", {special_piece(bos_text), sequence_a, special_piece(bos_text), sequence_b}},
      {"special_tokens", {{bos_text, special}}}};
  if (post.is_null()) {
    post = bos_template;
  } else {
    post = {{"type", "Sequence"}, {"processors", {post, bos_template}}};
  }
}

}  // namespace

void export_tokenizer_to_hf(const std::string& location, int64_t max_seq_len,
                            const std::string& output, nlohmann::json& hf_config) {
  std::unique_ptr<data::Tokenizer> tokenizer;
  try {
    tokenizer = data::load_tokenizer(location);
  } catch (const Error& e) {
    LOOM_THROW(InputError, "export: cannot load the tokenizer '", location,
               "' (model.tokenizer_path / hf_assets_path in the checkpoint's config.toml, relative "
               "to the folder training ran in): ",
               e.message(), "; pass --tokenizer PATH to name it");
  }
  const int64_t bos = tokenizer->bos_id(), eos = tokenizer->eos_id(), pad = tokenizer->pad_id();
  hf_config["bos_token_id"] = bos;
  hf_config["eos_token_id"] = eos;
  hf_config["pad_token_id"] = pad;
  const nlohmann::json generation = {
      {"bos_token_id", bos}, {"eos_token_id", eos}, {"pad_token_id", pad}};
  files::write_atomic(output + "/generation_config.json", generation.dump(2) + "\n");

  const std::string file = data::tokenizer_file(location);
  if (!strings::ends_with(file, ".json")) {
    log::get("checkpoint")
        ->warn(
            "export: the tokenizer '{}' has no tokenizer.json form, so the export has none "
            "(transformers' AutoTokenizer will not load the folder); its bos/eos/pad ids {}/{}/"
            "{} are in config.json and generation_config.json",
            location, bos, eos, pad);
    return;
  }
  const std::string text = read_file(file);
  nlohmann::json parsed;
  try {
    parsed = json::parse_bounded(text, file);
    const std::string bos_text = token_text(parsed, bos, file);
    add_training_bos(parsed, bos_text, bos);
    const nlohmann::json config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                                   {"bos_token", bos_text},
                                   {"eos_token", token_text(parsed, eos, file)},
                                   {"pad_token", token_text(parsed, pad, file)},
                                   {"model_max_length", max_seq_len},
                                   // decoder-only models take no token_type_ids:
                                   // generate(**tokenizer(text)) would refuse them.
                                   {"model_input_names", {"input_ids", "attention_mask"}},
                                   {"clean_up_tokenization_spaces", false}};
    files::write_atomic(output + "/tokenizer_config.json", config.dump(2) + "\n");
  } catch (const nlohmann::json::exception& e) {
    LOOM_THROW(InputError, file, ": ", e.what());
  }
  files::write_atomic(output + "/tokenizer.json", parsed.dump(2) + "\n");
}

}  // namespace loom::checkpoint

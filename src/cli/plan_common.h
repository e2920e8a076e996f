// Shared by the plan subcommands: the vocabulary a plan sizes the embedding and output with.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

#include "loom/config/job_config.h"

namespace loom::cli {

struct PlanVocab {
  int64_t size = 0;  // 0: the flavor's published vocabulary
  std::string note;  // why, when it is not the job's tokenizer
};

// --vocab-size N.
void add_vocab_size_option(CLI::App& command, int64_t& vocab_size);

// --vocab-size when given; else the job's tokenizer's when it loads; else the flavor's published
// vocabulary, with a note saying so (a config for a tokenizer not downloaded yet).
PlanVocab resolve_plan_vocab(const config::JobConfig& config, int64_t vocab_flag);

}  // namespace loom::cli

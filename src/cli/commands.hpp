// Each subcommand of the `attnres` executable registers itself on the app.
// A command's callback throws attnres::Error for anything the user got wrong.
#pragma once

namespace CLI {
class App;
}

namespace attnres::cli {

void register_prepare_command(CLI::App& app);    // prepare_command.cpp: corpora -> token shards
void register_tokenizer_command(CLI::App& app);  // tokenizer_command.cpp: train / encode tokenizers
void register_model_commands(CLI::App& app);     // model_commands.cpp: info, smoke training

}  // namespace attnres::cli

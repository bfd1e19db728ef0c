// `attnres info`: the parameter table and counts of a model configuration or checkpoint.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "model/param_layout.hpp"
#include "model/safetensors.hpp"
#include "util/error.hpp"

namespace attnres::cli {

void register_model_commands(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Print a checkpoint's model config, tokenizer, training step, parameter names, shapes and counts");
  auto path = std::make_shared<std::string>();
  cmd->add_option("--checkpoint,checkpoint", *path,
                  "model.safetensors, a run directory (its model.safetensors), or one of its "
                  "checkpoint-STEP.safetensors (as --checkpoint or the only argument)")
      ->required();
  cmd->callback([path] {
    std::string file_path = *path;
    const SafetensorsFile file = read_model_weights(file_path);
    const ModelConfig config = weights_config(file, file_path);
    const ParamLayout layout(config);
    // What `attnres train` records beside the weights (train/checkpoint.hpp); weights written
    // elsewhere (e.g. attnres.save in Python) may lack either.
    const auto meta = [&](const char* key) {
      const auto it = file.metadata.find(key);
      return it == file.metadata.end() ? std::string() : it->second;
    };
    const std::string tokenizer = meta("tokenizer"), hash = meta("tokenizer_hash"), step = meta("step");
    std::printf("weights: %s\n", file_path.c_str());
    std::printf("config: %s\n", nlohmann::json(config).dump().c_str());
    std::printf("tokenizer: %s%s\n", tokenizer.empty() ? "(not recorded)" : tokenizer.c_str(),
                hash.empty() ? "" : concat(" (content hash ", hash, ")").c_str());
    std::printf("step: %s\n", step.empty() ? "(not recorded)" : step.c_str());
    for (const auto& p : layout.params()) {
      std::string shape;
      for (auto s : p.shape) shape += (shape.empty() ? "" : " x ") + std::to_string(s);
      std::printf("  %-40s [%s]\n", p.name.c_str(), shape.c_str());
    }
    std::printf("parameters: %lld\n", static_cast<long long>(layout.total()));
  });
}

}  // namespace attnres::cli

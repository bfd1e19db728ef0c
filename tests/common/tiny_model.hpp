// The tiny model of the command-line tests, in one place: 2 layers of width 32 in 2 blocks, and
// its batch geometry (4 windows of 32 tokens). Each test adds its budget, evaluation and threads;
// there is no model.residual, which `experiment` sets from each run's arm.
#pragma once

#include <string>

namespace attnres::testing {

inline const std::string kTinyModel =
    "--preset tiny --set model.d_model=32 --set model.n_layers=2 --set model.n_heads=2 --set model.mlp_hidden=64 "
    "--set model.n_blocks=2 --set train.seq_len=32 --set train.batch_size=4";

}  // namespace attnres::testing

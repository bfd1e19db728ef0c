// The depth diagnostics as tables: analysis/tables.hpp.
#include <algorithm>
#include <map>
#include <utility>

#include "analysis/format.hpp"
#include "analysis/tables.hpp"
#include "model/family.hpp"

namespace attnres::analysis {
namespace {

// Seven significant digits: HC's gains can run into the thousands, mHC's backward gain can differ
// from 1 in the sixth decimal (Sinkhorn's column sums after 20 iterations).
std::string gain_cell(double g) { return format_printf("%.7g", g); }

}  // namespace

std::string mudd_routing_note() {
  return concat("MUDD (Q ~ V, K ~ V): a layer is a block, its routes the Q, K and V ways of the DA module feeding it ",
                "(block 0 reads the embedding alone). Their weights dw are signed and unnormalised, so per token ",
                "each way c is read as ", kMuddRoutingDefinition, " over the sources X_j it mixes (the normalised ",
                "ones with PrePostDANorm); JS(p_Q, p_V) and JS(p_K, p_V) (baselines-spec §6.5).");
}

std::vector<Table> depth_tables(const ExperimentSummary& s, bool detailed) {
  std::vector<Table> tables;
  if (!s.routing.empty()) {
    const bool any_k = std::any_of(s.routing.begin(), s.routing.end(), [](const ArmRouting& a) { return a.k_route; });
    Table t;
    t.title = "Depth routing: Jensen–Shannon divergence between the routes (mean over layers)";
    t.header = {"arm", "routes", "seeds", "JS all layers (nats)", "(bits)", "JS multi-source layers (nats)", "(bits)",
                "estimate"};
    t.left_columns = 2;
    auto js_row = [&](const ArmRouting& a, const char* routes, const JsLayerMean& all, const JsLayerMean& multi) {
      t.rows.push_back({a.arm, routes, std::to_string(a.n_seeds),
                        concat(format_number(all.nats, 4), " (", all.layers, ")"), format_number(all.bits, 4),
                        concat(format_number(multi.nats, 4), " (", multi.layers, ")"), format_number(multi.bits, 4),
                        a.per_token_js ? "per-token" : "of means"});
    };
    for (const auto& a : s.routing) {
      if (!a.two_routes) {
        t.rows.push_back({a.arm, "Q/K only", std::to_string(a.n_seeds), "", "", "", "", ""});
      } else if (!a.k_route) {
        js_row(a, "Q/K + V", a.all_layers, a.multi_source_layers);
      } else {
        js_row(a, "Q ~ V", a.all_layers, a.multi_source_layers);
        js_row(a, "K ~ V", a.k_all_layers, a.k_multi_source_layers);
      }
    }
    t.notes = {
        "Per attention sublayer, JS between the routes' depth weights (Q/K + V: the Q/K and V routes), averaged over "
        "evaluation tokens, then over layers (count in brackets).",
        "'all layers' counts single-source sublayers (JS = 0); 'multi-source' leaves them out. Max: ln 2 nats = 1 bit.",
        "estimate 'per-token': the runs' per-token average (the headline); 'of means': JS of the token-averaged "
        "distributions, a lower bound."};
    if (any_k) t.notes.push_back(mudd_routing_note());
    tables.push_back(std::move(t));

    if (detailed) {
      // One column per arm and route pair (Q ~ V and K ~ V for arms with a K route).
      std::vector<std::pair<const ArmRouting*, bool>> columns;  // (arm, K ~ V)
      for (const auto& a : s.routing) {
        if (a.two_routes) columns.push_back({&a, false});
        if (a.k_route) columns.push_back({&a, true});
      }
      if (!columns.empty()) {
        Table d;
        d.title = "Jensen–Shannon divergence per attention sublayer (nats)";
        d.header = {"layer", "sources"};
        for (const auto& [a, k] : columns) d.header.push_back(a->k_route ? a->arm + (k ? " K ~ V" : " Q ~ V") : a->arm);
        std::map<int, std::vector<std::string>> rows;
        for (std::size_t c = 0; c < columns.size(); ++c) {
          for (const auto& l : columns[c].first->layers) {
            auto& row = rows[l.layer];
            if (row.empty()) row = std::vector<std::string>(2 + columns.size(), "");
            row[0] = std::to_string(l.layer);
            row[1] = std::to_string(l.sources);
            row[2 + c] = format_number(columns[c].second ? l.js_k_nats : l.js_nats, 4);
          }
        }
        for (auto& [layer, row] : rows) d.rows.push_back(std::move(row));
        if (any_k) d.notes = {mudd_routing_note()};
        tables.push_back(std::move(d));
      }
      Table m;
      m.title = "Depth routing: mean distribution over sources per attention sublayer (mean over tokens and seeds)";
      m.header = {"arm", "layer", "sources", "Q/K route", "V route"};
      if (any_k) m.header = {"arm", "layer", "sources", "Q/K route (MUDD: Q)", "K route (MUDD)", "V route"};
      m.left_columns = 1;
      auto list = [](const std::vector<double>& v) {
        std::string out;
        for (double x : v) out += (out.empty() ? "" : " ") + format_number(x, 3);
        return out;
      };
      for (const auto& a : s.routing)
        for (const auto& l : a.layers) {
          std::vector<std::string> row = {a.arm, std::to_string(l.layer), std::to_string(l.sources), list(l.qk_mean)};
          if (any_k) row.push_back(a.k_route ? list(l.k_mean) : "");
          row.push_back(a.two_routes ? list(l.v_mean) : "(one route)");
          m.rows.push_back(std::move(row));
        }
      m.notes = {"Sources in order: the token embedding, the completed blocks, then the current block's partial sum "
                 "where the sublayer has one."};
      if (any_k) m.notes.push_back(mudd_routing_note());
      tables.push_back(std::move(m));
    }
  }

  for (const auto& a : s.connections) {
    // Targets are rows, sources columns (blank where a row does not read that source).
    int max_source = 0;
    for (const auto& row : a.connections.rows) max_source = std::max(max_source, row.sources.back());
    Table t;
    t.title = "Depth connections: " + a.arm + " '" + a.connections.name + "' (mean over " +
              std::to_string(a.n_seeds) + (a.n_seeds == 1 ? " seed)" : " seeds)");
    // The columns and notes are the family's record's for this table (model/family.hpp).
    const ConnectionKind* kind = connection_kind(a.connections.name);
    const ConnectionAxis axis = kind != nullptr ? kind->axis : ConnectionAxis::source;
    t.header = {"target"};
    for (int k = 0; k <= max_source; ++k) t.header.push_back(connection_column_label(axis, k));
    for (const auto& row : a.connections.rows) {
      std::vector<std::string> cells(static_cast<std::size_t>(max_source) + 2);
      cells[0] = std::to_string(row.target);
      for (std::size_t k = 0; k < row.sources.size(); ++k)
        cells[static_cast<std::size_t>(row.sources[k]) + 1] = format_number(row.weights[k], 3);
      t.rows.push_back(std::move(cells));
    }
    if (kind != nullptr) t.notes = kind->notes;
    tables.push_back(std::move(t));
  }

  for (const auto& a : s.amax_gain) {
    const results::AmaxGain& g = a.gain;
    Table t;
    t.title = "Amax gain: " + a.arm + " (" + std::to_string(a.n_seeds) + (a.n_seeds == 1 ? " seed)" : " seeds)");
    t.header = {"gain", "composite: mean", "composite: max", "single sublayer: max"};
    t.rows = {{"forward (max |row sum|)", gain_cell(g.composite_forward_mean), gain_cell(g.composite_forward_max),
               gain_cell(g.layer_forward_max)},
              {"backward (max |column sum|)", gain_cell(g.composite_backward_mean),
               gain_cell(g.composite_backward_max), gain_cell(g.layer_backward_max)}};
    t.notes = {"Per token, the composite P = H_res(last sublayer) ... H_res(first) (HC: A_r^T) and its largest "
               "absolute row and column sums (MHC-P §3.1; 1 is neutral); mean and max over evaluation tokens, the "
               "mean averaged and the max taken over seeds; single sublayer: the largest of one H_res."};
    tables.push_back(std::move(t));
  }
  return tables;
}

}  // namespace attnres::analysis

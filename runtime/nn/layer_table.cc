#include "runtime/nn/layer_table.h"

namespace fsdp::nn {

const char* layer_style_name(LayerStyle style) {
  switch (style) {
    case LayerStyle::block: return "block";
    case LayerStyle::norm: return "norm";
    case LayerStyle::final_norm: return "final_norm";
    case LayerStyle::column: return "column";
    case LayerStyle::column_heads: return "column_heads";
    case LayerStyle::row: return "row";
    case LayerStyle::attention: return "attention";
    case LayerStyle::experts: return "experts";
  }
  return "?";
}

bool matches_layer_pattern(const std::string& pattern, const std::string& name) {
  size_t p = 0, n = 0;
  while (true) {
    const size_t pe = pattern.find('.', p), ne = name.find('.', n);
    const std::string part = pattern.substr(p, pe == std::string::npos ? pe : pe - p);
    const std::string comp = name.substr(n, ne == std::string::npos ? ne : ne - n);
    if (part != "*" && part != comp) return false;
    if (comp.empty()) return false;  // '*' never matches an empty component
    if (pe == std::string::npos || ne == std::string::npos) return pe == ne;
    p = pe + 1;
    n = ne + 1;
  }
}

std::vector<StyledLayer> LayerTable::resolve(Module& root) const {
  std::vector<StyledLayer> out;
  for (Module* m : root.modules()) {
    const LayerRow* found = nullptr;
    for (const LayerRow& row : rows_) {
      if (!row.kind.empty() && row.kind != m->kind()) continue;
      if (!matches_layer_pattern(row.pattern, m->name())) continue;
      FSDP_CHECK(found == nullptr, ConfigError, "layer table: '", m->name(), "' is named by two "
                 "rows ('", found ? found->pattern : "", "' and '", row.pattern, "')");
      found = &row;
    }
    if (found) out.push_back({m, found});
  }
  return out;
}

std::vector<StyledLayer> LayerTable::layers(Module& root, LayerStyle style) const {
  std::vector<StyledLayer> out;
  for (const StyledLayer& l : resolve(root))
    if (l.row->style == style) out.push_back(l);
  return out;
}

}  // namespace fsdp::nn

// Per-layer stacks: which token mixer each layer of a model gets, and with which options.
//
// Config keys (docs/config.md, "Per-layer stacks and mixer kinds"):
//   model.layers         [n_layers names]  one name per layer, in order
//   model.layer_pattern  [names]           repeated over the layers (n_layers need not be a multiple)
//   model.mixers         {name: options}   an options block per name; a name that is not a mixer
//                                          kind gives its kind as "type" (two differently
//                                          configured windows, say)
//   model.mixer          {options}         the options of the architecture's primary kind (the
//                                          form single-mixer configs use)
// Neither layers nor layer_pattern: the architecture's default pattern. A name is a key of
// model.mixers or a mixer kind (then with default options, or model.mixer for the primary kind).
// Every options block must be used by some layer; unknown names, unknown kinds, a block given
// twice (model.mixer and model.mixers.<primary>) and a wrong layer count are UserErrors naming
// the file and the JSON path. Unknown option keys are the kinds' own validation.
#pragma once

#include <string>
#include <vector>

#include "model/registry.h"

namespace linac {

std::vector<LayerSpec> resolve_layers(const ModelConfig& cfg, const std::string& file);

// Validates the whole stack: resolves it and checks each distinct options block with its kind.
void validate_layers(const ModelConfig& cfg, const std::string& file);

}  // namespace linac
